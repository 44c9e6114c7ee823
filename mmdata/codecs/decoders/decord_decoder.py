"""CPU decoding with decord: random access by frame index over an in-memory segment."""

from __future__ import annotations

import io

import numpy as np

from mmdata.codecs.decoders.availability import DECORD_CODECS
from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.packets import probe_segment
from mmdata.codecs.decoders.requests import ClipRequest, frames_decoded_from_key_frames
from mmdata.errors import DecodeError


class DecordDecoder(SequentialDecoder):
    """decord's `VideoReader.get_batch`: seeks to the key frame before each wanted frame itself."""

    name = "decord"
    codecs = DECORD_CODECS

    def __init__(self, threads: int = 1):
        super().__init__()
        self.threads = threads

    def describe(self) -> str:
        import decord

        return f"decord {decord.__version__} (CPU, {self.threads} thread(s) per decoder)"

    def _decode_one(self, request: ClipRequest) -> tuple[np.ndarray, int]:
        import decord

        if not request.frames:
            return np.empty((0, 0, 0, 3), dtype=np.uint8), 0
        probe_segment(request)
        try:
            reader = decord.VideoReader(io.BytesIO(request.data), num_threads=self.threads)
            length = len(reader)
            if max(request.frames) >= length:
                raise DecodeError(f"segment has {length} frames; frame {max(request.frames)} requested")
            frames = reader.get_batch(list(request.frames)).asnumpy()
        except decord.DECORDError as exc:
            raise DecodeError(str(exc).splitlines()[0]) from exc
        if request.frame_size is not None and tuple(frames.shape[1:3]) != request.frame_size[::-1]:
            raise DecodeError(f"decodes to {frames.shape[2]}x{frames.shape[1]} frames, not {request.frame_size}")
        return frames, frames_decoded_from_key_frames(request.frames, request.gop)
