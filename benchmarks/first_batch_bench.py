"""Time to the first batch: from `DataLoader(...)` to the first batch in hand, in a fresh interpreter, the imports
timed apart, in one run.

The store is `autotune_bench.py`'s (24 episodes of 6 s, two 224x224 cameras: the held-out LeRobot-shaped store) and
the window LeRobot's policy windows (cam_high at t-0.1 s and t, cam_wrist at t, state at t-0.1 s and t, 16
actions), batch 8, shuffled. Each configuration (`--workers`) runs `--rounds` times, the order rotating; medians of
the import time, the construction, and the first batch after it, with the modules' bytecode written once
beforehand, as an installed package has it. Results:
benchmarks/results/first_batch_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune_bench import make_store
from machine import machine_name

RESULTS = Path(__file__).resolve().parent / "results"

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import torch
import mmdata
imported = time.perf_counter()
store, workers = sys.argv[1], sys.argv[2]
workers = workers if workers == "auto" else int(workers)
spec = mmdata.Windows(anchor_fps=30, streams={
    "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "cam_wrist": mmdata.Frames(offsets=[0.0]),
    "state": mmdata.Values(offsets=[-0.1, 0.0]), "action": mmdata.Values(offsets=[i / 30 for i in range(16)])})
building = time.perf_counter()
loader = mmdata.DataLoader(store, spec, batch_size=8, num_workers=workers, shuffle=True)
built = time.perf_counter()
batch = next(iter(loader))
first = time.perf_counter()
print(json.dumps({"import_s": imported - started, "construct_s": built - building, "iterate_s": first - built,
                  "to_first_batch_s": first - building}))
loader.close()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="0,2,auto")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", type=Path, help="a store made by autotune_bench.py (default: made afresh)")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    kinds = args.workers.split(",")
    rows: dict[str, list[dict]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as folder:
        store = args.store if args.store and args.store.exists() else make_store(Path(folder))
        # as an installed package runs: its modules' bytecode written once (a discarded run) and read from then on
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, "-c", CHILD, str(store), "0"], capture_output=True, env=environment, check=True)
        for round_ in range(args.rounds):
            shift = round_ % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(store), kind],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    env=environment,
                )
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-3000:])
                row = json.loads(done.stdout.strip().splitlines()[-1])
                rows[kind].append(row)
                print(f"round {round_}: num_workers={kind:5s} " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()))
    medians = {
        kind: {key: round(statistics.median(row[key] for row in rows[kind]), 3) for key in rows[kind][0]}
        for kind in kinds
    }
    results = {"machine": machine_name(), "rounds": rows, "medians": medians}
    print(json.dumps(medians, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"first_batch_{args.tag}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
