"""Decode once at every frame size (issue 40): mmdata against LeRobot's own loader on LeRobot-written data at
224x224, 480x640 and 720x1280, each size measured in one run.

For each size: a LeRobot v3.0 dataset written by lerobot's own writer (`--episodes` x `--episode-seconds`, two
cameras, AV1 as LeRobot writes it, frames with a drifting noise texture: smooth synthetic frames decode far
cheaper than recordings), converted with `mmdata convert --from lerobot` and its defaults. In `--rounds` rounds
whose order rotates, each in a fresh interpreter: LeRobotDataset + torch DataLoader (torchcodec with 0 and 2
workers, pyav with 2), mmdata.DataLoader with its defaults and mmdata.lerobot.LeRobotLoader (2 workers each),
on lerobot_bench.py's policy windows, batch 8 (LeRobot's loaders over a window of `--seconds` after their first
batch; mmdata's over whole epochs, at least `--seconds`, after a first one unmeasured). Then per size:
- the decode floor (`mmdata.measure.floor`, as `mmdata bench` reports it): every frame the samples deliver
  decoded once, in order, by PyAV with RGB conversion (warm; process CPU), measured by the default loader's own
  run just before and just after its epochs; the loader's CPU per sample (its process and workers) over the
  mean of the two, per run, then the median over rounds. The VM's speed swings by up to 2x within minutes, so a
  floor measured in another process at another moment of the round moved this ratio by 0.3 either way;
- that CPU told apart (the last round's): the decoder's own (`decode_cpu_ms_per_sample`, and per frame decoded
  against the floor's per frame: `decoder_over_floor_per_frame`) and the rest, the work around decoding
  (`outside_decoder_share` of the loader's CPU);
- mmdata against LeRobot's best, as the median of the ratios within each round;
- `mmdata bench` on the store (policy preset, batch 8, 2 workers): decode waste, frames evicted, the frame
  cache's budget line, peak memory per worker.

usage: python benchmarks/frame_size_bench.py [--sizes 224x224,480x640,720x1280] [--rounds 3] [--record NAME]
(sizes are HEIGHTxWIDTH; the LeRobot environment is lerobot_bench.py's). Results go to
benchmarks/results/NAME.json (default frame_sizes_cpu) with the machine named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lerobot_bench import (
    COMPATIBLE_LOADER,
    HERE,
    POLICY_SPEC,
    RESULTS,
    convert,
    ensure_venv,
    lerobot_run,
    medians,
    mmdata_run,
    run_rounds,
)
from machine import machine_name

TREE = HERE.parent
# mmdata's loaders are measured between epoch ends (`measure_epochs`): at an epoch's start a worker's first reads
# decode the frames its later reads take from the frame cache, so a window ending mid-epoch would count that
# work without the samples it serves (on these 1,907-sample stores, every segment opens in the first reads)
WHOLE_EPOCHS_COMPATIBLE = COMPATIBLE_LOADER.replace(
    "from process_time import measure\n", "from process_time import measure_epochs as measure\n"
)
assert WHOLE_EPOCHS_COMPATIBLE != COMPATIBLE_LOADER, "lerobot_bench's COMPATIBLE_LOADER no longer imports measure"

DEFAULT_LOADER = (
    """
import json, sys
sys.path.insert(0, {bench!r})
from process_time import measure_epochs
import mmdata
from mmdata.measure.floor import decode_floor
"""
    + POLICY_SPEC
    + """loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers={workers})
