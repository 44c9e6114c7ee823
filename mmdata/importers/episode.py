"""What a converter consumes: one recorded episode, described cheaply and loaded on demand.

Descriptions are small and picklable (paths, not pixels), so the converter can hand them to
worker processes, which do the heavy reading and encoding.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import av
import numpy as np

from mmdata.codecs.audio import AudioClip, AudioLimits, decode_audio
from mmdata.codecs.lowdim import NpyError, load_npy_file
from mmdata.codecs.video_copy import CopiedVideo, copy_segments
from mmdata.codecs.video_source import VideoInfo, iter_video_frames, probe_video
from mmdata.errors import CopyError, DecodeError, SourceError
from mmdata.importers.limits import (
    MAX_AUDIO_CHANNELS,
    MAX_AUDIO_RATE,
    MAX_AUDIO_SECONDS_WITHOUT_VIDEO,
    MAX_LOWDIM_BYTES,
    frame_size_problem,
)


@dataclass(frozen=True)
class CameraSource:
    """One camera recording: a video file PyAV can read, or the part of it in [start, end) seconds
    (files that concatenate many episodes, as LeRobot v3 writes them), whose times then start at 0.
    With `expected_frames`, a part that holds fewer frames is an error. With `grid` (a rate the
    format states), times within a thousandth of a period of k / grid are set to exactly that
    (see `snap_to_grid`)."""

    name: str
    path: str
    start: float | None = None
    end: float | None = None
    expected_frames: int | None = None
    grid: float | None = None

    def info(self, episode: str) -> VideoInfo:
        try:
            info = probe_video(self.path)
        except DecodeError as exc:
            raise SourceError(episode, self.path, f"unreadable video: {exc}", "re-export or replace the file") from exc
        problem = frame_size_problem(info.width, info.height)
        if problem is not None:
            raise SourceError(episode, self.path, problem, "scale the recording down")
        return info

    def frames(self, episode: str, fps: Fraction) -> Iterator[tuple[av.VideoFrame | np.ndarray, float]]:
        count = 0
        try:
            for frame, timestamp in iter_video_frames(self.path, fps, self.start, self.end):
                count += 1
                yield frame, float(snap_to_grid(np.asarray(timestamp), self.grid)) if self.grid else timestamp
        except DecodeError as exc:
            raise SourceError(
                episode, self.path, f"video stops decoding: {exc}", "re-export or replace the file"
            ) from exc
        if self.expected_frames is not None and count < self.expected_frames:
            span = f" in [{self.start:.3f}, {self.end:.3f}) s" if self.start is not None else ""
            raise SourceError(
                episode,
                self.path,
                f"the video holds {count} frames{span}, but the episode has {self.expected_frames}",
                "the video is shorter than its episode; re-encode it from the recording",
            )

    def copied(self, episode: str, segment_frames: int) -> CopiedVideo:
        """The recording's packets cut into segments of at most `segment_frames` frames at key frames, without
        decoding (`--video-codec copy`), with the frames' times as `frames` gives them."""
        try:
            copied = copy_segments(self.path, segment_frames, self.start, self.end)
        except CopyError as exc:
            raise SourceError(episode, self.path, f"camera '{self.name}': {exc}") from exc
        problem = frame_size_problem(copied.width, copied.height)
        if problem is not None:
            raise SourceError(episode, self.path, problem, "scale the recording down")
        if self.grid:
            copied.timestamps = snap_to_grid(copied.timestamps, self.grid)
        if self.expected_frames is not None and len(copied.timestamps) < self.expected_frames:
            raise SourceError(
                episode,
                self.path,
                f"the video holds {len(copied.timestamps)} frames, but the episode has {self.expected_frames}",
                "the video is shorter than its episode; re-encode it from the recording",
            )
        return copied


