"""CPU decoding with PyAV (FFmpeg): every codec FFmpeg reads; seeks to key frames inside a segment.

A segment with a packet index (see `mmdata.codecs.packet_index`) is decoded from its packets by a
decoder this process keeps open per stream shape, flushed between runs: no container is opened.
A segment without one (stores written before the index existed) is demuxed first.
"""

from __future__ import annotations

import io
import os

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from mmdata.codecs.colour import RGB_CONVERSION, fitted_rgb_into, rgb_into, to_rgb
from mmdata.codecs.decoders.availability import PYAV_CODECS
from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.packets import (
    SegmentPackets,
    check_frame,
    check_stream,
    demuxed_packets,
    indexed_packets,
    key_runs,
    probe_segment,
    request_rows,
    shown_in_order,
    software_decoder,
    wanted_frames,
)
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.codecs.packet_index import PacketIndex, index_describes
from mmdata.errors import DecodeError

# Open decoders a process keeps (one per codec, parameter sets and frame size).
MAX_OPEN_DECODERS = 16

__all__ = ["RGB_CONVERSION", "PYAV_CODECS", "PyAvDecoder", "decode_all_frames", "to_rgb"]


class DecoderPool:
    """The decoders this process keeps open, one per stream shape (codec, parameter sets, frame size).

    Decoders are created lazily in the process that uses them and dropped in a forked child, so a
    pool built before DataLoader workers fork shares no native state with them.
    """

    def __init__(self, threads: int = 1):
        self.threads = threads
        self._pid = os.getpid()
        self._open: dict[tuple, av.VideoCodecContext] = {}

    @staticmethod
    def _shape(request: ClipRequest) -> tuple:
        config = request.packets.codec_config if request.packets is not None else b""
        return request.codec, config, request.frame_size

    def get(self, request: ClipRequest) -> av.VideoCodecContext:
        if os.getpid() != self._pid:
            self._pid, self._open = os.getpid(), {}
        key = self._shape(request)
        codec, config, _ = key
        context = self._open.get(key)
        if context is None:
            if len(self._open) >= MAX_OPEN_DECODERS:
                del self._open[next(iter(self._open))]
            created = av.CodecContext.create(software_decoder(codec), "r")
            assert isinstance(created, av.VideoCodecContext)
            context = created
            if config:
                context.extradata = config
            context.thread_count = self.threads
            if request.frame_size is not None:
                width, height = request.frame_size
                context.options = {"max_pixels": str((width + 256) * (height + 256))}
            self._open[key] = context
        return context

    def discard(self, request: ClipRequest) -> None:
        """Forget the decoder of a request that failed, so the next request starts from a fresh one."""
        self._open.pop(self._shape(request), None)


