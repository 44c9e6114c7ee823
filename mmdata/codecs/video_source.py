"""Read recorded video files of any codec PyAV knows, frame by frame, with their timestamps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av

from mmdata.errors import DecodeError


@dataclass(frozen=True)
class VideoInfo:
    """What a recording's container says about its first video stream."""

    width: int
    height: int
    fps: Fraction
    codec: str


def probe_video(path: str) -> VideoInfo:
    """Width, height, nominal frame rate and codec of a video file."""
    try:
        with av.open(path, mode="r") as container:
            if not container.streams.video:
                raise DecodeError(f"{path} holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            if not rate:
                raise DecodeError(f"{path} declares no frame rate")
            return VideoInfo(
                stream.codec_context.width,
                stream.codec_context.height,
                Fraction(rate),
                stream.codec_context.name,
            )
    except av.error.FFmpegError as exc:
        raise DecodeError(f"{path} cannot be opened as video: {exc}") from exc


def iter_video_frames(
    path: str, fps: Fraction, start: float | None = None, end: float | None = None
) -> Iterator[tuple[av.VideoFrame, float]]:
    """Decoded frames in presentation order with their timestamps in seconds.

    Timestamps come from the container; a frame without one gets index / fps. With `start` /
    `end`, only the frames whose time lies in [start, end) (half a frame period of slack), with
    times counted from `start`; the decoder seeks to the key frame before `start`.
    """
    slack = 0.5 / float(fps)
    try:
        with av.open(path, mode="r") as container:
            stream = container.streams.video[0]
            context = stream.codec_context
            if context.width and context.height:
                # frames may not grow past what the container declares (an in-band size change)
                context.options = {**context.options, "max_pixels": str((context.width + 256) * (context.height + 256))}
            if start and stream.time_base:
                container.seek(int(start / stream.time_base), stream=stream, backward=True)
            for index, frame in enumerate(container.decode(stream)):
                timestamp = float(frame.time if frame.time is not None else index / fps)
                if start is not None and timestamp < start - slack:
                    continue
                if end is not None and timestamp >= end - slack:
                    break
                yield frame, timestamp - (start or 0.0)
    except av.error.FFmpegError as exc:
        raise DecodeError(f"{path} does not decode: {exc}") from exc