every_sample = range(len(loader.samples))
floor_before = decode_floor(loader, every_sample)
figures = measure_epochs(lambda: iter(loader), lambda batch: len(batch["sample_index"]), {seconds})
stats = loader.stats()
loader.close()
floor_after = decode_floor(loader, every_sample)
figures["decode_waste"] = stats["decode_waste"]
figures["frames_evicted"] = stats["frames_evicted"]
figures["frame_cache"] = stats["frame_cache"]["describe"]
figures["frame_cache_peak_bytes"] = stats["frame_cache_peak_bytes"]
figures["peak_rss_bytes_per_worker"] = stats["peak_rss_bytes_per_worker"]
figures["decode_waste_cause"] = stats["decode_waste_cause"]
figures["stages"] = stats["worker_stage_seconds"]
figures["cpu_ms_per_sample"] = round(1000 * figures["cpu_seconds"] / figures["samples"], 3)
figures["floor_ms_per_sample"] = [round(floor.ms_per_sample, 3) for floor in (floor_before, floor_after)]
figures["floor_frames_per_sample"] = round(floor_after.frames / floor_after.samples, 3)
floor_ms = sum(figures["floor_ms_per_sample"]) / 2  # before and after the epochs
figures["cpu_over_floor"] = round(figures["cpu_ms_per_sample"] / floor_ms, 3)
# the loader's CPU told apart: its decoder's (per sample and per frame decoded, over the whole run) and the rest
figures["decode_cpu_ms_per_sample"] = round(1000 * stats["decode_cpu_seconds"] / stats["samples"], 3)
figures["decode_cpu_ms_per_frame"] = stats["decode_cpu_ms_per_frame"]
figures["floor_ms_per_frame"] = round(floor_ms / figures["floor_frames_per_sample"], 3)
figures["outside_decoder_ms_per_sample"] = round(figures["cpu_ms_per_sample"] - figures["decode_cpu_ms_per_sample"], 3)
# each stage's CPU wherever it ran (the decoder's inside "video"), and what no stage covered: planning, hand-over
by_stage = {{k: 1000 * v / stats["samples"] for k, v in stats.get("stage_cpu_seconds", {{}}).items()}}
if by_stage:
    by_stage["outside_stages"] = figures["cpu_ms_per_sample"] - sum(by_stage.values())
figures["stage_cpu_ms_per_sample"] = {{k: round(v, 4) for k, v in by_stage.items()}}
print("RESULT " + json.dumps(figures))
"""
)


def lerobot_configurations(python: Path, source: Path, seconds: float) -> dict:
    configurations = {}
    for backend, workers in (("torchcodec", 0), ("torchcodec", 2), ("pyav", 2)):
        configurations[f"lerobot {backend} w{workers}"] = lambda b=backend, w=workers: lerobot_run(
            python, "load", str(source), "--backend", b, "--workers", str(w), "--seconds", str(seconds)
        )
    return configurations


def bench_figures(store: Path) -> dict:
    """`mmdata bench` on the store: the figures it records."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        command = [sys.executable, "-m", "mmdata", "bench", str(store), "--spec", "policy", "--batch-size", "8"]
        command += ["--num-workers", "2", "--steps", "60", "--json", str(out)]
        subprocess.run(command, check=True, capture_output=True, cwd=TREE)
        return json.loads(out.read_text())["figures"]


def floor_figures(runs: list[dict]) -> dict:
    """The decode floor as the default loader's runs measured it (before and after their epochs): the median
    CPU per sample, and samples per CPU-second (decoding alone is CPU-bound on one core)."""
    measured = [ms for run in runs for ms in run.get("floor_ms_per_sample", [])]
    if not measured:
        return {}
    ms_per_sample = statistics.median(measured)
    rate = round(1000 / ms_per_sample, 1)
    return {"ms_per_sample": round(ms_per_sample, 3), "runs_ms_per_sample": measured, "samples_per_cpu_s": rate}


def round_ratio(runs: dict[str, list[dict]], numerator: str, denominator: str, figure: str) -> float | None:
    """The median over rounds of `numerator`'s `figure` over `denominator`'s in the same round."""
    ratios = [
        top[figure] / bottom[figure]
        for top, bottom in zip(runs.get(numerator, []), runs.get(denominator, []))
        if top.get(figure) and bottom.get(figure)
    ]
    return round(statistics.median(ratios), 2) if ratios else None


