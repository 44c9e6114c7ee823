"""What the one planner (issue 56) costs the loader in its default order, measured against the tree before it in
the same run.

Policy windows at 224x224 (lerobot_bench.py's: `cam_high` at t-0.1 s and t, `cam_wrist` at t, state at t-0.1 s and
t, 16 actions at 30 Hz, every frame an anchor), batch 8, the loader's default order ("auto": "blocks" in this tree,
"segments" in the tree before), with 0 and 2 workers, on synthetic recordings converted with the defaults. Each
configuration runs in a fresh interpreter, the trees taking turns in each round (first one, then the other, then
the other way round); the figures are samples/s and samples per CPU-second of the whole process tree (the loader's
CPU per sample is its inverse) over whole epochs after a first one (`process_time.measure_epochs`: a window that
ends mid-epoch counts the frame cache's decoding ahead without the samples it serves, which favours whichever
order decodes later), and the ratios are this tree's median over the baseline's. The decode waste of each run
(frames decoded per frame delivered) is recorded too.

usage: python benchmarks/one_planner_cost_bench.py --baseline-tree DIR [--rounds 4] [--seconds 10]
(DIR: `git worktree add DIR 2ceb2c8`, the commit before the one planner). Writes
benchmarks/results/one_planner_cost.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_name
from verify_cost_bench import paired_trees, run

from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent

# Both trees take these keywords: `batch_size` and `num_workers` (the one dialect here, accepted by the tree before).
WINDOWS = """
import json, sys
sys.path.insert(0, {bench!r})
import mmdata
from process_time import measure_epochs
spec = mmdata.Windows(anchor_fps=30, streams={{
    "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
    "cam_wrist": mmdata.Frames(offsets=[0.0]),
    "state": mmdata.Values(offsets=[-0.1, 0.0]),
    "action": mmdata.Values(offsets=[i / 30 for i in range(16)]),
}})
loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers={workers})
figures = measure_epochs(lambda: iter(loader), lambda b: len(b["sample_index"]), {seconds})
figures["decode_waste"] = loader.stats()["decode_waste"]
figures["order"] = loader.shuffle
print("RESULT " + json.dumps(figures))
"""


def main() -> None:
    args, trees = paired_trees(__doc__)
    names = ("workers_0", "workers_2")
    samples: dict = {tree: {name: [] for name in names} for tree in trees}
    per_cpu: dict = {tree: {name: [] for name in names} for tree in trees}
    waste: dict = {tree: {name: [] for name in names} for tree in trees}
    orders: dict = {tree: None for tree in trees}
    with tempfile.TemporaryDirectory(prefix="mmdata-one-planner-bench-") as folder:
        root = Path(folder)
        write_synthetic_dataset(root / "raw", SynthSpec(episodes=24, min_seconds=4.4, max_seconds=6.0, seed=1))
        store = root / "default.wds"
        command = [sys.executable, "-m", "mmdata", "convert", str(root / "raw"), str(store), "--quiet"]
        subprocess.run(command, check=True, cwd=HERE.parent)
        for number in range(args.rounds):
            order = list(trees.items()) if number % 2 == 0 else list(trees.items())[::-1]
            for name in names:
                workers = int(name.rsplit("_", 1)[1])
                code = WINDOWS.format(bench=str(HERE), store=str(store), seconds=args.seconds, workers=workers)
                for tree_name, tree in order:
                    result = run(tree, code)
                    samples[tree_name][name].append(result["samples_per_s"])
                    per_cpu[tree_name][name].append(result["samples_per_cpu_s"])
                    waste[tree_name][name].append(result["decode_waste"])
                    orders[tree_name] = result["order"]
            latest = {tree: {name: round(values[-1], 1) for name, values in by.items()} for tree, by in samples.items()}
            print(f"round {number}: samples/s {json.dumps(latest)}", flush=True)

    def medians(of: dict) -> dict:
        return {tree: {name: statistics.median(values) for name, values in by.items()} for tree, by in of.items()}

    def ratios(of: dict) -> dict:
        middle = medians(of)
        return {name: round(middle["this"][name] / middle["baseline"][name], 4) for name in names}

    record = {
        "benchmark": "one_planner_cost_bench",
        "machine": machine_name(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "orders": orders,
        "samples_per_s": samples,
        "samples_per_cpu_s": per_cpu,
        "decode_waste": waste,
        "medians": {"samples_per_s": medians(samples), "samples_per_cpu_s": medians(per_cpu), "waste": medians(waste)},
        "this_over_baseline": {"samples_per_s": ratios(samples), "samples_per_cpu_s": ratios(per_cpu)},
    }
    path = HERE / "results" / "one_planner_cost.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["this_over_baseline"], indent=1), json.dumps(record["medians"]["waste"]))
    print(f"written {path}")


if __name__ == "__main__":
    main()
