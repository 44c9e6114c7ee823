"""Shared by the decode benchmarks: a corpus of encoded cameras and the clip/sparse requests on it.

Every video is stored two ways: as closed-GOP segments (what `mmdata convert` writes) and as one
whole file with an ordinary key-frame interval (what recorders write). The same random samples
are asked of both, so the ratio measures the storage layout alone.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from mmdata.codecs.decoders import ClipRequest, SegmentRef

FPS = 30
WHOLE_VIDEO_GOP = 250  # x264's default key-frame interval: what a recording usually has
SEGMENT_FRAMES = 32


@dataclass
class StoredVideo:
    """One camera of one episode: its segments per key-frame interval, and the whole-file encoding."""

    name: str
    codec: str
    width: int
    height: int
    frames: int
    segments: dict[int, list[bytes]]
    whole: bytes


def encode_corpus(codecs, resolutions, videos: int, seconds: float, gops) -> list[StoredVideo]:
    from mmdata.codecs.video_encode import VideoEncoding, encode_segments
    from mmdata.synthetic import synthetic_frame

    corpus = []
    count = int(seconds * FPS)
    for codec in codecs:
        for width, height in resolutions:
            for v in range(videos):
                frames = [synthetic_frame(i + 1000 * v, v % 2, height, width) for i in range(count)]
                segments = {
                    gop: [
                        b
                        for _, b in encode_segments(
                            frames, Fraction(FPS), width, height, VideoEncoding(codec, SEGMENT_FRAMES, gop)
                        )
                    ]
                    for gop in gops
                }
                ((_, whole),) = encode_segments(
                    frames, Fraction(FPS), width, height, VideoEncoding(codec, count, min(WHOLE_VIDEO_GOP, count))
                )
                corpus.append(
                    StoredVideo(f"{codec}-{width}x{height}-{v}", codec, width, height, count, segments, whole)
                )
    return corpus


def load_or_encode(path: Path, **kwargs) -> list[StoredVideo]:
    """The corpus cached at `path` when it was made with the same arguments (or none are given),
    else a fresh one."""
    if path.exists():
        cached = pickle.loads(path.read_bytes())
        if not isinstance(cached, dict):  # a bare list, as the first GPU runs carried it
            cached = {"arguments": None, "videos": cached}
        if not kwargs or cached["arguments"] == repr(sorted(kwargs.items())):
            return cached["videos"]
    corpus = encode_corpus(**kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"arguments": repr(sorted(kwargs.items())), "videos": corpus}))
    return corpus


def requests_for(video: StoredVideo, frames: np.ndarray, storage: str | int) -> list[ClipRequest]:
    """Requests for absolute `frames` of `video`: one per segment touched, or one on the whole file."""
    if storage == "whole":
        return [ClipRequest(video.whole, tuple(frames), video.codec, SegmentRef(video.name, "cam", 0), WHOLE_VIDEO_GOP)]
    segments = video.segments[storage]
    requests = []
    for segment in np.unique(frames // SEGMENT_FRAMES):
        inside = frames[frames // SEGMENT_FRAMES == segment] - segment * SEGMENT_FRAMES
        requests.append(
            ClipRequest(
                segments[segment], tuple(inside), video.codec, SegmentRef(video.name, "cam", int(segment)), storage
            )
        )
    return requests


def clip_samples(videos: list[StoredVideo], storage, count: int, seed: int, length=16, stride=2):
    """`count` clips of `length` frames at `stride`, random start, random video: (requests, frames)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        video = videos[int(rng.integers(len(videos)))]
        start = int(rng.integers(0, video.frames - (length - 1) * stride))
        frames = start + stride * np.arange(length)
        samples.append((requests_for(video, frames, storage), (video.name, frames)))
    return samples


def sparse_samples(videos: list[StoredVideo], storage, count: int, seed: int, lag_seconds=0.1, cameras=2):
    """Policy windows: frames at t - lag and t from `cameras` cameras of one episode, random anchor t."""
    rng = np.random.default_rng(seed)
    lag = round(lag_seconds * FPS)
    samples = []
    for _ in range(count):
        first = int(rng.integers(0, len(videos) - cameras + 1))
        anchor = int(rng.integers(lag, videos[first].frames))
        frames = np.array([anchor - lag, anchor])
        requests = []
        for video in videos[first : first + cameras]:
            requests += requests_for(video, frames, storage)
        samples.append((requests, (videos[first].name, frames)))
    return samples


def measure(decode: Callable[[list[ClipRequest]], list], samples, batch: int, min_seconds: float, max_batches: int):
    """Delivered frames/s over whole batches of samples, after one warm-up batch."""
    batches = [samples[i : i + batch] for i in range(0, len(samples), batch)]
    decode([r for s in batches[0] for r in s[0]])
    delivered, elapsed, done = 0, 0.0, 0
    while elapsed < min_seconds and done < max_batches:
        requests = [r for s in batches[done % len(batches)] for r in s[0]]
        started = time.perf_counter()
        decode(requests)
        elapsed += time.perf_counter() - started
        delivered += sum(len(r.frames) for r in requests)
        done += 1
    return delivered / elapsed, done
