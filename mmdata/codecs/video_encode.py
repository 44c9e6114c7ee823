"""Encode frames into closed-GOP video segments, each a small self-contained file.

A segment is encoded by its own encoder instance, so it starts with a key frame and its
parameter sets and references nothing outside itself: any segment decodes alone, and a
clip never needs a seek into a neighbour.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.codec.context import Flags
from av.video.frame import PictureType

from mmdata.errors import MmdataError

# codec name -> (FFmpeg encoder, container format, segment file extension)
VIDEO_CODECS = {
    "h264": ("libx264", "mp4", "mp4"),
    "hevc": ("libx265", "mp4", "mp4"),
    "vp9": ("libvpx-vp9", "webm", "webm"),
}


# x265 leaves its B-frame delay time uninitialised when a stream ends before the delay has been
# measured, and then stamps packets with garbage DTS that the muxer rejects at random
# (Multicorewareinc/x265 issue 781). Segments this short are encoded without B-frames.
X265_SHORT_SEGMENT_FRAMES = 8


@dataclass(frozen=True)
class VideoEncoding:
    """How cameras are stored: codec, frames per segment, key-frame interval, quality.

    `fast_decode` tunes H.264/HEVC for decoding speed (x264/x265 `tune=fastdecode`: CAVLC instead
    of CABAC, no deblocking or weighted prediction): about half the decode time for ~25% more bytes.
    """

    codec: str = "h264"
    segment_frames: int = 32
    gop: int = 8
    crf: int = 20
    preset: str = "fast"
    fast_decode: bool = False

    def __post_init__(self):
        if self.codec not in VIDEO_CODECS:
            raise MmdataError(f"unknown video codec '{self.codec}'; choose one of {', '.join(VIDEO_CODECS)}")
        if self.segment_frames < 1 or self.gop < 1:
            raise MmdataError("--segment-frames and --gop must be at least 1")
        if self.gop > self.segment_frames:
            raise MmdataError(
                f"--gop {self.gop} exceeds --segment-frames {self.segment_frames}: a segment holds"
                " one key frame at least, so the key-frame interval cannot be longer than it"
            )

    def encoder_options(self, frames: int | None = None) -> dict[str, str]:
        """FFmpeg encoder options for a segment of `frames` frames (when known)."""
        gop = self.gop
        tune = {"tune": "fastdecode"} if self.fast_decode else {}
        if self.codec == "h264":
            # cpu-independent: without it x264's macroblock-tree rate control gave other bytes on every
            # run for the same frames (same size, same quality): a store must be reproducible
            return {
                "crf": str(self.crf),
                "preset": self.preset,
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:threads=1:cpu-independent=1",
                **tune,
            }
        if self.codec == "hevc":
            params = f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:pools=1:frame-threads=1:log-level=error"
            if frames is not None and frames <= X265_SHORT_SEGMENT_FRAMES:
                params += ":bframes=0"
            return {"crf": str(self.crf), "preset": self.preset, "x265-params": params, **tune}
        return {
            "crf": str(self.crf),
            "b:v": "0",
            "deadline": "good",
            "cpu-used": "5",
            "threads": "1",
            "keyint_min": str(gop),
        }


# How cameras are stored for how they will be read (`mmdata convert --access`), measured by
# benchmarks/lerobot_bench.py and benchmarks/decode_bench.py (see docs/architecture.md):
# - windows: a few frames per camera per sample (policies). Every frame a key frame, tuned for
#   decoding speed: each frame decodes alone, at ~2.5x the bytes of the clips setting.
# - clips: runs of consecutive frames (world models). A key frame every 8 frames.
# - both: the clips setting, which serves windows at about half the windows setting's rate.
ACCESS_PATTERNS = {
    "windows": {"gop": 1, "fast_decode": True},
    "clips": {"gop": 8, "fast_decode": False},
    "both": {"gop": 8, "fast_decode": False},
}


def encoding_for_access(access: str, **overrides) -> VideoEncoding:
    """The VideoEncoding for an access pattern ("windows", "clips", "both"); `overrides` that are
    not None win (e.g. an explicit `gop`)."""
    if access not in ACCESS_PATTERNS:
        raise MmdataError(f"unknown access pattern '{access}'; choose one of {', '.join(ACCESS_PATTERNS)}")
    settings = {**ACCESS_PATTERNS[access], **{k: v for k, v in overrides.items() if v is not None}}
    return VideoEncoding(**settings)


def encode_segments(
    frames: Iterable[av.VideoFrame | np.ndarray],
    fps: Fraction,
    width: int,
    height: int,
    encoding: VideoEncoding,
) -> Iterator[tuple[int, bytes]]:
    """Yield (number of frames, encoded file bytes) for consecutive segments of `frames`.

    Frames are RGB uint8 arrays `[H, W, 3]` or decoded PyAV frames of any pixel format.
    Only one segment's frames are held in memory at a time.
    """
    if width % 2 or height % 2:
        raise MmdataError(
            f"video is {width}x{height}; 4:2:0 video needs even width and height"
            " (crop or scale the recording by one pixel)"
        )
    pending: list[av.VideoFrame | np.ndarray] = []
    for number, frame in enumerate(frames):
        found = _frame_size(frame)
        if found != (width, height):
            raise MmdataError(
                f"frame {number} is {'x'.join(map(str, found))}, the camera's first {width}x{height}"
                " (store every frame of a camera at one size)"
            )
        pending.append(frame)
        if len(pending) == encoding.segment_frames:
            yield len(pending), _encode_one_segment(pending, fps, width, height, encoding)
            pending = []
    if pending:
        yield len(pending), _encode_one_segment(pending, fps, width, height, encoding)


def _frame_size(frame: av.VideoFrame | np.ndarray) -> tuple[int, ...]:
    """(width, height) of a frame; an array's shape when it is no picture."""
    if isinstance(frame, av.VideoFrame):
        return frame.width, frame.height
    return tuple(frame.shape[1::-1]) if frame.ndim >= 2 else tuple(frame.shape)


