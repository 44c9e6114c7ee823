"""The compiled YUV 4:2:0 to RGB kernel of `mmdata.codecs.colour` (BT.601, limited range, exactly rounded),
in a module of its own so that numba is imported only by a process that converts frames."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def yuv420_to_rgb(luma: np.ndarray, blue: np.ndarray, red: np.ndarray, out: np.ndarray, planar: bool) -> None:
    """Into `out` `[H, W, 3]`, or `[3, H, W]` when `planar`; see `mmdata.codecs.colour` for the rounding."""
    height, width = luma.shape
    chroma_rows, chroma_columns = blue.shape
    # rows of chroma interpolated vertically (x4), padded by one column each side; then horizontally (x16)
    blue_row = np.empty(chroma_columns + 2, np.float32)
    red_row = np.empty(chroma_columns + 2, np.float32)
    blue_full = np.empty(width, np.float32)
    red_full = np.empty(width, np.float32)
    r = np.empty(width, np.float32)
    g = np.empty(width, np.float32)
    b = np.empty(width, np.float32)
    for i in range(height):
        near = i >> 1
        far = min(near + 1, chroma_rows - 1) if i & 1 else max(near - 1, 0)
        for c in range(chroma_columns):
            blue_row[c + 1] = 3 * np.float32(blue[near, c]) + np.float32(blue[far, c])
            red_row[c + 1] = 3 * np.float32(red[near, c]) + np.float32(red[far, c])
        blue_row[0], red_row[0] = blue_row[1], red_row[1]
        blue_row[chroma_columns + 1], red_row[chroma_columns + 1] = blue_row[chroma_columns], red_row[chroma_columns]
        for m in range(width >> 1):
            blue_full[2 * m] = 3 * blue_row[m + 1] + blue_row[m]
            blue_full[2 * m + 1] = 3 * blue_row[m + 1] + blue_row[m + 2]
            red_full[2 * m] = 3 * red_row[m + 1] + red_row[m]
            red_full[2 * m + 1] = 3 * red_row[m + 1] + red_row[m + 2]
        for j in range(width):
            u = blue_full[j] * np.float32(1 / 16) - np.float32(128)
            v = red_full[j] * np.float32(1 / 16) - np.float32(128)
            y = np.float32(255 / 219) * (np.float32(luma[i, j]) - np.float32(16)) + np.float32(0.5)
            green = y - np.float32(0.391762290) * u - np.float32(0.812967647) * v
            r[j] = min(max(y + np.float32(1.596026786) * v, np.float32(0)), np.float32(255))
            g[j] = min(max(green, np.float32(0)), np.float32(255))
            b[j] = min(max(y + np.float32(2.017232143) * u, np.float32(0)), np.float32(255))
        if planar:
            for j in range(width):
                out[0, i, j] = np.uint8(np.int32(r[j]))
                out[1, i, j] = np.uint8(np.int32(g[j]))
                out[2, i, j] = np.uint8(np.int32(b[j]))
            continue
        row = out[i].reshape(3 * width)
        for j in range(width):
            row[3 * j] = np.uint8(np.int32(r[j]))
            row[3 * j + 1] = np.uint8(np.int32(g[j]))
            row[3 * j + 2] = np.uint8(np.int32(b[j]))


@numba.njit(cache=True, nogil=True)
def i420_frames_to_rgb(frames: np.ndarray, out: np.ndarray) -> None:
    """Packed I420 frames `[N, H * W * 3 / 2]` (luma, then the blue and red planes) into `out` `[N, H, W, 3]`."""
    count, height, width, _ = out.shape
    luma_size, chroma_size = height * width, (height // 2) * (width // 2)
    for n in range(count):
        packed = frames[n]
        luma = packed[:luma_size].reshape(height, width)
        blue = packed[luma_size : luma_size + chroma_size].reshape(height // 2, width // 2)
        red = packed[luma_size + chroma_size : luma_size + 2 * chroma_size].reshape(height // 2, width // 2)
        yuv420_to_rgb(luma, blue, red, out[n], False)
