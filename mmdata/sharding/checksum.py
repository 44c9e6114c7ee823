"""Checksums recorded in the manifest for every stored piece (xxHash64, hex)."""

from __future__ import annotations

import numpy as np
import xxhash

ALGORITHM = "xxh64"


def checksum_bytes(data: bytes | memoryview) -> str:
    """Hex xxHash64 of a byte string."""
    return xxhash.xxh64_hexdigest(data)


def checksum_array(values: np.ndarray) -> str:
    """Hex xxHash64 of an array's C-order bytes (how Zarr rows are checked)."""
    return xxhash.xxh64_hexdigest(np.ascontiguousarray(values).tobytes())