class PyAvDecoder(SequentialDecoder):
    """Decodes only from the key frame before each wanted run of frames, and skips the unwanted
    frames that no other frame references. Indexed segments go to decoders kept open per stream
    shape; others are demuxed from their container first."""

    name = "pyav"
    codecs = PYAV_CODECS
    fits_geometry = True
    writes_channels_first = True

    def __init__(self, threads: int = 1):
        super().__init__()
        self.threads = threads
        self._reformatter: VideoReformatter | None = None
        self._pool: DecoderPool | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reformatter": None, "_pool": None}

    def describe(self) -> str:
        return f"pyav {av.__version__} (CPU, {self.threads} thread(s) per decoder)"

    def _decode_one(self, request: ClipRequest) -> tuple[np.ndarray, int]:
        if not request.frames:
            return np.empty((0, 0, 0, 3), dtype=np.uint8), 0
        if self._reformatter is None:
            self._reformatter = VideoReformatter()
        if request.packets is not None:
            return self._decode_indexed(request, request.packets, self._reformatter)
        try:
            with av.open(io.BytesIO(request.data), mode="r") as container:
                stream = container.streams.video[0]
                check_stream(stream.codec_context, request)
                stream.codec_context.thread_count = self.threads
                packets = demuxed_packets([packet for packet in container.demux(stream) if packet.size])
                return decode_runs(stream.codec_context, packets, request, self._reformatter)
        except (av.error.FFmpegError, IndexError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from exc

    def _decode_indexed(
        self, request: ClipRequest, index: PacketIndex, reformatter: VideoReformatter
    ) -> tuple[np.ndarray, int]:
        if self._pool is None:
            self._pool = DecoderPool(self.threads)
        try:
            context = self._pool.get(request)
            return decode_runs(context, indexed_packets(request.data, index), request, reformatter)
        except (av.error.FFmpegError, IndexError, ValueError, DecodeError) as exc:
            self._pool.discard(request)
            raise diagnosis(request, exc) from exc


def diagnosis(request: ClipRequest, failure: Exception) -> DecodeError:
    """Why an indexed segment failed to decode, in the store's terms: a segment of another codec or
    frame size than declared, an index that does not describe the segment's bytes, or else what the
    decoder said. Looked into only after a failure, so the fast path pays nothing for it."""
    try:
        probe_segment(request)
        if request.packets is not None and not index_describes(request.packets, request.data):
            return DecodeError("its packet index does not describe the segment's bytes; convert the store again")
    except DecodeError as found:
        return found
    return failure if isinstance(failure, DecodeError) else DecodeError(str(failure) or type(failure).__name__)


def decode_runs(
    context: av.VideoCodecContext, packets: SegmentPackets, request: ClipRequest, reformatter: VideoReformatter
) -> tuple[np.ndarray, int]:
    """Frames `request.frames` of a segment as uint8 `[F, H, W, 3]` (`[F, 3, H, W]` with
    `request.channels_first`; at `request.geometry` when set), and how many frames were decoded.

    Each run of wanted frames is decoded from the key frame before it, the context flushed first;
    a run ends as soon as its last wanted frame is out.
    """
    wanted = wanted_frames(request, packets.count, packets.key_frames)
    shown = packets.frames.tolist()
    geometry = request.geometry
    row_of = {int(frame): row for row, frame in enumerate(wanted)}
    out: np.ndarray | None = None
    done = np.zeros(len(wanted), bool)
    count = 0
    for key_position, last in key_runs(wanted, packets.key_frames, packets.key_positions):
        context.flush_buffers()
        latest = None
        for position in [*range(key_position, packets.count), None]:
            packet = None
            if position is not None:
                packet = packets.packet(position)
                # Frames nothing refers to are skipped unless wanted (B-frames between clip frames).
                context.skip_frame = "DEFAULT" if shown[position] in row_of else "NONREF"
            for frame in context.decode(packet):
                count += 1
                latest = shown_in_order(frame.pts, latest)
                row = row_of.get(frame.pts) if frame.pts is not None else None
                if row is None:
                    continue
                check_frame(frame, request)
                if out is None:
                    first_size = (frame.height, frame.width)
                    size = geometry.size if geometry else first_size
                    out = np.empty((len(wanted), *((3, *size) if request.channels_first else (*size, 3))), np.uint8)
                elif first_size != (frame.height, frame.width):
                    raise DecodeError(f"a frame is {frame.width}x{frame.height}, the segment's first is another size")
                target = out[row].transpose(1, 2, 0) if request.channels_first else out[row]  # [H, W, 3] either way
                if geometry is None:
                    rgb_into(frame, target, reformatter)
                else:
                    fitted_rgb_into(frame, target, geometry, reformatter)
                done[row] = True
            if done[row_of[last]]:
                break
    if out is None or not done.all():
        missing = wanted[~done].tolist()
        raise DecodeError(f"frames {missing} of {packets.count} did not decode")
    rows = request_rows(wanted, request)
    return (out if rows is None else out[rows]), count


def decode_all_frames(
    data: bytes, codec: str | None = None, frame_size: tuple[int, int] | None = None, max_frames: int | None = None
) -> np.ndarray:
    """Every frame of an encoded segment or file, in presentation order, as uint8 `[F, H, W, 3]`.

    With `codec` / `frame_size` the segment must be that (checked before decoding, see
    `check_stream`); more than `max_frames` frames is a DecodeError.
    """
    request = ClipRequest(data, (), codec or "", frame_size=frame_size)
    frames = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise DecodeError("holds no video stream")
            stream = container.streams.video[0]
            if codec is not None:
                check_stream(stream.codec_context, request)
            reformatter = VideoReformatter()
            latest = None
            for frame in container.decode(stream):
                latest = shown_in_order(frame.pts, latest)
                check_frame(frame, request)
                frames.append(to_rgb(frame, reformatter))
                if max_frames is not None and len(frames) > max_frames:
                    raise DecodeError(f"holds more than the {max_frames} frames it should")
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(f"video does not decode: {exc}") from exc
    if not frames:
        raise DecodeError("video holds no frames")
    return np.stack(frames)
