"""Packing quality and speed on realistic length distributions, against three baselines, in one run.

Distributions (token counts per sample):
- episodes: log-normal lengths of whole episodes (100 k samples);
- lerobot-windows: 50 k policy windows (2-4 cameras x 1-2 frames x 256 tokens + 50-100 actions
  + 14 state tokens);
- world-model: 10 k long sequences, log-uniform 2 k - 200 k tokens, cut into budget-sized chunks (as a loader
  cuts them with `Sequences(max_seconds=...)`).

mmdata packs as its loader does (`planning.packed_windows`): the epoch in a keyed global order, each shuffle window
packed into a fixed number of micro-batches (the fewer of first-fit decreasing and minimum bin slack, at the
smallest capacity that holds the window), dealt to the ranks heaviest first.

Baselines: (a) naive padding of random batches to the batch maximum, (b) first-fit decreasing
in pure Python, (c) the Multipack sampler's approach re-implemented (per step, binary search for
the longest prefix of the shuffled samples that FFD fits into one bin per rank).

usage: python benchmarks/pack_bench.py [--budget 16384] [--ranks 8] [--out benchmarks/results/pack_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from machine import machine_name  # noqa: E402

from mmdata.planning.orders import GlobalOrder  # noqa: E402
from mmdata.planning.packed_windows import PackedRankPlan, PackedWindows, plan_window_packing  # noqa: E402
from mmdata.planning.packing.kernels import first_fit_decreasing, minimum_bin_slack  # noqa: E402


def cut_to_budget(costs: np.ndarray, budget: int) -> np.ndarray:
    """Each sample longer than `budget` cut into budget-sized chunks and a shorter last one."""
    pieces = -(-costs // budget)
    chunk = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    return np.minimum(budget, np.repeat(costs, pieces) - chunk * budget).astype(np.int64)


def plan_packed(costs: np.ndarray, budget: int, ranks: int, window: int, seed: int = 0) -> PackedRankPlan:
    """The epoch of `costs` as the loader packs it at `ranks` ranks."""
    order = GlobalOrder(len(costs), seed, 0)
    packing = plan_window_packing(lambda p: costs[order.samples_at(p)], len(costs), window, budget, "tokens")
    return PackedRankPlan(order, PackedWindows(order.samples_at, costs.__getitem__, len(costs), packing), ranks, 0)


def plan_figures(plan: PackedRankPlan, costs: np.ndarray, budget: int) -> dict:
    """Efficiency (tokens over the budgets of the steps' micro-batches), the ranks' token spread per step, and the
    samples left out, of the whole epoch."""
    loads = np.array(
        [[costs[plan.micro_batch(s, r)].sum() for r in range(plan.world)] for s in range(len(plan))], np.float64
    )
    spread = loads.max(axis=1) / loads.mean(axis=1) - 1
    return {
        "steps": len(plan),
        "efficiency": float(loads.sum() / (loads.size * budget)),
        "rank_token_spread": float(spread.mean()),
        "rank_token_spread_max": float(spread.max()),
        "deferred_samples": int(len(plan.deferred)),
    }


def distributions(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    episodes = np.exp(rng.normal(np.log(1500), 0.9, size=100_000)).astype(np.int64).clip(16, 60_000)
    cameras, frames = rng.integers(2, 5, size=50_000), rng.integers(1, 3, size=50_000)
    windows = cameras * frames * 256 + rng.integers(50, 101, size=50_000) + 14
    world = np.exp(rng.uniform(np.log(2_000), np.log(200_000), size=10_000)).astype(np.int64)
    return {"episodes": episodes, "lerobot-windows": windows, "world-model": world}


def naive_padding(costs: np.ndarray, budget: int, seed: int) -> dict:
    """Random batches of as many samples as fit the budget at the median length, padded to their max.

    Padded efficiency is real tokens over padded tokens (the share of compute doing real work);
    budget utilisation is real tokens over the budget per batch (above 1: batches overrun it).
    """
    chunks = cut_to_budget(costs, budget)
    order = np.random.default_rng(seed).permutation(len(chunks))
    size = max(1, budget // int(np.median(chunks)))
    usable = len(order) // size * size
    batches = chunks[order[:usable]].reshape(-1, size)
    return {
        "batch_size": size,
        "padded_efficiency": float(batches.sum() / (batches.max(axis=1).sum() * size)),  # real / padded tokens
        "budget_utilisation": float(batches.sum() / (len(batches) * budget)),  # above 1: batches overrun it
    }


def python_ffd(lengths: list[int], capacity: int) -> int:
    room: list[int] = []
    for length in sorted(lengths, reverse=True):
        for index, free in enumerate(room):
            if free >= length:
                room[index] -= length
                break
        else:
            room.append(capacity - length)
    return len(room)


def multipack(costs: np.ndarray, budget: int, ranks: int, seed: int) -> dict:
    """Per step: the longest prefix that FFD packs into `ranks` bins (binary search), one bin per rank."""
    chunks = cut_to_budget(costs, budget)
    lengths = chunks[np.random.default_rng(seed).permutation(len(chunks))]
    start, loads, started = 0, [], time.perf_counter()
    while start < len(lengths):
        low, high = 1, min(len(lengths) - start, ranks * budget // max(1, int(lengths.min())) + 1)
        while low < high:
            middle = (low + high + 1) // 2
            _, bins = first_fit_decreasing(lengths[start : start + middle], budget)
            low, high = (middle, high) if bins <= ranks else (low, middle - 1)
        assignment, bins = first_fit_decreasing(lengths[start : start + low], budget)
        if bins < ranks:
            break  # the tail cannot give every rank a batch
        loads.append(np.bincount(assignment, weights=lengths[start : start + low], minlength=ranks))
        start += low
    seconds = time.perf_counter() - started
    per_step = np.array(loads)
    return {
        "efficiency": float(per_step.sum() / (len(per_step) * ranks * budget)),
        "rank_token_spread": float(np.mean(per_step.max(axis=1) / per_step.mean(axis=1) - 1)),
        "steps": len(per_step),
        "sequences_per_s": round(start / seconds),
    }


def kernel_speed(kernel, costs: np.ndarray, budget: int, window: int) -> float:
    """A packing kernel's sequences/s on one core, on shuffle windows of `window` samples (as the plan packs)."""
    chunks = cut_to_budget(costs, budget)
    kernel(chunks[:16], budget)
    repeats = max(1, 1_000_000 // len(chunks))
    started = time.perf_counter()
    for _ in range(repeats):
        for start in range(0, len(chunks), window):
            kernel(chunks[start : start + window], budget)
    return repeats * len(chunks) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--out", default="benchmarks/results/pack_cpu.json")
    args = parser.parse_args()
    rows = []
    for name, costs in distributions().items():
        costs = cut_to_budget(costs, args.budget)
        plan_packed(costs[:100], args.budget, args.ranks, args.window)  # compile
        started = time.perf_counter()
        plan = plan_packed(costs, args.budget, args.ranks, args.window)
        figures = plan_figures(plan, costs, args.budget)
        plan_seconds = time.perf_counter() - started
        numba_speed = kernel_speed(first_fit_decreasing, costs, args.budget, args.window)
        slack_speed = kernel_speed(minimum_bin_slack, costs, args.budget, args.window)
        sample = costs[: args.window].tolist()  # one shuffle window
        started = time.perf_counter()
        python_ffd(sample, args.budget)
        python_speed = len(sample) / (time.perf_counter() - started)
        row = {
            "distribution": name,
            "samples": len(costs),  # (after cutting to the budget)
            "mean_tokens": round(float(costs.mean())),
            "mmdata": {
                **figures,
                "plan_seconds": round(plan_seconds, 3),
                "plan_samples_per_s": round(len(costs) / plan_seconds),
                "ffd_sequences_per_s_one_core": round(numba_speed),
                "mbs_sequences_per_s_one_core": round(slack_speed),
            },
            "naive_padding": naive_padding(costs, args.budget, 0),
            "python_ffd": {"sequences_per_s": round(python_speed), "measured_on": len(sample)},
            "multipack": multipack(costs, args.budget, args.ranks, 0),
            "ffd_speedup_vs_python": round(numba_speed / python_speed, 1),
        }
        rows.append(row)
        m = row["mmdata"]
        print(
            f"{name:16s} mmdata eff {m['efficiency']:.4%}"
            f" spread {m['rank_token_spread']:.4%}"
            f" (max {m['rank_token_spread_max']:.3%}) deferred {m['deferred_samples']} | naive eff"
            f" {row['naive_padding']['padded_efficiency']:.2%} | multipack eff {row['multipack']['efficiency']:.4%}"
            f" spread {row['multipack']['rank_token_spread']:.4%} | FFD {numba_speed / 1e6:.2f} M seq/s,"
            f" {row['ffd_speedup_vs_python']}x pure Python, MBS {slack_speed / 1e6:.2f} M seq/s"
            f" | plan {m['plan_samples_per_s']:,} samples/s",
            flush=True,
        )
    result = {
        "machine": f"{machine_name()} (no GPU), one core used",
        "date": time.strftime("%Y-%m-%d"),
        "budget": args.budget,
        "ranks": args.ranks,
        "window": args.window,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
