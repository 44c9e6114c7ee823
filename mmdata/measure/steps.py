"""`StepTimer`: how long a training loop waits for data, and how long it computes, step by step."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np


class StepTimer:
    """Wrap the batches of a training loop to measure data wait against compute, per step.

        timer = mmdata.StepTimer(loader)
        for batch in timer:
            train_step(batch)
        print(timer.summary())

    The wait of a step is the time the loop spent asking for its batch; its compute is the time
    from receiving the batch to asking for the next one. A step *stalls* when its wait exceeds
    `stall_ms`. With `synchronize=True` (default when CUDA is in use) the timer waits for the GPU
    at the end of each step, so asynchronous kernels are counted as compute, not as the next
    step's wait. When `batches` is an `mmdata.DataLoader`, `report()` includes its stage times.
    """

    def __init__(self, batches: Iterable, stall_ms: float = 1.0, synchronize: bool | None = None):
        self.batches = batches
        self.stall_ms = stall_ms
        self.synchronize = synchronize
        self.waits: list[float] = []
        self.computes: list[float] = []
        self.wall = 0.0

    def __iter__(self) -> Iterator[Any]:
        synchronize = self._cuda_sync()
        iterator = iter(self.batches)
        started = time.perf_counter()
        received: float | None = None
        try:
            while True:
                asked = time.perf_counter()
                if received is not None:
                    if synchronize is not None:
                        synchronize()
                        asked = time.perf_counter()
                    self.computes.append(asked - received)
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                received = time.perf_counter()
                self.waits.append(received - asked)
                yield batch
        finally:
            self.wall += time.perf_counter() - started

    def _cuda_sync(self):
        if self.synchronize is False:
            return None
        try:
            import torch
        except ImportError:
            return None
        if torch.cuda.is_available() and (self.synchronize or torch.cuda.is_initialized()):
            return torch.cuda.synchronize
        return None

    def report(self) -> dict[str, Any]:
        """Steps, wall time, wait and compute totals and shares, stall fraction and wait percentiles."""
        waits = np.asarray(self.waits, dtype=np.float64)
        computes = np.asarray(self.computes, dtype=np.float64)
        stalled = waits > self.stall_ms / 1000
        report: dict[str, Any] = {
            "steps": len(waits),
            "wall_seconds": round(self.wall, 6),
            "wait_seconds": round(float(waits.sum()), 6),
            "compute_seconds": round(float(computes.sum()), 6),
            "wait_share": round(float(waits.sum()) / self.wall, 4) if self.wall else 0.0,
            "stall_threshold_ms": self.stall_ms,
            "stall_fraction": round(float(stalled.mean()), 4) if len(waits) else 0.0,
            "mean_stall_ms": round(float(waits[stalled].mean()) * 1000, 3) if stalled.any() else 0.0,
            "wait_ms": {f"p{q}": round(float(np.percentile(waits, q)) * 1000, 3) for q in (50, 95, 99)}
            if len(waits)
            else {},
        }
        stats = getattr(self.batches, "stats", None)
        if callable(stats):
            report["loader"] = stats()
        return report

    def summary(self) -> str:
        """The report as a few lines of text."""
        r = self.report()
        lines = [
            f"{r['steps']} steps in {r['wall_seconds']:.2f} s: waiting for data {r['wait_seconds']:.2f} s"
            f" ({r['wait_share']:.1%}), computing {r['compute_seconds']:.2f} s",
            f"input stalls: {r['stall_fraction']:.1%} of steps waited over {self.stall_ms:g} ms"
            f" (mean {r['mean_stall_ms']:.1f} ms); wait p50/p95/p99 "
            + "/".join(f"{r['wait_ms'].get(q, 0.0):.1f}" for q in ("p50", "p95", "p99"))
            + " ms",
        ]
        loader = r.get("loader")
        if loader:
            stages = {**loader.get("worker_stage_seconds", {}), **loader.get("main_stage_seconds", {})}
            if stages:
                lines.append("loader stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        return "\n".join(lines)
