"""The measuring code of `benchmarks/convert_bench.py` (its docstring says what is measured)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from machine import RESULTS, machine_name

from mmdata.codecs.video_encode import COPY, COPY_SEGMENT_FRAMES, VideoEncoding, encoding_for_access
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers import discover_episodes
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, episode_seconds, write_synthetic_dataset

RLDS_FIXTURE = Path(__file__).parent.parent / "tests" / "fixtures" / "rlds_small" / "tfds" / "robot_small" / "1.0.0"


def main(description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--codecs", default="h264,hevc,vp9")
    parser.add_argument("--importers", default="rlds,mcap", help="importers to measure (empty: none)")
    parser.add_argument("--copies", type=int, default=10, help="copies of the RLDS fixture's 3 episodes; MCAP logs")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    parser.add_argument("--lerobot", type=Path, help="a LeRobot v3.0 dataset: re-encoding against copying it")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the LeRobot comparison")
    args = parser.parse_args()

    spec = SynthSpec(episodes=args.episodes, min_seconds=args.min_seconds, max_seconds=args.max_seconds)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmdata-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, spec)
        sources = discover_raw_episodes(raw)
        frames = sum(round(s * spec.fps) * len(spec.cameras) for s in episode_seconds(spec))
        for codec in [name for name in args.codecs.split(",") if name]:
            encoding = VideoEncoding(codec=codec)
            options = ConvertOptions(
                layout="wds", encode=EncodeOptions(video=encoding), workers=args.workers, progress=False
            )
            started = time.perf_counter()
            report = convert(sources, Path(folder) / f"out-{codec}", options)
            seconds = time.perf_counter() - started
            rows.append(
                {
                    "codec": codec,
                    "encoding": asdict(encoding),
                    "episodes": report.converted,
                    "seconds": round(seconds, 2),
                    "episodes_per_s": round(report.converted / seconds, 3),
                    "frames_per_s": round(frames / seconds, 1),
                    "input_mb_per_s": round(report.input_bytes / 1e6 / seconds, 2),
                    "input_mb": round(report.input_bytes / 1e6, 2),
                    "output_mb": round(report.output_bytes / 1e6, 2),
                    "output_ratio": round(report.output_bytes / report.input_bytes, 3),
                }
            )
            print(
                f"{codec:5s} {seconds:7.1f} s  {rows[-1]['episodes_per_s']:6.2f} episodes/s"
                f"  {rows[-1]['frames_per_s']:7.0f} frames/s  {rows[-1]['input_mb_per_s']:6.2f} MB/s in"
                f"  ratio {rows[-1]['output_ratio']:.3f}"
            )
        importers = [name for name in args.importers.split(",") if name]
        importer_rows = [measure_importer(name, Path(folder), args.copies, args.workers) for name in importers]
        copying = measure_copy(args.lerobot, Path(folder), args.rounds, args.workers) if args.lerobot else None
    result = {
        "benchmark": "convert_bench",
        "machine": machine_name(),
        "workers": args.workers or os.cpu_count(),
        "dataset": {**asdict(spec), "cameras": [asdict(c) for c in spec.cameras], "frames": frames},
        "results": rows,
        "importers": importer_rows,
        "lerobot_copy": copying,
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"convert_{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


def measure_copy(dataset: Path, folder: Path, rounds: int, workers: int | None) -> dict:
    """The LeRobot dataset converted with the default options (re-encoded) and with `--video-codec copy`,
    alternating for `rounds` rounds: median camera frames/s of each, their ratio, store sizes against the
    dataset's."""
    sources = discover_episodes(str(dataset), "lerobot")
    info = json.loads((dataset / "meta" / "info.json").read_text())
    cameras = sum(1 for feature in info["features"].values() if feature["dtype"] == "video")
    frames = info["total_frames"] * cameras
    ways = {
        "re-encoded (default)": VideoEncoding(),
        "copy": encoding_for_access("both", codec=COPY, segment_frames=COPY_SEGMENT_FRAMES),  # `--video-codec copy`
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    sizes: dict[str, int] = {}
    for round_number in range(rounds):
        for name in ways if round_number % 2 == 0 else reversed(list(ways)):
            destination = folder / f"lerobot-{len(seconds[name])}-{'copy' if name == 'copy' else 'encoded'}"
            options = ConvertOptions(encode=EncodeOptions(video=ways[name]), workers=workers, progress=False)
            started = time.perf_counter()
            convert(sources, destination, options, source_root=dataset)
            seconds[name].append(time.perf_counter() - started)
            sizes[name] = folder_bytes(destination)
            shutil.rmtree(destination)
            print(
                f"round {round_number} {name:22s} {seconds[name][-1]:7.2f} s"
                f"  {frames / seconds[name][-1]:8.0f} frames/s"
            )
    source_bytes = folder_bytes(dataset)
    rows = {
        name: {
            "seconds": [round(x, 2) for x in runs],
            "frames_per_s": round(frames / statistics.median(runs), 1),
            "store_bytes": sizes[name],
            "store_vs_source_size": round(sizes[name] / source_bytes, 3),
        }
        for name, runs in seconds.items()
    }
    ratio = rows["copy"]["frames_per_s"] / rows["re-encoded (default)"]["frames_per_s"]
    print(
        f"LeRobot {dataset.name}: copy {rows['copy']['frames_per_s']:.0f} frames/s, re-encoding"
        f" {rows['re-encoded (default)']['frames_per_s']:.0f}: {ratio:.1f}x; stores against the dataset's"
        f" {source_bytes / 1e6:.1f} MB: copy {rows['copy']['store_vs_source_size']}, re-encoded"
        f" {rows['re-encoded (default)']['store_vs_source_size']}"
    )
    return {
        "dataset": str(dataset),
        "camera_frames": frames,
        "source_bytes": source_bytes,
        "rounds": rounds,
        "results": rows,
        "copy_vs_reencode_frames_per_s": round(ratio, 2),
    }


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure_importer(name: str, folder: Path, copies: int, workers: int | None) -> dict:
    """Episodes/s and frames/s of converting an importer's input (default h264 encoding, wds)."""
    if name == "rlds":
        source = _rlds_copies(folder / "rlds", copies)
        sources = discover_episodes(source, "rlds", fps=10)
        frames = sum(c.array.shape(s.name).rows for s in sources for c in s.cameras)
    elif name == "mcap":
        source = folder / "mcap"
        truths = _mcap_logs(source, copies)
        sources = discover_episodes(source, "mcap")
        frames = sum(len(t.frame_stamps) for t in truths)
    else:
        raise SystemExit(f"unknown importer '{name}' (rlds, mcap)")
    options = ConvertOptions(layout="wds", workers=workers, progress=False)
    started = time.perf_counter()
    report = convert(sources, folder / f"out-{name}", options)
    seconds = time.perf_counter() - started
    row = {
        "importer": name,
        "episodes": report.converted,
        "frames": frames,
        "seconds": round(seconds, 2),
        "episodes_per_s": round(report.converted / seconds, 3),
        "frames_per_s": round(frames / seconds, 1),
        "input_mb": round(report.input_bytes / 1e6, 2),
    }
    print(f"{name:5s} {seconds:7.1f} s  {row['episodes_per_s']:6.2f} episodes/s  {row['frames_per_s']:7.0f} frames/s")
    return row


def _rlds_copies(builder: Path, copies: int) -> Path:
    """The RLDS fixture's builder folder with its record file copied `copies` times (3 episodes each)."""
    builder.mkdir(parents=True)
    for name in ("dataset_info.json", "features.json"):
        shutil.copyfile(RLDS_FIXTURE / name, builder / name)
    (record,) = RLDS_FIXTURE.glob("*.tfrecord-*")
    for number in range(copies):
        shutil.copyfile(record, builder / f"robot_small-train.tfrecord-{number:05d}-of-{copies:05d}")
    return builder


def _mcap_logs(folder: Path, count: int) -> list:
    """`count` ROS 2 logs of 2 s, written as the MCAP tests write them."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests import mcap_logs

    folder.mkdir(parents=True)
    truths = []
    for number in range(count):
        with open(folder / f"log_{number:03d}.mcap", "wb") as handle:
            writer, schemas = mcap_logs.open_writer(handle)
            truths.append(mcap_logs.write_episode(writer, schemas, 10**18 + number * 10**11, 2.0, number, "pick"))
            writer.finish()
    return truths


if __name__ == "__main__":
    main()