@dataclass(frozen=True)
class AudioSource:
    """One audio recording; Opus files are stored as they are, everything else as FLAC."""

    name: str
    path: str

    def load(self, episode: str, max_seconds: float = MAX_AUDIO_SECONDS_WITHOUT_VIDEO) -> tuple[AudioClip, str, bytes]:
        """The decoded clip, its codec and the file's bytes; more than `max_seconds` of audio is an error."""
        limits = AudioLimits(max_seconds=max_seconds, max_channels=MAX_AUDIO_CHANNELS, max_rate=MAX_AUDIO_RATE)
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
            clip, codec = decode_audio(data, limits)
        except (DecodeError, OSError) as exc:
            raise SourceError(episode, self.path, f"unreadable audio: {exc}", "re-export or replace the file") from exc
        return clip, codec, data


@dataclass(frozen=True)
class LowdimSource:
    """A numeric stream: values `[T, ...]` with a fixed rate, or with explicit timestamps.

    `column` selects one column of a Parquet table whose `timestamp` column gives the times.
    """

    name: str
    path: str
    rate: float | None = None
    column: str | None = None

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, timestamps in seconds)."""
        if self.column is None:
            return self._load_npy(episode)
        return self._load_parquet_column(episode)

    def _load_npy(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            values = load_npy_file(self.path, MAX_LOWDIM_BYTES)
        except NpyError as exc:
            raise SourceError(episode, self.path, f"not a usable .npy array: {exc}", "re-export the stream") from exc
        except OSError as exc:
            raise SourceError(episode, self.path, f"unreadable: {exc}") from exc
        if values.ndim == 0 or values.dtype.kind not in "biuf":
            raise SourceError(
                episode,
                self.path,
                f"holds a {values.dtype} array of shape {values.shape}",
                "low-dimensional streams are numeric arrays [T, ...]",
            )
        if not self.rate:
            raise SourceError(
                episode,
                self.path,
                f"no sampling rate for stream '{self.name}'",
                f'add "rates": {{"{self.name}": <Hz>}} to meta.json',
            )
        return values, np.arange(values.shape[0], dtype=np.float64) / float(self.rate)

    def _load_parquet_column(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow.parquet as pq

        assert self.column is not None
        try:
            parquet = pq.ParquetFile(self.path)
            require_parquet_bytes(parquet, ["timestamp", self.column], MAX_LOWDIM_BYTES)
            table = parquet.read(columns=["timestamp", self.column])
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(episode, self.path, f"cannot read columns timestamp, {self.column}: {exc}") from exc
        timestamps = table.column("timestamp").to_numpy().astype(np.float64)
        column = table.column(self.column).combine_chunks()
        try:
            values = column_to_array(column)
        except ValueError as exc:
            raise SourceError(episode, self.path, f"column '{self.column}': {exc}") from exc
        return values, timestamps


def snap_to_grid(times: np.ndarray, rate: float, tolerance: float = 1e-3) -> np.ndarray:
    """Times within `tolerance` of a period of k / rate, set to exactly k / rate; others unchanged.

    Formats that store times as float32 (LeRobot's `timestamp` column, episode offsets in its
    concatenated videos) put frame 69 at 30 fps at 2.29999995 s instead of 2.3 s; snapping restores
    the grid the recorder ran on, so durations, windows and edges compare exactly at that rate.
    """
    steps = np.round(times * rate)
    return np.where(np.abs(times * rate - steps) <= tolerance, steps / rate, times)


def require_parquet_bytes(parquet, columns: list[str], limit: int, groups: list[int] | None = None) -> None:
    """Raise ValueError when `columns` of a Parquet file (of its row groups `groups`, by default all)
    declare more than `limit` bytes decompressed."""
    names = parquet.schema_arrow.names
    wanted = [names.index(c) for c in columns if c in names]
    metadata = parquet.metadata
    read = range(metadata.num_row_groups) if groups is None else groups
    declared = sum(metadata.row_group(g).column(i).total_uncompressed_size for g in read for i in wanted)
    if declared > limit:
        raise ValueError(f"columns {columns} hold {declared} bytes, more than the {limit} one episode's stream may")


def column_to_array(column) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or pa.types.is_large_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and (lengths != lengths[0]).any():
            raise ValueError("rows have different lengths; every row of a stream needs the same shape")
        width = int(lengths[0]) if len(lengths) else 0
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
    if column.null_count:
        raise ValueError("has missing values")
    return column.to_numpy(zero_copy_only=False)


class StreamInput(Protocol):
    """Any stream of an episode as conversion names it: its stream name and the file it is read from."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...


