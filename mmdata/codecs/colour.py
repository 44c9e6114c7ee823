"""YUV to RGB conversion of decoded frames, exactly rounded, written straight into the output batch.

FFmpeg's scaler gives exactly rounded RGB only on its slow C path (`ACCURATE_RND` with full chroma
interpolation: about 0.5 ms per 224x224 frame, more than decoding it). For the format every mmdata
store holds (8-bit 4:2:0, BT.601, limited range, centred chroma) a compiled kernel computes the
same thing about four times faster: chroma upsampled bilinearly (weights 3/4 and 1/4, edges
repeated), then the BT.601 matrix in float32, rounded to nearest. It agrees with the scaler's
accurate path on all but ~0.4% of values, which differ by one level (the scaler's fixed point
rounds differently there). Other formats and colour spaces go through the scaler.
"""

from __future__ import annotations

import functools

import av
import numpy as np
from av.video.plane import VideoPlane
from av.video.reformatter import Interpolation, VideoReformatter

from mmdata.codecs.geometry import FrameGeometry, fit_frames

# Exact rounding and full-resolution chroma interpolation: FFmpeg's default YUV->RGB path rounds
# down (about 1.3 levels darker on average); with these flags PyAV gives the very pixels DALI's
# decoder gives (mean difference 0.0 on the same bytes) and lands closer to the source. They are
# swscale's SWS_ACCURATE_RND and SWS_FULL_CHR_H_INT, which PyAV names only from version 16 (LeRobot
# pins PyAV 15, whose reformatter takes the flags as a plain number all the same).
_EXACT = int(getattr(Interpolation, "ACCURATE_RND", 0x40000)) | int(getattr(Interpolation, "FULL_CHR_H_INT", 0x2000))
RGB_CONVERSION = int(Interpolation.BILINEAR) | _EXACT
# The scaler on the calling thread only (loader workers run one per core already); PyAV before 16 has no
# `threads` option and always scales on one thread.
ONE_THREAD = {"threads": 1} if int(av.__version__.split(".")[0]) >= 16 else {}

# FFmpeg's AVColorSpace values the kernel's matrix is right for (unspecified means BT.601 to the
# scaler), and its AVColorRange values for limited ("MPEG") range.
_BT601_SPACES = frozenset({2, 5, 6})
_LIMITED_RANGES = frozenset({0, 1})


def to_rgb(frame: av.VideoFrame, reformatter: VideoReformatter | None = None) -> np.ndarray:
    """A decoded frame as uint8 RGB `[H, W, 3]`."""
    out = np.empty((frame.height, frame.width, 3), np.uint8)
    rgb_into(frame, out, reformatter)
    return out


