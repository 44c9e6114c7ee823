"""Frames at the model's resolution: which source pixels a frame keeps, and where they land.

A `FrameGeometry` says it all for one camera of one sample: the source `box` (a crop of the
decoded frame, or all of it) is scaled to the `place` rectangle of an output of `size`; what
`place` leaves uncovered (letterboxing) is black. Boxes sit on even pixels so that a 4:2:0
frame can be cropped before its colours are converted (chroma comes in 2x2 blocks); every
backend applies the same boxes, so they agree up to interpolation.

`frame_geometry` computes it from the resize mode; `fit_frames` applies it to decoded RGB frames
with torch (CPU or GPU) for backends that cannot resize while they decode. The PyAV backend does
it inside the decode, with FFmpeg's scaler (`mmdata.codecs.colour.fitted_rgb_into`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ResizeMode = Literal["stretch", "shorter_side", "pad"]
RESIZE_MODES = ("stretch", "shorter_side", "pad")
Interpolation = Literal["area", "bilinear", "bicubic"]
INTERPOLATIONS = ("area", "bilinear", "bicubic")
Crop = Literal["random"] | None
# torchvision's RandomResizedCrop tries this many boxes before falling back to a central one
RANDOM_CROP_ATTEMPTS = 10


@dataclass(frozen=True)
class FrameGeometry:
    """Source `box` and output `place` as (top, left, height, width) in pixels; output `size` (height, width)."""

    size: tuple[int, int]
    box: tuple[int, int, int, int]
    place: tuple[int, int, int, int]
    interpolation: Interpolation = "area"

    def covers(self, width: int, height: int) -> bool:
        """Whether the box is the whole of a `width` x `height` frame (no crop needed)."""
        return self.box == (0, 0, height, width)


def frame_geometry(
    width: int,
    height: int,
    size: tuple[int, int],
    mode: ResizeMode = "shorter_side",
    interpolation: Interpolation = "area",
    crop: Crop = None,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    rng: np.random.Generator | None = None,
) -> FrameGeometry:
    """The geometry of a `width` x `height` frame delivered at `size`.

    The region kept is the whole frame, or with `crop="random"` a box drawn as torchvision's
    RandomResizedCrop draws it (area share in `scale`, aspect ratio in `ratio`) from `rng`. Then
    `mode` maps the region to `size`: "stretch" scales it to fill, "shorter_side" scales its shorter
    side to fit and keeps the centre, "pad" fits it whole and letterboxes with black.
    """
    out_h, out_w = size
    top, left, box_h, box_w = (0, 0, height, width) if crop is None else _random_box(width, height, scale, ratio, rng)
    place = (0, 0, out_h, out_w)
    if mode == "shorter_side":
        factor = max(out_h / box_h, out_w / box_w)
        keep_h, keep_w = min(box_h, out_h / factor), min(box_w, out_w / factor)
        top, left = top + (box_h - keep_h) / 2, left + (box_w - keep_w) / 2
        box_h, box_w = keep_h, keep_w
    elif mode == "pad":
        factor = min(out_h / box_h, out_w / box_w)
        fit_h, fit_w = max(1, min(out_h, round(box_h * factor))), max(1, min(out_w, round(box_w * factor)))
        place = ((out_h - fit_h) // 2, (out_w - fit_w) // 2, fit_h, fit_w)
    elif mode != "stretch":
        raise ValueError(f"resize mode is one of {', '.join(RESIZE_MODES)}, not '{mode}'")
    return FrameGeometry((out_h, out_w), _even_box(top, left, box_h, box_w, width, height), place, interpolation)


def _random_box(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator | None
) -> tuple[float, float, float, float]:
    if rng is None:
        raise ValueError("a random crop needs a random generator")
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(RANDOM_CROP_ATTEMPTS):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        box_w, box_h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            return float(rng.integers(0, height - box_h + 1)), float(rng.integers(0, width - box_w + 1)), box_h, box_w
    aspect = width / height
    if aspect < ratio[0]:
        box_w, box_h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        box_h, box_w = height, round(height * ratio[1])
    else:
        box_w, box_h = width, height
    return (height - box_h) / 2, (width - box_w) / 2, box_h, box_w


def _even_box(
    top: float, left: float, box_h: float, box_w: float, width: int, height: int
) -> tuple[int, int, int, int]:
    """The box on even pixels (4:2:0 chroma comes in 2x2 blocks), at least 2x2 and inside the frame: each edge the
    even pixel nearest the exact one, so no edge moves by more than one source pixel (the box keeps its centre)."""
    if (round(top), round(left), round(box_h), round(box_w)) == (0, 0, height, width):
        return (0, 0, height, width)
    first_row, last_row = _even_span(top, top + box_h, height)
    first_column, last_column = _even_span(left, left + box_w, width)
    return (first_row, first_column, last_row - first_row, last_column - first_column)


def _even_span(start: float, end: float, side: int) -> tuple[int, int]:
    """[start, end) with both ends on the nearest even pixels, at least 2 long, inside [0, side rounded down to
    even)."""
    limit = side - side % 2
    first = min(max(0, 2 * round(start / 2)), limit - 2)
    return first, min(max(first + 2, 2 * round(end / 2)), limit)


def fit_frames(frames: Any, geometry: FrameGeometry) -> Any:
    """uint8 RGB frames `[F, H, W, 3]` (numpy, or a torch tensor on any device) cropped and scaled
    to `geometry`, in the same kind of array; antialiased when scaling down."""
    import torch

    as_numpy = isinstance(frames, np.ndarray)
    tensor = torch.from_numpy(frames) if as_numpy else frames
    top, left, box_h, box_w = geometry.box
    place_top, place_left, place_h, place_w = geometry.place
    region = tensor[:, top : top + box_h, left : left + box_w].permute(0, 3, 1, 2)
    if geometry.interpolation == "area":
        scaled = torch.nn.functional.interpolate(region.float(), size=(place_h, place_w), mode="area")
        scaled = scaled.round_().clamp_(0, 255).to(torch.uint8)
    else:
        scaled = torch.nn.functional.interpolate(
            region.contiguous(), size=(place_h, place_w), mode=geometry.interpolation, antialias=True
        )
    out = tensor.new_zeros((tensor.shape[0], *geometry.size, 3))
    out[:, place_top : place_top + place_h, place_left : place_left + place_w] = scaled.permute(0, 2, 3, 1)
    return out.numpy() if as_numpy else out
