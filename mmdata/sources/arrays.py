"""Streams held as arrays inside a container file (HDF5, Zarr) or as rows of a Parquet table.

Each source is a small, picklable address (file, key, row range) that reads its data only when
a conversion worker asks, and names the file and key in every error.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from mmdata.codecs.video_source import VideoInfo
from mmdata.errors import SourceError


@dataclass(frozen=True)
class Hdf5Array:
    """Rows [start, stop) of dataset `key` in the HDF5 file `path` (all rows when stop is None)."""

    path: str
    key: str
    start: int = 0
    stop: int | None = None

    def where(self) -> str:
        return f"{self.path}:{self.key}"

    def read(self, episode: str) -> np.ndarray:
        import h5py

        try:
            with h5py.File(self.path, "r") as handle:
                if self.key not in handle:
                    raise SourceError(episode, self.path, f"no dataset '{self.key}'", "check the file's layout")
                return np.asarray(handle[self.key][self.start : self.stop])
        except OSError as exc:
            raise SourceError(episode, self.path, f"unreadable HDF5 file: {exc}") from exc


@dataclass(frozen=True)
class ZarrArray:
    """Rows [start, stop) of array `key` in the Zarr store `path` (a folder or a .zip; v2 or v3)."""

    path: str
    key: str
    start: int = 0
    stop: int | None = None

    def where(self) -> str:
        return f"{self.path}/{self.key}"

    def read(self, episode: str) -> np.ndarray:
        from mmdata.sources.zarr_replay import open_replay_group

        group = open_replay_group(self.path)
        try:
            array = group[self.key]
            return np.asarray(array[self.start : self.stop])
        except KeyError as exc:
            raise SourceError(episode, self.path, f"no array '{self.key}'", "check the store's layout") from exc
        except (RuntimeError, ValueError, TypeError) as exc:
            from mmdata.sources.zarr_replay import missing_codec

            missing = missing_codec(exc)
            if missing is not None:
                raise SourceError(episode, self.where(), str(missing), "pip install imagecodecs") from exc
            raise SourceError(episode, self.where(), f"cannot be read: {exc}") from exc


ArrayRef = Hdf5Array | ZarrArray


@dataclass(frozen=True)
class ArrayCameraSource:
    """A camera stored as images: uint8 `[T, H, W, 3]` (or `[T, H, W]` grey), or one JPEG/PNG per row."""

    name: str
    array: ArrayRef
    fps: float

    @property
    def path(self) -> str:
        return self.array.path

    def info(self, episode: str) -> VideoInfo:
        first = self._images(episode)[:1]
        if not len(first):
            raise SourceError(episode, self.array.where(), "holds no images")
        height, width = first[0].shape[:2]
        return VideoInfo(width, height, Fraction(self.fps).limit_denominator(1001), "raw")

    def frames(self, episode: str, fps: Fraction) -> Iterator[tuple[np.ndarray, float]]:
        for index, image in enumerate(self._images(episode)):
            yield image, index / float(fps)

    def _images(self, episode: str) -> np.ndarray:
        data = self.array.read(episode)
        if data.dtype == object or data.ndim == 1 or (data.ndim == 2 and data.dtype == np.uint8):
            # one compressed image per row: variable-length bytes, or uint8 rows padded with zeros (ACT)
            return np.stack([decode_image(_as_bytes(item), episode, self.array.where()) for item in data])
        if data.dtype != np.uint8 or data.ndim not in (3, 4):
            raise SourceError(
                episode, self.array.where(), f"images are {data.dtype} {data.shape}", "expected uint8 [T, H, W, 3]"
            )
        if data.ndim == 3:
            data = np.repeat(data[..., None], 3, axis=-1)
        if data.shape[-1] != 3:
            raise SourceError(episode, self.array.where(), f"images have {data.shape[-1]} channels, not 3")
        return data


@dataclass(frozen=True)
class ArrayLowdimSource:
    """A numeric stream `[T, ...]` stored as an array, sampled at `rate` Hz."""

    name: str
    array: ArrayRef
    rate: float

    @property
    def path(self) -> str:
        return self.array.path

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        values = self.array.read(episode)
        if values.ndim == 1:
            values = values[:, None]
        if values.dtype.kind not in "biuf":
            raise SourceError(episode, self.array.where(), f"holds {values.dtype} values, not numbers")
        return values, np.arange(len(values), dtype=np.float64) / self.rate


@dataclass(frozen=True)
class ParquetRowsSource:
    """One column of the rows of a Parquet file that belong to one episode (LeRobot `data/` files).

    `first`/`count` are where the episode's rows should be; they are checked against the file's
    own `episode_index` column, and times come from its `timestamp` column.
    """

    name: str
    path: str
    column: str
    episode_index: int
    first: int
    count: int
    rate: float | None = None

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow.parquet as pq

        from mmdata.sources.episode import column_to_array

        try:
            rows = _row_range(
                pq.ParquetFile(self.path), ["episode_index", "timestamp", self.column], self.first, self.count
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
        return values, timestamps - timestamps[0] if len(timestamps) else timestamps


def _row_range(file, columns: list[str], first: int, count: int):
    """Rows [first, first + count) of a Parquet file, reading only the row groups that hold them
    (a LeRobot v3 data file holds many episodes; each is read once, not the whole file per episode)."""
    sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    groups = [g for g in range(len(sizes)) if bounds[g] < first + count and bounds[g + 1] > first]
    table = file.read_row_groups(groups, columns=columns)
    return table.slice(first - int(bounds[groups[0]]) if groups else 0, count)


def _as_bytes(item) -> bytes:
    return item.tobytes() if isinstance(item, np.ndarray) else bytes(item)


def decode_image(data: bytes, episode: str, where: str) -> np.ndarray:
    """A compressed image (JPEG, PNG, anything FFmpeg reads) as uint8 RGB."""
    try:
        with av.open(io.BytesIO(data), format="image2pipe") as container:
            frame = next(container.decode(video=0))
            return frame.to_ndarray(format="rgb24")
    except (av.error.FFmpegError, StopIteration) as exc:
        raise SourceError(episode, where, f"an image does not decode: {exc}") from exc
