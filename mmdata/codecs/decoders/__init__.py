"""Video decoding backends behind one interface: clip requests in, uint8 frames `[F, H, W, 3]` out."""

from mmdata.codecs.decoders.availability import backend_available, backends_for_codec
from mmdata.codecs.decoders.base import VideoDecoder
from mmdata.codecs.decoders.hybrid import HybridDecoder, RateSplit
from mmdata.codecs.decoders.requests import ClipRequest, DecodeStats, SegmentRef, frames_decoded_from_key_frames
from mmdata.codecs.decoders.select import (
    BACKEND_NAMES,
    choose_backend,
    make_video_decoder,
)

__all__ = [
    "BACKEND_NAMES",
    "ClipRequest",
    "DecodeStats",
    "HybridDecoder",
    "RateSplit",
    "SegmentRef",
    "VideoDecoder",
    "backend_available",
    "backends_for_codec",
    "choose_backend",
    "frames_decoded_from_key_frames",
    "make_video_decoder",
]
