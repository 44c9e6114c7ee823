"""Read the Zarr v3 arrays mmdata writes, by byte ranges through the store's one read path.

Each array's `zarr.json` is checked against what the writer writes (data type, shape, chunking,
codecs); anything else is refused with a StoreError naming the array. A piece is then fetched as
the chunk (numeric rows) or the shard element (a video segment, an audio file) that holds it, with
the shared timeouts and retries, and decompressed into a buffer of exactly the size the metadata
declares, so a small hostile chunk cannot expand into gigabytes. The layouts read:

- numeric arrays `[N, *row]`, chunked along the first axis only, codecs `bytes` (+ `zstd`);
- byte arrays (`variable_length_bytes`), one element per inner chunk, `sharding_indexed` with
  `vlen-bytes` (+ `zstd`) inside and a `bytes` (+ `crc32c`) index at the shard's end or start.

A chunk that was never written reads as the array's fill value, as in Zarr (the writer skips
chunks that hold only it); the manifest's checksums tell such a chunk from a deleted one.
"""

from __future__ import annotations

import math
import struct
import threading
from dataclasses import dataclass

import fsspec
import numpy as np
from cachetools import LRUCache

from mmdata.checks import parse_json
from mmdata.errors import IntegrityError, ReadError, StoreError
from mmdata.store.checksum import crc32c
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy, join, read_file, read_range, read_tail

MAX_CHUNK_BYTES = 256 << 20
MAX_METADATA_BYTES = 1 << 20
BYTES_TYPES = ("variable_length_bytes", "bytes")
_EMPTY = 2**64 - 1
_SHARD_INDEXES_KEPT = 512


@dataclass(frozen=True)
class ArrayLayout:
    """What reading an array needs from its `zarr.json`, after checking it."""

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype | None  # None for byte arrays
    chunk_rows: int
    separator: str
    compressed: bool
    fill_value: float | int | bool
    index_at_end: bool = True
    index_checksum: bool = False

    @property
    def chunk_bytes(self) -> int:
        row = int(np.prod(self.shape[1:], dtype=np.int64)) * (self.dtype.itemsize if self.dtype is not None else 0)
        return self.chunk_rows * row

    def key(self, chunk: int) -> str:
        return join(self.path, self.separator.join(["c", str(chunk), *["0"] * (len(self.shape) - 1)]))


class HeldBytes:
    """Bytes fetched ahead for a micro-batch's reads: spans of shard files and whole chunk files, by path."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[int, bytes]]] = {}
        self.files: dict[str, bytes] = {}

    def span(self, path: str, offset: int, size: int) -> bytes | None:
        for start, data in self.spans.get(path, ()):
            if start <= offset and offset + size <= start + len(data):
                return data[offset - start : offset - start + size]
        return None

    def add(self, other: HeldBytes) -> None:
        for path, spans in other.spans.items():
            self.spans.setdefault(path, []).extend(spans)
        self.files.update(other.files)

    def copy(self) -> HeldBytes:
        held = HeldBytes()
        held.add(self)
        return held


@dataclass(frozen=True)
class FetchPlan:
    """Where a set of pieces lies in the store's files: byte spans (path, offset, size) and whole files."""

    spans: list[tuple[str, int, int]]
    files: list[tuple[str, int]]  # (path, most bytes it may hold)


