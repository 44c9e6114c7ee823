"""uint8 frames to float32 in [0, 1] in one compiled pass, divided by 255 as LeRobot and torchvision divide them
(bit for bit), `[H, W, 3]` turned into `[3, H, W]` on the way when asked: what a model takes, made as the decoded
frames are gathered into the batch rather than in a second pass."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def unit_float(frame: np.ndarray, out: np.ndarray, planar: bool) -> None:
    """`frame` (uint8 `[H, W, C]`) divided by 255 into float32 `out`: `[C, H, W]` when `planar`, else `[H, W, C]`."""
    height, width, channels = frame.shape
    top = np.float32(255)
    for y in range(height):
        for x in range(width):
            for c in range(channels):
                value = np.float32(frame[y, x, c]) / top
                if planar:
                    out[c, y, x] = value
                else:
                    out[y, x, c] = value


@numba.njit(cache=True, nogil=True)
def unit_float_flat(values: np.ndarray, out: np.ndarray) -> None:
    """`values` (uint8, one dimension) divided by 255 into float32 `out`, as `unit_float` divides them."""
    top = np.float32(255)
    for i in range(values.size):
        out[i] = np.float32(values[i]) / top
