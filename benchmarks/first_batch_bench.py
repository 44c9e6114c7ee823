"""Time to the first batch: from `DataLoader(...)` to the first batch in hand, in a fresh interpreter, the imports
timed apart, in one run.

The store is `autotune_bench.py`'s (24 episodes of 6 s, two 224x224 cameras: the held-out LeRobot-shaped store) and
the window LeRobot's policy windows (cam_high at t-0.1 s and t, cam_wrist at t, state at t-0.1 s and t, 16
actions), batch 8, shuffled. Each configuration (`--workers`) runs `--rounds` times, the order rotating; medians of
the import time, the construction, and the first batch after it, with the modules' bytecode written once
beforehand, as an installed package has it.

With `--lerobot-venv` (lerobot_bench.py's environment, made there) the store is instead one LeRobot's own writer
wrote (24 episodes of about 6 s, two 224x224 cameras; `lerobot_side.py write`), converted with `mmdata convert
--from lerobot` and its defaults, and LeRobot's loader (LeRobotDataset + torch DataLoader: torchcodec and pyav, 0
and 2 workers) is timed the same way in the same rounds, from `LeRobotDataset(...)` to its first batch; the report
sets mmdata's first batch against LeRobot's best. Results: benchmarks/results/first_batch_<tag>.json with the
machine named.
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
from lerobot_bench import ensure_venv, lerobot_run
from machine import machine_name

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import torch
import mmdata
imported = time.perf_counter()
store, workers, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
keywords = {} if workers == "default" else {"num_workers": workers if workers == "auto" else int(workers)}
spec = mmdata.Windows(anchor_fps=30, streams={
    names[0]: mmdata.Frames(offsets=[-0.1, 0.0]), names[1]: mmdata.Frames(offsets=[0.0]),
    names[2]: mmdata.Values(offsets=[-0.1, 0.0]), names[3]: mmdata.Values(offsets=[i / 30 for i in range(16)])})
building = time.perf_counter()
loader = mmdata.DataLoader(store, spec, batch_size=8, shuffle=True, **keywords)
built = time.perf_counter()
batch = next(iter(loader))
first = time.perf_counter()
print(json.dumps({"import_s": imported - started, "construct_s": built - building, "iterate_s": first - built,
                  "to_first_batch_s": first - building}))
loader.close()
"""


SYNTHETIC_NAMES = ["cam_high", "cam_wrist", "state", "action"]
LEROBOT_NAMES = ["observation.images.cam_high", "observation.images.cam_wrist", "observation.state", "action"]
LEROBOT_LOADERS = [("torchcodec", 0), ("torchcodec", 2), ("pyav", 0), ("pyav", 2)]


def lerobot_store(python: Path, workdir: Path) -> tuple[Path, Path]:
    """A LeRobot dataset its own writer wrote (made once in `workdir`) and its conversion with mmdata's defaults."""
    source, store = workdir / "first-batch-lerobot", workdir / "first-batch-store.wds"
    if not (source / "meta" / "info.json").exists():
        print(f"writing {source} with lerobot's writer", flush=True)
        lerobot_run(python, "write", str(source), "--episodes", "24", "--seconds", "6")
    if not (store / "dataset.json").exists():
        command = [sys.executable, "-m", "mmdata", "convert", str(source), str(store), "--from", "lerobot"]
        subprocess.run([*command, "--quiet", "--overwrite"], check=True)
    return source, store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="default,0,2,auto", help="mmdata's num_workers ('default': not given)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--store", type=Path, help="a store made by autotune_bench.py (default: made afresh)")
    parser.add_argument("--lerobot-venv", type=Path, help="lerobot_bench.py's environment: LeRobot's data and loader")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-data")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    # as an installed package runs: its modules' bytecode written once (a discarded run) and read from then on
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as folder:
        configurations: dict[str, list[str]] = {}
        if args.lerobot_venv:
            python = ensure_venv(args.lerobot_venv, "0.4.4")
            args.workdir.mkdir(parents=True, exist_ok=True)
            source, store = lerobot_store(python, args.workdir)
            names = LEROBOT_NAMES
            for backend, workers in LEROBOT_LOADERS:
                side = [str(python), str(HERE / "lerobot_side.py"), "first", str(source), "--backend", backend]
                configurations[f"lerobot {backend} workers={workers}"] = [*side, "--workers", str(workers)]
        else:
            store = args.store if args.store and args.store.exists() else make_store(Path(folder))
            names = SYNTHETIC_NAMES
        for kind in args.workers.split(","):
            configurations[f"mmdata num_workers={kind}"] = [
                sys.executable,
                "-c",
                CHILD,
                str(store),
                kind,
                json.dumps(names),
            ]
        first_mmdata = next(command for name, command in configurations.items() if name.startswith("mmdata"))
        subprocess.run(first_mmdata, capture_output=True, env=environment, check=True)
        rows: dict[str, list[dict]] = {name: [] for name in configurations}
        names_in_order = list(configurations)
        for round_ in range(args.rounds):
            shift = round_ % len(names_in_order)
            for name in names_in_order[shift:] + names_in_order[:shift]:
                try:
                    row = _run(configurations[name], name, environment)
                except RuntimeError as exc:  # (a failed configuration is a row; the others still run)
                    rows[name].append({"error": str(exc)[-600:]})
                    print(f"round {round_}: {name:34s} failed: {str(exc)[-300:]}", flush=True)
                    continue
                rows[name].append(row)
                print(f"round {round_}: {name:34s} " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    good = {name: [row for row in runs if "error" not in row] for name, runs in rows.items()}
    medians = {
        name: {key: round(statistics.median(row[key] for row in runs), 3) for key in runs[0]}
        for name, runs in good.items()
        if runs
    }
    results = {"machine": machine_name(), "store": str(store), "rounds": rows, "medians": medians}
    lerobot = {name: row for name, row in medians.items() if name.startswith("lerobot")}
    if lerobot:
        best_name, best = min(lerobot.items(), key=lambda item: item[1]["to_first_batch_s"])
        results["lerobot_best"] = {"loader": best_name, "to_first_batch_s": best["to_first_batch_s"]}
        results["mmdata_over_lerobot_best"] = {
            name: round(row["to_first_batch_s"] / best["to_first_batch_s"], 3)
            for name, row in medians.items()
            if name.startswith("mmdata")
        }
    print(json.dumps({key: results[key] for key in results if key not in ("rounds",)}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"first_batch_{args.tag}.json").write_text(json.dumps(results, indent=1))


def _run(command: list[str], name: str, environment: dict) -> dict:
    environment = {**environment, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
