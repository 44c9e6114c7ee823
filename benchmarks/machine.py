"""What every benchmark records beside its figures: the machine it ran on, and where results go."""

from __future__ import annotations

import os
import platform
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def machine_name() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.node() or 'host'}: {os.cpu_count()} cores {cpu}, {platform.system()}"
