"""CPU decoding with PyAV (FFmpeg): every codec FFmpeg reads; seeks to key frames inside a segment."""

from __future__ import annotations

import io

import av
import numpy as np

from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.requests import ClipRequest
from mmdata.errors import DecodeError

PYAV_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mjpeg", "mpeg4"})


class PyAvDecoder(SequentialDecoder):
    """Demuxes a segment's packets, then decodes only from the key frame before each wanted run."""

    name = "pyav"
    codecs = PYAV_CODECS

    def __init__(self, threads: int = 1):
        super().__init__()
        self.threads = threads

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
                return self._decode_packets(stream.codec_context, packets, request.frames)
        except (av.error.FFmpegError, IndexError) as exc:
            raise DecodeError(str(exc) or type(exc).__name__) from exc

    @staticmethod
    def _decode_packets(context, packets: list, wanted_frames: tuple[int, ...]) -> tuple[np.ndarray, int]:
        if not packets:
            raise DecodeError("segment holds no video packets")
        order = {pts: index for index, pts in enumerate(sorted(packet.pts for packet in packets))}
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
                for frame in context.decode(packet):
                    index = order.get(frame.pts)
                    count += 1
                    if index in wanted_lookup:
                        decoded[index] = frame.to_ndarray(format="rgb24")
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
