"""Measuring the input pipeline: the loader run for N steps, its stage breakdown, the naive
baseline, sweeps, and `StepTimer` for a user's own training loop."""

from mmdata.bench.report import compare, format_table, load
from mmdata.bench.runner import run_loader, stage_breakdown
from mmdata.bench.steps import StepTimer

__all__ = ["StepTimer", "compare", "format_table", "load", "run_loader", "stage_breakdown"]
