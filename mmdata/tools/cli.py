"""The `mmdata` command: one subcommand per tool module."""

from __future__ import annotations

import argparse
import sys

from mmdata.errors import MmdataError
from mmdata.tools import bench, convert, demo, edit, export, inspect, stats, synth, verify, view
from mmdata.tools.formatting import terminal_text
from mmdata.tools.storage import apply_storage_options
from mmdata.version import __version__

TOOLS = (synth, convert, inspect, verify, stats, edit, demo, bench, view, export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmdata",
        description="Multimodal episode stores (WebDataset / Zarr) for robotics and video training.",
    )
    parser.add_argument("--version", action="version", version=f"mmdata {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for tool in TOOLS:
        tool.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        apply_storage_options(getattr(args, "storage_options", None))
        return int(args.run(args) or 0)
    except MmdataError as exc:
        print(f"mmdata {args.command}: error: {terminal_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mmdata {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
