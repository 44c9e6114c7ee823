"""Timed loops for loader benchmarks: samples/s and CPU seconds of the process and its workers.

Used on both sides of a comparison (mmdata's loader and another library's, the latter run in its
own virtual environment), so it needs the standard library only. CPU time is read from /proc for
the process and every descendant alive at the two reads (DataLoader workers live across the
measured window), so samples per CPU-second count the workers' time too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found += [int(child) for child in listing.read().split()]
    except OSError:
        pass
    return found


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process `pid` (default: this one) and its live descendants."""
    total, pending = 0.0, [pid or os.getpid()]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            continue
        pending += _children(current)
    return total


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process alone (all its threads), not its children."""
    with open(f"/proc/{os.getpid()}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def measure(batches: Callable[[], Iterator], count: Callable[[object], int], seconds: float) -> dict:
    """Draw batches from `batches()` (restarted at the end of an epoch) for `seconds` after one warm-up
    batch; samples/s, CPU seconds and samples per CPU-second over the measured window."""
    iterator = batches()
    next(iterator)
    samples, cpu_start, own_start, start = 0, tree_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        try:
            batch = next(iterator)
        except StopIteration:
            iterator = batches()
            continue
        samples += count(batch)
    figures = _figures(samples, time.perf_counter() - start, tree_cpu_seconds() - cpu_start)
    own = own_cpu_seconds() - own_start
    figures["own_cpu_s"] = round(own, 3)  # this process's threads: the loop, and whatever else runs in it
    figures["children_cpu_s"] = round(figures["cpu_seconds"] - own, 3)
    return figures


def measure_epochs(batches: Callable[[], Iterator], count: Callable[[object], int], seconds: float) -> dict:
    """Whole epochs after a first one drawn unmeasured, as many as `seconds` holds (at least one): samples/s, CPU
    seconds and samples per CPU-second between two epoch ends. A frame cache's first reads of an epoch decode the
    frames its later reads take, and workers run ahead into the next epoch, so a window that ends mid-epoch (or
    starts at one's beginning) counts decoding without the samples it serves; between epoch ends, the work done
    ahead is alike at both ends."""
    for _ in batches():
        pass
    samples, epochs, cpu_start, start = 0, 0, tree_cpu_seconds(), time.perf_counter()
    while not epochs or time.perf_counter() - start < seconds:
        samples += sum(count(batch) for batch in batches())
        epochs += 1
    return {**_figures(samples, time.perf_counter() - start, tree_cpu_seconds() - cpu_start), "epochs": epochs}


def _figures(samples: int, elapsed: float, cpu: float) -> dict:
    """Samples/s, CPU seconds and samples per CPU-second of a measured window."""
    return {
        "samples": samples,
        "seconds": round(elapsed, 3),
        "samples_per_s": round(samples / elapsed, 1),
        "cpu_seconds": round(cpu, 3),
        "samples_per_cpu_s": round(samples / cpu, 1) if cpu else None,
    }
