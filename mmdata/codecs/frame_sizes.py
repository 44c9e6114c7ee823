"""The sizes of the frames a stream's packets show, found without decoding every frame.

A copied video (`--video-codec copy`) keeps its packets as recorded, and a store's camera has one frame size,
so a recording whose frames change size part-way (a new H.264 / HEVC sequence parameter set, a new AV1 sequence
header, a VP9 frame of another size) must be found before its packets are stored. Sizes change only where the
stream says so, and that is cheap to find: VP9 frame headers give each frame's size in their first bytes (or
name the reference frame whose size it keeps); H.264, HEVC and AV1 announce a new size in a parameter set before
a key frame, and the key frame of each parameter set not seen before is decoded alone to learn its size (once
per process: the parameter sets of one recorder repeat from episode to episode).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import av

from mmdata.codecs.parameter_sets import Bits, config_units, length_size, sequence_units
from mmdata.errors import DecodeError

FrameSize = tuple[int, int]  # (width, height)

_KEPT_SIZES = 256
_SIZES_OF_PARAMETER_SETS: OrderedDict[tuple[str, bytes], FrameSize] = OrderedDict()


@dataclass(frozen=True)
class SizeChange:
    """The first frame of another size than the stream's: the packet that shows it (decode position) and its size."""

    position: int
    size: FrameSize


def first_size_change(
    codec: str, config: bytes, packets: Sequence[tuple[bytes, bool]], size: FrameSize, decoder: str
) -> SizeChange | None:
    """The first packet (of `packets`: payload and key flag, in decode order) whose frame is not `size`, or None.

    `config` is the stream's codec configuration (FFmpeg's extradata) and `decoder` the FFmpeg decoder that reads
    it. Raises DecodeError when a header cannot be read."""
    if codec == "vp9":
        return _vp9_size_change(packets, size)
    if codec not in ("h264", "hevc", "av1"):
        return None
    prefix = length_size(codec, config)
    known = dict.fromkeys(config_units(codec, config), size)
    for position, (payload, key) in enumerate(packets):
        if not key:
            continue
        for unit in sequence_units(codec, payload, prefix):
            found = known.get(unit)
            if found is None:
                found = known[unit] = _size_of_parameter_set(codec, unit, config, payload, decoder)
            if found != size:
                return SizeChange(position, found)
    return None


def _size_of_parameter_set(codec: str, unit: bytes, config: bytes, payload: bytes, decoder: str) -> FrameSize:
    """The size of the frames a parameter set declares: its key frame (`payload`) decoded alone."""
    key = (codec, unit)
    if key in _SIZES_OF_PARAMETER_SETS:
        _SIZES_OF_PARAMETER_SETS.move_to_end(key)
        return _SIZES_OF_PARAMETER_SETS[key]
    context = av.CodecContext.create(decoder, "r")
    assert isinstance(context, av.VideoCodecContext)
    context.thread_count = 1  # (a dav1d context closed with frames in its threads hangs the next one)
    if config:
        context.extradata = config
    try:
        frames = [*context.decode(av.Packet(payload)), *context.decode(None)]
    except av.error.FFmpegError as exc:
        raise DecodeError(f"a key frame with new {codec} parameters does not decode: {exc}") from exc
    if not frames:
        raise DecodeError(f"a key frame with new {codec} parameters decodes to no frame")
    size = (frames[0].width, frames[0].height)
    _SIZES_OF_PARAMETER_SETS[key] = size
    while len(_SIZES_OF_PARAMETER_SETS) > _KEPT_SIZES:
        _SIZES_OF_PARAMETER_SETS.popitem(last=False)
    return size


def _vp9_frames(payload: bytes) -> list[bytes]:
    """The frames of a VP9 packet: one, or those a superframe index lists."""
    if not payload:
        return []
    marker = payload[-1]
    if marker & 0xE0 == 0xC0:
        count, width = (marker & 7) + 1, ((marker >> 3) & 3) + 1
        index = 2 + width * count
        if len(payload) >= index and payload[-index] == marker:
            frames, position = [], 0
            for number in range(count):
                at = len(payload) - index + 1 + number * width
                size = int.from_bytes(payload[at : at + width], "little")
                frames.append(payload[position : position + size])
                position += size
            return frames
    return [payload]


def _vp9_size_change(packets: Sequence[tuple[bytes, bool]], size: FrameSize) -> SizeChange | None:
    """Each VP9 frame's size from its uncompressed header (VP9 bitstream specification, 6.2): key and intra-only
    frames state it; an inter frame keeps the size of a reference frame it names, or states its own. The eight
    reference slots are followed to know the sizes inter frames keep."""
    slots: list[FrameSize | None] = [None] * 8
    for position, (payload, _) in enumerate(packets):
        for frame in _vp9_frames(payload):
            shown, frame_size = _vp9_frame(Bits(frame), slots)
            if shown and frame_size is not None and frame_size != size:
                return SizeChange(position, frame_size)
    return None


def _vp9_frame(bits: Bits, slots: list[FrameSize | None]) -> tuple[bool, FrameSize | None]:
    """(whether the frame is shown, its size) of one VP9 frame; `slots` updated with the frames it refreshes."""
    if bits.read(2) != 2:
        raise DecodeError("a VP9 frame does not start with its frame marker")
    profile = bits.read(1) | (bits.read(1) << 1)
    if profile == 3:
        bits.read(1)
    if bits.read(1):  # show_existing_frame
        return True, slots[bits.read(3)]
    key = bits.read(1) == 0
    shown = bits.read(1) == 1
    error_resilient = bits.read(1) == 1
    if key:
        _vp9_sync_and_colour(bits, profile)
        size = (bits.read(16) + 1, bits.read(16) + 1)
        slots[:] = [size] * 8
        return shown, size
    intra_only = not shown and bits.read(1) == 1
    if not error_resilient:
        bits.read(2)  # reset_frame_context
    if intra_only:
        if profile > 0:
            _vp9_sync_and_colour(bits, profile)
        else:
            _vp9_sync(bits)
        refresh = bits.read(8)
        frame_size: tuple[int, int] | None = (bits.read(16) + 1, bits.read(16) + 1)
    else:
        refresh = bits.read(8)
        references = []
        for _ in range(3):
            references.append(bits.read(3))
            bits.read(1)  # sign bias
        frame_size = None
        for reference in references:
            if bits.read(1):  # found_ref: the size of that reference frame
                frame_size = slots[reference]
                break
        else:
            frame_size = (bits.read(16) + 1, bits.read(16) + 1)
    for slot in range(8):
        if refresh >> slot & 1:
            slots[slot] = frame_size
    return shown, frame_size


def _vp9_sync(bits: Bits) -> None:
    if bits.read(24) != 0x498342:
        raise DecodeError("a VP9 key frame lacks its sync code")


def _vp9_sync_and_colour(bits: Bits, profile: int) -> None:
    _vp9_sync(bits)
    if profile >= 2:
        bits.read(1)  # ten_or_twelve_bit
    if bits.read(3) != 7:  # colour space other than RGB
        bits.read(1)  # colour range
        if profile in (1, 3):
            bits.read(3)  # subsampling x and y, reserved
    elif profile in (1, 3):
        bits.read(1)
