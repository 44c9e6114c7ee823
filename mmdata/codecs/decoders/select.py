"""Choose and build a video decoding backend once, for the codecs a reader will meet."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mmdata.codecs.decoders import availability
from mmdata.codecs.decoders.availability import (
    BACKEND_CODECS,
    CPU_PREFERENCE,
    DEFAULT_CPU_PREFERENCE,
    cuda_available,
    dali_available,
    pynvvideocodec_available,
)
from mmdata.codecs.decoders.base import VideoDecoder
from mmdata.codecs.decoders.dali_decoder import DaliDecoder
from mmdata.codecs.decoders.decord_decoder import DecordDecoder
from mmdata.codecs.decoders.hybrid import HybridDecoder, RateSplit
from mmdata.codecs.decoders.measured import nearest_cell, nvdec_opens
from mmdata.codecs.decoders.nvdec import NvdecDecoder
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.decoders.spdl_decoder import SpdlDecoder, SpdlNvdecDecoder
from mmdata.codecs.decoders.spdl_libraries import spdl_nvdec_problem, spdl_problem
from mmdata.errors import MmdataError, UnsupportedCodecError

BACKEND_NAMES = ("auto", "dali", "nvdec", "spdl-nvdec", "dali-cpu", "pyav", "decord", "spdl", "hybrid")


# The GPU side a "hybrid" decoder can pair with PyAV on the host (`make_video_decoder("hybrid", gpu=...)`).
HYBRID_GPU_BACKENDS = ("dali", "nvdec", "spdl-nvdec")

# A GPU backend is chosen over the host's cores only when the measured table says it delivers this much more:
# single measurements on a shared machine vary by about 15%, and a GPU left to the trainer is worth something.
GPU_MARGIN = 1.2


def host_cores_per_rank() -> int:
    """The CPU cores this process may use, shared among the ranks of its node (torchrun's LOCAL_WORLD_SIZE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, cores // ranks)


def choose_backend(
    codecs: Sequence[str],
    device: str = "auto",
    frames_per_request: int | None = None,
    frame_size: tuple[int, int] | None = None,
    host_cores: int | None = None,
) -> str:
    """What `auto` means here: the backend the measured table (`measured.py`) says delivers the most frames/s
    for these codecs, frames of `frame_size` (width, height) and requests of `frames_per_request` frames, the
    CPU backend counted at `host_cores` (default: this rank's share of the node's cores).

    A GPU backend ("nvdec", then "dali") is a candidate only when `device` allows it ("auto" or "cuda"), it
    is installed, a GPU is visible, it decodes every codec, NVDEC opens frames of that size, and it beats the
    CPU by GPU_MARGIN. Without a frame size or request length, or for a codec never measured, the fastest
    CPU backend.
    """
    codecs = list(dict.fromkeys(codecs))
    cpu = _cpu_backend(codecs)
    if device == "cpu" or not codecs or frames_per_request is None or frame_size is None:
        return cpu
    found = [nearest_cell(codec, frame_size, frames_per_request) for codec in codecs]
    cells = [cell for cell in found if cell is not None]
    if len(cells) < len(found):
        return cpu
    cores = host_cores if host_cores is not None else host_cores_per_rank()
    best, best_rate = cpu, min(cell.pyav_per_core for cell in cells) * cores * GPU_MARGIN
    for name in ("nvdec", "dali"):
        eligible = all(codec in BACKEND_CODECS[name] and nvdec_opens(codec, frame_size) for codec in codecs)
        rate = min(getattr(cell, name) for cell in cells)
        if eligible and rate > best_rate and availability.backend_available(name):
            best, best_rate = name, rate
    return best


def _cpu_backend(codecs: list[str]) -> str:
    """The fastest installed CPU backend that decodes every codec."""
    first = codecs[0] if codecs else "h264"
    for name in [*CPU_PREFERENCE.get(first, DEFAULT_CPU_PREFERENCE), "pyav"]:
        if availability.backend_available(name) and all(c in BACKEND_CODECS[name] for c in codecs):
            return name
    raise UnsupportedCodecError(f"no installed decoder reads all of {', '.join(codecs)}")


def make_video_decoder(
    name: str = "auto",
    codecs: Sequence[str] = (),
    device: str = "auto",
    frames_per_request: int | None = None,
    frame_size: tuple[int, int] | None = None,
    device_id: int = 0,
    **options: Any,
) -> VideoDecoder:
    """Build the backend `name` ("auto", "dali", "nvdec" (PyNvVideoCodec, see `nvdec.py`), "spdl-nvdec" and
    "spdl" (whole segments per call, see `spdl_decoder.py`), "dali-cpu", "pyav", "decord", or "hybrid": DALI on the
    GPU and PyAV on the host sharing each batch, see `hybrid.py`) for `codecs`.

    Fails here, not on the first sample, when the backend is missing or cannot decode a codec.
    `device`, `frames_per_request` and `frame_size` (width, height) steer "auto" (see `choose_backend`);
    `device_id` is the CUDA device a GPU backend decodes on; `options` go to the backend (e.g. `pipelines=`,
    `reuse_sessions=` for DALI, `sessions=` for nvdec, `threads=` for spdl, spdl-nvdec and the CPU backends;
    `helpers=` for "hybrid": how many processes decode its host share at once, the loader's workers, and `gpu=`: its
    GPU side, "dali" (default), "nvdec" or "spdl-nvdec").
    """
    if name not in BACKEND_NAMES:
        raise MmdataError(f"unknown decoder '{name}'; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        name = choose_backend(codecs, device, frames_per_request, frame_size)
    gpu_side = options.pop("gpu", "dali") if name == "hybrid" else None
    if gpu_side is not None and gpu_side not in HYBRID_GPU_BACKENDS:
        raise MmdataError(f"hybrid pairs PyAV with gpu='dali', 'nvdec' or 'spdl-nvdec', not {gpu_side!r:.40}")
    if gpu_side is not None and not availability.backend_available(gpu_side):
        raise MmdataError(f"decoder 'hybrid' needs its GPU side, gpu='{gpu_side}': {_why_unavailable(gpu_side)}")
    if gpu_side is None and not availability.backend_available(name):
        raise MmdataError(_why_unavailable(name))
    if name == "hybrid":
        assert gpu_side is not None
        helpers = options.pop("helpers", 1)
        gpu = make_video_decoder(gpu_side, codecs, device_id=device_id, **options)
        decoder: VideoDecoder = HybridDecoder(gpu, PyAvDecoder(), RateSplit(helpers=helpers))
    elif name == "nvdec":
        decoder = NvdecDecoder(device_id=device_id, **options)
    elif name == "spdl-nvdec":
        decoder = SpdlNvdecDecoder(device_id=device_id, **options)
    elif name == "spdl":
        decoder = SpdlDecoder(**options)
    elif name == "pyav":
        decoder = PyAvDecoder(**options)
    elif name == "decord":
        decoder = DecordDecoder(**options)
    else:
        decoder = DaliDecoder(device="gpu" if name == "dali" else "cpu", device_id=device_id, **options)
    decoder.check_codecs(codecs)
    return decoder


def _why_unavailable(name: str) -> str:
    if name == "decord":
        return "decoder 'decord' needs the decord package: pip install 'mmdata[decord]' (x86-64 only; no aarch64 wheel)"
    if name == "spdl":
        return f"decoder 'spdl' cannot run: {spdl_problem()}"
    if name == "spdl-nvdec":
        if not cuda_available():
            return "decoder 'spdl-nvdec' needs a CUDA GPU visible to torch; use decoder='spdl' or 'pyav'"
        return f"decoder 'spdl-nvdec' cannot run: {spdl_nvdec_problem()}"
    if name == "nvdec":
        if not pynvvideocodec_available():
            return "decoder 'nvdec' needs NVIDIA's PyNvVideoCodec: pip install 'mmdata[nvdec]'"
        return "decoder 'nvdec' needs a CUDA GPU visible to torch; use decoder='pyav'"
    if not dali_available():
        return f"decoder '{name}' needs NVIDIA DALI: pip install 'mmdata[dali]' (CUDA 13) or 'mmdata[dali-cu12]'"
    return f"decoder '{name}' needs a CUDA GPU visible to torch; use decoder='dali-cpu' (VP8/VP9/MJPEG) or 'pyav'"
