"""CPU decoding with PyAV (FFmpeg): every codec FFmpeg reads; seeks to key frames inside a segment."""

from __future__ import annotations

import io

import av
import numpy as np
from av.video.reformatter import Interpolation, VideoReformatter

from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.errors import DecodeError

PYAV_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mjpeg", "mpeg4"})
# FFmpeg decoder names that decode a codec the store names otherwise.
DECODER_NAMES = {"av1": {"av1", "libdav1d", "libaom-av1"}, "vp9": {"vp9", "libvpx-vp9"}, "vp8": {"vp8", "libvpx"}}

# Exact rounding and full-resolution chroma interpolation: FFmpeg's default YUV->RGB path rounds
# down (about 1.3 levels darker on average); with these flags PyAV gives the very pixels DALI's
# decoder gives (mean difference 0.0 on the same bytes) and lands closer to the source.
RGB_CONVERSION = Interpolation.BILINEAR | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT


def to_rgb(frame: av.VideoFrame, reformatter: VideoReformatter | None = None) -> np.ndarray:
    """A decoded frame as uint8 RGB `[H, W, 3]`, converted the way every mmdata backend converts."""
    converter = reformatter or VideoReformatter()
    return converter.reformat(frame, format="rgb24", interpolation=RGB_CONVERSION, threads=1).to_ndarray()


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


def probe_segment(request: ClipRequest) -> None:
    """Check a segment's codec and frame size from its headers (for backends that decode it elsewhere)."""
    try:
        with av.open(io.BytesIO(request.data)) as container:
            if not container.streams.video:
                raise DecodeError("segment holds no video stream")
            check_stream(container.streams.video[0].codec_context, request)
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(str(exc) or type(exc).__name__) from exc


def presentation_order(packets: list[av.Packet]) -> dict[int, int]:
    """Each packet's frame index in presentation order, keyed by pts (decode order differs with B-frames)."""
    return {pts: index for index, pts in enumerate(sorted(packet.pts for packet in packets))}


class PyAvDecoder(SequentialDecoder):
    """Demuxes a segment's packets, then decodes only from the key frame before each wanted run,
    and skips the unwanted frames that no other frame references."""

    name = "pyav"
    codecs = PYAV_CODECS

    def __init__(self, threads: int = 1):
        super().__init__()
        self.threads = threads
        self._reformatter: VideoReformatter | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reformatter": None}

    def describe(self) -> str:
        return f"pyav {av.__version__} (CPU, {self.threads} thread(s) per decoder)"

    def _decode_one(self, request: ClipRequest) -> tuple[np.ndarray, int]:
        if not request.frames:
            return np.empty((0, 0, 0, 3), dtype=np.uint8), 0
        try:
            with av.open(io.BytesIO(request.data)) as container:
                stream = container.streams.video[0]
                check_stream(stream.codec_context, request)
                stream.codec_context.thread_count = self.threads
                packets = [packet for packet in container.demux(stream) if packet.size]
                if self._reformatter is None:
                    self._reformatter = VideoReformatter()
                return self._decode_packets(stream.codec_context, packets, request, self._reformatter)
        except (av.error.FFmpegError, IndexError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from exc

    @staticmethod
    def _decode_packets(
        context, packets: list, request: ClipRequest, reformatter: VideoReformatter
    ) -> tuple[np.ndarray, int]:
        wanted_frames = request.frames
        if not packets:
            raise DecodeError("segment holds no video packets")
        order = presentation_order(packets)
        wanted = sorted(set(wanted_frames))
        if wanted and wanted[-1] >= len(packets):
            raise DecodeError(f"segment has {len(packets)} frames; frame {wanted[-1]} requested")
        key_frames = sorted((order[p.pts], position) for position, p in enumerate(packets) if p.is_keyframe)
        if not key_frames or key_frames[0][0] != 0:
            raise DecodeError("segment does not start with a key frame")
        wanted_lookup = set(wanted)
        decoded: dict[int, np.ndarray] = {}
        count = 0
        for key_position, last in _runs(wanted, key_frames):
            context.flush_buffers()
            for packet in [*packets[key_position:], None]:
                if packet is not None:
                    # Frames nothing refers to are skipped unless wanted (B-frames between clip frames).
                    context.skip_frame = "DEFAULT" if order[packet.pts] in wanted_lookup else "NONREF"
                for frame in context.decode(packet):
                    index = order.get(frame.pts)
                    count += 1
                    if index in wanted_lookup:
                        check_frame(frame, request)
                        decoded[index] = to_rgb(frame, reformatter)
                if last in decoded:
                    break
        missing = [i for i in wanted if i not in decoded]
        if missing:
            raise DecodeError(f"frames {missing} of {len(packets)} did not decode")
        return np.stack([decoded[i] for i in wanted_frames]), count


def _runs(wanted: list[int], key_frames: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(decode position of the key frame to start from, last wanted frame) per run of wanted frames."""
    key_indices = np.array([index for index, _ in key_frames])
    runs: list[tuple[int, int]] = []
    for index in wanted:
        key = int(np.searchsorted(key_indices, index, side="right")) - 1
        if not runs or key_frames[key][0] > runs[-1][1]:
            runs.append((key_frames[key][1], index))
        else:
            runs[-1] = (runs[-1][0], index)
    return runs


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
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise DecodeError("holds no video stream")
            stream = container.streams.video[0]
            if codec is not None:
                check_stream(stream.codec_context, request)
            reformatter = VideoReformatter()
            for frame in container.decode(stream):
                check_frame(frame, request)
                frames.append(to_rgb(frame, reformatter))
                if max_frames is not None and len(frames) > max_frames:
                    raise DecodeError(f"holds more than the {max_frames} frames it should")
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(f"video does not decode: {exc}") from exc
    if not frames:
        raise DecodeError("video holds no frames")
    return np.stack(frames)
