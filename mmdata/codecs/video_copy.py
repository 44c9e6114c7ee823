"""A recording's video packets cut into a store's segments at key frames, without re-encoding a frame
(`mmdata convert --video-codec copy`).

A segment starts at a key frame and holds whole key-frame intervals up to `segment_frames` frames. Its
packets are muxed into the store's container for the codec (MP4, or WebM for VP9) stamped as the store's
own segments are: frame 0, 1, 2, ... in units of 1 / fps in presentation order (decode stamps kept in
order below them), so readers find every segment alike whatever made it. The frames' own times (from
the container) are returned for the manifest. A source whose frames after a key frame are shown before it
(open GOPs), whose key frames lie further apart than a segment may hold, whose frames change size part-way
(`frame_sizes`) or whose packets carry no presentation time is refused, naming what was found.

Packets carried one frame each outside a container (robot logs' `foxglove.CompressedVideo`: Annex B H.264
and H.265, VP9 frames, AV1 temporal units) are copied too (`copy_packets`): laid end to end as the codec's
elementary stream (IVF for VP9 and AV1), they go through FFmpeg's demuxer and parser for that stream,
which find the key frames. They come in decode order without presentation times, so an H.264 or HEVC stream
whose sequence parameter sets allow B-frames is decoded once to learn the order its frames are shown in
(`parameter_sets`): each frame is stored at its place in that order, and the caller gives it the time of the
message that carried it. The MP4 muxer turns Annex B and temporal units into MP4 samples, so those segments'
packet indexes are found by demuxing each segment.
"""

from __future__ import annotations

import io
import os
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np

from mmdata.codecs.frame_sizes import first_size_change
from mmdata.codecs.packet_index import PacketIndex, index_segment, located
from mmdata.codecs.parameter_sets import config_units, length_size, may_reorder, sequence_units
from mmdata.codecs.video_encode import SEGMENT_SUFFIXES
from mmdata.errors import CopyError, DecodeError

COPIED_CODECS = tuple(SEGMENT_SUFFIXES)  # every codec a store's segments hold, in the container they use


@dataclass
class CopiedVideo:
    """A camera's segments made from its recording's packets (with their packet indexes, known from the
    muxing), and what the cutting found."""

    codec: str
    width: int
    height: int
    fps: Fraction
    segments: list[bytes] = field(default_factory=list)
    segment_frames: list[int] = field(default_factory=list)
    indexes: list[PacketIndex] = field(default_factory=list)
    timestamps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    key_interval: int = 0  # the most frames from one key frame to the next
    shown: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each frame's packet, in shown order


@dataclass(frozen=True)
class _Packet:
    data: bytes
    pts: int
    dts: int | None
    key: bool


