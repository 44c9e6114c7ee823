"""Join closed-GOP segments that share stream parameters into one stream, without re-encoding.

A GPU decoder session costs milliseconds to open; decoding each small segment in its own
session leaves NVDEC idle. Segments encoded with the same parameters (codec, size, parameter
sets) are independent closed GOPs, so their packets can be muxed back to back, with shifted
timestamps, into one valid stream that one session decodes end to end.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from mmdata.codecs.decoders.packets import check_stream
from mmdata.codecs.decoders.requests import ClipRequest, frames_decoded_from_key_frames
from mmdata.codecs.packet_index import presentation_order
from mmdata.errors import DecodeError

_CONTAINERS = {"h264": "mp4", "hevc": "mp4", "av1": "mp4", "mpeg4": "mp4", "vp9": "webm", "vp8": "webm"}


@dataclass
class JoinedStream:
    """One decoder session's input: encoded bytes, the frames to take, and the requests they answer."""

    data: bytes
    frames: np.ndarray
    requests: list[int]
    frames_per_request: list[int]
    frames_decoded: int


def stream_parameters(data: bytes) -> tuple:
    """What two segments must share to be decoded by one session: codec, size, format, parameter sets."""
    with av.open(io.BytesIO(data), mode="r") as container:
        return _parameters(container.streams.video[0])


def _parameters(stream) -> tuple:
    context = stream.codec_context
    pixel_format = context.format.name if context.format is not None else None
    return (context.name, context.width, context.height, pixel_format, bytes(context.extradata or b""))


def group_by_parameters(requests: list[ClipRequest]) -> tuple[list[list[int]], dict[int, Exception]]:
    """Positions of requests grouped by stream parameters (in first-seen order), and unreadable ones.

    Segments of one stored stream share their parameters (one encoder configuration per camera),
    so a request that names its stream is grouped by it without opening its bytes; `join_segments`
    still checks that the parameters agree.
    """
    groups: dict[tuple, list[int]] = {}
    failed: dict[int, Exception] = {}
    for position, request in enumerate(requests):
        if request.where is not None:
            key: tuple = ("stream", request.codec, request.where.stream)
        else:
            try:
                key = stream_parameters(request.data)
            except (av.error.FFmpegError, IndexError) as exc:
                failed[position] = exc
                continue
        groups.setdefault(key, []).append(position)
    return list(groups.values()), failed


def join_segments(requests: list[ClipRequest], positions: list[int]) -> JoinedStream:
    """Mux the segments of `requests[positions]` into one stream; frames index into the joined stream.

    Only the closed GOPs that hold a requested frame are kept (a GOP references nothing outside
    itself), and of each only the packets up to its last wanted frame (see `_needed_prefix`), so
    the session decodes from the key frame before each wanted frame to the last one wanted.
    Timestamps are rewritten to run on without gaps.
    """
    first = requests[positions[0]]
    container_format = _CONTAINERS.get(first.codec)
    if container_format is None:
        raise DecodeError(f"cannot join {first.codec} segments into one stream")
    buffer = io.BytesIO()
    frames: list[np.ndarray] = []
    kept_frames = 0
    clock = 0
    with av.open(buffer, "w", format=container_format) as out:
        out_stream, parameters = None, None
        for position in positions:
            request = requests[position]
            with av.open(io.BytesIO(request.data), mode="r") as container:
                stream = container.streams.video[0]
                check_stream(stream.codec_context, request)
                if out_stream is None:
                    out_stream, parameters = out.add_stream_from_template(stream), _parameters(stream)
                elif _parameters(stream) != parameters:
                    raise DecodeError(f"{request.place()}: encoded with other parameters than the segments beside it")
                packets = [packet for packet in container.demux(stream) if packet.dts is not None]
                order = presentation_order(packets)
                if request.frames and max(request.frames) >= len(packets):
                    last = max(request.frames)
                    raise DecodeError(f"{request.place()}: segment has {len(packets)} frames; frame {last} requested")
                wanted = set(request.frames)
                new_index: dict[int, int] = {}
                for whole_gop in _closed_gops(packets):
                    gop = _needed_prefix(whole_gop, order, wanted)
                    if not gop:
                        continue
                    shown = sorted(order[packet.pts] for packet in gop)
                    first_pts = min(packet.pts for packet in gop)
                    end_pts = max(packet.pts + (packet.duration or 1) for packet in gop)
                    shift = clock - first_pts
                    for packet in gop:
                        packet.pts += shift
                        packet.dts += shift
                        packet.stream = out_stream
                        out.mux(packet)
                    clock += end_pts - first_pts
                    for index in shown:
                        new_index[index] = kept_frames
                        kept_frames += 1
            frames.append(np.asarray([new_index[i] for i in request.frames], dtype=np.int32))
    return JoinedStream(
        data=buffer.getvalue(),
        frames=np.concatenate(frames) if frames else np.empty(0, np.int32),
        requests=list(positions),
        frames_per_request=[len(requests[p].frames) for p in positions],
        frames_decoded=kept_frames,
    )


def _closed_gops(packets: list) -> list[list]:
    """Packets in decode order, cut before every key frame."""
    gops: list[list] = []
    for packet in packets:
        if packet.is_keyframe or not gops:
            gops.append([])
        gops[-1].append(packet)
    return gops


def _needed_prefix(gop: list, order: dict[int, int], wanted: set[int]) -> list:
    """The shortest decode-order prefix of a closed GOP that holds every wanted frame in it and
    shows a gapless run of frames from the GOP's first (empty when it holds no wanted frame).

    A frame references only packets before it in decode order, so the packets after the last
    wanted one are not needed; with B-frames the cut waits until the frames shown so far leave
    no hole, so the joined stream's frames still run on without gaps.
    """
    shown = [order[packet.pts] for packet in gop]
    missing = len(wanted.intersection(shown))
    if not missing:
        return []
    first, latest = min(shown), -1
    for count, index in enumerate(shown, start=1):
        missing -= index in wanted
        latest = max(latest, index)
        if not missing and latest - first + 1 == count:
            return gop[:count]
    return gop


def lone_segment(requests: list[ClipRequest], position: int) -> JoinedStream:
    """One request's segment as a session of its own (no joining)."""
    request = requests[position]
    return JoinedStream(
        data=request.data,
        frames=np.asarray(request.frames, dtype=np.int32),
        requests=[position],
        frames_per_request=[len(request.frames)],
        frames_decoded=frames_decoded_from_key_frames(request.frames, request.gop),
    )
