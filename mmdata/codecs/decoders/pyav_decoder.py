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

# Exact rounding and full-resolution chroma interpolation: FFmpeg's default YUV->RGB path rounds
# down (about 1.3 levels darker on average); with these flags PyAV gives the very pixels DALI's
# decoder gives (mean difference 0.0 on the same bytes) and lands closer to the source.
RGB_CONVERSION = Interpolation.BILINEAR | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT


def to_rgb(frame: av.VideoFrame, reformatter: VideoReformatter | None = None) -> np.ndarray:
    """A decoded frame as uint8 RGB `[H, W, 3]`, converted the way every mmdata backend converts."""
    converter = reformatter or VideoReformatter()
    return converter.reformat(frame, format="rgb24", interpolation=RGB_CONVERSION, threads=1).to_ndarray()


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
                stream.codec_context.thread_count = self.threads
                packets = [packet for packet in container.demux(stream) if packet.size]
                if self._reformatter is None:
                    self._reformatter = VideoReformatter()
                return self._decode_packets(stream.codec_context, packets, request.frames, self._reformatter)
        except (av.error.FFmpegError, IndexError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from exc

    @staticmethod
    def _decode_packets(
        context, packets: list, wanted_frames: tuple[int, ...], reformatter: VideoReformatter
    ) -> tuple[np.ndarray, int]:
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


def decode_all_frames(data: bytes) -> np.ndarray:
    """Every frame of an encoded segment or file, in presentation order, as uint8 `[F, H, W, 3]`."""
    try:
        with av.open(io.BytesIO(data)) as container:
            reformatter = VideoReformatter()
            frames = [to_rgb(frame, reformatter) for frame in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(f"video does not decode: {exc}") from exc
    if not frames:
        raise DecodeError("video holds no frames")
    return np.stack(frames)
