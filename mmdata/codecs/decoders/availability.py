"""Which backends can run here and which codecs each decodes: probed without building a decoder.

The interface (`base`) names a backend that can decode a refused codec from here, and `select`
chooses among the available ones; neither needs a backend module for it.
"""

from __future__ import annotations

import functools
import importlib

from mmdata.codecs.decoders.spdl_libraries import spdl_nvdec_problem, spdl_problem

PYAV_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mjpeg", "mpeg4"})
# decord's bundled FFmpeg has no software AV1 decoder ("cannot find video stream"): AV1 goes to PyAV (dav1d)
DECORD_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "mjpeg", "mpeg4"})
DALI_GPU_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mjpeg", "mpeg4"})
DALI_CPU_CODECS = frozenset({"vp8", "vp9", "mjpeg"})
NVDEC_CODECS = frozenset({"h264", "hevc", "vp9"})
# SPDL converts 8-bit 4:2:0 only (MJPEG decodes to full-range yuvj420p); NVDEC through SPDL reads AV1 too
SPDL_CODECS = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mpeg4"})
SPDL_NVDEC_CODECS = frozenset({"h264", "hevc", "vp9", "av1"})
BACKEND_CODECS = {
    "dali": DALI_GPU_CODECS,
    "nvdec": NVDEC_CODECS,
    "spdl-nvdec": SPDL_NVDEC_CODECS,
    "dali-cpu": DALI_CPU_CODECS,
    "pyav": PYAV_CODECS,
    "decord": DECORD_CODECS,
    "spdl": SPDL_CODECS,
}

# Fastest CPU backend first, per codec, as measured by benchmarks/decode_bench.py
# (benchmarks/results/decode_cpu.json; the reasons are in docs/architecture.md).
CPU_PREFERENCE: dict[str, tuple[str, ...]] = {
    "h264": ("pyav", "decord"),
    "hevc": ("pyav", "decord"),
    "vp9": ("pyav", "dali-cpu", "decord"),
    "av1": ("pyav",),
}
DEFAULT_CPU_PREFERENCE = ("pyav", "decord", "dali-cpu")


def _installed(module: str) -> bool:
    """Whether `module` imports (a broken install counts as missing)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def dali_available() -> bool:
    return _installed("nvidia.dali")


def decord_available() -> bool:
    return _installed("decord")


def pynvvideocodec_available() -> bool:
    return _installed("PyNvVideoCodec")


@functools.cache
def spdl_available() -> bool:
    """Whether SPDL and an FFmpeg it can load are here (see `spdl_libraries`); probed once per process."""
    return spdl_problem() is None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def backend_available(name: str) -> bool:
    """Whether `name` can run here: its library is installed and, for a GPU backend, a CUDA GPU is visible."""
    if name == "pyav":
        return True
    if name == "decord":
        return decord_available()
    if name == "dali-cpu":
        return dali_available()
    if name in ("dali", "hybrid"):
        return dali_available() and cuda_available()
    if name == "nvdec":
        return pynvvideocodec_available() and cuda_available()
    if name == "spdl":
        return spdl_available()
    if name == "spdl-nvdec":
        return spdl_available() and cuda_available() and spdl_nvdec_problem() is None
    return False


def backends_for_codec(codec: str) -> list[str]:
    """The backends available here that decode `codec`: the GPU ones, then the CPU ones fastest first."""
    order = ["dali", "nvdec", *CPU_PREFERENCE.get(codec, DEFAULT_CPU_PREFERENCE)]
    order += [name for name in BACKEND_CODECS if name not in order]
    return [name for name in order if codec in BACKEND_CODECS[name] and backend_available(name)]
