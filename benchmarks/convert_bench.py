"""Conversion throughput per video codec on the synthetic dataset, measured in one run.

Prints episodes/s, frames/s, input MB/s and the output/input size ratio for h264, hevc and
vp9, and writes the figures with the machine named to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.sources.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, episode_seconds, write_synthetic_dataset

RESULTS = Path(__file__).parent / "results"


def machine_name() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.node() or 'host'}: {os.cpu_count()} cores {cpu}, {platform.system()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--codecs", default="h264,hevc,vp9")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    args = parser.parse_args()

    spec = SynthSpec(episodes=args.episodes, min_seconds=args.min_seconds, max_seconds=args.max_seconds)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmdata-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, spec)
        sources = discover_raw_episodes(raw)
        frames = sum(round(s * spec.fps) * len(spec.cameras) for s in episode_seconds(spec))
        for codec in args.codecs.split(","):
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
    result = {
        "benchmark": "convert_bench",
        "machine": machine_name(),
        "workers": args.workers or os.cpu_count(),
        "dataset": {**asdict(spec), "cameras": [asdict(c) for c in spec.cameras], "frames": frames},
        "results": rows,
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"convert_{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