def _encode_one_segment(
    frames: list[av.VideoFrame | np.ndarray],
    fps: Fraction,
    width: int,
    height: int,
    encoding: VideoEncoding,
) -> bytes:
    encoder_name, container_format, _ = VIDEO_CODECS[encoding.codec]
    buffer = io.BytesIO()
    # bitexact: no random UIDs or encoder tags, so the same input gives the same bytes.
    with av.open(buffer, "w", format=container_format, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(encoder_name, rate=fps)
        # Frames are stamped 0, 1, 2, ... in units of 1/fps; frames decoded from a recording carry
        # their container's time base, which must not leak in (it would collapse every pts to 0).
        time_base = 1 / Fraction(fps)
        stream.codec_context.time_base = time_base
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.gop_size = encoding.gop
        stream.codec_context.flags |= Flags.bitexact
        # One encoder thread: conversion runs one encoder per core already, and frame threads would
        # make the bytes depend on timing.
        stream.codec_context.thread_count = 1
        stream.options = encoding.encoder_options(len(frames))
        for index, frame in enumerate(frames):
            video_frame = _as_video_frame(frame, width, height)
            video_frame.pts = index
            video_frame.time_base = time_base
            out.mux(stream.encode(video_frame))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def _as_video_frame(frame: av.VideoFrame | np.ndarray, width: int, height: int) -> av.VideoFrame:
    if isinstance(frame, np.ndarray):  # its size was checked by encode_segments
        if frame.shape != (height, width, 3) or frame.dtype != np.uint8:
            raise MmdataError(
                f"frame of shape {frame.shape} and dtype {frame.dtype}; expected ({height}, {width}, 3) uint8"
            )
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
    converted = frame.reformat(format="yuv420p")
    # A decoded frame keeps its source picture type (I/P/B), which encoders take as a forced
    # frame type: x265 crashes on forced B-frames, and x264 would copy the source's GOP pattern.
    converted.pict_type = PictureType.NONE
    return converted
