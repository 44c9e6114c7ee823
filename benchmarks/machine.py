"""What every benchmark records beside its figures: the machine it ran on, and where results go."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def machine_name() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.node() or 'host'}: {os.cpu_count()} cores {cpu}, {platform.system()}"


def write_results(name: str, report: dict) -> Path:
    """Write `report` to benchmarks/results/<name>.json and say where."""
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return path
