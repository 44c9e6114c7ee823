"""Encode frames into closed-GOP video segments, each a small self-contained file.

A segment is encoded by its own encoder instance, so it starts with a key frame and its
parameter sets and references nothing outside itself: any segment decodes alone, and a
clip never needs a seek into a neighbour.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.bitstream import BitStreamFilterContext, bitstream_filters_available
from av.codec.context import Flags
from av.container import OutputContainer
from av.video.frame import PictureType

from mmdata.codecs.colour import to_rgb
from mmdata.errors import MmdataError

# codec name -> (FFmpeg encoder, container format, segment file extension)
COPY = "copy"  # the recording's packets cut into segments at key frames, not re-encoded (`codecs/video_copy.py`)
# `mmdata convert --video-codec copy`'s segment length: a copied segment carries the container's ~1 KB of
# headers like any other, and with key frames every few frames (LeRobot's AV1: 2) longer segments cost a
# reader nothing in decoding, so copies take twice the encoded default (the store stays within ~2% of
# LeRobot's size rather than ~5%)
COPY_SEGMENT_FRAMES = 64
VIDEO_CODECS = {
    "h264": ("libx264", "mp4", "mp4"),
    "hevc": ("libx265", "mp4", "mp4"),
    "vp9": ("libvpx-vp9", "webm", "webm"),
}


# x265 leaves its B-frame delay time uninitialised when a stream ends before the delay has been
# measured, and then stamps packets with garbage DTS that the muxer rejects at random
# (Multicorewareinc/x265 issue 781). Segments this short are encoded without B-frames.
X265_SHORT_SEGMENT_FRAMES = 8

# The container (and file suffix) of a stored segment, by codec: the encoders' own, and the codecs a copy keeps (AV1)
SEGMENT_SUFFIXES = {codec: suffix for codec, (_, _, suffix) in VIDEO_CODECS.items()} | {"av1": "mp4"}

# What an encoder may hold of a segment's frames, so that a worker's memory does not grow with the frame
# size: frames reach the encoder one at a time, its lookahead is shortened for frames so large that its
# default depth would pass this (8192x8192: 5 frames of 100 MB instead of 30), and an HEVC segment holds
# back its first frames (to learn whether it is short) only while they fit in it.
ENCODER_FRAME_BUDGET = 512 << 20
_DEEPEST_DEFAULT_LOOKAHEAD = 60  # x264's placebo preset; every other default is shallower

# The speed presets x264 and x265 share, fastest first.
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")
# Each codec's default preset and constant rate factor, measured by benchmarks/store_size_bench.py. For H.264, x264's
# "medium" at crf 19.5 stores camera scenes in ~8% fewer bytes than "fast" at crf 20 (the default before issue
# 41) at the same fidelity to the source (PSNR within 0.03 dB) and decode speed: its finer motion search costs
# the encoder, not the decoder, and it spends what it saves on a half-step lower crf. HEVC keeps its settings
# (not measured against LeRobot's data).
DEFAULT_PRESETS = {"h264": "medium", "hevc": "fast"}
DEFAULT_CRF = {"h264": 19.5, "hevc": 20, "vp9": 20}
# x264 writes its version and every option into each stream it starts (an SEI message of ~650 bytes, 3-4% of a
# 32-frame 224x224 segment) and has no option to leave it out; this bitstream filter drops it from each segment
# (x264 writes no other SEI message with closed GOPs and no HRD signalling). An FFmpeg built without the filter
# (PyAV's wheels have it) keeps the banner: the same frames, a few percent more bytes.
H264_DROP_SEI = "filter_units=remove_types=6"
# The constant rate factors the encoders take: x264 and x265 any number in [0, 51], libvpx an integer in [0, 63].
CRF_RANGES = {"h264": 51, "hevc": 51, "vp9": 63}


@dataclass(frozen=True)
class VideoEncoding:
    """How cameras are stored: codec, frames per segment, key-frame interval, quality.

    `codec="copy"` keeps a recording's H.264, HEVC, AV1 or VP9 packets as they are, cut into segments of at most
    `segment_frames` frames at its key frames (`gop` and `crf` then do not apply; `codecs/video_copy.py`).
    `preset` is the encoder's speed preset and `crf` its constant rate factor, lower for better quality (defaults:
    the codec's in DEFAULT_PRESETS and DEFAULT_CRF; VP9 ignores the preset and takes a whole-number crf).
    `fast_decode` tunes H.264/HEVC for decoding speed (x264/x265 `tune=fastdecode`: CAVLC instead
    of CABAC, no deblocking or weighted prediction): about half the decode time for ~20% more bytes
    (on by default: `mmdata convert --access both`; see ACCESS_PATTERNS).
    """

    codec: str = "h264"
    segment_frames: int = 32
    gop: int = 8
    crf: float | None = None
    preset: str | None = None
    fast_decode: bool = True

    def __post_init__(self):
        if self.codec not in VIDEO_CODECS and self.codec != COPY:
            raise MmdataError(f"unknown video codec '{self.codec}'; choose one of {', '.join(VIDEO_CODECS)} or {COPY}")
        if self.preset is None:
            object.__setattr__(self, "preset", DEFAULT_PRESETS.get(self.codec, "medium"))
        elif self.preset not in PRESETS:
            raise MmdataError(f"unknown --preset '{self.preset}'; choose one of {', '.join(PRESETS)}")
        if self.crf is None:
            object.__setattr__(self, "crf", DEFAULT_CRF.get(self.codec, 20))
        self._check_crf()
        if self.segment_frames < 1 or self.gop < 1:
            raise MmdataError("--segment-frames and --gop must be at least 1")
        if self.gop > self.segment_frames and self.codec != COPY:
            raise MmdataError(
                f"--gop {self.gop} exceeds --segment-frames {self.segment_frames}: a segment holds"
                " one key frame at least, so the key-frame interval cannot be longer than it"
            )

    def _check_crf(self) -> None:
        crf, highest = self.crf, CRF_RANGES.get(self.codec)
        if isinstance(crf, bool) or not isinstance(crf, (int, float)) or not math.isfinite(crf):
            raise MmdataError(f"--crf is {crf!r}; give a number such as {DEFAULT_CRF['h264']}")
        if highest is not None and not 0 <= crf <= highest:
            raise MmdataError(f"--crf {crf:g} is outside [0, {highest}] for {self.codec}")
        if self.codec == "vp9" and crf != int(crf):
            raise MmdataError(f"--crf {crf:g}: libvpx takes a whole number for vp9; give {round(crf)}")

    def encoder_options(self, frames: int | None = None, frame_size: tuple[int, int] | None = None) -> dict[str, str]:
        """FFmpeg encoder options for a segment of `frames` frames (when known) of `frame_size` (width, height;
        large frames get a shorter lookahead, see ENCODER_FRAME_BUDGET)."""
        gop, preset, crf = self.gop, self.preset, self.crf
        assert preset is not None and crf is not None, "filled in when the encoding is made"
        tune = {"tune": "fastdecode"} if self.fast_decode else {}
        depth = lookahead_frames(*frame_size) if frame_size is not None else None
        if self.codec == "h264":
            # cpu-independent: without it x264's macroblock-tree rate control gave other bytes on every
            # run for the same frames (same size, same quality): a store must be reproducible
            params = f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:threads=1:cpu-independent=1"
            if depth is not None:
                params += f":rc-lookahead={depth}"
            return {"crf": f"{crf:g}", "preset": preset, "x264-params": params, **tune}
        if self.codec == "hevc":
            # info=0: no SEI message carrying x265's version and options (~2 KB per segment)
            params = f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0:pools=1:frame-threads=1:log-level=error"
            params += ":info=0"
            if frames is not None and frames <= X265_SHORT_SEGMENT_FRAMES:
                params += ":bframes=0"
            if depth is not None:
                params += f":rc-lookahead={depth}"
            return {"crf": f"{crf:g}", "preset": preset, "x265-params": params, **tune}
        lag = {"lag-in-frames": str(depth)} if depth is not None else {}
        return {
            "crf": str(int(crf)),
            "b:v": "0",
            "deadline": "good",
            "cpu-used": "5",
            "threads": "1",
            "keyint_min": str(gop),
            **lag,
        }


# How cameras are stored for how they will be read (`mmdata convert --access`), measured by
# benchmarks/lerobot_bench.py and benchmarks/decode_bench.py (see docs/architecture.md):
# - windows: a few frames per camera per sample (policies). Every frame a key frame, tuned for
#   decoding speed: each frame decodes alone, at ~2.5x the bytes of the clips setting.
# - clips: runs of consecutive frames (world models). A key frame every 8 frames.
# - both (the default): a key frame every 8 frames, tuned for decoding speed: with the loader's
#   "blocks" order and frame cache it serves windows faster than the windows setting, at ~1.2x the
#   bytes of clips (LeRobot's 100 episodes with x264's "fast" preset: 29.2 MB against LeRobot's 30.5 MB; 25.0 MB
#   untuned; "medium" at crf 19.5, the default since, in about 8% fewer at the same fidelity: see DEFAULT_PRESETS).
ACCESS_PATTERNS = {
    "windows": {"gop": 1, "fast_decode": True},
    "clips": {"gop": 8, "fast_decode": False},
    "both": {"gop": 8, "fast_decode": True},
}


def encoding_for_access(access: str, **overrides) -> VideoEncoding:
    """The VideoEncoding for an access pattern ("windows", "clips", "both"); `overrides` that are
    not None win (e.g. an explicit `gop`)."""
    if access not in ACCESS_PATTERNS:
        raise MmdataError(f"unknown access pattern '{access}'; choose one of {', '.join(ACCESS_PATTERNS)}")
    settings = {**ACCESS_PATTERNS[access], **{k: v for k, v in overrides.items() if v is not None}}
    return VideoEncoding(**settings)


def lookahead_frames(width: int, height: int) -> int | None:
    """The encoder lookahead depth for frames of this size within ENCODER_FRAME_BUDGET, or None where the
    encoder's own default fits (every size up to about 3000x2000)."""
    depth = ENCODER_FRAME_BUDGET // max(1, width * height * 3 // 2)
    return None if depth >= _DEEPEST_DEFAULT_LOOKAHEAD else max(1, depth)