def rgb_into(frame: av.VideoFrame, out: np.ndarray, reformatter: VideoReformatter | None = None) -> None:
    """Convert `frame` to RGB into `out` (uint8 `[H, W, 3]`, e.g. one row of a batch array, or the `[H, W, 3]`
    view of a channels-first frame, `chw.transpose(1, 2, 0)`)."""
    if _kernel_converts(frame):
        width, height = frame.width, frame.height
        y_plane, u_plane, v_plane = frame.planes
        luma = _plane_view(y_plane)[:height, :width]
        blue = _plane_view(u_plane)[: height // 2, : width // 2]
        red = _plane_view(v_plane)[: height // 2, : width // 2]
        planar = out.transpose(2, 0, 1)  # a channels-first frame's memory, seen as [H, W, 3]: written plane by plane
        if out.flags.c_contiguous or planar.flags.c_contiguous:
            _kernel()(luma, blue, red, out if out.flags.c_contiguous else planar, not out.flags.c_contiguous)
        else:
            interleaved = np.empty(out.shape, np.uint8)
            _kernel()(luma, blue, red, interleaved, False)
            out[...] = interleaved
        return
    converter = reformatter or VideoReformatter()
    out[...] = converter.reformat(frame, format="rgb24", interpolation=RGB_CONVERSION, **ONE_THREAD).to_ndarray()


def yuv420_frames_to_rgb(frames: np.ndarray, out: np.ndarray) -> None:
    """Packed 8-bit I420 frames `[N, H * W * 3 / 2]` (BT.601, limited range: an mmdata store's) into uint8
    `out` `[N, H, W, 3]`, by the kernel's rules, in one compiled call that holds no interpreter lock."""
    count, height, width, channels = out.shape
    if frames.dtype != np.uint8 or frames.shape != (count, height * width * 3 // 2) or height % 2 or width % 2:
        size = height * width * 3 // 2
        raise ValueError(f"{count} packed I420 frames of {width}x{height} are uint8 [{count}, {size}]")
    if channels != 3 or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"RGB frames go into a contiguous uint8 [N, H, W, 3] array, not {out.dtype} {out.shape}")
    _batch_kernel()(np.ascontiguousarray(frames), out)


# FFmpeg's scaler filters for downscaling inside the decode; with exact rounding and full chroma
# interpolation its output is within 0.25 levels (mean absolute) of torch's antialiased resize of the
# exactly converted full frame, at 0.46 ms for 480x640 -> 224x224 on one core, where converting the
# full frame and resizing it with torch takes 1.34 ms.
SCALER_FILTERS = {
    "area": Interpolation.AREA,
    "bilinear": Interpolation.BILINEAR,
    "bicubic": Interpolation.BICUBIC,
}


def fitted_rgb_into(
    frame: av.VideoFrame, out: np.ndarray, geometry: FrameGeometry, reformatter: VideoReformatter | None = None
) -> None:
    """Crop, scale and convert `frame` to RGB into `out` (uint8 `[*geometry.size, 3]`) in one pass of
    FFmpeg's scaler; a 4:2:0 frame is cropped on its planes first, so only the kept pixels are scaled."""
    if frame.format.name != "yuv420p":
        full = np.empty((frame.height, frame.width, 3), np.uint8)
        rgb_into(frame, full, reformatter)
        out[...] = fit_frames(full[None], geometry)[0]
        return
    if not geometry.covers(frame.width, frame.height):
        frame = _cropped(frame, geometry.box)
    top, left, height, width = geometry.place
    converter = reformatter or VideoReformatter()
    scaled = converter.reformat(
        frame,
        width=width,
        height=height,
        format="rgb24",
        interpolation=SCALER_FILTERS[geometry.interpolation] | _EXACT,
        **ONE_THREAD,
    ).to_ndarray()
    if (height, width) != tuple(out.shape[:2]):
        out[...] = 0
    out[top : top + height, left : left + width] = scaled


def _cropped(frame: av.VideoFrame, box: tuple[int, int, int, int]) -> av.VideoFrame:
    """The part `box` (even top, left, height, width) of a 4:2:0 frame, as a new frame of the same colours."""
    top, left, height, width = box
    cropped = av.VideoFrame(width, height, "yuv420p")
    for source, target, scale in zip(frame.planes, cropped.planes, (1, 2, 2)):
        rows, columns = slice(top // scale, (top + height) // scale), slice(left // scale, (left + width) // scale)
        source_view, target_view = _plane_view(source), _plane_view(target)
        target_view[: height // scale, : width // scale] = source_view[rows, columns]
    cropped.colorspace, cropped.color_range = frame.colorspace, frame.color_range
    return cropped


def _kernel_converts(frame: av.VideoFrame) -> bool:
    return (
        frame.format.name == "yuv420p"
        and frame.width % 2 == 0
        and frame.height % 2 == 0
        and frame.colorspace in _BT601_SPACES
        and frame.color_range in _LIMITED_RANGES
    )


@functools.cache
def _kernel():
    """The compiled conversion, loaded when a frame is first converted: importing numba and loading the
    kernel takes ~0.2 s, which a process that never converts a frame (a conversion that copies video
    packets) is spared."""
    from mmdata.codecs.colour_kernel import yuv420_to_rgb

    return yuv420_to_rgb


@functools.cache
def _batch_kernel():
    """The compiled conversion of a batch of packed frames, loaded on first use (see `_kernel`)."""
    from mmdata.codecs.colour_kernel import i420_frames_to_rgb

    return i420_frames_to_rgb


def _plane_view(plane: VideoPlane) -> np.ndarray:
    """A frame plane's bytes as rows of its `line_size` (the pixels, then each line's padding), without a copy."""
    return np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)  # type: ignore[call-overload, unused-ignore]  # (a buffer; stubs vary)
