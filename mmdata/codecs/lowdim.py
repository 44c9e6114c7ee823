"""Low-dimensional arrays as `.npy` bytes: readable by numpy alone, exact to the bit."""

from __future__ import annotations

import io

import numpy as np


def encode_npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(values), allow_pickle=False)
    return buffer.getvalue()


def decode_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)