def encode_segments(
    frames: Iterable[av.VideoFrame | np.ndarray],
    fps: Fraction,
    width: int,
    height: int,
    encoding: VideoEncoding,
) -> Iterator[tuple[int, bytes]]:
    """Yield (number of frames, encoded file bytes) for consecutive segments of `frames`.

    Frames are RGB uint8 arrays `[H, W, 3]` or decoded PyAV frames of any pixel format. Each reaches
    the encoder as it comes (see ENCODER_FRAME_BUDGET), so memory does not grow with segment length.
    """
    if width % 2 or height % 2:
        raise MmdataError(
            f"video is {width}x{height}; 4:2:0 video needs even width and height"
            " (crop or scale the recording by one pixel)"
        )
    segment: _SegmentEncoder | None = None
    for number, frame in enumerate(frames):
        found = _frame_size(frame)
        if found != (width, height):
            raise MmdataError(
                f"frame {number} is {'x'.join(map(str, found))}, the camera's first {width}x{height}"
                " (store every frame of a camera at one size)"
            )
        if segment is None:
            segment = _SegmentEncoder(fps, width, height, encoding)
        segment.add(_as_video_frame(frame, width, height))
        if segment.count == encoding.segment_frames:
            yield segment.count, segment.finish()
            segment = None
    if segment is not None:
        yield segment.count, segment.finish()


