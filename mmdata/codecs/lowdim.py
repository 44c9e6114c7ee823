"""Low-dimensional arrays as `.npy` bytes: readable by numpy alone, exact to the bit.

Reading checks the header before anything is allocated: the declared shape and dtype must be
the expected ones (when given) and the bytes after the header must be exactly what they declare,
so a 100-byte file cannot declare 10^11 rows.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from mmdata.errors import NpyError

MAX_HEADER_BYTES = 65536


def encode_npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(values), allow_pickle=False)
    return buffer.getvalue()


def npy_header(data: bytes | io.BufferedReader) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran order, header length) of `.npy` bytes or an open file; raises NpyError."""
    stream = io.BytesIO(data[:MAX_HEADER_BYTES]) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(stream, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise NpyError(f"not a readable .npy array ({exc})") from exc
    if dtype.hasobject or dtype.kind not in "biuf":
        raise NpyError(f"holds {dtype} values, not numbers")
    return tuple(int(size) for size in shape), dtype, bool(fortran), stream.tell()


def decode_npy(data: bytes, shape: tuple[int, ...] | None = None, dtype: str | None = None) -> np.ndarray:
    """The array in `.npy` bytes, read-only; with `shape` / `dtype` it must be exactly that."""
    declared, found_dtype, fortran, header = npy_header(data)
    if shape is not None and declared != tuple(shape):
        raise NpyError(f"holds an array of shape {declared}, the manifest says {tuple(shape)}")
    if dtype is not None and found_dtype != np.dtype(dtype):
        raise NpyError(f"holds {found_dtype} values, the schema says {dtype}")
    count = math.prod(declared)
    if len(data) - header != count * found_dtype.itemsize:
        raise NpyError(
            f"declares {count} values of {found_dtype.itemsize} bytes but holds {len(data) - header} bytes after"
            " its header"
        )
    values = np.frombuffer(data, found_dtype, count, header)
    return values.reshape(declared, order="F" if fortran else "C")


def load_npy_file(path: str | Path, max_bytes: int) -> np.ndarray:
    """An `.npy` file, after checking that its header agrees with its size and that it holds at most
    `max_bytes` of values; raises NpyError otherwise."""
    with open(path, "rb") as handle:
        shape, dtype, fortran, header = npy_header(handle)
        size = Path(path).stat().st_size
        count = math.prod(shape)
        if size - header != count * dtype.itemsize:
            raise NpyError(f"declares {shape} of {dtype} but the file holds {size - header} bytes after its header")
        if count * dtype.itemsize > max_bytes:
            raise NpyError(f"holds {count * dtype.itemsize} bytes of values, more than the {max_bytes} allowed")
        values = np.fromfile(handle, dtype, count)
    return values.reshape(shape, order="F" if fortran else "C")
