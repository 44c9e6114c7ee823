"""What the messages of a robot log mean: their time, their numeric fields, their pictures.

Messages come decoded by the MCAP library's ROS 2 (CDR), ROS 1 or protobuf decoders as plain objects with
attributes; this module reads them by duck typing and by schema name, with no ROS installation:

- time: `header.stamp` (ROS 2: `sec` + `nanosec`; ROS 1: `secs` + `nsecs`) or `timestamp` (Foxglove:
  `seconds` + `nanos`);
- numbers: a field path such as `position` or `linear.x`, a number or a list of numbers;
- pictures: `sensor_msgs/CompressedImage` and `foxglove.CompressedImage` (JPEG/PNG), `sensor_msgs/Image`
  and `foxglove.RawImage` (8-bit RGB/BGR/RGBA/BGRA/mono), and `foxglove.CompressedVideo` packets
  (H.264, H.265, VP9, AV1; one frame per message, as Foxglove specifies), decoded with PyAV.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import av
import numpy as np

from mmdata.errors import MessageError
from mmdata.importers.arrays import decode_image

COMPRESSED_IMAGES = ("sensor_msgs/msg/CompressedImage", "sensor_msgs/CompressedImage", "foxglove.CompressedImage")
RAW_IMAGES = ("sensor_msgs/msg/Image", "sensor_msgs/Image", "foxglove.RawImage")
VIDEO_PACKETS = ("foxglove.CompressedVideo",)
PICTURE_SCHEMAS = COMPRESSED_IMAGES + RAW_IMAGES + VIDEO_PACKETS
VIDEO_FORMATS = {"h264": "h264", "h265": "hevc", "hevc": "hevc", "vp9": "vp9", "av1": "libdav1d"}  # -> decoder
STORED_CODECS = {"h264": "h264", "h265": "hevc", "hevc": "hevc", "vp9": "vp9", "av1": "av1"}  # -> a store's codec
_RAW_LAYOUTS = {"rgb8": (3, None), "bgr8": (3, [2, 1, 0]), "rgba8": (4, [0, 1, 2]), "bgra8": (4, [2, 1, 0])}
_GREY = ("mono8", "8UC1")


def schema_kind(schema_name: str) -> str:
    """ "compressed", "raw" or "video" for a picture schema, else "other"."""
    bare = schema_name.replace("foxglove_msgs/msg/", "foxglove.")
    if bare in COMPRESSED_IMAGES:
        return "compressed"
    if bare in RAW_IMAGES:
        return "raw"
    if bare in VIDEO_PACKETS:
        return "video"
    return "other"


def stamp_ns(message: Any) -> int | None:
    """The message's own time in nanoseconds (header stamp, or Foxglove `timestamp`); None without one."""
    header = getattr(message, "header", None)
    stamp = getattr(header, "stamp", None) if header is not None else getattr(message, "timestamp", None)
    if stamp is None:
        return None
    if hasattr(stamp, "nanosec"):
        return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
    if hasattr(stamp, "nsecs"):  # ROS 1
        return int(stamp.secs) * 1_000_000_000 + int(stamp.nsecs)
    if hasattr(stamp, "nanos"):
        return int(stamp.seconds) * 1_000_000_000 + int(stamp.nanos)
    return None


def field_value(message: Any, path: str) -> Any:
    """The value at a dotted field path (`position`, `linear.x`, `pose.position.z`)."""
    value = message
    for part in path.split("."):
        if not hasattr(value, part):
            held = sorted(k for k in getattr(value, "__slots__", ()) or vars(value) if not k.startswith("_"))
            raise MessageError(f"has no field '{path}' (at '{part}'; it holds {held})")
        value = getattr(value, part)
    return value


def numbers(message: Any, fields: tuple[str, ...]) -> np.ndarray:
    """The fields' numbers, concatenated into one row: float64, or int64 when every one is an integer."""
    parts = []
    for path in fields:
        value = field_value(message, path)
        if isinstance(value, (bytes, bytearray)):
            value = np.frombuffer(value, dtype=np.uint8)
        array = np.asarray(value)
        if array.dtype.kind not in "biuf" or array.ndim > 1:
            raise MessageError(f"field '{path}' holds {type(value).__name__} {str(value)[:60]!r}, not numbers")
        parts.append(array.reshape(-1))
    row = np.concatenate(parts) if parts else np.zeros(0)
    return row.astype(np.int64 if row.dtype.kind in "biu" else np.float64)


def text(message: Any, path: str) -> str:
    value = field_value(message, path)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise MessageError(f"field '{path}' holds {type(value).__name__}, not text")
    return value


_DEPTH_MARKS = ("compresseddepth", "16uc1", "32fc1", "16sc1", "mono16", "16u", "32f")


