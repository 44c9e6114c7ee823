"""What checking every read costs, and whether the loader kept its speed, measured in one run.

1. The loader (loader_bench.py's policy windows, 2 workers) on one WebDataset and one Zarr store,
   with checksum verification on, for this tree and for an earlier one (`--baseline-tree`, e.g.
   an export of the commit before the reliability work), in rounds of fresh interpreters whose
   order alternates, so both see the same machine state. The ratio is this tree's median over the
   baseline's.
2. The same loader in one process (no workers): CPU milliseconds per sample, for both trees, in
   alternating rounds; far less noisy than wall-clock throughput on a shared VM.
3. `open_dataset(verify=True)` against `verify=False` for `frames_at`, `values_at` and
   `audio_between` calls on the same stores (this tree only; the two alternate call by call), and
   the loader with and without it.

Results go to benchmarks/results/verify_cost.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from machine import machine_name

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# loader_bench.py's loader, built in a fresh interpreter from `store`, `workers` and `verify`.
BUILD_LOADER = """
import json, time
import mmdata
spec = mmdata.Windows(anchor_fps=10, streams={{
    "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
    "state": mmdata.Values(offsets=[-0.1, 0.0]),
    "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
    "audio": mmdata.Audio(window=(-1.0, 0.0), sample_rate=16000),
}})
tokens = {{"cam_high": 256, "action": 1, "state": 1, "audio": 50}}
loader = mmdata.DataLoader(
    {store!r}, spec, tokens_per=tokens, batch_tokens=16384, num_workers={workers}, verify={verify}
)
"""

LOADER = (
    BUILD_LOADER
    + """
try:
    from mmdata.measure.runner import run_for_seconds
except ImportError:  # trees before the issue-28 package names
    from mmdata.bench.runner import run_for_seconds
figures = run_for_seconds(loader, {seconds}, lambda b: (len(b["sample_index"]), 2 * len(b["sample_index"])), warmup=4)
print("RESULT " + json.dumps(figures))
"""
)

# The same loader in one process: CPU time per sample, which the machine's noise barely moves.
LOADER_CPU = (
    BUILD_LOADER
    + """
batches = iter(loader)
for _ in range(3):
    next(batches)
samples, started = 0, time.process_time()
for _, batch in zip(range(60), batches):
    samples += len(batch["sample_index"])
print("RESULT " + json.dumps({{"cpu_ms_per_sample": (time.process_time() - started) / samples * 1000}}))
"""
)

ACCESS = """
import json, time
import numpy as np
import mmdata
datasets = {{verify: mmdata.open_dataset({store!r}, verify=verify) for verify in (True, False)}}
rng = np.random.default_rng(0)
durations = datasets[True].table.column("duration").to_pylist()
picks = [(int(e), float(t) * durations[int(e)]) for e, t in zip(rng.integers(0, len(durations), 400), rng.random(400))]
calls = {{
    "frames_at": lambda d, e, t: d.frames_at(e, "cam_high", [t]),
    "values_at": lambda d, e, t: d.values_at(e, "state", [t]),
    "audio_between": lambda d, e, t: d.audio_between(e, "audio", t, t + 1),
}}
result = {{}}
for name, call in calls.items():
    spent = {{True: 0.0, False: 0.0}}
    for number, (e, t) in enumerate(picks):
        for verify in ((True, False) if number % 2 else (False, True)):  # alternate which goes first
            started = time.perf_counter()
            call(datasets[verify], e, t)
            spent[verify] += time.perf_counter() - started
    for verify, seconds in spent.items():
        result[f"{{name}}_{{'verified' if verify else 'unverified'}}_ms"] = round(seconds / len(picks) * 1000, 4)
print("RESULT " + json.dumps(result))
"""


def paired_trees(description: str | None) -> tuple[argparse.Namespace, dict[str, Path]]:
    """The options of a benchmark that runs this tree against `--baseline-tree` in turns (`--rounds` rounds of
    `--seconds` each), and the two trees by name."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    return args, {"this": HERE.parent, "baseline": args.baseline_tree.resolve()}


def run(tree: Path, code: str) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environment, cwd=tree
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode or not lines:
        raise RuntimeError(f"run in {tree} failed:\n{result.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, help="a source tree of the earlier mmdata (with mmdata/ in it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--episodes", type=int, default=8)
    args = parser.parse_args()
    tree = HERE.parent
    record: dict = {"benchmark": "verify_cost_bench", "machine": machine_name(), "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="mmdata-verify-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, SynthSpec(episodes=args.episodes, min_seconds=5.0, max_seconds=30.0))
        stores = {}
        for layout in ("wds", "zarr"):
            stores[layout] = str(Path(folder) / f"store.{layout}")
            convert(discover_raw_episodes(raw), stores[layout], ConvertOptions(layout=layout, progress=False))
        trees = {"this": tree} | ({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})
        loader: dict = {layout: {name: [] for name in trees} for layout in stores}
        unverified: dict = {layout: [] for layout in stores}
        for round_number in range(args.rounds):
            for layout, store in stores.items():
                runs = [(name, path, True) for name, path in trees.items()] + [("unverified", tree, False)]
                for name, path, verify in runs if round_number % 2 == 0 else runs[::-1]:
                    code = LOADER.format(store=store, workers=2, verify=verify, seconds=args.seconds)
                    figures = run(path, code)
                    (loader[layout][name] if verify else unverified[layout]).append(figures["samples_per_s"])
                print(f"round {round_number}: {layout} {[(n, v[-1]) for n, v in loader[layout].items()]}", flush=True)
        record["loader_samples_per_s"] = {
            layout: {name: {"runs": runs, "median": statistics.median(runs)} for name, runs in by_tree.items()}
            | {"this_unverified": {"runs": unverified[layout], "median": statistics.median(unverified[layout])}}
            for layout, by_tree in loader.items()
        }
        record["ratios"] = {
            layout: {
                "this_over_baseline": round(figures["this"]["median"] / figures["baseline"]["median"], 4)
                if "baseline" in figures
                else None,
                "verified_over_unverified": round(figures["this"]["median"] / figures["this_unverified"]["median"], 4),
            }
            for layout, figures in record["loader_samples_per_s"].items()
        }
        cpu: dict = {layout: {name: [] for name in trees} for layout in stores}
        for round_number in range(args.rounds):
            for layout, store in stores.items():
                for name, path in trees.items() if round_number % 2 == 0 else reversed(trees.items()):
                    code = LOADER_CPU.format(store=store, workers=0, verify=True)
                    cpu[layout][name].append(run(path, code)["cpu_ms_per_sample"])
        record["loader_cpu_ms_per_sample_one_process"] = {
            layout: {
                name: {"runs": [round(v, 3) for v in runs], "median": round(statistics.median(runs), 3)}
                for name, runs in by_tree.items()
            }
            for layout, by_tree in cpu.items()
        }
        record["access_ms"] = {layout: run(tree, ACCESS.format(store=store)) for layout, store in stores.items()}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "verify_cost.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["ratios"], indent=1))
    print(json.dumps(record["access_ms"], indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
