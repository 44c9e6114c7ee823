"""What the loader measured: per-stage time in workers and in the main process, data wait and the training loop's
own time per step (`loop_ms`: from a batch handed over to the next asked for), bytes,
frames decoded against delivered, skipped samples, memory. Kept as running totals plus a bounded
window of recent per-step waits, so it costs nothing to keep on for a whole run."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from mmdata.loading.step_record import StepRecord
from mmdata.loading.timing import Stage, add_time

RECENT_STEPS = 10_000
READY_WAIT_SECONDS = 0.001


class LoaderStats:
    """Running totals the loader keeps as batches reach the training loop."""

    def __init__(self):
        self.steps = self.samples = self.tokens = 0
        self.bytes_read = 0
        self.read_retries = 0
        self.frames_decoded = self.frames_delivered = 0
        self.decode_cpu = 0.0
        self.frame_cache_peak_bytes = 0
        self.frames_evicted = 0
        self.data_wait = 0.0
        self.ready_when_asked = 0
        self.waits: deque[float] = deque(maxlen=RECENT_STEPS)
        self.loop_seconds = 0.0
        self.loops: deque[float] = deque(maxlen=RECENT_STEPS)
        self.worker_seconds: dict[str, float] = {}
        self.stage_cpu: dict[str, float] = {}
        self.main_seconds: dict[str, float] = {}
        self.worker_busy: dict[int, float] = {}
        self.worker_cpu: dict[int, float] = {}
        self.skipped: list[str] = []
        self.skipped_count = 0
        self.borrowed_count = 0
        self.peak_rss: dict[int, int] = {}
        self.main_queue_depths: deque[int] = deque(maxlen=RECENT_STEPS)
        self.worker_pids: set[int] = set()
        self.per_source: dict[int, list[int]] = {}

    def add_main(self, stage: Stage, seconds: float) -> None:
        """Count time the main process spent on a stage outside any step (an epoch planned before its first)."""
        add_time(self.main_seconds, stage, seconds)

    def add_loop(self, seconds: float) -> None:
        """Count one step of the training loop: the time from a batch handed to it to its asking for the next."""
        self.loop_seconds += seconds
        self.loops.append(seconds)

    def add_step(self, record: StepRecord, waited: float, queue_depth: int | None = None) -> None:
        """Count one batch handed to the training loop, with what reading it measured."""
        self.steps += 1
        self.samples += record.samples
        self.tokens += record.tokens
        self.bytes_read += record.bytes_read
        self.read_retries += record.read_retries
        self.frames_decoded += record.frames_decoded
        self.frames_delivered += record.frames_delivered
        self.decode_cpu += record.decode_cpu
        self.frame_cache_peak_bytes = max(self.frame_cache_peak_bytes, record.frame_cache_bytes)
        self.frames_evicted += record.frames_evicted
        self.data_wait += waited
        self.waits.append(waited)
        self.ready_when_asked += waited < READY_WAIT_SECONDS
        if queue_depth is not None:
            self.main_queue_depths.append(queue_depth)
        _add_into(self.worker_seconds, record.seconds)
        _add_into(self.stage_cpu, record.stage_cpu)
        _add_into(self.main_seconds, record.main_seconds)
        worker = record.worker
        self.worker_pids.add(record.pid)
        self.worker_busy[worker] = self.worker_busy.get(worker, 0.0) + record.busy
        if record.cpu is not None:
            self.worker_cpu[worker] = self.worker_cpu.get(worker, 0.0) + record.cpu
        self.skipped_count += len(record.failed)
        self.borrowed_count += record.borrowed
        self.skipped += list(record.failed.values())[: max(0, 100 - len(self.skipped))]
        self.peak_rss[worker] = max(self.peak_rss.get(worker, 0), record.peak_rss)
        for source, figures in record.sources.items():
            totals = self.per_source.setdefault(int(source), [0, 0, 0])
            for position, value in enumerate(figures):
                totals[position] += value

    def sources(self, names: list[str]) -> dict[str, dict[str, int]]:
        """Samples, tokens and skipped samples delivered per source, by name."""
        return {
            name: dict(zip(("samples", "tokens", "skipped_samples"), self.per_source.get(number, [0, 0, 0])))
            for number, name in enumerate(names)
        }

    def snapshot(self) -> dict[str, Any]:
        percentiles = _percentiles_ms(self.waits)
        busy = self.loop_seconds + self.data_wait
        return {
            "steps": self.steps,
            "samples": self.samples,
            "tokens": self.tokens,
            "bytes_read": self.bytes_read,
            "read_retries": self.read_retries,
            "skipped_samples": self.skipped_count,
            "borrowed_samples": self.borrowed_count,
            "skipped": list(self.skipped),
            "data_wait_seconds": round(self.data_wait, 6),
            "wait_ms": percentiles,
            "loop_seconds": round(self.loop_seconds, 6),
            "loop_ms": _percentiles_ms(self.loops),
            "wait_share": round(self.data_wait / busy, 4) if busy else 0.0,
            "ready_when_asked": round(self.ready_when_asked / self.steps, 4) if self.steps else 0.0,
            "main_queue_depth_mean": round(float(np.mean(self.main_queue_depths)), 3)
            if self.main_queue_depths
            else None,
            "worker_stage_seconds": {k: round(v, 6) for k, v in self.worker_seconds.items()},
            "main_stage_seconds": {k: round(v, 6) for k, v in self.main_seconds.items()},
            "stage_cpu_seconds": {k: round(v, 6) for k, v in self.stage_cpu.items()},
            "worker_busy_seconds": {k: round(v, 6) for k, v in self.worker_busy.items()},
            "worker_cpu_seconds": {k: round(v, 6) for k, v in self.worker_cpu.items()},
            "frames_decoded": self.frames_decoded,
            "frames_delivered": self.frames_delivered,
            "decode_cpu_seconds": round(self.decode_cpu, 6),
            "decode_cpu_ms_per_frame": round(1000 * self.decode_cpu / self.frames_decoded, 4)
            if self.frames_decoded
            else None,
            "frame_cache_peak_bytes": self.frame_cache_peak_bytes,
            "frames_evicted": self.frames_evicted,
            "decode_waste": round(self.frames_decoded / self.frames_delivered, 4) if self.frames_delivered else 0.0,
            "peak_rss_bytes_per_worker": dict(self.peak_rss),
            "worker_pids": sorted(self.worker_pids),
        }


def _percentiles_ms(seconds: deque[float]) -> dict[str, float]:
    """p50/p95/p99 and the longest of recent durations, in milliseconds (none yet: empty)."""
    if not seconds:
        return {}
    values = np.asarray(seconds, dtype=np.float64) * 1000
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in (50, 95, 99)} | {
        "max": round(float(values.max()), 3)
    }


def _add_into(totals: dict[str, float], seconds: dict[str, float]) -> None:
    for stage, spent in seconds.items():
        totals[stage] = totals.get(stage, 0.0) + spent
