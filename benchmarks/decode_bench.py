"""Clip and sparse-window decoding on this machine's CPU, per backend and codec, in one run.

Measures delivered frames/s for
- 16-frame clips (stride 2, random starts) stored as 32-frame closed-GOP segments vs as whole
  videos (key frame every 250 frames), at 224x224 and 640x480, per backend and codec; whole
  videos are read by each backend's own seeking decoder, by PyAV's container seek (what
  torchvision's and LeRobot's PyAV paths do) and naively from the first frame;
- sparse policy windows (frames at t - 0.1 s and t from 2 cameras) and clips, for key-frame
  intervals 2, 8 and 32 inside the segments, with decode waste (frames decoded / delivered)
  and storage cost (bytes per frame);
- DALI's CPU decoder with joined sessions against one session per request, for both patterns.

usage: python benchmarks/decode_bench.py [--out benchmarks/results/decode_cpu.json] [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import av  # noqa: E402
import numpy as np  # noqa: E402
from decode_workload import FPS, clip_samples, load_or_encode, measure, sparse_samples  # noqa: E402
from machine import machine_name  # noqa: E402

from mmdata.codecs.decoders import backends_for_codec, make_video_decoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import to_rgb  # noqa: E402

GOPS = [2, 4, 8, 32]


def row_for(decoder_name: str, codec: str, samples, label: str, min_seconds: float, **options) -> dict:
    decoder = make_video_decoder(decoder_name, [codec], **options)
    fps, batches = measure(decoder.decode, samples, batch=16, min_seconds=min_seconds, max_batches=40)
    row = {
        "case": label,
        "decoder": decoder_name,
        "codec": codec,
        **options,
        "delivered_fps": round(fps),
        "decode_waste": round(decoder.stats.decode_waste, 2),
        "batches": batches,
    }
    print(json.dumps(row), flush=True)
    return row


def wanted_frames(request, indexed_frames) -> np.ndarray:
    """The request's frames, in the order asked, from (frame index, frame) pairs in presentation order."""
    wanted, frames = set(request.frames), {}
    for index, frame in indexed_frames:
        if index in wanted:
            frames[index] = to_rgb(frame)
        if index >= max(request.frames):
            break
    return np.stack([frames[i] for i in request.frames])


def decode_from_the_start(requests) -> list:
    """The naive whole-video reader: decode every frame from the file's first, keep the wanted ones."""
    outputs = []
    for request in requests:
        with av.open(io.BytesIO(request.data)) as container:
            outputs.append(wanted_frames(request, enumerate(container.decode(video=0))))
    return outputs


def decode_after_container_seek(requests) -> list:
    """The usual whole-video reader: seek the container to the key frame before the clip, decode
    every frame from there (torchvision's `read_video` and LeRobot's PyAV path do this)."""
    outputs = []
    for request in requests:
        with av.open(io.BytesIO(request.data)) as container:
            stream = container.streams.video[0]
            container.seek(int(min(request.frames) / FPS / stream.time_base), stream=stream, backward=True)
            indexed = ((round(frame.time * FPS), frame) for frame in container.decode(stream))
            outputs.append(wanted_frames(request, indexed))
    return outputs


BASELINES = {
    "pyav, from the first frame": decode_from_the_start,
    "pyav, container seek": decode_after_container_seek,
}


def baseline_row(name: str, codec: str, samples, label: str, min_seconds: float) -> dict:
    fps, batches = measure(BASELINES[name], samples, batch=16, min_seconds=min_seconds, max_batches=40)
    row = {
        "case": label,
        "decoder": name,
        "codec": codec,
        "delivered_fps": round(fps),
        "batches": batches,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/decode_cpu.json")
    parser.add_argument(
        "--corpus",
        default="benchmarks/.cache/decode_corpus.pkl",
        help="encoded videos, made on the first run and reused",
    )
    parser.add_argument("--quick", action="store_true", help="224x224 H.264 only, shorter runs")
    args = parser.parse_args()
    codecs = ["h264"] if args.quick else ["h264", "hevc", "vp9"]
    resolutions = [(224, 224)] if args.quick else [(224, 224), (640, 480)]
    min_seconds = 0.5 if args.quick else 1.5
    started = time.perf_counter()
    corpus = load_or_encode(
        Path(args.corpus + (".quick" if args.quick else "")),
        codecs=codecs,
        resolutions=resolutions,
        videos=2,
        seconds=10,
        gops=GOPS,
    )
    print(f"corpus ready in {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for codec in codecs:
        for width, height in resolutions:
            videos = [v for v in corpus if v.codec == codec and v.width == width]
            size = f"{width}x{height}"
            whole_samples = clip_samples(videos, "whole", 64, seed=1)
            label = f"clips {size} whole-video"
            naive = baseline_row("pyav, from the first frame", codec, whole_samples, label, min_seconds)
            seek = baseline_row("pyav, container seek", codec, whole_samples, label, min_seconds)
            rows += [naive, seek]
            for backend in backends_for_codec(codec):
                whole = row_for(
                    backend, codec, clip_samples(videos, "whole", 64, seed=1), f"clips {size} whole-video", min_seconds
                )
                rows.append(whole)
                for gop in (32, 8):
                    label = f"clips {size} segments gop{gop}"
                    segments = row_for(backend, codec, clip_samples(videos, gop, 64, seed=1), label, min_seconds)
                    segments["speedup_vs_whole"] = round(segments["delivered_fps"] / whole["delivered_fps"], 2)
                    segments["speedup_vs_naive_whole"] = round(segments["delivered_fps"] / naive["delivered_fps"], 2)
                    segments["speedup_vs_container_seek"] = round(segments["delivered_fps"] / seek["delivered_fps"], 2)
                    rows.append(segments)
    gop_rows = []
    for codec in codecs:
        videos = [v for v in corpus if v.codec == codec and v.width == 224]
        for gop in GOPS:
            bytes_per_frame = sum(len(b) for v in videos for b in v.segments[gop]) / sum(v.frames for v in videos)
            for backend in backends_for_codec(codec):
                for label, samples in (
                    ("sparse 224x224 2 cams x 2 frames", sparse_samples(videos, gop, 64, seed=3)),
                    ("clips 224x224", clip_samples(videos, gop, 64, seed=1)),
                ):
                    row = row_for(backend, codec, samples, f"{label} gop{gop}", min_seconds)
                    row.update(gop=gop, bytes_per_frame=round(bytes_per_frame))
                    gop_rows.append(row)
    session_rows = []
    if "vp9" in codecs and "dali-cpu" in backends_for_codec("vp9"):
        videos = [v for v in corpus if v.codec == "vp9" and v.width == 224]
        for gop in GOPS:
            for label, samples in (
                ("sparse 224x224 2 cams x 2 frames", sparse_samples(videos, gop, 64, seed=3)),
                ("clips 224x224", clip_samples(videos, gop, 64, seed=1)),
            ):
                for reuse in (True, False):
                    row = row_for("dali-cpu", "vp9", samples, f"{label} gop{gop}", min_seconds, reuse_sessions=reuse)
                    session_rows.append(row)
    result = {
        "machine": f"{machine_name()} (no GPU)",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "clips": rows,
        "key_frame_interval": gop_rows,
        "dali_cpu_sessions": session_rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
