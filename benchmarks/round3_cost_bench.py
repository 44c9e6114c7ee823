"""What reliability round 3 (issue 27) cost conversion and the loader, measured against the tree before it.

Each tree converts the same synthetic recordings (2 workers; WebDataset) and then runs the loader of
verify_cost_bench.py over its own store (stores of this tree carry packet-index checksums the earlier one
does not read): loader samples/s with 2 workers, and CPU milliseconds per sample in one process. The trees
take turns in each round, in fresh interpreters, first one then the other, then the other way round; the
ratios are this tree's median over the baseline's.

usage: python benchmarks/round3_cost_bench.py --baseline-tree DIR [--rounds 4]
(DIR: `git worktree add DIR 8978f34`, the commit before round 3). Writes benchmarks/results/round3_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from machine import machine_name
from verify_cost_bench import LOADER, LOADER_CPU, run

from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent

CONVERT = """
import json, resource, shutil, time
from mmdata.conversion.pipeline import ConvertOptions, convert
try:
    from mmdata.importers.raw import discover_raw_episodes
except ImportError:  # trees before the issue-28 package names
    from mmdata.sources.raw import discover_raw_episodes
shutil.rmtree({store!r}, ignore_errors=True)
started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
convert(discover_raw_episodes({raw!r}), {store!r}, ConvertOptions(layout="wds", workers=2, progress=False))
after = resource.getrusage(resource.RUSAGE_CHILDREN)
print("RESULT " + json.dumps({{"seconds": time.perf_counter() - started,
                               "worker_cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    trees = {"this": HERE.parent, "baseline": args.baseline_tree.resolve()}
    figures: dict = {name: {"convert_s": [], "convert_worker_cpu_s": [], "loader_samples_per_s": [], "cpu_ms": []}
                     for name in trees}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="mmdata-round3-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, SynthSpec(episodes=6, min_seconds=5.0, max_seconds=15.0))
        for number in range(args.rounds):
            order = list(trees.items()) if number % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                store = str(Path(folder) / f"{name}.wds")
                converted = run(tree, CONVERT.format(raw=str(raw), store=store))
                figures[name]["convert_s"].append(converted["seconds"])
                figures[name]["convert_worker_cpu_s"].append(converted["worker_cpu_s"])
            for name, tree in order:
                store = str(Path(folder) / f"{name}.wds")
                loaded = run(tree, LOADER.format(store=store, workers=2, verify=True, seconds=args.seconds))
                figures[name]["loader_samples_per_s"].append(loaded["samples_per_s"])
                figures[name]["cpu_ms"].append(
                    run(tree, LOADER_CPU.format(store=store, workers=0, verify=True))["cpu_ms_per_sample"]
                )
            print(
                f"round {number}: "
                + json.dumps({n: {k: round(v[-1], 3) for k, v in f.items()} for n, f in figures.items()}),
                flush=True,
            )
    medians = {name: {key: statistics.median(values) for key, values in by.items()} for name, by in figures.items()}
    record = {
        "benchmark": "round3_cost_bench",
        "machine": machine_name(),
        "rounds": args.rounds,
        "runs": figures,
        "medians": medians,
        "this_over_baseline": {
            key: round(medians["this"][key] / medians["baseline"][key], 4) for key in medians["this"]
        },
    }
    path = HERE / "results" / "round3_cost.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["this_over_baseline"], indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
