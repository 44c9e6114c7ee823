"""Streams held as arrays inside a container file (HDF5, Zarr) or as rows of a Parquet table.

Each source is a small, picklable address (file, key, row range) that reads its data only when
a conversion worker asks, and names the file and key in every error.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import av
import numpy as np

from mmdata.codecs.video_source import VideoInfo
from mmdata.errors import SourceError
from mmdata.importers.limits import (
    MAX_ARRAY_CHUNK_BYTES,
    MAX_IMAGE_BLOCK_BYTES,
    MAX_LOWDIM_BYTES,
    frame_size_problem,
)
from mmdata.importers.zarr_groups import missing_codec, open_replay_group


@dataclass(frozen=True)
class ArrayShape:
    """What an array declares, read from its metadata alone: rows (of the episode's range), the
    shape of one row, the element type, and the bytes of its largest stored chunk."""

    rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    chunk_bytes: int

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class Hdf5Array:
    """Rows [start, stop) of dataset `key` in the HDF5 file `path` (all rows when stop is None).

    The dataset must hold its data inside the file: external raw storage, virtual datasets and
    links to other files are refused, so an importer never reads a file outside its source.
    """

    path: str
    key: str
    start: int = 0
    stop: int | None = None

    def where(self) -> str:
        return f"{self.path}:{self.key}"

    def shape(self, episode: str) -> ArrayShape:
        return self._open(episode, lambda data: _declared(data.shape, data.dtype, data.chunks, self, episode))

    def read(self, episode: str, first: int = 0, last: int | None = None) -> np.ndarray:
        """Rows [first, last) of the address's range (all of it by default)."""
        lo, hi = _within(self.start, self.stop, first, last)
        return self._open(episode, lambda dataset: np.asarray(dataset[lo:hi]))

    def _open(self, episode: str, use):
        import h5py

        try:
            with h5py.File(self.path, "r") as handle:
                return use(hdf5_dataset(handle, self.key, episode, self.path))
        except OSError as exc:
            raise SourceError(episode, self.path, f"unreadable HDF5 file: {exc}") from exc


def hdf5_dataset(handle, key: str, episode: str, path: str):
    """`handle[key]`, after checking that no link on the way leaves the file and that the dataset's
    data is stored in it (not external raw files, not a virtual dataset mapping other files)."""
    import h5py

    node = handle
    for part in [p for p in key.split("/") if p]:
        link = node.get(part, getlink=True)
        if link is None:
            raise SourceError(episode, path, f"no dataset '{key}'", "check the file's layout")
        if isinstance(link, h5py.ExternalLink):
            raise SourceError(episode, path, f"'{key}' links to another file ({link.filename})", "copy the data in")
        node = node[part]
    if not isinstance(node, h5py.Dataset):
        raise SourceError(episode, path, f"'{key}' is a group, not a dataset", "check the file's layout")
    if node.external or node.is_virtual:
        raise SourceError(
            episode, path, f"dataset '{key}' keeps its data in other files (external or virtual)", "copy the data in"
        )
    return node


@dataclass(frozen=True)
class ZarrArray:
    """Rows [start, stop) of array `key` in the Zarr store `path` (a folder or a .zip; v2 or v3)."""

    path: str
    key: str
    start: int = 0
    stop: int | None = None

    def where(self) -> str:
        return f"{self.path}/{self.key}"

    def shape(self, episode: str) -> ArrayShape:
        array = self._array(episode)
        return _declared(array.shape, array.dtype, array.chunks, self, episode)

    def read(self, episode: str, first: int = 0, last: int | None = None) -> np.ndarray:
        """Rows [first, last) of the address's range (all of it by default)."""
        lo, hi = _within(self.start, self.stop, first, last)
        try:
            return np.asarray(self._array(episode)[lo:hi])
        except (RuntimeError, ValueError, TypeError) as exc:
            raise self._failure(episode, exc) from exc

    def _array(self, episode: str):
        try:
            return open_replay_group(self.path)[self.key]
        except KeyError as exc:
            raise SourceError(episode, self.path, f"no array '{self.key}'", "check the store's layout") from exc
        except (RuntimeError, ValueError, TypeError) as exc:
            raise self._failure(episode, exc) from exc

    def _failure(self, episode: str, exc: Exception) -> SourceError:
        missing = missing_codec(exc)
        if missing is not None:
            return SourceError(episode, self.where(), str(missing), "pip install imagecodecs")
        return SourceError(episode, self.where(), f"cannot be read: {exc}")


ArrayRef = Hdf5Array | ZarrArray


class RowArray(Protocol):
    """Rows an importer reads a block at a time: an HDF5 or Zarr array, LeRobot's image column, RLDS's steps."""

    @property
    def path(self) -> str: ...

    def where(self) -> str: ...

    def shape(self, episode: str) -> ArrayShape: ...

    def read(self, episode: str, first: int = 0, last: int | None = None) -> np.ndarray: ...


def _within(start: int, stop: int | None, first: int, last: int | None) -> tuple[int, int | None]:
    lo = start + first
    if last is None:
        return lo, stop
    return lo, start + last if stop is None else min(stop, start + last)


def _declared(shape: tuple, dtype, chunks: tuple | None, array: ArrayRef, episode: str) -> ArrayShape:
    """The declared shape of the address's rows, refusing a chunk too large to decompress at once."""
    dtype = np.dtype(dtype)
    rows = 0
    if shape:
        stop = shape[0] if array.stop is None else min(array.stop, shape[0])
        rows = max(0, stop - array.start)
    chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize if chunks else 0
    declared = ArrayShape(rows, tuple(int(n) for n in shape[1:]), dtype, chunk_bytes)
    if chunk_bytes > MAX_ARRAY_CHUNK_BYTES:
        limit = MAX_ARRAY_CHUNK_BYTES
        raise SourceError(episode, array.where(), f"stores chunks of {chunk_bytes} bytes, above the {limit} allowed")
    return declared


def require_bytes(array: RowArray, declared: ArrayShape, limit: int, episode: str, what: str) -> None:
    """Refuse to read `declared` rows when they would take more than `limit` bytes."""
    total = declared.rows * declared.row_bytes
    if total > limit:
        raise SourceError(
            episode,
            array.where(),
            f"{what} declares {declared.rows} rows of {declared.row_shape} {declared.dtype} = {total} bytes, more than"
            f" the {limit} one episode's stream may hold",
            "check the file; it may be damaged",
        )


@dataclass(frozen=True)
class ArrayCameraSource:
    """A camera stored as images: uint8 `[T, H, W, 3]` (or `[T, H, W]` grey), or one JPEG/PNG per row.

    Images are read a block of rows at a time, so memory does not grow with the episode's length.
    """

    name: str
    array: RowArray
    fps: float

    @property
    def path(self) -> str:
        return self.array.path

    def declared_frames(self, episode: str) -> int:
        """Images the array declares for the episode, from its metadata alone (nothing is read)."""
        return self._declared(episode).rows

    def info(self, episode: str) -> VideoInfo:
        declared = self._declared(episode)
        if declared.rows == 0:
            raise SourceError(episode, self.array.where(), "holds no images")
        first = next(iter(self._images(episode, 0, 1)))
        height, width = first.shape[:2]
        problem = frame_size_problem(width, height)
        if problem is not None:
            raise SourceError(episode, self.array.where(), problem, "store smaller images")
        return VideoInfo(width, height, Fraction(self.fps).limit_denominator(1001), "raw")

    def frames(self, episode: str, fps: Fraction) -> Iterator[tuple[np.ndarray, float]]:
        declared = self._declared(episode)
        encoded = _encoded_rows(declared)
        # raw images: as many rows as fit in a block's bytes; encoded ones: 64 rows of their (compressed)
        # bytes at a time, each decoded only when the encoder takes it
        block = 64 if encoded else max(1, MAX_IMAGE_BLOCK_BYTES // max(1, declared.row_bytes))
        index = 0
        for first in range(0, declared.rows, block):
            for image in self._images(episode, first, min(declared.rows, first + block)):
                yield image, index / float(fps)
                index += 1

    def _declared(self, episode: str) -> ArrayShape:
        declared = self.array.shape(episode)
        if not _encoded_rows(declared) and (declared.dtype != np.uint8 or len(declared.row_shape) not in (2, 3)):
            raise SourceError(
                episode,
                self.array.where(),
                f"images are {declared.dtype} {declared.row_shape}",
                "expected uint8 [T, H, W, 3]",
            )
        return declared

    def _images(self, episode: str, first: int, last: int) -> Iterator[np.ndarray] | np.ndarray:
        data = self.array.read(episode, first, last)
        if data.dtype == object or data.ndim == 1 or (data.ndim == 2 and data.dtype == np.uint8):
            # one compressed image per row: variable-length bytes, or uint8 rows padded with zeros (ACT),
            # decoded one at a time (pictures of another size are named where frames are encoded)
            return (decode_image(_as_bytes(item), episode, self.array.where()) for item in data)
        if data.ndim == 3:
            data = np.repeat(data[..., None], 3, axis=-1)
        if data.shape[-1] != 3:
            raise SourceError(episode, self.array.where(), f"images have {data.shape[-1]} channels, not 3")
        return data


def _encoded_rows(declared: ArrayShape) -> bool:
    """Whether each row holds one compressed image (bytes objects, or a padded uint8 vector)."""
    return (
        declared.dtype == object
        or len(declared.row_shape) == 0
        or (len(declared.row_shape) == 1 and declared.dtype == np.uint8)
    )


@dataclass(frozen=True)
class ArrayLowdimSource:
    """A numeric stream `[T, ...]` stored as an array, sampled at `rate` Hz."""

    name: str
    array: RowArray
    rate: float

    @property
    def path(self) -> str:
        return self.array.path

    def declared_rows(self, episode: str) -> int:
        return self.array.shape(episode).rows

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        declared = self.array.shape(episode)
        if declared.dtype.kind not in "biuf":
            raise SourceError(episode, self.array.where(), f"holds {declared.dtype} values, not numbers")
        require_bytes(self.array, declared, MAX_LOWDIM_BYTES, episode, f"low-dim stream '{self.name}'")
        values = self.array.read(episode)
        if values.ndim == 1:
            values = values[:, None]
        return values, np.arange(len(values), dtype=np.float64) / self.rate


@dataclass(frozen=True)
class ParquetRowsSource:
    """One column of the rows of a Parquet file that belong to one episode (LeRobot `data/` files).

    `first`/`count` are where the episode's rows should be; they are checked against the file's
    own `episode_index` column, and times come from its `timestamp` column, counted from the
    episode's first row and snapped to `rate` (see `snap_to_grid`).
    """

    name: str
    path: str
    column: str
    episode_index: int
    first: int
    count: int
    rate: float | None = None

    def declared_rows(self, episode: str) -> int:
        return self.count

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:

        from mmdata.importers.episode import column_to_array, snap_to_grid

        try:
            rows = parquet_rows(
                _parquet_file(self.path), ["episode_index", "timestamp", self.column], self.first, self.count
            )
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(episode, self.path, f"cannot read column '{self.column}': {exc}") from exc
        owners = rows.column("episode_index").to_numpy()
        if len(rows) != self.count or (owners != self.episode_index).any():
            found = sorted(set(owners.tolist()))
            raise SourceError(
                episode,
                self.path,
                f"rows {self.first}..{self.first + self.count - 1} should hold episode {self.episode_index},"
                f" but their episode_index is {found[:5]}" + (" ..." if len(found) > 5 else ""),
                "the data file disagrees with meta/episodes; re-export the dataset",
            )
        timestamps = rows.column("timestamp").to_numpy().astype(np.float64)
        try:
            values = column_to_array(rows.column(self.column).combine_chunks())
        except ValueError as exc:
            raise SourceError(episode, self.path, f"column '{self.column}': {exc}") from exc
        if values.ndim == 1:
            values = values[:, None]
        if len(timestamps):
            timestamps = timestamps - timestamps[0]
        return values, snap_to_grid(timestamps, self.rate) if self.rate else timestamps


@dataclass(frozen=True)
class ParquetImages:
    """Rows [first, first + count) of a Parquet column of encoded images, one PNG/JPEG per row: LeRobot's
    `image` features, which Hugging Face datasets stores as `{bytes, path}` structs (or plain binary).
    An `ArrayCameraSource` reads it a block of rows at a time, like an HDF5 column of JPEGs."""

    path: str
    column: str
    first: int
    count: int

    def where(self) -> str:
        return f"{self.path}:{self.column}"

    def shape(self, episode: str) -> ArrayShape:
        return ArrayShape(self.count, (), np.dtype(object), 0)

    def read(self, episode: str, first: int = 0, last: int | None = None) -> np.ndarray:
        """Rows [first, last) of the episode's rows (all of them by default), as an object array of bytes."""
        import pyarrow as pa

        last = self.count if last is None else min(last, self.count)
        try:
            import pyarrow.parquet as pq

            groups, offset = _groups_holding(pq.ParquetFile(self.path).metadata, self.first + first, last - first)
            stamp = os.stat(self.path)
            column = _image_row_groups(self.path, self.column, groups, (stamp.st_mtime_ns, stamp.st_size))
            column = column.slice(offset, last - first)
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(episode, self.where(), f"cannot read the image column: {exc}") from exc
        if pa.types.is_struct(column.type):
            if column.type.get_field_index("bytes") < 0:
                raise SourceError(episode, self.where(), f"image rows are {column.type}, with no 'bytes' field")
            column = column.combine_chunks().field("bytes")
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            raise SourceError(episode, self.where(), f"image rows are {column.type}, not encoded images")
        if column.null_count:
            raise SourceError(
                episode,
                self.where(),
                "some image rows hold no bytes (images kept as files beside the dataset)",
                "embed the images (LeRobot's dataset.push_to_hub / save with embedded images) and convert again",
            )
        return np.array(column.to_pylist() + [None], dtype=object)[:-1]


def _groups_holding(metadata, first: int, count: int) -> tuple[tuple[int, ...], int]:
    """The row groups of a Parquet file holding rows [first, first + count), and where the first lies in them."""
    bounds = np.concatenate([[0], np.cumsum([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])])
    groups = tuple(g for g in range(metadata.num_row_groups) if bounds[g] < first + count and bounds[g + 1] > first)
    return groups, first - int(bounds[groups[0]]) if groups else 0


@functools.lru_cache(maxsize=1)
def _image_row_groups(path: str, column: str, groups: tuple[int, ...], version: tuple[int, int]):
    """One column of some row groups, kept while a camera reads its rows a block at a time from them
    (`version`, the file's mtime and size, tells a rewritten file from the one read)."""
    import pyarrow.parquet as pq

    from mmdata.importers.episode import require_parquet_bytes

    file = pq.ParquetFile(path)
    require_parquet_bytes(file, [column], MAX_ARRAY_CHUNK_BYTES, list(groups))
    return file.read_row_groups(list(groups), columns=[column]).column(column)


def _parquet_file(path: str):
    """The Parquet file at `path`, its footer parsed once for the episodes read one after another from it (a
    LeRobot v3 data file holds many), as long as the file is unchanged."""
    import pyarrow.parquet as pq

    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    if _PARQUET_FILES.get("key") != key:
        _PARQUET_FILES.update(key=key, file=pq.ParquetFile(path))
    return _PARQUET_FILES["file"]


_PARQUET_FILES: dict = {}


def parquet_rows(file, columns: list[str], first: int, count: int):
    """Rows [first, first + count) of a Parquet file, reading only the row groups that hold them
    (a LeRobot v3 data file holds many episodes; each is read once, not the whole file per episode)."""
    from mmdata.importers.episode import require_parquet_bytes

    groups, offset = _groups_holding(file.metadata, first, count)
    require_parquet_bytes(file, columns, MAX_LOWDIM_BYTES, list(groups))
    return file.read_row_groups(list(groups), columns=columns).slice(offset, count)


def _as_bytes(item) -> bytes:
    return item.tobytes() if isinstance(item, np.ndarray) else bytes(item)


def decode_image(data: bytes, episode: str, where: str) -> np.ndarray:
    """A PNG or JPEG image as uint8 RGB. Its header's size is read and checked before decoding, and the
    decoder refuses anything larger, since a few bytes can declare a picture of gigabytes; other formats
    (GIF, TIFF, WebP, ...: FFmpeg would decode them, sized by headers this does not read) are refused."""
    declared = declared_image_size(data)
    if declared is None:
        raise SourceError(
            episode,
            where,
            f"an image is not a PNG or JPEG with a readable header (it starts {bytes(data[:8])!r})",
            "store camera pictures as PNG or JPEG",
        )
    problem = frame_size_problem(*declared)
    if problem is not None:
        raise SourceError(episode, where, f"an image's header declares {problem}", "store smaller images")
    try:
        with av.open(io.BytesIO(data), format="image2pipe", mode="r") as container:
            context = container.streams.video[0].codec_context
            context.options = {**context.options, "max_pixels": str((declared[0] + 256) * (declared[1] + 256))}
            frame = next(container.decode(video=0))
            if (frame.width, frame.height) != declared:
                raise SourceError(
                    episode,
                    where,
                    f"an image decodes to {frame.width}x{frame.height}, its header says {declared[0]}x{declared[1]}",
                    "re-encode the picture",
                )
            return frame.to_ndarray(format="rgb24")
    except (av.error.FFmpegError, StopIteration, IndexError) as exc:
        raise SourceError(episode, where, f"an image does not decode: {exc}") from exc


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_FRAME_MARKERS = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0..SOF15, not DHT, JPG, DAC


def declared_image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) a PNG or JPEG header declares, read before decoding (a few bytes can declare a
    picture of gigabytes); None for other formats or a header this does not find."""
    if data.startswith(_PNG_SIGNATURE) and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if not data.startswith(b"\xff\xd8"):
        return None
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _JPEG_FRAME_MARKERS:
            return int.from_bytes(data[at + 7 : at + 9], "big"), int.from_bytes(data[at + 5 : at + 7], "big")
        if marker == 0xFF:
            at += 1
            continue
        at += 2 + length
    return None
