"""What each decoding backend delivered, by codec, frame size and request length: the table `auto` chooses by.

Measured by `benchmarks/gpu/decode_sizes.py` on one NVIDIA H200 with 16 host cores, 2026-11-27
(`benchmarks/results/gpu_proof_h200/decode_sizes.json`): the same requests (batches of 64 samples from
32-frame segments with a key frame every 8) decoded by `decoder="nvdec"` (7 sessions), `decoder="dali"` (its
host-side joining included, on one thread) and PyAV in 16 processes. The PyAV figure is kept per host core,
so that a rank with fewer cores than that machine expects proportionally less from its CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MEASURED_ON = "NVIDIA H200 with 16 host cores (benchmarks/results/gpu_proof_h200/decode_sizes.json, 2026-11-27)"
HOST_CORES_MEASURED = 16
# Requests of at least this many frames are compared with the 16-frame clips, shorter ones with the 2-frame windows.
LONG_REQUEST_FRAMES = 8
# The smallest frames NVDEC opens a decoder for (NVIDIA's Video Codec SDK support matrix; HEVC at 112x112 was
# refused on the H200 by cuvidCreateDecoder, benchmarks/results/gpu_proof_h200/nvdec_curve.json).
NVDEC_MIN_SIZE = {"h264": (48, 16), "hevc": (144, 144), "vp9": (128, 128)}


@dataclass(frozen=True)
class Cell:
    """Delivered frames/s of each backend for one codec, frame size and request length."""

    codec: str
    width: int
    height: int
    long_requests: bool
    nvdec: float
    dali: float
    pyav_per_core: float

    @property
    def pixels(self) -> int:
        return self.width * self.height


def _cell(codec: str, width: int, height: int, frames: int, nvdec: float, dali: float, pyav_16: float) -> Cell:
    long_requests = frames >= LONG_REQUEST_FRAMES
    return Cell(codec, width, height, long_requests, nvdec, dali, pyav_16 / HOST_CORES_MEASURED)


CELLS: tuple[Cell, ...] = (
    _cell("h264", 224, 224, 16, nvdec=1391, dali=2378, pyav_16=14397),
    _cell("h264", 224, 224, 2, nvdec=453, dali=584, pyav_16=6249),
    _cell("h264", 640, 480, 16, nvdec=1294, dali=1509, pyav_16=3413),
    _cell("h264", 640, 480, 2, nvdec=384, dali=418, pyav_16=1770),
    _cell("h264", 1920, 1080, 16, nvdec=798, dali=248, pyav_16=516),
    _cell("h264", 1920, 1080, 2, nvdec=284, dali=58, pyav_16=330),
    _cell("hevc", 224, 224, 16, nvdec=1381, dali=2203, pyav_16=13264),
    _cell("hevc", 224, 224, 2, nvdec=370, dali=577, pyav_16=5951),
    _cell("hevc", 640, 480, 16, nvdec=1221, dali=2021, pyav_16=3115),
    _cell("hevc", 640, 480, 2, nvdec=387, dali=530, pyav_16=1825),
    _cell("hevc", 1920, 1080, 16, nvdec=1150, dali=301, pyav_16=495),
    _cell("hevc", 1920, 1080, 2, nvdec=340, dali=79, pyav_16=295),
)


def nearest_cell(codec: str, frame_size: tuple[int, int], frames_per_request: int) -> Cell | None:
    """The measured cell closest to frames of `frame_size` (width, height) in requests of `frames_per_request`:
    same codec and request length, nearest frame area on a log scale; None for a codec never measured."""
    long_requests = frames_per_request >= LONG_REQUEST_FRAMES
    cells = [c for c in CELLS if c.codec == codec and c.long_requests == long_requests]
    if not cells:
        return None
    area = max(1, frame_size[0] * frame_size[1])
    return min(cells, key=lambda c: abs(math.log(c.pixels / area)))


def nvdec_opens(codec: str, frame_size: tuple[int, int]) -> bool:
    """Whether NVDEC opens a decoder for `codec` frames of `frame_size` (width, height)."""
    smallest = NVDEC_MIN_SIZE.get(codec)
    return smallest is not None and frame_size[0] >= smallest[0] and frame_size[1] >= smallest[1]
