"""Measuring the input pipeline: the loader run for N steps, its stage breakdown, the naive
baseline, sweeps, and `StepTimer` for a user's own training loop.

The names below are imported when first used, so that the CLI's parser (which reads the presets)
does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "StepTimer": "mmdata.measure.steps",
    "compare": "mmdata.measure.report",
    "format_table": "mmdata.measure.report",
    "load": "mmdata.measure.report",
    "run_loader": "mmdata.measure.runner",
    "stage_breakdown": "mmdata.measure.runner",
}
__all__ = ["StepTimer", "compare", "format_table", "load", "run_loader", "stage_breakdown"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmdata.measure' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
