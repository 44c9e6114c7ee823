"""What the issue-28 redesign (one explicit loading chain, grouped options, packages cut along the data
flow) cost the loader, measured against the tree before it in the same run.

Both trees read the same stores (the store format did not change), each configuration in a fresh
interpreter, the trees taking turns in each round (first one, then the other, then the other way
round); the ratios are this tree's median over the baseline's.

- `loader`: loader_bench.py's workload (policy windows with 1 s of audio, packed at 16,384 tokens,
  2 workers) on synthetic recordings converted with the defaults.
- `windows_default` / `windows_access`: lerobot_bench.py's mmdata workload (two cameras, `cam_high`
  at t-0.1 s and t, `cam_wrist` at t, state at t-0.1 s and t, 16 actions at 30 Hz, every frame an
  anchor, batch 8, shuffled, 2 workers) on a store converted with the defaults (gop 8) and with
  `--access windows`. The recordings are synthetic (two cameras 224x224 and 208x160 at 30 fps);
  LeRobot's own loader is not run here (its benchmark needs an 8 GB environment).
- `lerobot_loader`: the same windows through `mmdata.lerobot.LeRobotLoader` (float CHW frames,
  LeRobot's keys) on the `--access windows` store.

usage: python benchmarks/redesign_cost_bench.py --baseline-tree DIR [--rounds 4] [--seconds 10]
(DIR: `git worktree add DIR e7c12e3`, the commit before the redesign). Writes
benchmarks/results/redesign_cost.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_name
from verify_cost_bench import BUILD_LOADER, paired_trees, run

from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent

MEASURE = """
import sys
sys.path.insert(0, {bench!r})
from process_time import measure
print("RESULT " + json.dumps(measure(lambda: iter(loader), lambda b: len(b["sample_index"]), {seconds})))
"""
# Both trees take the loader's ungrouped keywords (this one with a DeprecationWarning, on stderr).
LOADER = BUILD_LOADER + MEASURE

# lerobot_bench.py's window on the synthetic recordings' stream names; the loader is built after it.
POLICY_WINDOWS = """
import json
import mmdata
spec = mmdata.Windows(anchor_fps=30, streams={{
    "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
    "cam_wrist": mmdata.Frames(offsets=[0.0]),
    "state": mmdata.Values(offsets=[-0.1, 0.0]),
    "action": mmdata.Values(offsets=[i / 30 for i in range(16)]),
}})
"""
WINDOWS = (
    POLICY_WINDOWS
    + """
loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers=2, shuffle="global")
"""
    + MEASURE
)

LEROBOT_LOADER = """
import json, sys
sys.path.insert(0, {bench!r})
from process_time import measure
from mmdata.lerobot import LeRobotLoader
delta_timestamps = {{"cam_high": [-0.1, 0.0], "state": [-0.1, 0.0], "action": [i / 30 for i in range(16)]}}
loader = LeRobotLoader({store!r}, delta_timestamps, batch_size=8, num_workers=2, shuffle="global")
print("RESULT " + json.dumps(measure(lambda: iter(loader), lambda b: len(b["index"]), {seconds})))
"""


def convert(source: Path, destination: Path, *options: str) -> None:
    command = [sys.executable, "-m", "mmdata", "convert", str(source), str(destination), "--quiet", *options]
    subprocess.run(command, check=True, cwd=HERE.parent)


def main() -> None:
    args, trees = paired_trees(__doc__)
    with tempfile.TemporaryDirectory(prefix="mmdata-redesign-bench-") as folder:
        root = Path(folder)
        write_synthetic_dataset(root / "raw", SynthSpec(episodes=8, min_seconds=5.0, max_seconds=30.0))
        write_synthetic_dataset(root / "raw30", SynthSpec(episodes=24, min_seconds=4.4, max_seconds=6.0, seed=1))
        convert(root / "raw", root / "loader.wds")
        convert(root / "raw30", root / "default.wds")
        convert(root / "raw30", root / "windows.wds", "--access", "windows")
        configurations = {
            "loader": (LOADER, root / "loader.wds"),
            "windows_default": (WINDOWS, root / "default.wds"),
            "windows_access": (WINDOWS, root / "windows.wds"),
            "lerobot_loader": (LEROBOT_LOADER, root / "windows.wds"),
        }
        figures: dict = {tree: {name: [] for name in configurations} for tree in trees}
        cpu: dict = {tree: {name: [] for name in configurations} for tree in trees}
        for number in range(args.rounds):
            order = list(trees.items()) if number % 2 == 0 else list(trees.items())[::-1]
            for name, (template, store) in configurations.items():
                code = template.format(bench=str(HERE), store=str(store), seconds=args.seconds, workers=2, verify=True)
                for tree_name, tree in order:
                    result = run(tree, code)
                    figures[tree_name][name].append(result["samples_per_s"])
                    cpu[tree_name][name].append(result["samples_per_cpu_s"])
            latest = {tree: {name: round(values[-1], 1) for name, values in by.items()} for tree, by in figures.items()}
            print(f"round {number}: {json.dumps(latest)}", flush=True)
    medians = {tree: {name: statistics.median(values) for name, values in by.items()} for tree, by in figures.items()}
    cpu_medians = {tree: {name: statistics.median(values) for name, values in by.items()} for tree, by in cpu.items()}

    def ratios(of: dict) -> dict:
        return {name: round(of["this"][name] / of["baseline"][name], 4) for name in of["this"]}

    record = {
        "benchmark": "redesign_cost_bench",
        "machine": machine_name(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "samples_per_s": figures,
        "samples_per_cpu_s": cpu,
        "medians": medians,
        "cpu_medians": cpu_medians,
        "this_over_baseline": ratios(medians),
        "this_over_baseline_per_cpu_s": ratios(cpu_medians),
    }
    path = HERE / "results" / "redesign_cost.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"samples/s": ratios(medians), "per CPU-s": ratios(cpu_medians)}, indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
