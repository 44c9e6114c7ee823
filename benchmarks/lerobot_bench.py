"""mmdata against LeRobot's own loader on a dataset LeRobot itself wrote, measured in one run.

1. A LeRobot v3.0 dataset is written by lerobot's own writer (24 episodes, 2 cameras 224x224 at
   30 fps, ~6 s each, AV1 as LeRobot writes it), in a throwaway virtual environment holding lerobot
   and its pinned torch (`--venv`; made on first use with `pip install lerobot==VERSION torchcodec`).
   torchcodec needs FFmpeg's shared libraries (Debian: `apt-get install libavutil57 libavcodec59
   libavformat59 libavdevice59 libavfilter8 libswscale6 libswresample4`); without them its rows fail
   and are reported, the pyav rows still run.
2. It is converted with `mmdata convert --from lerobot` (the default: gop 8 tuned for decoding) into a
   WebDataset store, and with `--access windows` (every frame a key frame) into a WebDataset and a Zarr store.
3. Policy windows (cam_high at t-0.1 s and t, cam_wrist at t, state at t-0.1 s and t, 16 actions at
   30 Hz; every frame an anchor), batch 8, shuffled, are drawn for `--seconds` by each loader in a
   fresh interpreter, in `--rounds` rounds whose order rotates: LeRobotDataset + torch DataLoader
   (torchcodec and pyav, 0 and 2 workers), mmdata.DataLoader in its default order (the "blocks" order
   with the frame cache) on each store, and on the default store in the global and locality orders (what
   an order costs in mixing: distinct episodes per batch), and mmdata.lerobot.LeRobotLoader (LeRobot's
   batches: float CHW frames, its keys and index fields; 2 workers), reported against the native loader
   on the same store.
   With `--baseline-tree` (an export of an earlier mmdata) that tree also runs, on stores it
   converted with its own defaults: the before/after of the same run.
4. 200 random samples are checked equal on both sides: each frame's identity by its pixel stripe,
   state and action as float32, the action padding.

Samples/s and samples per CPU-second (process and workers) are reported per configuration
(medians over rounds), with the ratio of each mmdata configuration with 2 workers to the best
LeRobot configuration, and each loader's stage breakdown. Results go to
benchmarks/results/lerobot_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

import numpy as np
from machine import machine_name
from verify_cost_bench import run as run_in_tree

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CAMERAS = ("observation.images.cam_high", "observation.images.cam_wrist")

# After a `loader` is built: samples/s and per CPU-second for `seconds`, the decode waste, the frame cache's peak
# and the distinct episodes per batch (what an order costs in mixing); `stats.get`: a baseline tree has fewer figures.
MEASURE_WITH_MIXING = """
import json, sys
sys.path.insert(0, {bench!r})
from process_time import measure
episodes = []

def count(batch):
    episodes.append(len(set(batch["episode_index"].tolist())))
    return len(batch["sample_index"])

figures = measure(lambda: iter(loader), count, {seconds})
stats = loader.stats()
figures["stages"] = stats.get("worker_stage_seconds")
figures["decode_waste"] = stats.get("decode_waste")
figures["frame_cache_peak_bytes"] = stats.get("frame_cache_peak_bytes")
figures["episodes_per_batch"] = sum(episodes) / max(1, len(episodes))
print("RESULT " + json.dumps(figures))
"""

# Written with the loader's ungrouped keywords, which a baseline tree takes too. In the "blocks" order (the default)
# the decoded-frame cache, on by default, serves a segment's samples from one decode.
# The policy windows on LeRobot's feature names, as code for a run in a fresh interpreter (`mmdata` imported, then
# formatted with the run's fields: hence the doubled braces).
POLICY_SPEC = """
spec = mmdata.Windows(anchor_fps=30, streams={{
    "observation.images.cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
    "observation.images.cam_wrist": mmdata.Frames(offsets=[0.0]),
    "observation.state": mmdata.Values(offsets=[-0.1, 0.0]),
    "action": mmdata.Values(offsets=[i / 30 for i in range(16)]),
}})
"""
MMDATA_LOADER = (
    """
import mmdata
"""
    + POLICY_SPEC
    + """loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers={workers}, shuffle={shuffle!r})