def picture_problem(message: Any, kind: str) -> str | None:
    """Why a picture topic's message is not an 8-bit colour or grey picture mmdata stores as a camera (a depth
    image, a 16-bit or float encoding, an unknown video format), or None when it is one."""
    if kind == "raw":
        encoding = str(getattr(message, "encoding", "")).lower()
        known = encoding in _RAW_LAYOUTS or encoding in _GREY or encoding.upper() in _GREY
        return None if known else f"raw encoding '{encoding}'"
    if kind == "compressed":
        form = str(getattr(message, "format", "")).lower()
        return f"format '{form}' (depth)" if any(mark in form for mark in _DEPTH_MARKS) else None
    if kind == "video":
        form = str(getattr(message, "format", "")).lower()
        return None if form in VIDEO_FORMATS else f"video format '{form}'"
    return f"{kind} messages"


def picture(message: Any, kind: str, where: str, episode: str) -> np.ndarray:
    """The RGB image of an image message (`kind` from `schema_kind`): uint8 [H, W, 3]."""
    if kind == "compressed":
        return decode_image(bytes(message.data), episode, where)
    if kind == "raw":
        return _raw_image(message)
    raise MessageError(f"a {kind} message is not one picture")


def _raw_image(message: Any) -> np.ndarray:
    encoding = str(message.encoding).lower()
    height, width, step = int(message.height), int(message.width), int(message.step)
    data = np.frombuffer(bytes(message.data), dtype=np.uint8)
    if encoding in _GREY or encoding.upper() in _GREY:
        channels, order = 1, None
    elif encoding in _RAW_LAYOUTS:
        channels, order = _RAW_LAYOUTS[encoding]
    else:
        raise MessageError(
            f"raw image encoding '{message.encoding}' is not stored as a camera (8-bit rgb8, bgr8, rgba8, bgra8, mono8"
            " are; depth and 16-bit images are not)"
        )
    if step < width * channels or len(data) < step * height:
        raise MessageError(f"a {width}x{height} {encoding} image with step {step} holds only {len(data)} bytes")
    rows = data[: step * height].reshape(height, step)[:, : width * channels].reshape(height, width, channels)
    if channels == 1:
        return np.repeat(rows, 3, axis=2)
    return np.ascontiguousarray(rows if order is None else rows[:, :, order])


def stored_codec(video_format: str) -> str:
    """The codec a store names for a `foxglove.CompressedVideo` format (its packets copied as they are)."""
    codec = STORED_CODECS.get(video_format.lower())
    if codec is None:
        raise MessageError(f"video format '{video_format}' is not one of {sorted(STORED_CODECS)}")
    return codec


class PacketDecoder:
    """Decodes a topic's video packets (one frame per message) in order, giving each frame the time of
    the message that carried it (matched by packet number, so a decoder's delay cannot shift times)."""

    def __init__(self, video_format: str):
        codec = VIDEO_FORMATS.get(video_format.lower())
        if codec is None:
            raise MessageError(f"video format '{video_format}' is not one of {sorted(VIDEO_FORMATS)}")
        self.format = video_format.lower()
        context = av.CodecContext.create(codec, "r")
        assert isinstance(context, av.VideoCodecContext)
        self._context = context
        # One thread, as the store's decoders run: a dav1d context left with frames in its threads (a camera's
        # size read from its first frame) hangs the next one opened in the process.
        self._context.thread_count = 1
        self._times: dict[int, float] = {}
        self._sent = 0
        self._latest_shown = -1
        self.reordered = False  # a frame came out after the frame of a later packet (B-frames)

    def decode(self, data: bytes, time: float) -> Iterator[tuple[av.VideoFrame, float]]:
        packet = av.Packet(data)
        packet.pts = packet.dts = self._sent
        self._times[self._sent] = time
        self._sent += 1
        yield from self._timed(self._decoded(packet))

    def flush(self) -> Iterator[tuple[av.VideoFrame, float]]:
        yield from self._timed(self._decoded(None))
        if self._times:
            first = min(self._times)
            raise MessageError(
                f"{len(self._times)} of {self._sent} packets gave no frame, the first of them packet {first}"
                " (a stream that starts without a key frame, or damaged packets)"
            )

    def _decoded(self, packet: av.Packet | None) -> list[av.VideoFrame]:
        try:
            return self._context.decode(packet)
        except av.error.FFmpegError as exc:
            which = f"packet {packet.pts}" if packet is not None else "the end of the stream"
            raise MessageError(f"{self.format} {which} does not decode: {exc}") from exc

    def _timed(self, frames) -> Iterator[tuple[av.VideoFrame, float]]:
        for frame in frames:
            if frame.pts not in self._times:
                raise MessageError(f"the decoder returned a frame for no packet sent (pts {frame.pts})")
            self.reordered |= frame.pts < self._latest_shown
            self._latest_shown = max(self._latest_shown, frame.pts)
            yield frame, self._times.pop(frame.pts)
