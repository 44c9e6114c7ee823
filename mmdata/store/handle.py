"""`Store`: an open store, local or remote, without a decoder: its schema, its manifest (checked), its
pieces by address, and everything that can be read or planned from them: timestamps, low-dim values,
audio, and the segment requests that deliver a camera's frames. Decoding those requests is the
reader's job (`mmdata.store.dataset.Dataset`, or the loader's decode stage)."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.implementations.local import LocalFileSystem

from mmdata.checks import inside, option_bool, option_int, parse_json
from mmdata.codecs.align import Interpolation, frame_indices_at, sample_range, values_at
from mmdata.codecs.audio import AudioClip, AudioLimits, as_float, decode_audio, resample
from mmdata.codecs.decoders.requests import ClipRequest, SegmentRef
from mmdata.codecs.packet_index import PacketIndex, is_checked
from mmdata.errors import DecodeError, IntegrityError, OptionError, ReadError, StoreError
from mmdata.schema import DatasetSchema, VideoStream
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy, in_this_process, join, read_file, resolve
from mmdata.store.layout import DATASET_FILE, PARTIAL_DIR
from mmdata.store.lru import ByteBudgetCache
from mmdata.store.manifest import ORIGIN, Piece, packets_column
from mmdata.store.manifest_reader import open_manifest
from mmdata.store.piece_readers import PieceReader, ZarrPieceReader, piece_reader, zarr_array_paths

MAX_SCHEMA_BYTES = 16 << 20
# Decoded audio may run past the manifest's sample count by at most one codec frame (FLAC: 65535).
MAX_AUDIO_FRAME_SAMPLES = 65536


# What a store opened by a user (`open_store`, `open_dataset`) keeps of what it read: per-sample reads (`frames_at`,
# `values_at`) otherwise read and verify an episode's timestamps at every call (~0.1-0.3 ms each, 10-25x the
# aligning itself). A loader gives its own copy of a store the larger `Reading.cache_bytes`.
OPENED_CACHE_BYTES = 64 << 20


Times = Sequence[float] | np.ndarray  # seconds in an episode, asked for


@dataclass
class StreamData:
    """Values of one stream and the time of each value (seconds).

    `is_pad` marks values asked for outside the episode (clamped to its edge, or silence for audio); None for
    the stored values of a span, none of which is. Video values are numpy arrays, or torch CUDA tensors when the
    decoder is DALI on the GPU.
    """

    values: Any
    timestamps: np.ndarray
    is_pad: np.ndarray | None = None


@dataclass
class FrameRequests:
    """A camera's frame requests: what decoding a set of its frames takes (the segment requests) and how to
    reorder their outputs (the "plan" of `Store.plan_frames`; the word plan otherwise means the order of samples).

    `positions[i]` is where the i-th requested frame lands in the requests' outputs, concatenated.
    `pieces[j]` is where request j's segment is stored; aligned requests (`Store.align_frames`) name
    them without having read them (their `data` is empty) and `Store.read_segments` reads them.
    The requests of many samples can share one decoder call (one batch for DALI).
    """

    requests: list[ClipRequest]
    positions: np.ndarray
    timestamps: np.ndarray
    is_pad: np.ndarray
    pieces: list[Piece] = field(default_factory=list)

    @property
    def is_read(self) -> bool:
        return all(request.data for request in self.requests)


@dataclass
class SegmentTable:
    """Where a camera's segments of one episode are, and their packet indexes (None: demux it)."""

    segments: list[dict]
    pieces: list[Piece]
    first_frames: list[int]
    indexes: list[PacketIndex | None]


@dataclass
class EpisodeData:
    index: int
    key: str
    task: str
    metadata: dict[str, Any] = field(default_factory=dict)
    streams: dict[str, StreamData] = field(default_factory=dict)

    def __getitem__(self, stream: str) -> StreamData:
        return self.streams[stream]


