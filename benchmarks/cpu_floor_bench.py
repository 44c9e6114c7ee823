"""The loader's CPU per sample over the decode floor, with 0 and 2 workers, told apart by stage (issue 41's targets).

On a store of LeRobot-written data (default: the 224x224 store `frame_size_bench.py` leaves in its work folder),
lerobot_bench.py's policy windows, batch 8, the default loader (order "auto", the frame cache), in `--rounds` rounds
whose order alternates, each configuration in a fresh interpreter over whole epochs (`frame_size_bench.py`'s
measurement): the loader's CPU per sample (its process and workers) over the decode floor measured by the same
run just before and after its epochs (`mmdata.measure.floor`), the decoder's part of it, and each stage's CPU per
sample wherever it ran (`loader.stats()["stage_cpu_seconds"]`) with `outside_stages` (planning, the hand-over
between processes, the loops around the stages). Medians over rounds; stage figures from the median round.

With `--baseline-tree` (a source tree of an earlier mmdata) each configuration also runs on that tree in the same
rounds: the before/after of one run.

usage: PYTHONPATH=.:benchmarks python benchmarks/cpu_floor_bench.py [--store PATH] [--rounds 5] [--record NAME]
       [--baseline-tree DIR]
Results go to benchmarks/results/cpu_floor_<NAME>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from frame_size_bench import DEFAULT_LOADER, TREE
from lerobot_bench import mmdata_run, run_rounds
from machine import machine_name, write_results

STORE = Path.home() / ".cache" / "mmdata-bench" / "lerobot-data" / "sizes-store-12x6s-224x224.wds"
FIGURES = ("cpu_ms_per_sample", "floor_ms_per_sample", "cpu_over_floor", "decode_cpu_ms_per_sample", "decode_waste")


def summary(runs: list[dict]) -> dict:
    """Medians of the rounds' figures, and the stage split of the round whose CPU over the floor is the median."""
    good = [run for run in runs if "cpu_over_floor" in run]
    if not good:
        return {"error": runs[-1].get("error", "no round finished") if runs else "not run"}
    middle = sorted(good, key=lambda run: run["cpu_over_floor"])[len(good) // 2]
    figures = {
        "cpu_over_floor": round(statistics.median(run["cpu_over_floor"] for run in good), 3),
        "cpu_over_floor_runs": [run["cpu_over_floor"] for run in good],
        "samples_per_s": round(statistics.median(run["samples_per_s"] for run in good), 1),
    }
    figures.update({name: middle.get(name) for name in FIGURES if name != "cpu_over_floor"})
    figures["stage_cpu_ms_per_sample"] = middle.get("stage_cpu_ms_per_sample")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, default=STORE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--record", default=None, help="write benchmarks/results/cpu_floor_<RECORD>.json")
    parser.add_argument("--baseline-tree", type=Path, help="also run these configurations on an earlier tree")
    args = parser.parse_args()
    if not (args.store / "dataset.json").exists():
        raise SystemExit(f"{args.store} is no store: run benchmarks/frame_size_bench.py --sizes 224x224 first")
    trees = {"": TREE, **({"before, ": args.baseline_tree} if args.baseline_tree else {})}
    configurations = {
        f"{label}workers {workers}": lambda w=workers, t=tree: mmdata_run(
            t, args.store, w, args.seconds, DEFAULT_LOADER
        )
        for label, tree in trees.items()
        for workers in (0, 2)
    }
    runs = run_rounds(configurations, args.rounds)
    report = {
        "benchmark": "cpu_floor_bench",
        "machine": machine_name(),
        "store": str(args.store),
        "rounds": args.rounds,
        "seconds_per_run": args.seconds,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "results": {name: summary(results) for name, results in runs.items()},
    }
    for name, figures in report["results"].items():
        print(f"{name}: {json.dumps(figures)}")
    if args.record:
        write_results(f"cpu_floor_{args.record}", report)


if __name__ == "__main__":
    main()
