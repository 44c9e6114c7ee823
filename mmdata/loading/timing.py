"""Stage timers cheap enough to leave on, with optional profiler ranges.

`timed(seconds, "video", cpu)` adds the block's wall time to `seconds["video"]` (two perf_counter
calls, well under a microsecond) and its thread's CPU time to `cpu["video"]` (two thread-clock reads,
about a microsecond): with workers sharing the cores wall time overstates a stage, its CPU does not.
With `enable_profiler_ranges(True)` each stage also opens a `torch.profiler.record_function` range
and, on a CUDA machine, an NVTX range (for Nsight), named `mmdata/<stage>`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_PROFILER_RANGES = False


def enable_profiler_ranges(enabled: bool) -> None:
    """Turn the profiler / NVTX ranges of every stage on or off in this process (inherited by forked workers)."""
    global _PROFILER_RANGES
    _PROFILER_RANGES = bool(enabled)


@contextmanager
def timed(seconds: dict[str, float], stage: str, cpu: dict[str, float] | None = None) -> Iterator[None]:
    """Add the wall time of the block to `seconds[stage]`, and the CPU time of this thread in it to `cpu[stage]`."""
    ranges = _open_ranges(stage) if _PROFILER_RANGES else None
    cpu_started = time.thread_time() if cpu is not None else 0.0
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started
        if cpu is not None:
            cpu[stage] = cpu.get(stage, 0.0) + time.thread_time() - cpu_started
        if ranges is not None:
            _close_ranges(ranges)


def _open_ranges(stage: str):
    import torch

    record = torch.profiler.record_function(f"mmdata/{stage}")
    record.__enter__()
    nvtx = torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(f"mmdata/{stage}")
    return record, nvtx


def _close_ranges(ranges) -> None:
    import torch

    record, nvtx = ranges
    if nvtx:
        torch.cuda.nvtx.range_pop()
    record.__exit__(None, None, None)