class ZarrArrays:
    """The arrays of one store, each checked once when first used; reads rows and byte elements, from
    `held` bytes when they were fetched ahead (see `locate`)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, policy: ReadPolicy = DEFAULT_READ_POLICY):
        self.fs = fs
        self.root = root
        self.policy = policy
        self.held = HeldBytes()
        self._layouts: dict[str, ArrayLayout] = {}
        self._indexes: LRUCache = LRUCache(maxsize=_SHARD_INDEXES_KEPT)
        self._indexes_lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {
            **self.__dict__,
            "_indexes": LRUCache(maxsize=_SHARD_INDEXES_KEPT),
            "held": HeldBytes(),
            "_indexes_lock": None,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _indexes_lock=threading.Lock())

    def locate(self, elements: list[tuple[str, int]], rows: list[tuple[str, int, int]]) -> FetchPlan:
        """Where byte-array `elements` (path, index) and numeric `rows` (path, start, count) lie; reads the shard
        indexes it needs (a fetch ahead runs this in its own thread). Anything out of range is left to the read."""
        spans: list[tuple[str, int, int]] = []
        files: dict[str, int] = {}
        for path, index in elements:
            layout = self.layout(path)
            if layout.dtype is not None or not 0 <= index < layout.shape[0]:
                continue
            shard, inner = divmod(index, layout.chunk_rows)
            offset, nbytes = (int(v) for v in self._shard_index(layout, shard)[inner])
            if offset != _EMPTY:
                spans.append((join(self.root, layout.key(shard)), offset, nbytes))
        for path, start, count in rows:
            layout = self.layout(path)
            if layout.dtype is None or count <= 0 or start < 0 or start + count > layout.shape[0]:
                continue
            limit = _zstd_bound(layout.chunk_bytes) if layout.compressed else layout.chunk_bytes
            for chunk in range(start // layout.chunk_rows, (start + count - 1) // layout.chunk_rows + 1):
                files[join(self.root, layout.key(chunk))] = limit
        return FetchPlan(spans, sorted(files.items()))

    def layout(self, path: str) -> ArrayLayout:
        if path not in self._layouts:
            where = join(self.root, path)
            try:
                document = parse_json(read_file(self.fs, join(where, "zarr.json"), MAX_METADATA_BYTES, self.policy))
                self._layouts[path] = parse_layout(path, document)
            except ReadError as exc:
                raise StoreError(f"Zarr array '{path}' of the store cannot be read: {exc}") from exc
            except ValueError as exc:
                raise StoreError(
                    f"Zarr array '{path}' ({where}/zarr.json): {exc}; mmdata reads the Zarr layout its own"
                    " writer makes: convert the store again"
                ) from exc
        return self._layouts[path]

    def rows(self, path: str, start: int, count: int, row_shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """Rows [start, start + count) of a numeric array whose rows are `row_shape` of `dtype`."""
        layout = self.layout(path)
        native = None if layout.dtype is None else layout.dtype.newbyteorder("=")
        if native is None or native != np.dtype(dtype).newbyteorder("=") or layout.shape[1:] != tuple(row_shape):
            found = "bytes" if layout.dtype is None else f"{layout.dtype} rows of {layout.shape[1:]}"
            raise StoreError(f"Zarr array '{path}' holds {found}; the store's schema says {dtype} rows of {row_shape}")
        if start < 0 or count < 0 or start + count > layout.shape[0]:
            raise IntegrityError(
                f"Zarr array '{path}': rows {start}..{start + count} lie outside its {layout.shape[0]} rows"
            )
        if count == 0:
            return np.empty((0, *layout.shape[1:]), native)
        first, last = start // layout.chunk_rows, (start + count - 1) // layout.chunk_rows
        parts = [self._chunk(layout, chunk) for chunk in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        offset = start - first * layout.chunk_rows
        return np.array(joined[offset : offset + count], dtype=native)  # in this machine's byte order

    def element(self, path: str, index: int, size: int) -> bytes:
        """Element `index` of a byte array, which the manifest says holds `size` bytes."""
        layout = self.layout(path)
        if layout.dtype is not None:
            raise StoreError(f"Zarr array '{path}' holds numbers, not the encoded bytes the schema says")
        if not 0 <= index < layout.shape[0]:
            raise IntegrityError(f"Zarr array '{path}': element {index} lies outside its {layout.shape[0]}")
        shard, inner = divmod(index, layout.chunk_rows)
        key = layout.key(shard)
        offset, nbytes = (int(v) for v in self._shard_index(layout, shard)[inner])
        if offset == _EMPTY and nbytes == _EMPTY:
            raise IntegrityError(f"{key}: element {index} of '{path}' is missing; restore the store or convert again")
        expected = size + 8  # vlen-bytes: item count and length, then the bytes
        if nbytes > (_zstd_bound(expected) if layout.compressed else expected):
            raise IntegrityError(f"{key}: element {index} takes {nbytes} bytes, too many for the {size} it holds")
        raw = self.held.span(join(self.root, key), offset, nbytes)
        if raw is None:
            raw = read_range(self.fs, join(self.root, key), offset, nbytes, self.policy)
        payload = _decompress(raw, expected, key).tobytes() if layout.compressed else raw
        if len(payload) != expected:
            raise IntegrityError(f"{key}: element {index} holds {len(payload) - 8} bytes, the manifest says {size}")
        items, length = struct.unpack_from("<II", payload)
        if items != 1 or length != size:
            raise IntegrityError(f"{key}: element {index} is not one byte string of {size} bytes")
        return payload[8:]

    def _chunk(self, layout: ArrayLayout, chunk: int) -> np.ndarray:
        key = layout.key(chunk)
        shape = (layout.chunk_rows, *layout.shape[1:])
        expected = layout.chunk_bytes
        limit = _zstd_bound(expected) if layout.compressed else expected
        try:
            raw = self.held.files.get(join(self.root, key))
            if raw is None or len(raw) > limit:
                raw = read_file(self.fs, join(self.root, key), limit, self.policy)
        except ReadError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            return np.full(shape, layout.fill_value, layout.dtype)
        except IntegrityError as exc:
            raise IntegrityError(f"{key}: a chunk larger than its {expected} bytes could hold ({exc})") from exc
        payload = _decompress(raw, expected, key) if layout.compressed else np.frombuffer(raw, np.uint8)
        if len(payload) != expected:
            raise IntegrityError(f"{key}: the chunk holds {len(payload)} bytes, its array declares {expected}")
        assert layout.dtype is not None, "a byte array's chunks are read element by element"
        return payload.view(layout.dtype).reshape(shape)

    def _shard_index(self, layout: ArrayLayout, shard: int) -> np.ndarray:
        with self._indexes_lock:
            cached = self._indexes.get((layout.path, shard))
            if cached is not None:
                return cached
        key = join(self.root, layout.key(shard))
        index_bytes = layout.chunk_rows * 16 + (4 if layout.index_checksum else 0)
        if layout.index_at_end:
            data, length = read_tail(self.fs, key, index_bytes, self.policy)
        else:
            data, length = read_range(self.fs, key, 0, index_bytes, self.policy), None
        entries = data[: layout.chunk_rows * 16]
        if layout.index_checksum and crc32c(entries) != struct.unpack("<I", data[-4:])[0]:
            raise IntegrityError(f"{key}: the shard index fails its CRC32C; restore the store or convert again")
        index = np.frombuffer(entries, "<u8").reshape(layout.chunk_rows, 2)
        used = index[:, 0] != _EMPTY
        if length is not None and (index[used, 0] + index[used, 1] > length).any():
            raise IntegrityError(f"{key}: the shard index points past the end of the shard")
        with self._indexes_lock:
            self._indexes[(layout.path, shard)] = index
        return index


def parse_layout(path: str, document: object) -> ArrayLayout:
    """Check a `zarr.json` document against the layouts mmdata writes; raises ValueError saying why not."""
    if not isinstance(document, dict) or document.get("zarr_format") != 3 or document.get("node_type") != "array":
        raise ValueError("not a Zarr v3 array")
    if document.get("storage_transformers"):
        raise ValueError("storage transformers are not read")
    shape = _sizes(document.get("shape"), "shape")
    if not shape:
        raise ValueError("has no dimensions")
    grid = document.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise ValueError("its chunk grid is not regular")
    chunks = _sizes((grid.get("configuration") or {}).get("chunk_shape"), "chunk_shape")
    if len(chunks) != len(shape) or chunks[0] < 1 or tuple(chunks[1:]) != tuple(shape[1:]):
        raise ValueError(f"chunk shape {chunks} does not cut shape {shape} along its first axis only")
    encoding = document.get("chunk_key_encoding")
    separator = (encoding or {}).get("configuration", {}).get("separator", "/") if isinstance(encoding, dict) else None
    if not isinstance(encoding, dict) or encoding.get("name") != "default" or separator not in ("/", "."):
        raise ValueError("chunk keys are not Zarr v3's default encoding")
    codecs = document.get("codecs")
    if not isinstance(codecs, list) or not codecs:
        raise ValueError("lists no codecs")
    data_type = document.get("data_type")
    if data_type in BYTES_TYPES:
        return _bytes_layout(path, shape, chunks[0], separator, codecs)
    dtype = _numeric_dtype(data_type)
    names = [_codec_name(codec) for codec in codecs]
    if names not in (["bytes"], ["bytes", "zstd"]):
        raise ValueError(f"codecs {names} are not bytes (+ zstd)")
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    if endian not in ("little", "big"):
        raise ValueError(f"byte order {endian!r} is neither little nor big")
    layout = ArrayLayout(
        path,
        shape,
        dtype.newbyteorder("<" if endian == "little" else ">"),
        chunks[0],
        separator,
        names[-1] == "zstd",
        _fill_value(document.get("fill_value"), dtype),
    )
    if layout.chunk_bytes > MAX_CHUNK_BYTES:
        raise ValueError(f"a chunk holds {layout.chunk_bytes} bytes, more than the {MAX_CHUNK_BYTES} read at once")
    return layout


def _bytes_layout(path: str, shape: tuple[int, ...], per_shard: int, separator: str, codecs: list) -> ArrayLayout:
    if len(shape) != 1 or len(codecs) != 1 or _codec_name(codecs[0]) != "sharding_indexed":
        raise ValueError("a byte array is read only as a 1-D array sharded with sharding_indexed")
    config = codecs[0].get("configuration") or {}
    if _sizes(config.get("chunk_shape"), "inner chunk_shape") != (1,):
        raise ValueError("a shard's inner chunks do not hold one element each")
    inner = [_codec_name(codec) for codec in config.get("codecs") or []]
    if inner not in (["vlen-bytes"], ["vlen-bytes", "zstd"]):
        raise ValueError(f"inner codecs {inner} are not vlen-bytes (+ zstd)")
    index = [_codec_name(codec) for codec in config.get("index_codecs") or []]
    if index not in (["bytes"], ["bytes", "crc32c"]):
        raise ValueError(f"shard index codecs {index} are not bytes (+ crc32c)")
    if (config["index_codecs"][0].get("configuration") or {}).get("endian", "little") != "little":
        raise ValueError("the shard index is not little-endian")
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise ValueError(f"shard index location {location!r}")
    if per_shard > 1 << 20:
        raise ValueError(f"shards of {per_shard} elements are too large to index")
    compressed = inner[-1] == "zstd"
    return ArrayLayout(path, shape, None, per_shard, separator, compressed, 0, location == "end", "crc32c" in index)


def _codec_name(codec: object) -> str:
    if isinstance(codec, str):
        return codec
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        return codec["name"]
    raise ValueError(f"a codec entry {codec!r} has no name")


def _sizes(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"{what} {value!r} is not a list of sizes")
    if len(value) > 9 or math.prod(value) > 2**62:
        raise ValueError(f"{what} {value!r} is out of range")
    return tuple(value)


def _numeric_dtype(data_type: object) -> np.dtype:
    names = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32")
    if data_type not in (*names, "float64"):
        raise ValueError(f"data type {data_type!r} is not one mmdata stores")
    return np.dtype(str(data_type))


def _fill_value(value: object, dtype: np.dtype) -> float | int | bool:
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(str(value).replace("Infinity", "inf"))
    if isinstance(value, bool) or (isinstance(value, (int, float)) and dtype.kind in "iufb"):
        return value
    if value is None:
        return 0
    raise ValueError(f"fill value {value!r} is not a number")


def _decompress(data: bytes, expected: int, key: str) -> np.ndarray:
    """Zstandard-decompress `data` into exactly `expected` bytes, checking the frame's declared size
    first: a frame that declares any other size (or none) is refused before anything is allocated."""
    from numcodecs import zstd

    declared = zstd_content_size(data)
    if declared != expected:
        raise IntegrityError(f"{key}: a zstd frame declaring {declared} bytes where its array holds {expected}")
    out = np.empty(expected, np.uint8)
    try:
        zstd.decompress(data, out)
    except (RuntimeError, ValueError) as exc:
        raise IntegrityError(f"{key}: does not decompress ({exc}); restore the store or convert again") from exc
    return out


def zstd_content_size(data: bytes) -> int | None:
    """The content size a zstd frame header declares (RFC 8878, 3.1.1), or None when it declares none."""
    if len(data) < 6 or data[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = data[4]
    single_segment = (descriptor >> 5) & 1
    size_flag = descriptor >> 6
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0 or len(data) < position + width:
        return None
    value = int.from_bytes(data[position : position + width], "little")
    return value + 256 if width == 2 else value


def _zstd_bound(size: int) -> int:
    """The most bytes a zstd frame of `size` bytes of content can take (ZSTD_COMPRESSBOUND, with room)."""
    return size + (size >> 7) + 1024
