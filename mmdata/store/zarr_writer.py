"""Write episodes into a Zarr v3 store in the Diffusion Policy replay-buffer convention.

    data/<stream>          low-dim values [total_steps, *shape], all episodes concatenated
    timestamps/<stream>    seconds from episode start, one per row / video frame
    meta/episode_ends      exclusive end row of each episode in data/* (streams on one clock)
    video/<camera>         variable-length bytes, one element per closed-GOP segment
    audio/<stream>         variable-length bytes, one FLAC/Opus file per episode

Each encoded episode is first saved under `.mmdata-partial/` as a data-only file (the resume
checkpoint, see `conversion/episode_file.py`); the arrays are then written in one ordered pass in
chunk-aligned blocks, so no chunk or shard is rewritten.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BytesCodec, VLenBytesCodec, ZstdCodec

from mmdata.errors import StoreError
from mmdata.schema import LowdimStream, Stream
from mmdata.store.checksum import checksum_array, checksum_bytes
from mmdata.store.encoded import EncodedEpisode
from mmdata.store.episode_file import read_episode_file, write_episode_file
from mmdata.store.layout import PARTIAL_DIR, start_again
from mmdata.store.manifest import Piece, base_row, packets_column, span_columns
from mmdata.store.piece_readers import zarr_array_paths

EPISODE_SUFFIX = ".episode"
SEGMENTS_PER_SHARD = 256
AUDIO_PER_SHARD = 64
TARGET_CHUNK_BYTES = 1 << 20


def _create_bytes_array(group: zarr.Group, path: str, per_shard: int) -> zarr.Array:
    """A 1-D array of variable-length byte strings, one inner chunk per element, sharded.

    The elements are encoded media (video segments, FLAC or Opus), which a general-purpose
    compressor cannot shrink: they are stored as they are, so reading one costs no decompression.
    Codecs are named rather than left to zarr's defaults, so the store is exactly the layout
    `store/zarr_reader.py` reads, whatever zarr version wrote it (so are the numeric arrays')."""
    with warnings.catch_warnings():
        # zarr-python's VariableLengthBytes has no v3 spec yet; we read it with zarr-python only.
        warnings.simplefilter("ignore")
        return group.create_array(
            path,
            shape=(0,),
            chunks=(1,),
            shards=(per_shard,),
            dtype=zarr.dtype.VariableLengthBytes(),
            serializer=VLenBytesCodec(),
            compressors=None,
            overwrite=True,
        )


class _BlockAppender:
    """Append rows to a 1-D or N-D Zarr array, writing only whole aligned blocks until flushed."""

    def __init__(self, array: zarr.Array, block: int):
        self.array = array
        self.block = block
        self.length = 0
        self._pending: list[Any] = []
        self._pending_rows = 0

    def append(self, rows: np.ndarray | list[bytes]) -> int:
        """Queue rows; returns the index of the first one in the array."""
        start = self.length + self._pending_rows
        self._pending.append(rows)
        self._pending_rows += len(rows)
        if self._pending_rows >= self.block:
            self._write(whole_blocks_only=True)
        return start

    def flush(self) -> None:
        if self._pending_rows:
            self._write(whole_blocks_only=False)

    def _write(self, whole_blocks_only: bool) -> None:
        if isinstance(self._pending[0], list):
            merged = np.empty(self._pending_rows, dtype=object)
            merged[:] = [item for part in self._pending for item in part]
        else:
            merged = np.concatenate(self._pending)
        count = (len(merged) // self.block) * self.block if whole_blocks_only else len(merged)
        if count == 0:
            return
        self.array.resize((self.length + count, *self.array.shape[1:]))
        self.array[self.length : self.length + count] = merged[:count]
        self.length += count
        rest = merged[count:]
        self._pending = [list(rest) if rest.dtype == object else rest] if len(rest) else []
        self._pending_rows = len(rest)


class ZarrWriter:
    """Cache encoded episodes (resumable), then write the Zarr arrays in one pass at the end.

    Given the manifest rows of the episodes a store already holds (`earlier_rows`) and its arrays' lengths
    (`array_lengths`, `existing_lengths`), it appends: new rows after those lengths (only the chunk and shard
    each array ends in are rewritten, each in one atomic replace, with its earlier elements unchanged; rows an
    interrupted append left beyond them are written over), and `meta/episode_ends` over every episode."""

    def __init__(
        self,
        root: str | os.PathLike,
        earlier_rows: list[dict[str, Any]] | None = None,
        array_lengths: dict[str, int] | None = None,
        arrays_url: str | None = None,
    ):
        self.root = Path(root)
        self.partial = self.root / PARTIAL_DIR / "episodes"
        self.earlier_rows = list(earlier_rows or [])
        self.array_lengths = dict(array_lengths or {})
        self.arrays_url = arrays_url or str(self.root)  # (an append to object storage writes its arrays there)

    def restore(self) -> dict[str, Any] | None:
        self.partial.mkdir(parents=True, exist_ok=True)
        for leftover in self.partial.glob("*.tmp"):
            leftover.unlink()
        cached = sorted(self.partial.glob(f"*{EPISODE_SUFFIX}"))
        if not cached:
            return None
        return read_episode_file(cached[-1], start_again(self.root))[2]

    def durable(self) -> bool:
        return any(self.partial.glob(f"*{EPISODE_SUFFIX}"))

    def discard(self) -> None:
        """Nothing to remove: an episode is durable as soon as it is added, and nothing is written outside the
        partial folder before `finish`."""

    def add(self, episode: EncodedEpisode, index: int, checkpoint: dict[str, Any]) -> None:
        write_episode_file(self.partial / f"{episode.position:08d}{EPISODE_SUFFIX}", episode, index, checkpoint)

    def finish(self, checkpoint: dict[str, Any], streams: Sequence[Stream]) -> list[dict[str, Any]]:
        """Write every cached episode into the arrays; the checkpoint is already in the cache."""
        restart = start_again(self.root)
        cached = (read_episode_file(path, restart)[:2] for path in sorted(self.partial.glob(f"*{EPISODE_SUFFIX}")))
        return self.write(streams, cached)

    def write(self, streams: Sequence[Stream], episodes: Iterable[tuple[EncodedEpisode, int]]) -> list[dict[str, Any]]:
        """Write `episodes` (each with its number in the store), in order, into the arrays in one pass;
        their manifest rows."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification")
            return self._write_store(list(streams), episodes)

    def _write_store(
        self, streams: list[Stream], episodes: Iterable[tuple[EncodedEpisode, int]]
    ) -> list[dict[str, Any]]:
        group = zarr.open_group(self.arrays_url, mode="a", zarr_format=3)
        if self.earlier_rows:
            appenders = self._open_arrays(group, streams)
        else:
            group.attrs.update({"mmdata": {"layout": "zarr", "manifest": "episodes.parquet"}})
            appenders = self._create_arrays(group, streams)
        rows = [self._write_episode(episode, index, appenders) for episode, index in episodes]
        for appender in appenders.values():
            appender.flush()
        self._write_episode_ends(group, [*self.earlier_rows, *rows], streams)
        return rows

    def _open_arrays(self, group: zarr.Group, streams: list[Stream]) -> dict[str, _BlockAppender]:
        """Appenders after the end of the arrays an earlier conversion wrote, each in blocks of its chunks."""
        appenders: dict[str, _BlockAppender] = {}
        for path in zarr_array_paths(streams):
            array = _array(group, path)
            length = self.array_lengths.get(path, array.shape[0])
            if array.shape[0] != length:
                array.resize((length, *array.shape[1:]))
            block = array.shards[0] if array.shards is not None else array.chunks[0]
            appenders[path] = _BlockAppender(array, block)
            appenders[path].length = length
        return appenders

    def _create_arrays(self, group: zarr.Group, streams: list[Stream]) -> dict[str, _BlockAppender]:
        appenders: dict[str, _BlockAppender] = {}

        def numeric(path: str, shape: tuple[int, ...], dtype: str) -> None:
            row_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize or 1
            rows = int(max(1, min(65536, TARGET_CHUNK_BYTES // row_bytes)))
            array = group.create_array(
                path,
                shape=(0, *shape),
                chunks=(rows, *shape),
                dtype=dtype,
                serializer=BytesCodec(endian="little"),
                compressors=ZstdCodec(level=0),
                overwrite=True,
            )
            appenders[path] = _BlockAppender(array, rows)

        def blobs(path: str, per_shard: int) -> None:
            appenders[path] = _BlockAppender(_create_bytes_array(group, path, per_shard), per_shard)

        for stream in streams:
            if stream.kind == "video":
                blobs(f"video/{stream.name}", SEGMENTS_PER_SHARD)
                numeric(f"timestamps/{stream.name}", (), "float64")
            elif stream.kind == "audio":
                blobs(f"audio/{stream.name}", AUDIO_PER_SHARD)
            elif isinstance(stream, LowdimStream):
                numeric(f"data/{stream.name}", stream.shape, stream.dtype)
                numeric(f"timestamps/{stream.name}", (), "float64")
        return appenders

    def _write_episode(
        self, episode: EncodedEpisode, index: int, appenders: dict[str, _BlockAppender]
    ) -> dict[str, Any]:
        row = base_row(index, episode.source, episode.task, episode.duration, episode.metadata, "")

        def rows_piece(path: str, values: np.ndarray) -> dict[str, Any]:
            start = appenders[path].append(values)
            return Piece(path, start, values.nbytes, checksum_array(values)).to_dict()

        for video in episode.videos:
            name = video.spec.name
            first = appenders[f"video/{name}"].append(list(video.segments))
            row[f"{name}/segments"] = [
                {
                    "first_frame": frame,
                    "num_frames": count,
                    **Piece(f"video/{name}", first + i, len(data), checksum_bytes(data)).to_dict(),
                }
                for i, (frame, count, data) in enumerate(zip(video.first_frames, video.segment_frames, video.segments))
            ]
            row[f"{name}/timestamps"] = rows_piece(f"timestamps/{name}", video.timestamps)
            row[packets_column(name)] = video.packet_records()
            row.update(span_columns(video))
        for audio in episode.audio:
            name = audio.spec.name
            element = appenders[f"audio/{name}"].append([audio.data])
            row[f"{name}/data"] = Piece(f"audio/{name}", element, len(audio.data), checksum_bytes(audio.data)).to_dict()
            row.update(span_columns(audio))
        for stream in episode.lowdim:
            name = stream.spec.name
            row[f"{name}/data"] = rows_piece(f"data/{name}", stream.values)
            row[f"{name}/timestamps"] = rows_piece(f"timestamps/{name}", stream.timestamps)
            row.update(span_columns(stream))
        return row

    @staticmethod
    def _write_episode_ends(group: zarr.Group, rows: list[dict[str, Any]], streams: list[Stream]) -> None:
        """`meta/episode_ends` for the low-dim streams that share one clock; others get their own."""
        lowdim = [s for s in streams if isinstance(s, LowdimStream)]
        if not lowdim:
            return
        ends = {s.name: np.cumsum([row[f"{s.name}/count"] for row in rows]).astype(np.int64) for s in lowdim}
        reference = ends[lowdim[0].name]
        written: set[str] = set()
        for stream in lowdim:
            shared = np.array_equal(ends[stream.name], reference)
            path = "meta/episode_ends" if shared else f"meta/episode_ends_{stream.name}"
            group[f"data/{stream.name}"].attrs["episode_ends"] = path
            if path not in written:
                array = group.create_array(path, shape=reference.shape, dtype="int64", overwrite=True)
                array[:] = ends[stream.name]
                written.add(path)


def existing_lengths(root: str | os.PathLike, streams: list[Stream]) -> dict[str, int]:
    """The length of each array of a Zarr store (a folder or an fsspec URL) holding `streams`: where an append's
    rows begin."""
    group = zarr.open_group(str(root), mode="r", zarr_format=3)
    return {path: int(_array(group, path).shape[0]) for path in zarr_array_paths(streams)}


def _array(group: zarr.Group, path: str) -> zarr.Array:
    """The array at `path` of a store's group; a group found there instead is a damaged store."""
    found = group[path]
    if not isinstance(found, zarr.Array):
        raise StoreError(f"'{path}' of the Zarr store is a group where an array of its streams belongs")
    return found
