"""Run a loader for N steps after warm-up, optionally beside a simulated training step, and turn
what it measured into the figures `mmdata bench` reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch

from mmdata.loading import DataLoader, Frames
from mmdata.loading.timing import Stage, timed
from mmdata.measure.floor import decode_floor
from mmdata.measure.steps import StepTimer
from mmdata.planning.planner import EpochPlan


def endless(loader: DataLoader) -> Iterator[dict[str, Any]]:
    """The loader's batches, epoch after epoch."""
    while True:
        produced = False
        for batch in loader:
            produced = True
            yield batch
        if not produced:
            raise RuntimeError("the loader has no steps for this rank (fewer samples than ranks?)")


def simulated_step(step_ms: float, device: torch.device) -> Callable[[], None]:
    """A stand-in for a training step of `step_ms`: a sleep on the CPU, a matmul loop on a GPU."""
    if step_ms <= 0:
        return lambda: None
    if device.type != "cuda":
        return lambda: time.sleep(step_ms / 1000)
    a = torch.randn(4096, 4096, device=device)
    repeats = 10

    def step() -> None:
        for _ in range(repeats):
            a @ a
        torch.cuda.synchronize(device)

    step()  # the first matmul also sets cuBLAS up: kept out of the calibration
    for _ in range(2):  # the second pass corrects for the first's launch overheads
        started = time.perf_counter()
        step()
        per_matmul = (time.perf_counter() - started) / repeats
        repeats = max(1, round(step_ms / 1000 / per_matmul))
    return step