class CameraInput(Protocol):
    """A camera as conversion reads it, whatever holds it: a video file (`CameraSource`), images in an array, a
    log's topic."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...

    def info(self, episode: str) -> VideoInfo: ...

    def frames(self, episode: str, fps: Fraction) -> Iterator[tuple[av.VideoFrame | np.ndarray, float]]: ...


@runtime_checkable
class CopiedCamera(CameraInput, Protocol):
    """A camera whose recorded packets can be stored as they are (`--video-codec copy`): a video file's or a log's."""

    def copied(self, episode: str, segment_frames: int) -> CopiedVideo: ...


@runtime_checkable
class DeclaredCamera(CameraInput, Protocol):
    """A camera of images in an array: its frames' count and rate are declared before any is read."""

    @property
    def fps(self) -> float: ...

    def declared_frames(self, episode: str) -> int: ...


class LowdimInput(Protocol):
    """A numeric stream as conversion reads it: values `[T, ...]` and their times, from a file, an array or a log."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def rate(self) -> float | None: ...

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class EpisodeSource:
    """Everything needed to convert one episode; `problem` is set when discovery found it unusable.

    `deferred`, when set, holds what discovery left for the conversion worker to read (a task and
    metadata inside each record): `deferred.complete(source)` returns the full description, so an
    importer of a dataset of thousands of episodes reads none of them before converting.
    """

    name: str
    task: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    cameras: tuple[CameraInput, ...] = ()
    audio: tuple[AudioSource, ...] = ()
    lowdim: tuple[LowdimInput, ...] = ()
    problem: SourceError | None = None
    deferred: Any = None

    @property
    def streams(self) -> tuple[StreamInput, ...]:
        """Every stream of the episode: cameras, audio, low-dim."""
        return (*self.cameras, *self.audio, *self.lowdim)


def source_files(episode: EpisodeSource) -> list[list[Any]]:
    """The files an episode is read from, each `[path, size, modification time in ns]` (size -1 when it
    cannot be read): what tells a resumed conversion that a recording changed since the interrupted run."""
    paths = {stream.path for stream in episode.streams}
    deferred_path = getattr(episode.deferred, "path", None)
    if isinstance(deferred_path, str):
        paths.add(deferred_path)
    found = []
    for path in sorted(paths):
        try:
            status = os.stat(path)
            found.append([path, status.st_size, status.st_mtime_ns])
        except OSError:
            found.append([path, -1, 0])
    return found


def require_common_streams(
    episodes: list[EpisodeSource], where: Callable[[EpisodeSource, str, str], str] | None = None
) -> list[EpisodeSource]:
    """Mark episodes that lack a stream which other episodes have.

    `where(episode, kind, stream)` names what is missing for the message (a file name, an HDF5
    key); by default the episode's own first source.
    """
    described = [e for e in episodes if e.problem is None]
    expected: dict[str, str] = {}
    for episode in described:
        for group, kind in ((episode.cameras, "camera"), (episode.audio, "audio"), (episode.lowdim, "low-dim")):
            for stream in group:
                expected.setdefault(stream.name, kind)
    checked = []
    for episode in episodes:
        if episode.problem is None:
            sources = episode.streams
            present = {s.name for s in sources}
            missing = [n for n in expected if n not in present]
            if missing:
                first = missing[0]
                kind = expected[first]
                location = where(episode, kind, first) if where else (sources[0].path if sources else None)
                episode = EpisodeSource(
                    name=episode.name,
                    problem=SourceError(
                        episode.name,
                        location,
                        f"missing {kind} stream '{first}' that other episodes have"
                        + (f" (also missing: {missing[1:]})" if len(missing) > 1 else ""),
                        "add it, or pass --skip-bad to convert the other episodes",
                    ),
                )
        checked.append(episode)
    return checked