class _SegmentEncoder:
    """One segment's encoder, fed a frame at a time. An HEVC segment holds back its first frames until
    it knows whether it is short (X265_SHORT_SEGMENT_FRAMES), while they fit in ENCODER_FRAME_BUDGET;
    frames larger than that are encoded without B-frames from the start."""

    def __init__(self, fps: Fraction, width: int, height: int, encoding: VideoEncoding):
        self.fps, self.width, self.height, self.encoding = fps, width, height, encoding
        self.count = 0
        self._held: list[av.VideoFrame] = []
        self._buffer = io.BytesIO()
        self._out: OutputContainer | None = None
        self._stream: av.VideoStream | None = None
        self._filter: BitStreamFilterContext | None = None
        frame_bytes = width * height * 3 // 2
        self._hold = 0
        if encoding.codec == "hevc":
            self._hold = X265_SHORT_SEGMENT_FRAMES + 1
            if self._hold * frame_bytes > ENCODER_FRAME_BUDGET:
                self._hold = 0
                self._open(frames=1)  # encoded as a short segment is: without B-frames

    def add(self, frame: av.VideoFrame) -> None:
        frame.pts = self.count
        frame.time_base = 1 / Fraction(self.fps)
        self.count += 1
        if self._out is None and len(self._held) + 1 < self._hold:
            self._held.append(frame)
            return
        if self._out is None:
            self._open(frames=None)
        _, stream = self._opened()
        for held in [*self._held, frame]:
            self._mux(stream.encode(held))
        self._held = []

    def finish(self) -> bytes:
        if self._out is None:
            self._open(frames=self.count)
            for held in self._held:
                self._mux(self._opened()[1].encode(held))
            self._held = []
        out, stream = self._opened()
        self._mux(stream.encode(None))
        if self._filter is not None:
            self._mux(self._filter.filter(None), filter_first=False)
        out.close()
        return self._buffer.getvalue()

    def _opened(self) -> tuple[OutputContainer, av.VideoStream]:
        assert self._out is not None and self._stream is not None, "the container opens before a frame is encoded"
        return self._out, self._stream

    def _mux(self, packets: list[av.Packet], filter_first: bool = True) -> None:
        """Write the encoder's packets, through the bitstream filter where there is one."""
        if filter_first and self._filter is not None:
            packets = [kept for packet in packets for kept in self._filter.filter(packet)]
        out, stream = self._opened()
        for packet in packets:
            packet.stream = stream
            out.mux(packet)

    def _open(self, frames: int | None) -> None:
        encoder_name, container_format, _ = VIDEO_CODECS[self.encoding.codec]
        # bitexact: no random UIDs or encoder tags, so the same input gives the same bytes.
        self._out = av.open(self._buffer, "w", format=container_format, options={"fflags": "+bitexact"})
        stream = self._out.add_stream(encoder_name, rate=self.fps)
        assert isinstance(stream, av.VideoStream)
        # Frames are stamped 0, 1, 2, ... in units of 1/fps; frames decoded from a recording carry
        # their container's time base, which must not leak in (it would collapse every pts to 0).
        stream.codec_context.time_base = 1 / Fraction(self.fps)
        stream.width = self.width
        stream.height = self.height
        stream.pix_fmt = "yuv420p"
        stream.gop_size = self.encoding.gop
        stream.codec_context.flags |= Flags.bitexact
        # One encoder thread: conversion runs one encoder per core already, and frame threads would
        # make the bytes depend on timing.
        stream.codec_context.thread_count = 1
        stream.options = {**self.encoding.encoder_options(frames, (self.width, self.height))}
        self._stream = stream
        if self.encoding.codec == "h264" and "filter_units" in bitstream_filters_available:
            self._filter = BitStreamFilterContext(H264_DROP_SEI, stream)


def padded_to_even(frame: av.VideoFrame | np.ndarray) -> np.ndarray:
    """An RGB frame whose odd sides are grown to even ones by repeating its last column and row: what 4:2:0
    storage needs (`VideoStream.coded_size`); readers cut the frames back to the camera's own size."""
    rgb = to_rgb(frame) if isinstance(frame, av.VideoFrame) else np.asarray(frame)
    height, width = rgb.shape[:2]
    return np.pad(rgb, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def _frame_size(frame: av.VideoFrame | np.ndarray) -> tuple[int, ...]:
    """(width, height) of a frame; an array's shape when it is no picture."""
    if isinstance(frame, av.VideoFrame):
        return frame.width, frame.height
    return tuple(frame.shape[1::-1]) if frame.ndim >= 2 else tuple(frame.shape)


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