class Store:
    """A converted store. Reads only what a request needs: the manifest, then pieces by address.

    `verify` (on by default) checks every piece read against the manifest's checksum, so a damaged
    byte raises IntegrityError instead of returning wrong data; `cache_bytes` keeps that much of
    recently read timestamps, low-dim arrays, decoded audio and segment tables for the next request;
    `read_policy` sets the timeout and retries of every read. `schema` opens the store as that schema
    describes it instead of as its `dataset.json` does: an appended version before it is published.

    Opening checks `dataset.json` and the manifest (see `store/manifest_checks.py`): a store whose
    structure is wrong raises StoreError here; an episode whose manifest row is inconsistent is
    listed in `damaged` and raises IntegrityError when read.
    """

    def __init__(
        self,
        url: str,
        verify: bool = True,
        cache_bytes: int = 0,
        read_policy: ReadPolicy = DEFAULT_READ_POLICY,
        schema: DatasetSchema | None = None,
    ):
        option_bool(verify, "verify")
        option_int(cache_bytes, "cache_bytes", 0, 1 << 50)
        if not isinstance(read_policy, ReadPolicy):
            raise OptionError(f"read_policy is a ReadPolicy, not {read_policy!r:.60}")
        self.url = url
        self.read_policy = read_policy
        self.fs, self.root = resolve(url)
        with contextlib.suppress(AttributeError, OSError):  # a store opens at the version there now: listings this
            in_this_process(self.fs).invalidate_cache(self.root)  # process cached before a writer published are gone
        self.schema = schema if schema is not None else self._read_schema()
        where = f"{self.url}/{self.schema.manifest_file}"
        path = join(self.root, self.schema.manifest_file)
        self.manifest = open_manifest(self.fs, path, read_policy, self.schema, where)
        for origin in self.schema.media_stores():
            self._check_origin(origin)
        self.pieces: PieceReader = piece_reader(self.schema.layout, self.fs, self.root, verify, read_policy)
        if isinstance(self.pieces, ZarrPieceReader):
            added = self.schema.stream_origins
            own = [stream for stream in self.schema.streams if stream.name not in added]
            for prefix in [f"{origin}/" for origin in self.schema.origins] or [""]:
                for path in zarr_array_paths(own):
                    self.pieces.arrays.layout(prefix + path)
            for stream in self.schema.streams:
                for path in zarr_array_paths([stream]) if stream.name in added else ():
                    self.pieces.arrays.layout(f"{added[stream.name]}/{path}")
        self.cache = ByteBudgetCache(cache_bytes)

    @property
    def codecs(self) -> list[str]:
        """The codec of every camera, in schema order: what a decoder for this store must decode."""
        return [s.codec for s in self.schema.streams if isinstance(s, VideoStream)]

    def _read_schema(self) -> DatasetSchema:
        try:
            data = read_file(self.fs, join(self.root, DATASET_FILE), MAX_SCHEMA_BYTES, self.read_policy)
        except ReadError as exc:
            if not isinstance(exc.__cause__, (FileNotFoundError, NotADirectoryError)):
                raise
            hint = "it is not an mmdata store"
            if self.fs.exists(join(self.root, PARTIAL_DIR)):
                hint = "it holds an unfinished conversion: run `mmdata convert ... --resume` to complete it"
            raise StoreError(f"'{self.url}' has no {DATASET_FILE}: {hint}") from exc
        return DatasetSchema.from_json(data, where=f"{self.url}/{DATASET_FILE}")

    def _check_origin(self, origin: str) -> None:
        """A split or merged store reads its episodes' media from the stores `origins` lists, and a store with a
        stream added from another store that stream's: each must be there."""
        try:
            where = join(self.root, origin)
        except ValueError as exc:
            raise StoreError(
                f"'{self.url}': {DATASET_FILE} names a store to read media from whose path {exc}; restore"
                f" {DATASET_FILE} or convert the store again"
            ) from None
        if not self.fs.exists(join(where, DATASET_FILE)):
            raise StoreError(
                f"'{self.url}' reads its episodes' media from the store at '{origin}' ({where}), which is not there:"
                " put that store back where it was (stores split or merged by `mmdata edit` point at their"
                " origins' shards), or convert this one again"
            )

    def holds(self, path: str | os.PathLike) -> bool:
        """Whether the local `path` lies inside this store's folder, links resolved (always False for a store in
        object storage): what a command writing beside a store must not write into."""
        return isinstance(self.fs, LocalFileSystem) and inside(self.root, path)

    @property
    def damaged(self) -> dict[int, str]:
        """Episodes whose manifest row failed the checks, and why (reading them raises): all of them, found at open,
        for a manifest read whole; for one read by row group, those found so far (by `columns` and reads)."""
        return self.manifest.damaged

    @property
    def table(self) -> pa.Table:
        """The manifest as a pyarrow Table, one row per episode (of a manifest read by row group, every row group
        is read: a loader plans from `columns` and reads rows one by one)."""
        return self.manifest.table

    def columns(self, names: Sequence[str]) -> pa.Table:
        """The manifest's columns `names`, every row: what a loader plans from (keys, durations, shards), read
        without the rows' pieces (see `store.manifest_reader`). A split or merged store's shards are named as
        its rows' pieces are, relative to it (`manifest.rooted_in_origin`)."""
        if "shard" not in names or not self.schema.origins:
            return self.manifest.columns(names)
        table = self.manifest.columns([*names, ORIGIN])
        origin, shard = (pc.cast(table.column(name), pa.string()) for name in (ORIGIN, "shard"))
        own = pc.or_(pc.equal(origin, ""), pc.equal(shard, ""))
        rooted = pc.if_else(own, shard, pc.binary_join_element_wise(origin, shard, "/"))
        return table.set_column(table.schema.get_field_index("shard"), "shard", rooted).drop_columns([ORIGIN])

    def __len__(self) -> int:
        return len(self.manifest)

    def metadata_of(self, row: dict) -> dict[str, Any]:
        """An episode's metadata from its manifest row (checked: a JSON object)."""
        try:
            metadata = parse_json(row["metadata"] or "{}")
        except ValueError as exc:
            raise IntegrityError(f"episode '{row['key']}': its metadata {exc}; convert the store again") from exc
        if not isinstance(metadata, dict):
            raise IntegrityError(f"episode '{row['key']}': its metadata is not a JSON object")
        return metadata

    def plan_span(self, index: int, stream: str, start: float, end: float) -> FrameRequests:
        """The segment requests that deliver every frame of camera `stream` stamped in [start, end)."""
        row = self.manifest.row(index)
        timestamps = self.timestamps_of(row, stream)
        wanted = np.flatnonzero((timestamps >= start) & (timestamps < end))
        spec = self._video_stream(stream)
        return self.read_segments(self._frame_plan(row, spec, wanted, timestamps[wanted], np.zeros(len(wanted), bool)))

    def plan_frames(self, index: int, stream: str, times: Times, tolerance: float | None = None) -> FrameRequests:
        """The segment requests that deliver camera `stream` at `times` (seconds) of episode `index`.

        Each time maps to the frame with the nearest stored timestamp, which must lie within
        `tolerance` seconds (default: half a frame period); times outside the episode clamp to its
        first or last frame and are flagged in `is_pad`. Only the segments holding those frames
        are read, and each frame is decoded once however often it is asked for.
        """
        return self.read_segments(self.align_frames(index, stream, times, tolerance))

    def align_frames(self, index: int, stream: str, times: Times, tolerance: float | None = None) -> FrameRequests:
        """`plan_frames` without reading the segments: the frames and the pieces holding them, from the
        stored timestamps alone. A loader aligns a micro-batch once, fetches the pieces the plans name
        (coalesced, ahead of time from object storage), then reads them (`read_segments`) to decode."""
        row, spec, indices, timestamps, is_pad = self._frames_wanted(index, stream, times, tolerance)
        return self._frame_plan(row, spec, indices, timestamps, is_pad)

    def read_segments(self, plan: FrameRequests) -> FrameRequests:
        """The plan with its segments' bytes read (from what was fetched ahead, the cache or the store)."""
        if plan.is_read:
            return plan
        requests = [
            dataclasses.replace(request, data=self.segment_bytes(piece))
            for request, piece in zip(plan.requests, plan.pieces)
        ]
        return dataclasses.replace(plan, requests=requests)

    def segment_bytes(self, piece: Piece) -> bytes:
        """One stored segment's encoded bytes: a piece an aligned plan names (read from what was fetched
        ahead, the cache or the store)."""
        return self.pieces.read_bytes(piece)

    def row_pieces(self, index: int, streams: Sequence[str]) -> list[Piece]:
        """The pieces the manifest row of episode `index` points to for `streams` (timestamps, low-dim and
        audio data): what aligning or reading them needs first, found without a read."""
        row = self.manifest.row(index)
        return [
            Piece.from_dict(row[column])
            for name in streams
            for column in (f"{name}/timestamps", f"{name}/data")
            if row.get(column) is not None
        ]

    def _frames_wanted(
        self, index: int, stream: str, times: Times, tolerance: float | None
    ) -> tuple[dict, VideoStream, np.ndarray, np.ndarray, np.ndarray]:
        row = self.manifest.row(index)
        spec = self._video_stream(stream)
        timestamps = self.timestamps_of(row, stream)
        limit = 0.5 / spec.fps if tolerance is None else float(tolerance)
        indices, is_pad = frame_indices_at(timestamps, np.asarray(times), limit, episode=row["key"], stream=stream)
        return row, spec, indices, timestamps[indices], is_pad

    def _frame_plan(
        self, row: dict, spec: VideoStream, indices: np.ndarray, timestamps: np.ndarray, is_pad: np.ndarray
    ) -> FrameRequests:
        table = self.cache.get(("segments", row["key"], spec.name), lambda: self.segment_table(row, spec.name))
        wanted = indices.tolist()
        unique = sorted(set(wanted))  # a sample asks a handful of frames: plain Python beats numpy's calls here
        display_size = None if spec.coded_size == (spec.width, spec.height) else (spec.width, spec.height)
        requests, pieces = [], []
        firsts = table.first_frames
        # `unique` is sorted, so each segment's frames are one run
        for number, run in itertools.groupby(unique, key=lambda frame: bisect.bisect_right(firsts, frame) - 1):
            pieces.append(table.pieces[number])
            requests.append(
                ClipRequest(
                    b"",
                    tuple(frame - firsts[number] for frame in run),
                    spec.codec,
                    SegmentRef(row["key"], spec.name, number),
                    spec.gop,
                    spec.coded_size,
                    table.indexes[number],
                    display_size=display_size,
                )
            )
        position_of = {frame: position for position, frame in enumerate(unique)}
        positions = np.array([position_of[frame] for frame in wanted], np.int64)
        return FrameRequests(requests, positions, timestamps, is_pad, pieces)

    @staticmethod
    def segment_table(row: dict, name: str) -> SegmentTable:
        """A camera's segments in one episode, with their pieces and parsed packet indexes."""
        segments = row[f"{name}/segments"]
        records = row.get(packets_column(name)) or [None] * len(segments)
        indexes: list[PacketIndex | None] = []
        for number, (segment, record) in enumerate(zip(segments, records)):
            try:
                index = None
                if is_checked(record):
                    index = PacketIndex.from_record(record, int(segment["size"]), int(segment["num_frames"]))
            except DecodeError as exc:
                raise IntegrityError(f"{SegmentRef(row['key'], name, number)}: {exc}; convert the store again") from exc
            indexes.append(index)
        firsts = [int(segment["first_frame"]) for segment in segments]
        return SegmentTable(segments, [Piece.from_dict(s) for s in segments], firsts, indexes)

    def values_at(self, index: int, stream: str, times: Times, interpolation: Interpolation = "nearest") -> StreamData:
        """Low-dim `stream` at `times`: "nearest", "previous" (zero-order hold) or "linear"; padded at the edges."""
        timestamps, values = self._lowdim(self.manifest.row(index), stream)
        at = np.asarray(times, dtype=np.float64)
        picked, is_pad = values_at(timestamps, values, at, interpolation)
        return StreamData(picked, at, is_pad)

    def audio_between(
        self,
        index: int,
        stream: str,
        t0: float,
        t1: float,
        sample_rate: int | None = None,
        mono: bool = False,
    ) -> StreamData:
        """Audio samples `[S, C]` as float32 in [-1, 1], with t0 <= t < t1, sample-exact at the stored rate.

        Time outside the recording is silence, flagged in `is_pad`. With `sample_rate` or `mono`
        the window is resampled / downmixed after it is cut. (`read_episode` gives the stored
        integer samples as they are.)
        """
        clip, t_start = self.audio_track_of(self.manifest.row(index), stream)
        first, last = sample_range(t_start, clip.sample_rate, t0, t1)
        inside_first, inside_last = max(first, 0), min(max(last, 0), len(clip.samples))
        samples = np.zeros((last - first, clip.channels), np.float32)
        if inside_last > inside_first:
            samples[inside_first - first : inside_last - first] = as_float(clip.samples[inside_first:inside_last])
        positions = np.arange(first, last)
        is_pad = (positions < 0) | (positions >= len(clip.samples))
        window = resample(AudioClip(samples, clip.sample_rate, t_start + first / clip.sample_rate), sample_rate, mono)
        if window.sample_rate != clip.sample_rate:
            times = window.t_start + np.arange(len(window.samples)) / window.sample_rate
            is_pad = _pad_by_time(times, t_start, len(clip.samples) / clip.sample_rate)
        else:
            times = t_start + positions / clip.sample_rate
        return StreamData(window.samples, times, is_pad)

    def timestamps_of(self, row: dict, name: str) -> np.ndarray:
        """The stored timestamps of stream `name` in the episode of manifest row `row` (checked, cached)."""

        def load() -> np.ndarray:
            piece, count = Piece.from_dict(row[f"{name}/timestamps"]), row[f"{name}/count"]
            return self._checked_times(row, name, self.pieces.read_rows(piece, (count,), "float64"))

        return self.cache.get(("timestamps", row["key"], name), load)

    @staticmethod
    def _checked_times(row: dict, name: str, timestamps: np.ndarray) -> np.ndarray:
        """Timestamps must increase and lie inside the span the manifest gives the stream."""
        if len(timestamps) and (
            not np.isfinite(timestamps).all()
            or (np.diff(timestamps) <= 0).any()
            or timestamps[0] < row[f"{name}/t_start"] - 1e-6
            or timestamps[-1] >= row[f"{name}/t_end"] + 1e-6
        ):
            raise IntegrityError(
                f"episode '{row['key']}', stream '{name}': its timestamps do not increase inside"
                f" [{row[f'{name}/t_start']:.6f}, {row[f'{name}/t_end']:.6f}) s; convert the store again"
            )
        return timestamps

    def _lowdim(self, row: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps, values) of a low-dim stream in one episode."""

        def load() -> np.ndarray:
            spec = self.schema.lowdim(name)
            shape = (row[f"{name}/count"], *spec.shape)
            return self.pieces.read_rows(Piece.from_dict(row[f"{name}/data"]), shape, spec.dtype)

        values = self.cache.get(("values", row["key"], name), load)
        return self.timestamps_of(row, name), values

    def audio_track_of(self, row: dict, name: str) -> tuple[AudioClip, float]:
        """An episode's whole audio track, decoded within the limits its schema and row set, and the
        time of its first sample."""
        piece = Piece.from_dict(row[f"{name}/data"])
        spec = self.schema.audio(name)
        count = row[f"{name}/count"]
        limits = AudioLimits(spec.codec, spec.sample_rate, spec.channels, count + MAX_AUDIO_FRAME_SAMPLES)

        def load() -> AudioClip:
            try:
                clip = decode_audio(self.pieces.read_bytes(piece), limits)[0]
            except DecodeError as exc:
                raise IntegrityError(f"episode '{row['key']}', audio '{name}': {exc}") from exc
            if spec.codec == "flac" and len(clip.samples) != count:
                raise IntegrityError(
                    f"episode '{row['key']}', audio '{name}': {len(clip.samples)} samples, the manifest says {count}"
                )
            return clip

        return self.cache.get(("audio", row["key"], name), load), row[f"{name}/t_start"]

    def _video_stream(self, name: str) -> VideoStream:
        stream = self.schema.stream(name)
        if not isinstance(stream, VideoStream):
            raise StoreError(f"stream '{name}' of '{self.url}' is {stream.kind}, not video")
        return stream

    def audio_span(self, index: int, name: str, start: float, end: float) -> StreamData:
        """The stored audio samples of `name` stamped in [start, end), as stored (integers for FLAC)."""
        row = self.manifest.row(index)
        clip, t_start = self.audio_track_of(row, name)
        rate = clip.sample_rate
        low, high = max(start, t_start), min(end, t_start + len(clip.samples) / rate)
        first, last = sample_range(t_start, rate, low, high) if high > low else (0, 0)
        samples = clip.samples[first:last]
        return StreamData(samples, t_start + np.arange(first, first + len(samples)) / rate)

    def lowdim_span(self, index: int, name: str, start: float, end: float) -> StreamData:
        """The stored values of low-dim stream `name` stamped in [start, end)."""
        row = self.manifest.row(index)
        timestamps, values = self._lowdim(row, name)
        inside = (timestamps >= start) & (timestamps < end)
        return StreamData(values[inside], timestamps[inside])


def _pad_by_time(times: np.ndarray, t_start: float, duration: float) -> np.ndarray:
    return (times < t_start - 1e-9) | (times >= t_start + duration - 1e-9)


def assemble_frames(plan: FrameRequests, decoded: list[Any]) -> StreamData:
    """The frames of a plan in the order they were asked for, from its decoded requests."""
    return StreamData(assemble_frames_at(plan.positions, decoded), plan.timestamps, plan.is_pad)


def assemble_frames_at(positions: np.ndarray, decoded: list[Any]) -> Any:
    """`decoded` (numpy arrays or torch tensors) concatenated, then taken at `positions`."""
    if decoded and not isinstance(decoded[0], np.ndarray):
        import torch

        return torch.cat(decoded)[torch.as_tensor(positions, device=decoded[0].device)]
    return np.concatenate(decoded)[positions]


def open_store(
    path_or_url: str,
    verify: bool = True,
    cache_bytes: int = OPENED_CACHE_BYTES,
    read_policy: ReadPolicy = DEFAULT_READ_POLICY,
) -> Store:
    """Open a store written by `mmdata convert` (a local folder or an fsspec URL) without a decoder; it keeps up
    to `cache_bytes` of the timestamps, low-dim arrays and audio it read (0: none), so that reading an episode's
    frames or values again does not read and verify its timestamps again."""
    return Store(str(path_or_url), verify, cache_bytes, read_policy)
