"""A camera's stored segments of one episode joined into one file a browser (or LeRobot) plays, without
re-encoding.

Segments are closed-GOP files of one codec at one frame rate (`mmdata.codecs.video_encode`), so their
packets can follow each other in one container once each segment's timestamps are shifted to where its
first frame lies in the episode. H.264 goes into MP4 (with the index at the front, so playback starts
before the whole file has arrived), VP9 into WebM. HEVC is remuxed into MP4 for tools that take it
(Rerun); for a browser, most of which do not play it, `playable_in_browsers` re-encodes it as H.264
(the one case the page does not show the stored bytes).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av

from mmdata.codecs.video_encode import VideoEncoding, encode_segments
from mmdata.errors import DecodeError, StoreError
from mmdata.schema import VideoStream
from mmdata.store.filesystem import replacing_by_name, write_bytes_atomically
from mmdata.store.handle import Store
from mmdata.store.manifest import Piece

CONTAINERS = {
    "h264": ("mp4", "video/mp4"),
    "hevc": ("mp4", "video/mp4"),
    "av1": ("mp4", "video/mp4"),
    "vp9": ("webm", "video/webm"),
}
BROWSER_CODECS = ("h264", "vp9")


@dataclass(frozen=True)
class EpisodeVideo:
    """One camera of one episode as a playable file: where it was written, its MIME type and frame count."""

    path: Path
    mime: str
    frames: int


def write_episode_video(
    store: Store, index: int, camera: str, stem: Path, playable_in_browsers: bool = False, container: str | None = None
) -> EpisodeVideo:
    """Camera `camera` of episode `index` as one playable file at `stem` + the container's suffix: the stored
    packets, remuxed (written beside as a partial file and renamed, so a failure leaves nothing half-made).
    With `playable_in_browsers`, a codec browsers do not play (HEVC) is re-encoded as H.264 instead.
    `container` ("mp4", "webm") overrides the codec's usual one (`CONTAINERS`)."""
    stream = store.schema.stream(camera)
    if not isinstance(stream, VideoStream):
        raise DecodeError(f"stream '{camera}' is not a camera")
    if playable_in_browsers and stream.codec not in BROWSER_CODECS:
        return _reencoded(store, index, stream, stem)
    if container is None and stream.codec not in CONTAINERS:
        raise DecodeError(f"camera '{camera}': {stream.codec} has no container to remux it into; re-encode it")
    extension, mime = (container, f"video/{container}") if container else CONTAINERS[stream.codec]
    row = store.manifest.row(index)
    table = store.segment_table(row, camera)
    path = stem.with_name(f"{stem.name}.{extension}")
    options = {"movflags": "+faststart"} if extension == "mp4" else {}
    frames = 0
    with replacing_by_name(path) as partial, av.open(partial, "w", format=extension, options=options) as output:
        target = None
        for number, (segment, piece) in enumerate(zip(table.segments, table.pieces)):
            where = f"episode '{row['key']}', camera '{camera}', segment {number}"
            try:
                with av.open(io.BytesIO(store.segment_bytes(piece)), mode="r") as source:
                    video = source.streams.video[0]
                    if video.time_base is None:
                        raise StoreError(f"{where}: the segment's video declares no time base; convert the store again")
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
    return EpisodeVideo(path, mime, frames)


def _reencoded(store: Store, index: int, stream: VideoStream, stem: Path) -> EpisodeVideo:
    """The camera's frames, decoded and encoded again as one H.264 MP4 by the store's own encoder (crf 18)."""
    row = store.manifest.row(index)
    count = max(1, int(row[f"{stream.name}/count"]))
    encoding = VideoEncoding("h264", segment_frames=count, gop=min(8, count), crf=18)
    pieces = store.segment_table(row, stream.name).pieces
    frames = (frame for piece in pieces for frame in _decoded(store, piece))
    width, height = stream.coded_size
    files = list(encode_segments(frames, Fraction(stream.fps).limit_denominator(1001), width, height, encoding))
    if len(files) != 1:
        raise DecodeError(
            f"episode '{row['key']}', camera '{stream.name}': its segments hold more frames than the manifest's"
            f" {count}; run `mmdata verify {store.url}`"
        )
    ((written, data),) = files
    path = stem.with_name(f"{stem.name}.mp4")
    write_bytes_atomically(str(path), [data])
    return EpisodeVideo(path, "video/mp4", written)


def _decoded(store: Store, piece: Piece) -> Iterator[av.VideoFrame]:
    with av.open(io.BytesIO(store.segment_bytes(piece)), mode="r") as source:
        yield from source.decode(video=0)
