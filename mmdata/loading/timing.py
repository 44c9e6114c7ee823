"""The loading chain's declared stages and their timers, cheap enough to leave on, with optional profiler ranges.

`timed(seconds, Stage.DECODE, cpu)` adds the block's wall time to `seconds["decode"]` (two perf_counter
calls, well under a microsecond) and its thread's CPU time to `cpu["decode"]` (two thread-clock reads,
about a microsecond): with workers sharing the cores wall time overstates a stage, its CPU does not.
With `enable_profiler_ranges(True)` each stage also opens a `torch.profiler.record_function` range
and, on a CUDA machine, an NVTX range (for Nsight), named `mmdata/<stage>`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

_PROFILER_RANGES = False


class Stage(Enum):
    """The stages of the loading chain, in the order data flows through them; each has its own timer, and
    `DataLoader.stats()` reports each by its value."""

    PLAN = "plan"  # an epoch's steps (the main process's first, the workers' next ones)
    FETCH = "fetch"  # bytes from the store: manifest rows and segments (from object storage coalesced, ahead)
    ALIGN = "align"  # each sample's streams at its times: the cameras' frame plans (this step's and the horizon's)
    LOWDIM = "lowdim"  # low-dim values interpolated at the samples' times
    AUDIO = "audio"  # audio cut at the samples' times
    DECODE_PREPARE = "decode_prepare"  # a camera's requests merged, the decoder's host-side preparation
    DECODE = "decode"  # the decoder's call, the frame cache, the frames gathered per sample
    SETTLE = "settle"  # substitutes read for failed samples
    COLLATE = "collate"  # packed or padded tensors
    H2D = "h2d"  # the batch copied to the GPU


def enable_profiler_ranges(enabled: bool) -> None:
    """Turn the profiler / NVTX ranges of every stage on or off in this process (inherited by forked workers)."""
    global _PROFILER_RANGES
    _PROFILER_RANGES = bool(enabled)


@contextmanager
def timed(seconds: dict[str, float], stage: Stage, cpu: dict[str, float] | None = None) -> Iterator[None]:
    """Add the wall time of the block to `seconds[stage.value]`, and the CPU time of this thread in it to
    `cpu[stage.value]`."""
    name = stage.value
    ranges = _open_ranges(name) if _PROFILER_RANGES else None
    cpu_started = time.thread_time() if cpu is not None else 0.0
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        if cpu is not None:
            cpu[name] = cpu.get(name, 0.0) + time.thread_time() - cpu_started
        if ranges is not None:
            _close_ranges(ranges)


def add_time(seconds: dict[str, float], stage: Stage, spent: float) -> None:
    """Add `spent` seconds measured elsewhere (an epoch planned between reads) to `seconds[stage.value]`."""
    seconds[stage.value] = seconds.get(stage.value, 0.0) + spent


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