def measure_size(python: Path, args: argparse.Namespace, height: int, width: int) -> dict:
    name = f"{args.episodes}x{args.episode_seconds:g}s-{height}x{width}"
    source = args.workdir / f"sizes-{name}"
    if not (source / "meta" / "info.json").exists():
        print(f"writing {source} with lerobot's writer", flush=True)
        lerobot_run(
            python, "write", str(source), "--episodes", str(args.episodes), "--seconds", str(args.episode_seconds),
            "--height", str(height), "--width", str(width), "--texture",
        )  # fmt: skip
    store = args.workdir / f"sizes-store-{name}.wds"
    started = time.perf_counter()
    convert(TREE, source, store, "wds")
    print(f"{height}x{width}: store ready ({time.perf_counter() - started:.0f} s)", flush=True)
    configurations = lerobot_configurations(python, source, args.seconds)
    configurations["mmdata default w2"] = lambda: mmdata_run(TREE, store, 2, args.seconds, DEFAULT_LOADER)
    configurations["mmdata LeRobotLoader w2"] = lambda: mmdata_run(
        TREE, store, 2, args.seconds, WHOLE_EPOCHS_COMPATIBLE, "auto"
    )
    runs = run_rounds(configurations, args.rounds, f"{height}x{width} ")
    summary = medians(runs)
    lerobot = {k: v for k, v in summary.items() if k.startswith("lerobot") and "samples_per_s" in v}
    best = max(lerobot.items(), key=lambda item: item[1]["samples_per_s"]) if lerobot else None
    floor = floor_figures(runs.get("mmdata default w2", []))
    figures = {
        "lerobot_dataset": str(source),
        "results": summary,
        "best_lerobot": best[0] if best else None,
        "decode_floor": floor,
        "bench": bench_figures(store),
    }
    if best and "samples_per_s" in summary.get("mmdata default w2", {}):
        # ratios within each round (the machine's speed moves between rounds), then their median
        figures["mmdata_vs_best_lerobot"] = round_ratio(runs, "mmdata default w2", best[0], "samples_per_s")
        figures["lerobotloader_vs_best_lerobot"] = round_ratio(
            runs, "mmdata LeRobotLoader w2", best[0], "samples_per_s"
        )
        over = [run["cpu_over_floor"] for run in runs["mmdata default w2"] if "cpu_over_floor" in run]
        figures["cpu_per_sample_over_floor"] = round(statistics.median(over), 2) if over else None
        figures["cpu_per_sample_over_floor_runs"] = over
        default = summary["mmdata default w2"]
        if "decode_cpu_ms_per_frame" in default:
            # decoding in the loader against decoding alone, per frame; and the share of the CPU around decoding
            figures["decoder_over_floor_per_frame"] = round(
                default["decode_cpu_ms_per_frame"] / default["floor_ms_per_frame"], 2
            )
            figures["outside_decoder_share"] = round(
                default["outside_decoder_ms_per_sample"] / default["cpu_ms_per_sample"], 3
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="224x224,480x640,720x1280", help="HEIGHTxWIDTH, comma-separated")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-venv")
    parser.add_argument("--lerobot-version", default="0.4.4")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-data")
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--episode-seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="measuring time per configuration and round (mmdata: whole epochs)"
    )
    parser.add_argument("--record", default="frame_sizes_cpu", help="results file name, without .json")
    args = parser.parse_args()
    python = ensure_venv(args.venv, args.lerobot_version)
    args.workdir.mkdir(parents=True, exist_ok=True)
    record: dict = {
        "benchmark": "frame_size_bench",
        "machine": machine_name(),
        "lerobot_version": args.lerobot_version,
        "dataset": {"episodes": args.episodes, "episode_seconds": args.episode_seconds, "cameras": 2, "codec": "AV1"},
        "rounds": args.rounds,
        "seconds_per_run": args.seconds,
        "sizes": {},
    }
    out = RESULTS / f"{args.record}.json"
    for size in args.sizes.split(","):
        height, width = (int(side) for side in size.lower().split("x"))
        record["sizes"][f"{height}x{width}"] = measure_size(python, args, height, width)
        out.write_text(json.dumps(record, indent=1) + "\n")
        figures = record["sizes"][f"{height}x{width}"]
        print(
            f"{height}x{width}: mmdata {figures.get('mmdata_vs_best_lerobot')}x LeRobot's best"
            f" ({figures.get('best_lerobot')}), LeRobotLoader {figures.get('lerobotloader_vs_best_lerobot')}x,"
            f" CPU per sample {figures.get('cpu_per_sample_over_floor')}x the decode floor,"
            f" decode waste {figures['bench']['decode_waste']}",
            flush=True,
        )
    print(f"written {out}")


if __name__ == "__main__":
    main()
