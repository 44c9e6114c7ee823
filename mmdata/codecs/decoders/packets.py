"""What every backend needs from a segment before and around decoding it: checks of its codec and
frame size against the store's, its packets in decode order, the frames a request wants, and the
runs of frames to decode from each key frame. Every backend imports these; none imports another backend.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import av
import numpy as np

from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.codecs.packet_index import PacketIndex, key_frames_of, presented_frames
from mmdata.errors import DecodeError

# FFmpeg decoder names that decode a codec the store names otherwise.
DECODER_NAMES = {"av1": {"av1", "libdav1d", "libaom-av1"}, "vp9": {"vp9", "libvpx-vp9"}, "vp8": {"vp8", "libvpx"}}
# The software decoder to open for a codec whose FFmpeg default needs hardware (the native "av1" decodes only
# through a hardware accelerator; dav1d is the fast software one, and what FFmpeg picks when demuxing)
SOFTWARE_DECODERS = {"av1": ("libdav1d", "libaom-av1")}


def software_decoder(codec: str) -> str:
    """The name of an FFmpeg decoder PyAV can open for `codec` without hardware."""
    for name in SOFTWARE_DECODERS.get(codec, ()):
        if name in av.codecs_available:
            return name
    return codec


def check_stream(context, request: ClipRequest) -> None:
    """Refuse a segment whose codec or frame size is not what the store declares, before decoding;
    the decoder is also told to refuse any frame larger than declared (`max_pixels`), so a small
    segment cannot make it allocate frames of another size midway."""
    if context.name not in DECODER_NAMES.get(request.codec, {request.codec}):
        raise DecodeError(f"holds {context.name} video, the store says {request.codec}")
    if request.frame_size is not None:
        width, height = request.frame_size
        if (context.width, context.height) != (width, height):
            raise DecodeError(f"holds {context.width}x{context.height} frames, the store says {width}x{height}")
        # FFmpeg checks its padded buffer (width aligned to the SIMD stride), hence the margin.
        context.options = {**context.options, "max_pixels": str((width + 256) * (height + 256))}


def check_frame(frame: av.VideoFrame, request: ClipRequest) -> None:
    if request.frame_size is not None and (frame.width, frame.height) != request.frame_size:
        width, height = request.frame_size
        raise DecodeError(f"a frame is {frame.width}x{frame.height}, the store says {width}x{height}")


def shown_in_order(stamp: int | None, latest: int | None) -> int:
    """`stamp`, the stamp of a frame the decoder gives after one stamped `latest` (None: the first); DecodeError
    unless it is later. A decoder gives frames in the order they are shown, which the bitstream sets: a segment
    whose stamps say another order (B-frames stamped in decode order) would otherwise give each frame another's
    place."""
    if stamp is None:
        raise DecodeError("a frame came out of the decoder without a stamp")
    if latest is not None and stamp <= latest:
        raise DecodeError(
            f"its frames come out of the decoder in another order than their stamps say (stamp {stamp} after"
            f" {latest}): the segment was stored with its frames out of order; convert the episode again"
        )
    return stamp


def probe_segment(request: ClipRequest) -> tuple[int, int]:
    """Check a segment's codec and frame size from its headers (for backends that decode it elsewhere);
    its (width, height)."""
    try:
        with av.open(io.BytesIO(request.data), mode="r") as container:
            if not container.streams.video:
                raise DecodeError("segment holds no video stream")
            context = container.streams.video[0].codec_context
            check_stream(context, request)
            return context.width, context.height
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from exc


@dataclass
class SegmentPackets:
    """A segment's packets in decode order, made on demand: `packet(i)` gives packet i with its pts
    set to the frame it shows (its presentation index), so decoded frames say which frame they are.
    `key_frames` / `key_positions`: the frames key packets show (ascending) and their positions."""

    count: int
    frames: np.ndarray
    key_frames: np.ndarray
    key_positions: np.ndarray
    packet: Callable[[int], av.Packet]


def demuxed_packets(packets: list[av.Packet]) -> SegmentPackets:
    """Packets demuxed from a container (decode order), renumbered by presentation order."""
    frames = np.asarray(presented_frames(packets), np.int64)
    for packet, frame in zip(packets, frames):
        packet.pts = int(frame)
    keys = np.asarray([p.is_keyframe for p in packets], bool)
    return SegmentPackets(len(packets), frames, *key_frames_of(frames, keys), packets.__getitem__)


def indexed_packets(data: bytes, index: PacketIndex) -> SegmentPackets:
    """Packets sliced out of a segment's bytes by its packet index, without demuxing."""
    view = memoryview(data)
    offsets, sizes, frames = index.offsets.tolist(), index.sizes.tolist(), index.frames.tolist()

    def packet(position: int) -> av.Packet:
        start = offsets[position]
        made = av.Packet(view[start : start + sizes[position]])  # type: ignore[arg-type, unused-ignore]  # (PyAV takes any buffer; its stubs vary by release)
        made.pts = frames[position]
        return made

    return SegmentPackets(len(index), index.frames, *index.key_frames, packet)


def wanted_frames(request: ClipRequest, count: int, key_frames: np.ndarray | None = None) -> np.ndarray:
    """The distinct frames `request` asks of a segment of `count` frames, ascending; raises DecodeError when
    the segment cannot serve them (no frames, too few, or, where its `key_frames` are known, no key frame first)."""
    if not count:
        raise DecodeError("segment holds no video packets")
    wanted = np.unique(np.asarray(request.frames, np.int64))
    if wanted[-1] >= count:
        raise DecodeError(f"segment has {count} frames; frame {int(wanted[-1])} requested")
    if key_frames is not None and (not len(key_frames) or key_frames[0] != 0):
        raise DecodeError("segment does not start with a key frame")
    return wanted


def request_rows(wanted: np.ndarray, request: ClipRequest) -> np.ndarray | None:
    """Rows of frames decoded in `wanted` order that give `request.frames` in its order, repeats included
    (None when they are that order already)."""
    if len(wanted) == len(request.frames) and np.array_equal(wanted, request.frames):
        return None
    return np.searchsorted(wanted, np.asarray(request.frames, np.int64))


def key_runs(wanted: np.ndarray, key_frames: np.ndarray, key_positions: np.ndarray) -> list[tuple[int, int]]:
    """(decode position of the key frame to start from, last wanted frame) per run of wanted frames:
    wanted frames that share a key frame, or follow one another without a key frame between, share a run."""
    keys = np.searchsorted(key_frames, wanted, side="right") - 1
    runs: list[tuple[int, int]] = []
    for index, key in zip(wanted.tolist(), keys.tolist()):
        if not runs or key_frames[key] > runs[-1][1]:
            runs.append((int(key_positions[key]), index))
        else:
            runs[-1] = (runs[-1][0], index)
    return runs
