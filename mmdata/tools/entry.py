"""The `mmdata` console script's entry point, which imports the command line only when called.

A conversion's worker processes are spawned, and a spawned process imports the running script again
before its first job; were the script to import `mmdata.tools.cli` (every tool, ~0.6 s), each worker
would load it for nothing.
"""

from __future__ import annotations


def main() -> int:
    """Run the `mmdata` command (see `mmdata.tools.cli`)."""
    from mmdata.tools.cli import main as run_command

    return run_command()
