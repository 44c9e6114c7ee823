"""What an epoch of millions of samples costs before its first batch, and per step, in one run.

A loader plans every epoch (order, then micro-batches per rank) in the main process for the first
epoch and in each worker for the next ones, so planning time is time the GPU waits at every epoch
boundary. This measures, for an epoch of `--samples` policy windows (low-dim only, so nothing but
planning is timed), with the loader's defaults (the "auto" order):

- `build_s`: building the loader (reading the manifest's planning columns, the sample index, the planner);
- `plan_s`: the epoch's plan (`Planner.epoch_plan`);
- `first_step_s`: one rank's steps and the samples of its first step (`rank_steps`, made lazily);
- `pickled_mb`: the planner and a rank's steps as they reach a spawned worker process (pickled; forked
  workers inherit them instead);
- `advance_us`: the per-step bookkeeping of the loader's state (samples consumed so far);
- `first_batch_s`: `iter(DataLoader)` to its first batch with the defaults (`num_workers="auto"`: forked workers, the
  first of them reading it); `build_to_first_batch_s` adds `build_s`; `first_batch_in_process_s`: the same with
  `num_workers=0`.

A small loader is built and read first, so that what the process pays once (imports, Numba's cached kernels) is
not counted against the first configuration.

usage: python benchmarks/planning_bench.py [--samples 1000000] [--out benchmarks/results/planning_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_name  # noqa: E402

import mmdata  # noqa: E402
from mmdata.conversion.pipeline import ConvertOptions, convert  # noqa: E402
from mmdata.importers.raw import discover_raw_episodes  # noqa: E402
from mmdata.synthetic import SynthSpec, write_synthetic_dataset  # noqa: E402


def store(folder: Path) -> mmdata.Dataset:
    write_synthetic_dataset(folder / "raw", SynthSpec(episodes=4, min_seconds=20.0, max_seconds=30.0))
    convert(discover_raw_episodes(folder / "raw"), folder / "store.wds", ConvertOptions(progress=False))
    return mmdata.open_dataset(str(folder / "store.wds"))


def measure(dataset: mmdata.Dataset, samples: int, batch: dict) -> dict:
    seconds = sum(float(dataset.manifest.row(i)["duration"]) for i in range(len(dataset)))
    spec = mmdata.Windows(anchor_fps=samples / seconds, streams={"action": mmdata.Values(offsets=[0.0, 0.1])})
    building = time.perf_counter()
    loader = mmdata.DataLoader(dataset, spec, seed=1, **batch)
    built = time.perf_counter()
    plan = loader.planner.epoch_plan(1, 0, [], 1)
    planned = time.perf_counter()
    steps = loader.planner.rank_steps(plan, 0)
    steps[0]
    first = time.perf_counter()
    advance_started = time.perf_counter()
    for count in range(1, 1001):
        plan.samples_consumed(count)
    advance = (time.perf_counter() - advance_started) / 1000
    loader_started = time.perf_counter()
    next(iter(loader))
    first_batch = time.perf_counter() - loader_started
    loader.close()
    in_process = mmdata.DataLoader(dataset, spec, seed=1, num_workers=0, **batch)
    in_process_started = time.perf_counter()
    next(iter(in_process))
    first_batch_in_process = time.perf_counter() - in_process_started
    return {
        "samples": len(loader.samples),
        "order": loader.shuffle,
        "steps": len(steps),
        "build_s": round(built - building, 3),
        "plan_s": round(planned - built, 3),
        "first_step_s": round(first - planned, 4),
        "pickled_mb": round(len(pickle.dumps((loader.planner, steps))) / 1e6, 2),
        "advance_us": round(advance * 1e6, 2),
        "first_batch_s": round(first_batch, 3),
        "build_to_first_batch_s": round(built - building + first_batch, 3),
        "first_batch_in_process_s": round(first_batch_in_process, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dataset = store(Path(folder))
        warm = mmdata.Windows(anchor_fps=1, streams={"action": mmdata.Values()})
        next(
            iter(mmdata.DataLoader(dataset, warm, batch_size=1, num_workers=0))
        )  # (the process's imports, Numba's cache: once)
        results = {
            "machine": machine_name(),
            "batch_size_256": measure(dataset, args.samples, {"batch_size": 256}),
            "batch_tokens_4096": measure(dataset, args.samples, {"batching": mmdata.Batching(batch_tokens=4096)}),
        }
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
