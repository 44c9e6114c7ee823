"""A camera's stored segments of one episode joined into one file a browser plays, without re-encoding.

Segments are closed-GOP files of one codec at one frame rate (`mmdata.codecs.video_encode`), so their
packets can follow each other in one container once each segment's timestamps are shifted to where its
first frame lies in the episode. H.264 goes into MP4 (with the index at the front, so playback starts
before the whole file has arrived), VP9 into WebM. HEVC is remuxed into MP4 for tools that take it
(Rerun); for a browser, most of which do not play it, `playable_in_browsers` re-encodes it as H.264
(the one case the page does not show the stored bytes).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av

from mmdata.errors import DecodeError
from mmdata.schema import VideoStream
from mmdata.store.handle import Store

CONTAINERS = {"h264": ("mp4", "video/mp4"), "hevc": ("mp4", "video/mp4"), "vp9": ("webm", "video/webm")}
BROWSER_CODECS = ("h264", "vp9")


@dataclass(frozen=True)
class EpisodeVideo:
    """One camera of one episode as a playable file: where it was written, its MIME type and frame count."""

    path: Path
    mime: str
    frames: int


def write_episode_video(
    store: Store, index: int, camera: str, stem: Path, playable_in_browsers: bool = False
) -> EpisodeVideo:
    """Camera `camera` of episode `index` as one playable file at `stem` + the container's suffix: the stored
    packets, remuxed (written beside as a partial file and renamed, so a failure leaves nothing half-made).
    With `playable_in_browsers`, a codec browsers do not play (HEVC) is re-encoded as H.264 instead."""
    stream = store.schema.stream(camera)
    if not isinstance(stream, VideoStream):
        raise DecodeError(f"stream '{camera}' is not a camera")
    if playable_in_browsers and stream.codec not in BROWSER_CODECS:
        return _reencoded(store, index, stream, stem)
    extension, mime = CONTAINERS[stream.codec]
    row = store.manifest.row(index)
    table = store.segment_table(row, camera)
    path = stem.with_name(f"{stem.name}.{extension}")
    partial = stem.with_name(f"{stem.name}.partial.{extension}")
    options = {"movflags": "+faststart"} if extension == "mp4" else {}
    frames = 0
    with av.open(str(partial), "w", format=extension, options=options) as output:
        target = None
        for number, (segment, piece) in enumerate(zip(table.segments, table.pieces)):
            where = f"episode '{row['key']}', camera '{camera}', segment {number}"
            try:
                with av.open(io.BytesIO(store.segment_bytes(piece))) as source:
                    video = source.streams.video[0]
                    if target is None:
                        target = output.add_stream_from_template(video)
                    shift = int(Fraction(int(segment["first_frame"])) / Fraction(stream.fps) / video.time_base)
                    for packet in source.demux(video):
                        if packet.size == 0:
                            continue
                        packet.pts = None if packet.pts is None else packet.pts + shift
                        packet.dts = None if packet.dts is None else packet.dts + shift
                        packet.stream = target
                        output.mux(packet)
                        frames += 1
            except av.error.FFmpegError as exc:
                raise DecodeError(f"{where}: does not remux: {exc}; run `mmdata verify {store.url}`") from exc
    partial.replace(path)
    return EpisodeVideo(path, mime, frames)


def _reencoded(store: Store, index: int, stream: VideoStream, stem: Path) -> EpisodeVideo:
    """The camera's frames, decoded and encoded again as H.264 in MP4 at the stream's rate (near-lossless)."""
    row = store.manifest.row(index)
    path, partial = stem.with_name(f"{stem.name}.mp4"), stem.with_name(f"{stem.name}.partial.mp4")
    table = store.segment_table(row, stream.name)
    frames = 0
    with av.open(str(partial), "w", format="mp4", options={"movflags": "+faststart"}) as output:
        target = output.add_stream("libx264", rate=Fraction(stream.fps).limit_denominator(1001))
        target.width, target.height, target.pix_fmt = stream.coded_size[0], stream.coded_size[1], "yuv420p"
        target.options = {"crf": "18", "preset": "veryfast"}
        for piece in table.pieces:
            with av.open(io.BytesIO(store.segment_bytes(piece))) as source:
                for frame in source.decode(video=0):
                    frame.pts = None
                    for packet in target.encode(frame.reformat(format="yuv420p")):
                        output.mux(packet)
                    frames += 1
        for packet in target.encode(None):
            output.mux(packet)
    partial.replace(path)
    return EpisodeVideo(path, "video/mp4", frames)