def copy_segments(path: str, segment_frames: int, start: float | None = None, end: float | None = None) -> CopiedVideo:
    """The video of `path` (its frames shown in [start, end) seconds, times then counted from `start`) as
    segments of at most `segment_frames` frames cut at key frames; CopyError when it cannot be."""
    try:
        with _recording(path) as container:
            if not container.streams.video:
                raise CopyError("it holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            if not rate:
                raise CopyError("it declares no frame rate")
            fps = Fraction(rate)
            slack = 0.5 / float(fps)
            codec = stream.codec_context.name
            if codec == "libdav1d":
                codec = "av1"
            if codec not in COPIED_CODECS:
                raise CopyError(
                    f"its video is {codec}; --video-codec copy keeps {', '.join(COPIED_CODECS)} as they are"
                    " (re-encode it with --video-codec h264)"
                )
            base = stream.time_base
            if base is None:
                raise CopyError("its video stream declares no time base")
            container.seek(int((start or 0.0) / base) if base else 0, stream=stream, backward=True)
            seconds_per_tick = float(base)
            packets = []
            for packet in container.demux(stream):
                if not packet.size:
                    continue
                if packet.pts is None:
                    raise CopyError(
                        "a packet of its video carries no presentation time, so the frame it shows cannot be placed;"
                        " re-encode it (--video-codec h264)"
                    )
                seconds = packet.pts * seconds_per_tick
                if start is not None and seconds < start - slack:
                    continue
                if end is not None and seconds >= end - slack:
                    if packet.is_keyframe:
                        break
                    continue
                packets.append(_Packet(bytes(packet), int(packet.pts), packet.dts, bool(packet.is_keyframe)))
            copied = CopiedVideo(codec, stream.codec_context.width, stream.codec_context.height, fps)
            _refuse_size_changes(stream, packets, copied)
            _cut(stream, packets, fps, segment_frames, copied)
    except av.error.FFmpegError as exc:
        raise CopyError(f"its packets cannot be read: {exc}") from exc
    times = np.sort(np.array([p.pts for p in packets], np.int64)) * seconds_per_tick - (start or 0.0)
    copied.timestamps = times
    return copied


# How packets carried one frame each are laid end to end for FFmpeg to parse: the demuxer, and for IVF the
# header's codec tag (H.264 and H.265 are Annex B byte streams already).
_ELEMENTARY_STREAMS = {"h264": ("h264", b""), "hevc": ("hevc", b""), "vp9": ("ivf", b"VP90"), "av1": ("ivf", b"AV01")}


def copy_packets(codec: str, payloads: Sequence[bytes], fps: Fraction, segment_frames: int) -> CopiedVideo:
    """Video packets of one frame each, in decode order (`codec` one of COPIED_CODECS: Annex B H.264 / H.265, VP9
    frames, AV1 temporal units), cut into segments of at most `segment_frames` frames at the key frames FFmpeg's
    parser finds; CopyError when they cannot be. `shown` gives the packet of each frame in the order frames are
    shown (H.264 and HEVC with B-frames show them in another order than they come); the caller sets
    `timestamps`, one per frame in that order."""
    if codec not in _ELEMENTARY_STREAMS:
        raise CopyError(f"its video is {codec}; --video-codec copy keeps {', '.join(COPIED_CODECS)} as they are")
    demuxer, tag = _ELEMENTARY_STREAMS[codec]
    data = _ivf(tag, payloads) if demuxer == "ivf" else b"".join(payloads)
    try:
        with av.open(io.BytesIO(data), format=demuxer, mode="r") as container:
            stream = container.streams.video[0]
            found = [p for p in container.demux(stream) if p.size]
            if [p.size for p in found] != [len(p) for p in payloads]:
                raise CopyError(
                    f"FFmpeg's {codec} parser finds {len(found)} frames in its {len(payloads)} packets, which"
                    " should hold one frame each; re-encode it (--video-codec h264)"
                )
            if found:
                _require_key_frame_first(bool(found[0].is_keyframe))
            shown = _shown_positions(stream.codec_context, codec, [(bytes(p), bool(p.is_keyframe)) for p in found])
            rank = np.empty(len(found), np.int64)
            rank[shown] = np.arange(len(found))
            packets = [_Packet(bytes(p), int(rank[n]), n, bool(p.is_keyframe)) for n, p in enumerate(found)]
            copied = CopiedVideo(codec, stream.codec_context.width, stream.codec_context.height, fps, shown=shown)
            _refuse_size_changes(stream, packets, copied)
            # MP4 holds length-prefixed samples without temporal delimiters: its muxer rewrites these packets
            _cut(stream, packets, fps, segment_frames, copied, rewritten=SEGMENT_SUFFIXES[codec] == "mp4")
    except av.error.FFmpegError as exc:
        raise CopyError(f"its {codec} packets cannot be parsed: {exc}") from exc
    return copied


def _shown_positions(template: av.VideoCodecContext, codec: str, packets: list[tuple[bytes, bool]]) -> np.ndarray:
    """The position of the packet of each frame, in the order the decoder shows them: the order they come unless
    the stream's sequence parameter sets allow B-frames (VP9 and AV1 show each packet's frame as it comes), and
    then found by decoding (each packet numbered, the frames come out in presentation order carrying their
    number)."""
    if codec not in ("h264", "hevc"):
        return np.arange(len(packets))
    config = bytes(template.extradata or b"")
    try:
        prefix = length_size(codec, config)
        units = [
            *config_units(codec, config),
            *(unit for data, key in packets if key for unit in sequence_units(codec, data, prefix)),
        ]
    except DecodeError:
        units = []  # (parameter sets that cannot be found: decode to learn the order)
    if units and not any(may_reorder(codec, unit) for unit in units):
        return np.arange(len(packets))
    payloads = [data for data, _ in packets]
    context = av.CodecContext.create(template.name, "r")
    assert isinstance(context, av.VideoCodecContext)
    if template.extradata:
        context.extradata = template.extradata
    context.thread_count = 1
    context.options = {"skip_loop_filter": "all"}  # the order is all that is read
    shown: list[int] = []
    for position, payload in enumerate([*payloads, None]):
        packet = None
        if payload is not None:
            packet = av.Packet(payload)
            packet.pts = packet.dts = position
        try:
            shown.extend(-1 if frame.pts is None else frame.pts for frame in context.decode(packet))
        except av.error.FFmpegError as exc:
            raise CopyError(
                f"its packet {position} does not decode ({exc}); re-encode it (--video-codec h264)"
            ) from exc
    if sorted(shown) != list(range(len(payloads))):
        raise CopyError(
            f"its {len(payloads)} packets decode to {len(shown)} frames in an order that does not show each once;"
            " re-encode it (--video-codec h264)"
        )
    return np.asarray(shown, np.int64)


def _refuse_size_changes(stream: av.video.stream.VideoStream, packets: list[_Packet], copied: CopiedVideo) -> None:
    """CopyError when a frame is not the stream's size (a store's camera has one size)."""
    context = stream.codec_context
    config = bytes(context.extradata or b"")
    try:
        change = first_size_change(
            copied.codec, config, [(p.data, p.key) for p in packets], (copied.width, copied.height), context.name
        )
    except DecodeError as exc:
        raise CopyError(f"its frame headers cannot be read ({exc}); re-encode it (--video-codec h264)") from exc
    if change is not None:
        width, height = change.size
        raise CopyError(
            f"its frames change size at packet {change.position} of the episode, from {copied.width}x{copied.height}"
            f" to {width}x{height}; a camera's frames have one size: re-encode the recording at one size"
            " (ffmpeg -vf scale=W:H), or split it where the size changes"
        )


def _ivf(tag: bytes, payloads: Sequence[bytes]) -> bytes:
    """Frames in an IVF file (a 32-byte header, then each frame's size and number before it); the size the
    header gives is left 0 for the parser to find."""
    header = b"DKIF" + struct.pack("<HH4sHHIII", 0, 32, tag, 0, 0, 1, 1, len(payloads)) + bytes(4)
    return header + b"".join(struct.pack("<IQ", len(p), number) + p for number, p in enumerate(payloads))


def _cut(
    stream, packets: list[_Packet], fps: Fraction, segment_frames: int, copied: CopiedVideo, rewritten: bool = False
) -> None:
    """Segments of `packets` into `copied`; `rewritten`: the muxer rewrites the packets (Annex B and temporal
    units become MP4 samples), so each segment's packet index is found by demuxing it."""
    if not packets:
        return
    _require_key_frame_first(packets[0].key)
    groups = list(_key_frame_groups(packets))
    copied.key_interval = max(len(group) for group in groups)
    if copied.key_interval > segment_frames:
        raise CopyError(
            f"key frames lie up to {copied.key_interval} frames apart, more than a segment of"
            f" {segment_frames} frames may hold; pass --segment-frames {copied.key_interval} or more (at most 4096),"
            " or re-encode (--video-codec h264)"
        )
    segment: list[_Packet] = []
    for group in [*groups, []]:
        if segment and (not group or len(segment) + len(group) > segment_frames):
            data, index = _muxed(stream, copied.codec, segment, fps, rewritten)
            copied.segments.append(data)
            copied.indexes.append(index)
            copied.segment_frames.append(len(segment))
            segment = []
        segment += group


def _require_key_frame_first(key: bool) -> None:
    if not key:
        raise CopyError(
            "its first frame (in the episode) is not a key frame, so no segment can"
            " start there without decoding; re-encode it (--video-codec h264)"
        )


def _key_frame_groups(packets: list[_Packet]) -> Iterator[list[_Packet]]:
    """Packets in decode order, grouped from each key frame to the next."""
    group: list[_Packet] = []
    for packet in packets:
        if packet.key and group:
            yield group
            group = []
        group.append(packet)
    yield group


def _muxed(
    template, codec: str, packets: list[_Packet], fps: Fraction, rewritten: bool = False
) -> tuple[bytes, PacketIndex]:
    """One segment file of `packets` (decode order), stamped 0, 1, 2, ... / fps in presentation order, and its
    packet index (each payload found in the file's bytes, as `packet_index.index_segment` finds them; found by
    demuxing the file when the muxer `rewritten` them)."""
    first_shown = min(p.pts for p in packets)
    if packets[0].pts != first_shown:
        raise CopyError(
            f"frames after the key frame at {packets[0].pts} are shown before it (an open GOP), so segments"
            " cut there would not decode on their own; re-encode it (--video-codec h264)"
        )
    rank = {pts: number for number, pts in enumerate(sorted(p.pts for p in packets))}
    delay = max(position - rank[p.pts] for position, p in enumerate(packets))
    buffer = io.BytesIO()
    time_base = 1 / Fraction(fps)
    with av.open(buffer, "w", format=SEGMENT_SUFFIXES[codec], options=_BITEXACT) as output:
        stream = output.add_stream_from_template(template, opaque=True)
        stream.time_base = time_base
        for position, source in enumerate(packets):
            packet = av.Packet(source.data)
            packet.pts = rank[source.pts]
            packet.dts = position - delay
            packet.duration = 1  # (a last sample without a duration is cut off by the MP4 edit list)
            packet.time_base = time_base
            packet.is_keyframe = source.key
            packet.stream = stream
            output.mux(packet)
        config = bytes(stream.codec_context.extradata or b"")
    data = buffer.getvalue()
    try:
        if rewritten:
            return data, index_segment(data)
        index = located(
            config, data, [p.data for p in packets], [rank[p.pts] for p in packets], [p.key for p in packets]
        )
    except DecodeError as exc:
        raise CopyError(f"the muxer did not store the packets as they came ({exc})") from exc
    return data, index


@contextmanager
def _recording(path: str) -> Iterator[av.container.InputContainer]:
    """`path` opened for demuxing, kept open for the next call on the same file (the episodes of a LeRobot
    video file are read one after another, and opening it parses the index of all of them again)."""
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    container = _OPEN.pop(key, None)
    if container is None:
        container = av.open(path, mode="r")
    try:
        yield container
    except BaseException:
        container.close()
        raise
    _OPEN[key] = container
    while len(_OPEN) > _KEPT_OPEN:
        _OPEN.popitem(last=False)[1].close()


_KEPT_OPEN = 4
_OPEN: OrderedDict[tuple, av.container.InputContainer] = OrderedDict()


_BITEXACT = {"fflags": "+bitexact"}
