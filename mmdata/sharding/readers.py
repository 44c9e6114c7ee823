"""Fetch stored pieces by their manifest address: byte ranges of shards, or Zarr elements and rows.

Both layouts read through `sharding/filesystem.py` (deadlines, retries of transient errors only)
and, with `verify` (the default), check every piece against the manifest's checksum, so a flipped
byte is an IntegrityError and never a wrong frame. Numeric rows are checked against the shape
and dtype the schema declares before anything is allocated for them.
"""

from __future__ import annotations

from typing import Protocol

import fsspec
import numpy as np

from mmdata.codecs.lowdim import NpyError, decode_npy
from mmdata.errors import IntegrityError
from mmdata.schema import DatasetSchema
from mmdata.sharding.checksum import checksum_array, checksum_bytes
from mmdata.sharding.filesystem import DEFAULT_READ_POLICY, ReadPolicy, join, read_range
from mmdata.sharding.manifest import Piece
from mmdata.sharding.zarr_reader import ZarrArrays


class PieceReader(Protocol):
    bytes_read: int  # running total of payload bytes fetched, for throughput figures
    verify: bool

    def read_bytes(self, piece: Piece) -> bytes:
        """An encoded blob: a video segment, an audio file, or (WebDataset) any member."""

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A numeric array of exactly `shape` and `dtype`: low-dim values or timestamps."""


def checked(piece: Piece, checksum: str) -> None:
    """Raise IntegrityError, naming the piece, when what was read is not what the writer stored."""
    if checksum != piece.checksum:
        raise IntegrityError(
            f"{piece.path} at {piece.offset} ({piece.size} bytes): checksum mismatch ({checksum} read, the manifest"
            f" says {piece.checksum}); the store is damaged: restore the file or convert again"
        )


class WdsPieceReader:
    """Pieces of WebDataset shards: each one is one byte-range read, checked against its checksum
    when `verify` is set (xxHash64 runs at several GB/s, far below the cost of decoding)."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
    ):
        self.fs = fs
        self.root = root
        self.verify = verify
        self.policy = policy
        self.bytes_read = 0

    def read_bytes(self, piece: Piece) -> bytes:
        data = read_range(self.fs, join(self.root, piece.path), piece.offset, piece.size, self.policy)
        self.bytes_read += len(data)
        if self.verify:
            checked(piece, checksum_bytes(data))
        return data

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        data = self.read_bytes(piece)
        try:
            return decode_npy(data, shape, dtype)
        except NpyError as exc:
            raise IntegrityError(f"{piece.path} at {piece.offset}: {exc}; restore the file or convert again") from exc


class ZarrPieceReader:
    """Pieces of a Zarr v3 store: elements of byte arrays, row ranges of numeric arrays."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
    ):
        self.arrays = ZarrArrays(fs, root, policy)
        self.verify = verify
        self.bytes_read = 0

    def read_bytes(self, piece: Piece) -> bytes:
        data = self.arrays.element(piece.path, piece.offset, piece.size)
        self.bytes_read += len(data)
        if self.verify:
            checked(piece, checksum_bytes(data))
        return data

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        values = self.arrays.rows(piece.path, piece.offset, shape[0], shape[1:], dtype)
        self.bytes_read += values.nbytes
        if self.verify:
            checked(piece, checksum_array(values))
        return values


def zarr_array_paths(schema: DatasetSchema) -> list[str]:
    """The Zarr arrays a store's schema implies (checked when the store is opened)."""
    groups = {"video": ("video", "timestamps"), "audio": ("audio",), "lowdim": ("data", "timestamps")}
    return [f"{group}/{stream.name}" for stream in schema.streams for group in groups.get(stream.kind, ())]


def piece_reader(
    layout: str, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
) -> PieceReader:
    reader = WdsPieceReader if layout == "wds" else ZarrPieceReader
    return reader(fs, root, verify, policy)
