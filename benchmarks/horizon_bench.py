"""The frame cache's horizon set by a segment's life in a cache's reads, against the fixed 128 reads before it, in
one run (`frame_budget.horizon_for`).

With `num_workers=0` the default 8 lanes share the main process, so a 32-frame segment's samples span 256 of its
reads; a 128-read horizon decodes most segments in two passes. The workload is frame_size_bench.py's (policy
windows: `cam_high` at t-0.1 s and t, `cam_wrist` at t, state, 16 actions; every frame an anchor; batch 8) on
its store of LeRobot-written 480x640 data (run frame_size_bench.py first, or give `--store`). Each configuration
runs in a fresh interpreter, alternating by round: two epochs measured after a first one. Reports CPU ms per
sample (and its ratio within each round, then their median), samples/s, decode waste and the process's peak RSS;
writes benchmarks/results/NAME.json.

usage: python benchmarks/horizon_bench.py [--store PATH] [--workers 0] [--rounds 3] [--record horizon_cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lerobot_bench import POLICY_SPEC
from machine import RESULTS, machine_name
from verify_cost_bench import run

HERE = Path(__file__).resolve().parent
STORE = Path.home() / ".cache" / "mmdata-bench" / "lerobot-data" / "sizes-store-12x6s-480x640.wds"
CODE = (
    """
import json, resource, time
import mmdata
import mmdata.loading.assembly as assembly
if {fixed}:
    assembly.horizon_for = lambda life, lanes, workers: 128  # the fixed horizon before horizon_for
"""
    + POLICY_SPEC
    + """loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers={workers})
sum(len(batch["sample_index"]) for batch in loader)
loader.reset_stats()
cpu, wall = time.process_time(), time.perf_counter()
samples = sum(len(batch["sample_index"]) for _ in range(2) for batch in loader)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
stats = loader.stats()
print("RESULT " + json.dumps({{
    "cpu_ms_per_sample": round(1000 * cpu / samples, 3), "samples_per_s": round(samples / wall, 1),
    "decode_waste": stats["decode_waste"], "horizon": stats["frame_cache"]["horizon"],
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
}}))
"""
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, default=STORE)
    parser.add_argument("--workers", type=int, default=0, help="CPU per sample counts the main process only: use 0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", default="horizon_cpu", help="results file name, without .json")
    args = parser.parse_args()
    if not (args.store / "dataset.json").exists():
        raise SystemExit(f"{args.store} is not a store: run benchmarks/frame_size_bench.py --sizes 480x640 first")
    configurations = {"fixed 128 reads": True, "a segment's life": False}
    runs: dict[str, list[dict]] = {name: [] for name in configurations}
    for round_number in range(args.rounds):
        names = list(configurations)[:: 1 if round_number % 2 == 0 else -1]
        for name in names:
            code = CODE.format(fixed=configurations[name], store=str(args.store), workers=args.workers)
            figures = run(HERE.parent, code)
            runs[name].append(figures)
            print(f"round {round_number} {name:18s} {json.dumps(figures)}", flush=True)
    summary = {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]} for name, results in runs.items()
    }
    ratios = [
        round(life["cpu_ms_per_sample"] / fixed["cpu_ms_per_sample"], 3)
        for life, fixed in zip(runs["a segment's life"], runs["fixed 128 reads"])
    ]
    record = {
        "benchmark": "horizon_bench",
        "machine": machine_name(),
        "store": str(args.store),
        "workers": args.workers,
        "rounds": args.rounds,
        "medians": summary,
        "runs": runs,
        # the VM's speed drifts between rounds: the ratio within each round, then their median
        "cpu_per_sample_ratios": ratios,
        "cpu_per_sample_ratio": round(statistics.median(ratios), 3),
    }
    out = RESULTS / f"{args.record}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"CPU per sample, a segment's life over fixed 128 reads, per round: {ratios}")
    print(f"written {out}")


if __name__ == "__main__":
    main()