def run_loader(
    loader: DataLoader,
    steps: int,
    warmup: int = 3,
    step_ms: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Measure `steps` batches after `warmup`; returns figures, stage breakdown and the loader's stats.
    `progress(done, total)` is called after every step, warm-up's included."""
    batches = endless(loader)
    total = warmup + steps
    for done, _ in enumerate(islice(batches, warmup), 1):
        if progress is not None:
            progress(done, total)
    loader.reset_stats()
    step = simulated_step(step_ms, loader.device)
    timer = StepTimer(islice(batches, steps), synchronize=False)
    samples = frames = 0
    episodes: list[np.ndarray] = []
    delivered: list[np.ndarray] = []
    main_cpu = -time.process_time()
    for done, batch in enumerate(timer, warmup + 1):
        samples += len(batch["sample_index"])
        frames += _frames_in(loader, batch)
        episodes.append(_episodes_in(batch))
        delivered.append(_host_integers(batch["sample_index"]))
        stepped = time.process_time()
        step()
        if progress is not None:
            progress(done, total)
        main_cpu -= time.process_time() - stepped  # the training step's and the progress line's CPU is not the loader's
    main_cpu += time.process_time()
    loader.close()
    stats = loader.stats()
    wall = timer.wall
    stall = timer.report()
    figures = {
        "steps": stall["steps"],
        "wall_seconds": round(wall, 4),
        "samples_per_s": round(samples / wall, 2),
        "frames_per_s": round(frames / wall, 2),
        "tokens_per_s": round(stats["tokens"] / wall, 1),
        "mb_per_s": round(stats["bytes_read"] / 1e6 / wall, 3),
        "latency_ms": stall["wait_ms"],
        "stall_fraction": stall["stall_fraction"],
        "mean_stall_ms": stall["mean_stall_ms"],
        "step_ms_measured": round(1000 * stall["compute_seconds"] / max(1, stall["steps"]), 2),
        "decode_waste": stats["decode_waste"],
        "frame_cache_bound_mb": round(stats["frame_cache"]["bound"] / 2**20, 1) if stats["frame_cache"] else 0.0,
        "frame_cache_horizon": stats["frame_cache"]["horizon"] if stats["frame_cache"] else 0,
        "frame_cache_peak_mb": round(stats["frame_cache_peak_bytes"] / 2**20, 1),
        "frames_evicted": stats["frames_evicted"],
        **mixing_figures(episodes),
        "peak_rss_mb_per_worker": {str(k): round(v / 2**20, 1) for k, v in stats["peak_rss_bytes_per_worker"].items()},
        **plan_figures(loader),
    }
    per_step = wall / max(1, stall["steps"])
    figures["instrumentation_share"] = round(instrumentation_seconds(len(loader.spec.streams) + 6) / per_step, 6)
    if loader.device.type == "cuda":
        figures["gpu_memory_mb"] = round(torch.cuda.max_memory_allocated(loader.device) / 2**20, 1)
    if stats["decode_waste_cause"]:
        figures["decode_waste_cause"] = stats["decode_waste_cause"]
    if stats["frame_cache"]:
        figures["frame_cache"] = stats["frame_cache"]["describe"]
    figures.update(cpu_figures(loader, main_cpu, stats, samples, delivered))
    return {
        "figures": figures,
        "stages": stage_breakdown(stats, wall, stall["compute_seconds"], loader.num_workers),
        "loader_stats": stats,
    }


def cpu_figures(
    loader: DataLoader, main_cpu: float, stats: dict[str, Any], samples: int, delivered: list[np.ndarray]
) -> dict[str, float]:
    """The loader's CPU per sample (its process and its workers) and, for a decoder on the host, the part of it
    the decoder spent, the decode floor of the samples delivered (`measure.floor`) and the loader's CPU over it; and
    that CPU per stage of the chain (wherever the stage ran) with what no stage covered."""
    cpu = main_cpu + sum(stats["worker_cpu_seconds"].values())
    figures: dict[str, Any] = {"cpu_ms_per_sample": round(1000 * cpu / max(1, samples), 3)}
    stage_cpu = {stage: 1000 * seconds / max(1, samples) for stage, seconds in stats["stage_cpu_seconds"].items()}
    # the rest: planning, the hand-over between processes, the loops that run the stages
    stage_cpu["outside_stages"] = max(0.0, figures["cpu_ms_per_sample"] - sum(stage_cpu.values()))
    figures["stage_cpu_ms_per_sample"] = {stage: round(ms, 4) for stage, ms in stage_cpu.items()}
    if loader.decoder.device != "cpu" or not delivered:
        return figures
    figures["decode_cpu_ms_per_sample"] = round(1000 * stats["decode_cpu_seconds"] / max(1, samples), 3)
    floor = decode_floor(loader, np.concatenate(delivered))
    if floor is not None and floor.cpu_seconds > 0:
        figures["decode_floor_ms_per_sample"] = round(floor.ms_per_sample, 3)
        figures["cpu_over_decode_floor"] = round(1000 * cpu / max(1, samples) / floor.ms_per_sample, 3)
    return figures


def _episodes_in(batch: dict[str, Any]) -> np.ndarray:
    """The (source, episode) of each sample of a batch, as one number each (the batch may be on a GPU)."""
    episode = _host_integers(batch["episode_index"])
    source = _host_integers(batch["source"]) if "source" in batch else np.zeros_like(episode)
    return source * (1 << 40) + episode


def _host_integers(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.cpu().numpy()
    return np.asarray(values, dtype=np.int64)


def mixing_figures(episodes: list[np.ndarray]) -> dict[str, float]:
    """How well batches mix: distinct episodes per batch, the share of a batch's episodes the batch before
    it also held, and the correlation of the mean episode number of consecutive batches (near 0 when
    consecutive batches are unrelated)."""
    if not episodes:
        return {"episodes_per_batch": 0.0, "episodes_shared_with_previous": 0.0, "episode_lag1_correlation": 0.0}
    distinct = [set(batch.tolist()) for batch in episodes]
    shared = [len(now & before) / len(now) for before, now in zip(distinct, distinct[1:]) if now]
    means = np.asarray([batch.mean() for batch in episodes], np.float64)
    correlation = 0.0
    if len(means) > 2 and means[:-1].std() > 0 and means[1:].std() > 0:
        correlation = float(np.corrcoef(means[:-1], means[1:])[0, 1])
    return {
        "episodes_per_batch": round(float(np.mean([len(d) for d in distinct])), 3),
        "episodes_shared_with_previous": round(float(np.mean(shared)) if shared else 0.0, 3),
        "episode_lag1_correlation": round(correlation, 3),
    }


def instrumentation_seconds(timers_per_step: int, repeats: int = 20_000) -> float:
    """What the stage timers cost per step: `timers_per_step` timed blocks (wall and CPU, as the chain times them),
    measured here."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    for _ in range(repeats):
        with timed(seconds, Stage.DECODE, {}):
            pass
    return (time.perf_counter() - started) / repeats * timers_per_step


def run_for_seconds(
    batches: Iterable, seconds: float, count: Callable[[Any], tuple[int, int]], warmup: int = 1, step=None
) -> dict[str, Any]:
    """Samples/s and frames/s of any loader for about `seconds` after `warmup` batches, starting new
    epochs as needed (worker start-up counts, as in training); `count(batch)` gives (samples, frames)."""
    iterator = iter(batches)
    for _ in range(warmup):
        next(iterator)
    samples = frames = count_batches = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for batch in iterator:
            batch_samples, batch_frames = count(batch)
            samples, frames, count_batches = samples + batch_samples, frames + batch_frames, count_batches + 1
            if step is not None:
                step()
            if time.perf_counter() - started >= seconds:
                break
        else:
            iterator = iter(batches)
    elapsed = time.perf_counter() - started
    return {
        "batches": count_batches,
        "seconds": round(elapsed, 3),
        "samples_per_s": round(samples / elapsed, 2),
        "frames_per_s": round(frames / elapsed, 2),
    }


# Steps of a plan made per step (the "blocks" order) whose figures `plan_figures` takes: the whole epoch's would cost
# what planning per step saves.
DEALT_STEPS = 256


def plan_figures(loader: DataLoader) -> dict[str, float]:
    """Packing efficiency and rank token spread of the current epoch's plan (of its first `DEALT_STEPS` steps: the
    whole epoch's would cost what planning per step saves)."""
    return _dealt_figures(loader, loader.epoch_plan())


def _dealt_figures(loader: DataLoader, epoch_plan: EpochPlan) -> dict[str, float]:
    """Efficiency (tokens over the budget, or over each micro-batch padded to its longest sample) and rank token
    spread of the first `DEALT_STEPS` steps of a plan whose steps are made when read."""
    plan, budget = epoch_plan.plan, loader.batching.batch_tokens
    real = padded = 0
    spreads = []
    for step in range(min(len(plan), DEALT_STEPS)):
        loads = []
        for rank in range(loader.world_size):
            costs = np.array([ref.cost for ref in loader.planner.refs(epoch_plan, plan.micro_batch(step, rank))])
            loads.append(int(costs.sum()))
            padded += budget if budget else int(costs.max()) * len(costs)
        real += sum(loads)
        spreads.append(max(loads) / (sum(loads) / len(loads)) - 1)
    return {
        "packing_efficiency": round(real / padded, 5) if padded else 0.0,
        "rank_token_spread": round(float(np.mean(spreads)), 5) if spreads else 0.0,
    }


def stage_breakdown(stats: dict[str, Any], wall: float, compute: float, workers: int) -> dict[str, Any]:
    """Where the time went.

    `main_thread`: shares of the wall time that add up to 1, `unaccounted` being what no timer
    covered. In-process loading (no workers) lists each reading stage there; with workers the main
    thread shows the data wait, and `workers` gives each stage's share of the workers' busy time
    and their utilization (busy time over workers x wall time; batches prefetched during warm-up
    can lift it slightly above 1 on short runs).
    """
    main = {f"main_{k}": v for k, v in stats["main_stage_seconds"].items()}
    worker = stats["worker_stage_seconds"]
    if workers == 0:
        seconds = {**worker, **main, "step": compute}
        seconds["unaccounted"] = wall - sum(seconds.values())
        return {"main_thread": _shares(seconds, wall)}
    seconds = {"data_wait": stats["data_wait_seconds"], **main, "step": compute}
    seconds["unaccounted"] = wall - sum(seconds.values())
    busy = sum(stats["worker_busy_seconds"].values())
    worker_seconds = dict(worker)
    worker_seconds["other"] = max(0.0, busy - sum(worker.values()))
    return {
        "main_thread": _shares(seconds, wall),
        "workers": {
            "utilization": round(busy / (wall * workers), 4) if wall else 0.0,
            "stages": _shares(worker_seconds, busy),
        },
    }


def _shares(seconds: dict[str, float], total: float) -> dict[str, dict[str, float]]:
    return {k: {"seconds": round(v, 4), "share": round(v / total, 4) if total else 0.0} for k, v in seconds.items()}


def _frames_in(loader: DataLoader, batch: dict[str, Any]) -> int:
    count = 0
    for name, stream in loader.spec.streams.items():
        if isinstance(stream, Frames):
            lengths = batch.get(f"{name}_lengths")
            count += int(lengths.sum()) if lengths is not None else int(batch[name].shape[0])
    return count