"""
    + MEASURE_WITH_MIXING
)

COMPATIBLE_LOADER = """
import json, sys
sys.path.insert(0, {bench!r})
from process_time import measure
from mmdata.lerobot import LeRobotLoader
delta_timestamps = {{
    "observation.images.cam_high": [-0.1, 0.0],
    "observation.state": [-0.1, 0.0],
    "action": [i / 30 for i in range(16)],
}}
loader = LeRobotLoader({store!r}, delta_timestamps, batch_size=8, num_workers={workers}, shuffle={shuffle!r})
figures = measure(lambda: iter(loader), lambda batch: len(batch["index"]), {seconds})
stats = loader.stats()
figures["stages"] = stats.get("worker_stage_seconds")
figures["decode_waste"] = stats.get("decode_waste")
print("RESULT " + json.dumps(figures))
"""


def ensure_venv(path: Path, version: str) -> Path:
    """The interpreter of a virtual environment with lerobot (and torchcodec) installed, made if missing."""
    python = path / "bin" / "python"
    probe = [str(python), "-c", "import lerobot.datasets.lerobot_dataset"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"making {path} with lerobot {version} (several GB, a few minutes)", flush=True)
    venv.create(path, with_pip=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"lerobot=={version}", "torchcodec"], check=True)
    return python


def run_rounds(configurations: dict[str, Callable[[], dict]], rounds: int, label: str = "") -> dict[str, list[dict]]:
    """Each configuration's figures per round, the order rotating from round to round (a failure is a row)."""
    runs: dict[str, list[dict]] = {name: [] for name in configurations}
    names = list(configurations)
    for round_number in range(rounds):
        shift = round_number * len(names) // rounds
        for name in names[shift:] + names[:shift]:
            try:
                runs[name].append(configurations[name]())
            except RuntimeError as exc:
                runs[name].append({"error": str(exc)[-600:]})
            figures = runs[name][-1]
            print(
                f"{label}round {round_number} {name:28s} {figures.get('samples_per_s', 'failed')} samples/s"
                f" {figures.get('samples_per_cpu_s', '')} per CPU-s",
                flush=True,
            )
    return runs


def medians(runs: dict[str, list[dict]], figures: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Per configuration: the medians of its rounds' samples/s and per CPU-second, each round's samples/s, and the
    last good round's other `figures` (all of them when None); a configuration without a good round, its error."""
    summary = {}
    for name, results in runs.items():
        good = [r for r in results if "samples_per_s" in r]
        if not good:
            summary[name] = {"error": results[-1].get("error", "")}
            continue
        last = good[-1]
        kept = (
            {k: v for k, v in last.items() if k not in ("samples_per_s", "samples_per_cpu_s")}
            if figures is None
            else {k: last.get(k) for k in figures}
        )
        summary[name] = {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in good),
            "samples_per_cpu_s": statistics.median(r["samples_per_cpu_s"] for r in good),
            "runs": [r["samples_per_s"] for r in good],
            **kept,
        }
    return summary


def run_json(command: list[str], environment: dict) -> dict:
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed:\n{result.stderr[-3000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :] if lines else result.stdout)


def lerobot_run(python: Path, *arguments: str) -> dict:
    environment = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}
    return run_json([str(python), str(HERE / "lerobot_side.py"), *arguments], environment)


def mmdata_run(
    tree: Path, store: Path, workers: int, seconds: float, code: str = MMDATA_LOADER, shuffle: str = "global"
) -> dict:
    return run_in_tree(
        tree, code.format(bench=str(HERE), store=str(store), workers=workers, seconds=seconds, shuffle=shuffle)
    )


