"""Fetch stored pieces by their manifest address: byte ranges of shards, or Zarr elements."""

from __future__ import annotations

import warnings
from typing import Protocol

import fsspec
import numpy as np

from mmdata.codecs.lowdim import decode_npy
from mmdata.errors import IntegrityError
from mmdata.sharding.checksum import checksum_array, checksum_bytes
from mmdata.sharding.filesystem import join, read_range
from mmdata.sharding.manifest import Piece


class PieceReader(Protocol):
    bytes_read: int  # running total of payload bytes fetched, for throughput figures

    def read_bytes(self, piece: Piece) -> bytes:
        """An encoded blob: a video segment, an audio file, or (WebDataset) any member."""

    def read_rows(self, piece: Piece, count: int) -> np.ndarray:
        """A numeric array of `count` rows: low-dim values or timestamps."""

    def read_rows_with_checksum(self, piece: Piece, count: int) -> tuple[np.ndarray, str]:
        """The rows and their checksum, computed the way the writer computed it, from one read."""


def checked(piece: Piece, checksum: str) -> None:
    """Raise IntegrityError, naming the piece, when what was read is not what the writer stored."""
    if checksum != piece.checksum:
        raise IntegrityError(
            f"{piece.path} at {piece.offset} ({piece.size} bytes): checksum {checksum} does not match the"
            f" manifest's {piece.checksum}; the store is damaged: restore the file or convert again"
        )


class WdsPieceReader:
    """Pieces of WebDataset shards: each one is one byte-range read, checked against its checksum
    when `verify` is set (xxHash64 runs at several GB/s, far below the cost of decoding)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = False):
        self.fs = fs
        self.root = root
        self.verify = verify
        self.bytes_read = 0

    def read_bytes(self, piece: Piece) -> bytes:
        data = read_range(self.fs, join(self.root, piece.path), piece.offset, piece.size)
        self.bytes_read += len(data)
        if self.verify:
            checked(piece, checksum_bytes(data))
        return data

    def read_rows(self, piece: Piece, count: int) -> np.ndarray:
        data = self.read_bytes(piece)
        try:
            return decode_npy(data)
        except (ValueError, EOFError, OSError) as exc:
            raise IntegrityError(f"{piece.path} at {piece.offset}: not a readable .npy array ({exc})") from exc

    def read_rows_with_checksum(self, piece: Piece, count: int) -> tuple[np.ndarray, str]:
        data = self.read_bytes(piece)
        return decode_npy(data), checksum_bytes(data)


class ZarrPieceReader:
    """Pieces of a Zarr v3 store: elements of byte arrays, row ranges of numeric arrays."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = False):
        import zarr
        from zarr.storage import FsspecStore, LocalStore

        protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
        if "file" in protocols:
            store = LocalStore(root, read_only=True)
        else:
            store = FsspecStore.from_url(f"{protocols[0]}://{root.lstrip('/')}", read_only=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.group = zarr.open_group(store, mode="r", zarr_format=3)
        self._arrays: dict = {}
        self.verify = verify
        self.bytes_read = 0

    def _array(self, path: str):
        if path not in self._arrays:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._arrays[path] = self.group[path]
        return self._arrays[path]

    def read_bytes(self, piece: Piece) -> bytes:
        data = bytes(self._read(piece, 1)[0])
        if self.verify:
            checked(piece, checksum_bytes(data))
        return data

    def read_rows(self, piece: Piece, count: int) -> np.ndarray:
        values = self._read(piece, count)
        if self.verify:
            checked(piece, checksum_array(values))
        return values

    def _read(self, piece: Piece, count: int):
        array = self._array(piece.path)
        self.bytes_read += piece.size
        try:
            return array[piece.offset : piece.offset + count]
        except (RuntimeError, ValueError) as exc:  # a compressed chunk or shard index that does not decode
            raise IntegrityError(
                f"{piece.path}[{piece.offset}:{piece.offset + count}] does not decode ({exc});"
                " the store is damaged: restore it or convert again"
            ) from exc

    def read_rows_with_checksum(self, piece: Piece, count: int) -> tuple[np.ndarray, str]:
        values = self.read_rows(piece, count)
        return values, checksum_array(values)


def piece_reader(layout: str, fs: fsspec.AbstractFileSystem, root: str, verify: bool = False) -> PieceReader:
    return WdsPieceReader(fs, root, verify) if layout == "wds" else ZarrPieceReader(fs, root, verify)
