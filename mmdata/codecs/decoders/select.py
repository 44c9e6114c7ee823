"""Choose and build a video decoding backend once, for the codecs a reader will meet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmdata.codecs.decoders.base import VideoDecoder
from mmdata.codecs.decoders.dali_decoder import (
    DALI_CPU_CODECS,
    DALI_GPU_CODECS,
    DaliDecoder,
    cuda_available,
    dali_available,
)
from mmdata.codecs.decoders.decord_decoder import DECORD_CODECS, DecordDecoder, decord_available
from mmdata.codecs.decoders.hybrid import HybridDecoder, RateSplit
from mmdata.codecs.decoders.nvdec import NVDEC_CODECS, NvdecDecoder, pynvvideocodec_available
from mmdata.codecs.decoders.pyav_decoder import PYAV_CODECS, PyAvDecoder
from mmdata.errors import MmdataError, UnsupportedCodecError

BACKEND_NAMES = ("auto", "dali", "nvdec", "dali-cpu", "pyav", "decord", "hybrid")
_CODECS = {
    "dali": DALI_GPU_CODECS,
    "nvdec": NVDEC_CODECS,
    "dali-cpu": DALI_CPU_CODECS,
    "pyav": PYAV_CODECS,
    "decord": DECORD_CODECS,
}

# Fastest CPU backend first, per codec, as measured by benchmarks/decode_bench.py
# (benchmarks/results/decode_cpu.json; the reasons are in docs/architecture.md).
CPU_PREFERENCE: dict[str, tuple[str, ...]] = {
    "h264": ("pyav", "decord"),
    "hevc": ("pyav", "decord"),
    "vp9": ("pyav", "dali-cpu", "decord"),
}
_DEFAULT_CPU_PREFERENCE = ("pyav", "decord", "dali-cpu")

# Where NVDEC beats the host's cores, as measured on an H200 host with 16 cores (H.264, joined
# sessions against PyAV in 16 processes on the same requests; benchmarks/results/decode_gpu_h200.md):
# 16-frame clips at 640x480 ran 5,337 frames/s on the GPU against 3,427 on the CPU, while at
# 224x224 the CPU won every pattern (16-frame clips 16,013 against 9,959; 8-frame clips 9,605
# against 5,924; 2-frame windows 7,555 against 3,241). So `auto` sends a stream to the GPU only
# when its frames are large and its requests long.
GPU_MIN_FRAMES_PER_REQUEST = 8
GPU_MIN_FRAME_PIXELS = 640 * 480


def backend_available(name: str) -> bool:
    """Whether `name` can run here: its library is installed and, for "dali", a CUDA GPU is visible."""
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
    return False


def backends_for_codec(codec: str) -> list[str]:
    """The backends available here that decode `codec`, fastest first."""
    order = ["dali", "nvdec", *CPU_PREFERENCE.get(codec, _DEFAULT_CPU_PREFERENCE)]
    order += [name for name in _CODECS if name not in order]
    return [name for name in order if codec in _CODECS[name] and backend_available(name)]


def choose_backend(
    codecs: Sequence[str],
    device: str = "auto",
    frames_per_request: int | None = None,
    frame_pixels: int | None = None,
) -> str:
    """What `auto` means here.

    DALI on the GPU when `device` allows it ("auto" or "cuda"), a GPU and DALI are present, DALI
    decodes every codec, and the work is of the kind where the GPU was measured to win: frames of
    at least GPU_MIN_FRAME_PIXELS and requests of at least GPU_MIN_FRAMES_PER_REQUEST frames (each
    condition applies when its figure is given). Otherwise the fastest CPU backend for the codecs.
    """
    codecs = list(dict.fromkeys(codecs))
    gpu_wins = (frames_per_request is None or frames_per_request >= GPU_MIN_FRAMES_PER_REQUEST) and (
        frame_pixels is None or frame_pixels >= GPU_MIN_FRAME_PIXELS
    )
    if device != "cpu" and gpu_wins and backend_available("dali") and all(c in DALI_GPU_CODECS for c in codecs):
        return "dali"
    first = codecs[0] if codecs else "h264"
    for name in [*CPU_PREFERENCE.get(first, _DEFAULT_CPU_PREFERENCE), "pyav"]:
        if name != "dali" and backend_available(name) and all(c in _CODECS[name] for c in codecs):
            return name
    raise UnsupportedCodecError(f"no installed decoder reads all of {', '.join(codecs)}")


def make_video_decoder(
    name: str = "auto",
    codecs: Sequence[str] = (),
    device: str = "auto",
    frames_per_request: int | None = None,
    frame_pixels: int | None = None,
    device_id: int = 0,
    **options: Any,
) -> VideoDecoder:
    """Build the backend `name` ("auto", "dali", "nvdec" (PyNvVideoCodec, see `nvdec.py`), "dali-cpu", "pyav",
    "decord", or "hybrid": DALI on the GPU and PyAV on the host sharing each batch, see `hybrid.py`) for `codecs`.

    Fails here, not on the first sample, when the backend is missing or cannot decode a codec.
    `device`, `frames_per_request` and `frame_pixels` steer "auto" (see `choose_backend`); `device_id` is the
    CUDA device a GPU backend decodes on; `options` go to the
    backend (e.g. `pipelines=`, `reuse_sessions=` for DALI, `sessions=` for nvdec, `threads=` for the CPU backends;
    `helpers=` for "hybrid": how many processes decode its host share at once, the loader's workers).
    """
    if name not in BACKEND_NAMES:
        raise MmdataError(f"unknown decoder '{name}'; choose one of {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        name = choose_backend(codecs, device, frames_per_request, frame_pixels)
    if not backend_available(name):
        raise MmdataError(_why_unavailable(name))
    if name == "hybrid":
        helpers = options.pop("helpers", 1)
        gpu = DaliDecoder(device="gpu", device_id=device_id, **options)
        decoder: VideoDecoder = HybridDecoder(gpu, PyAvDecoder(), RateSplit(helpers=helpers))
    elif name == "nvdec":
        decoder = NvdecDecoder(device_id=device_id, **options)
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
        return "decoder 'decord' needs the decord package: pip install decord"
    if name == "nvdec":
        if not pynvvideocodec_available():
            return "decoder 'nvdec' needs NVIDIA's PyNvVideoCodec: pip install 'mmdata[nvdec]'"
        return "decoder 'nvdec' needs a CUDA GPU visible to torch; use decoder='pyav'"
    if not dali_available():
        return f"decoder '{name}' needs NVIDIA DALI: pip install 'mmdata[dali]' (CUDA 13) or 'mmdata[dali-cu12]'"
    return f"decoder '{name}' needs a CUDA GPU visible to torch; use decoder='dali-cpu' (VP8/VP9/MJPEG) or 'pyav'"