def convert(tree: Path, source: Path, destination: Path, layout: str, *options: str) -> None:
    if (destination / "dataset.json").exists():
        return
    command = [sys.executable, "-m", "mmdata", "convert", str(source), str(destination), "--from", "lerobot"]
    command += ["--to", layout, "--quiet", "--overwrite", *options]
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_equal(python: Path, source: Path, stores: dict[str, Path], count: int) -> dict:
    """Compare `count` random LeRobot samples with mmdata's frames and values at the same times."""
    import mmdata
    from mmdata.synthetic import read_index_stripe

    reference = lerobot_run(python, "sample", str(source), "--count", str(count))["samples"]
    report = {}
    for layout, store in stores.items():
        dataset = mmdata.open_dataset(str(store))
        row_of = {dataset.metadata_of(dataset.manifest.row(r))["lerobot_episode_index"]: r for r in range(len(dataset))}
        mismatches = []
        for sample in reference:
            row, t = row_of[sample["episode_index"]], sample["frame_index"] / 30
            for camera, offsets in zip(CAMERAS, ([-0.1, 0.0], [0.0])):
                frames = dataset.frames_at(row, camera, [t + o for o in offsets]).values
                if [read_index_stripe(f) for f in frames] != sample[camera]:
                    mismatches.append(f"{camera} at episode {sample['episode_index']} frame {sample['frame_index']}")
            state = dataset.values_at(row, "observation.state", [t - 0.1, t]).values
            action = dataset.values_at(row, "action", [t + i / 30 for i in range(16)])
            same = np.array_equal(state.astype(np.float32), np.asarray(sample["state"], np.float32))
            same &= np.array_equal(action.values.astype(np.float32), np.asarray(sample["action"], np.float32))
            same &= action.is_pad.tolist() == sample["action_is_pad"]
            if not same:
                mismatches.append(f"state/action at episode {sample['episode_index']} frame {sample['frame_index']}")
        report[layout] = {"samples": len(reference), "mismatches": len(mismatches), "first": mismatches[:5]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-venv")
    parser.add_argument("--lerobot-version", default="0.4.4", help="the newest lerobot for Python 3.11")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-data")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--episode-seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per configuration and round")
    parser.add_argument("--check-samples", type=int, default=200)
    parser.add_argument("--baseline-tree", type=Path, help="a source tree of an earlier mmdata, measured alongside")
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    parser.add_argument(
        "--only",
        help="measure only mmdata configurations whose names hold one of these (comma-separated; LeRobot's always)",
    )
    args = parser.parse_args()

    python = ensure_venv(args.venv, args.lerobot_version)
    source = args.workdir / f"lerobot-{args.episodes}x{args.episode_seconds:g}s"
    if not (source / "meta" / "info.json").exists():
        print(f"writing {source} with lerobot's writer", flush=True)
        lerobot_run(
            python, "write", str(source), "--episodes", str(args.episodes), "--seconds", str(args.episode_seconds)
        )
    tree = HERE.parent
    stores = {layout: args.workdir / f"store-windows.{layout}" for layout in ("wds", "zarr")}
    for layout, store in stores.items():
        convert(tree, source, store, layout, "--access", "windows")
    configurations: dict[str, object] = {}
    for backend in ("torchcodec", "pyav"):
        for workers in (0, 2):
            configurations[f"lerobot {backend} w{workers}"] = lambda b=backend, w=workers: lerobot_run(
                python, "load", str(source), "--backend", b, "--workers", str(w), "--seconds", str(args.seconds)
            )
    # the store `mmdata convert` makes by default (gop 8 tuned for decoding), in the default order ("auto": the
    # "blocks" order with the frame cache), and in the other orders, for their mixing
    default_store = args.workdir / "store-default.wds"
    convert(tree, source, default_store, "wds")
    for workers in (0, 2):
        configurations[f"mmdata default store w{workers}"] = lambda w=workers: mmdata_run(
            tree, default_store, w, args.seconds, shuffle="auto"
        )
    for order in ("global", "locality"):
        configurations[f"mmdata default store, {order} order w2"] = lambda o=order: mmdata_run(
            tree, default_store, 2, args.seconds, shuffle=o
        )
    # LeRobot's own AV1 packets kept as they are (--video-codec copy: no re-encoding), in the default order
    copy_store = args.workdir / "store-copy.wds"
    convert(tree, source, copy_store, "wds", "--video-codec", "copy")
    for workers in (0, 2):
        configurations[f"mmdata copy store w{workers}"] = lambda w=workers: mmdata_run(
            tree, copy_store, w, args.seconds, shuffle="auto"
        )
    # LeRobot's batches (float CHW frames, LeRobot's keys and index fields) from the same store
    configurations["mmdata lerobot-compatible default store w2"] = lambda: mmdata_run(
        tree, default_store, 2, args.seconds, COMPATIBLE_LOADER, "auto"
    )
    # every frame a key frame (--access windows), in the default order
    for layout, store in stores.items():
        for workers in (0, 2) if layout == "wds" else (2,):
            configurations[f"mmdata windows store {layout} w{workers}"] = lambda s=store, w=workers: mmdata_run(
                tree, s, w, args.seconds, shuffle="auto"
            )
    configurations["mmdata lerobot-compatible windows store wds w2"] = lambda: mmdata_run(
        tree, stores["wds"], 2, args.seconds, COMPATIBLE_LOADER, "auto"
    )
    if args.baseline_tree:
        for layout in ("wds", "zarr"):
            old_store = args.workdir / f"store-baseline.{layout}"
            convert(args.baseline_tree.resolve(), source, old_store, layout)
            configurations[f"baseline mmdata {layout} w2"] = lambda s=old_store: mmdata_run(
                args.baseline_tree.resolve(), s, 2, args.seconds
            )
    if args.only:
        wanted = [part.strip() for part in args.only.split(",")]
        configurations = {
            name: run
            for name, run in configurations.items()
            if name.startswith("lerobot") or any(w in name for w in wanted)
        }
    runs = run_rounds(configurations, args.rounds)
    summary = medians(runs, ("stages", "decode_waste", "episodes_per_batch", "frame_cache_peak_bytes"))
    lerobot = {n: s for n, s in summary.items() if n.startswith("lerobot") and "samples_per_s" in s}
    best_rate = max(lerobot.items(), key=lambda item: item[1]["samples_per_s"])
    best_cpu = max(lerobot.items(), key=lambda item: item[1]["samples_per_cpu_s"])
    ratios = {}
    for name, figures in summary.items():
        if "mmdata" in name and name.endswith("w2") and "samples_per_s" in figures:
            ratios[name] = {
                "vs_best_lerobot_samples_per_s": round(figures["samples_per_s"] / best_rate[1]["samples_per_s"], 2),
                "vs_best_lerobot_per_cpu_s": round(figures["samples_per_cpu_s"] / best_cpu[1]["samples_per_cpu_s"], 2),
            }
    for store_name in ("default store", "windows store wds", "copy store"):
        native = summary.get(f"mmdata {store_name} w2", {})
        compatible = summary.get(f"mmdata lerobot-compatible {store_name} w2", {})
        if "samples_per_s" in native and "samples_per_s" in compatible:
            ratios[f"lerobot-compatible vs native mmdata, {store_name}"] = round(
                compatible["samples_per_s"] / native["samples_per_s"], 3
            )
    equality = check_equal(
        python, source, {**stores, "default_wds": default_store, "copy_wds": copy_store}, args.check_samples
    )
    for name, figures in summary.items():
        print(
            f"{name:28s} {figures.get('samples_per_s', 'failed')} samples/s, {figures.get('samples_per_cpu_s', '')}"
            " per CPU-s"
        )
    print(f"best LeRobot: {best_rate[0]} (samples/s), {best_cpu[0]} (per CPU-s)")
    for name, ratio in ratios.items():
        if isinstance(ratio, float):
            print(f"{name}: {ratio}x samples/s")
            continue
        print(
            f"{name}: {ratio['vs_best_lerobot_samples_per_s']}x samples/s, {ratio['vs_best_lerobot_per_cpu_s']}x"
            " per CPU-second"
        )
    print(f"equality on {args.check_samples} samples: {equality}")
    sizes = {
        name: folder_bytes(path)
        for name, path in {"lerobot": source, "default_wds": default_store, "copy_wds": copy_store, **stores}.items()
    }
    print(f"store sizes against LeRobot's: { {n: round(b / sizes['lerobot'], 2) for n, b in sizes.items()} }")
    record = {
        "benchmark": "lerobot_bench",
        "store_bytes": sizes,
        "machine": machine_name(),
        "lerobot_version": args.lerobot_version,
        "dataset": {"episodes": args.episodes, "episode_seconds": args.episode_seconds, "cameras": "2 x 224x224 AV1"},
        "convert_options": {
            "default": "--from lerobot",
            "windows": "--from lerobot --access windows",
            "copy": "--from lerobot --video-codec copy",
        },
        "default_store_video": json.loads((default_store / "dataset.json").read_text())["created"]["video"],
        "rounds": args.rounds,
        "seconds_per_run": args.seconds,
        "results": summary,
        "best_lerobot": {"samples_per_s": best_rate[0], "per_cpu_s": best_cpu[0]},
        "ratios": ratios,
        "equality": equality,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"lerobot_{args.tag}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
