"""Checksums recorded in the manifest for every stored piece (xxHash64, hex), and CRC32C, which the
formats mmdata reads use (Zarr shard indexes, TFRecord framing)."""

from __future__ import annotations

import struct

import numpy as np
import xxhash

ALGORITHM = "xxh64"


def checksum_bytes(data: bytes | memoryview) -> str:
    """Hex xxHash64 of a byte string."""
    return xxhash.xxh64_hexdigest(data)


def checksum_array(values: np.ndarray) -> str:
    """Hex xxHash64 of an array's C-order bytes (how Zarr rows are checked)."""
    return xxhash.xxh64_hexdigest(np.ascontiguousarray(values).tobytes())


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli) of a byte string: google-crc32c when installed, else numcodecs' (zarr's)."""
    try:
        import google_crc32c

        return int(google_crc32c.value(bytes(data)))
    except ImportError:
        from numcodecs import CRC32C

        return struct.unpack("<I", bytes(CRC32C().encode(np.frombuffer(data, np.uint8)))[-4:])[0]
