"""Checks of `episodes.parquet` against `dataset.json`, before anything is read through it.

The structure is checked as a whole: every column the schema implies, with its type; one row
per episode, in order, as many as `dataset.json` says; unique keys. A manifest that fails is not
a store (StoreError). Values are checked per row, vectorised over the table: an episode whose
row is inconsistent (a negative offset, a piece outside the store, a piece larger than its
stream could need, a duration its streams do not span, segments that do not tile its frames) is
*damaged*: reading it raises IntegrityError naming the episode, `verify` lists it, and the loader
leaves it out (on_error="skip") or refuses to start (on_error="raise").

The limits below are what keeps a small hostile manifest from making a reader allocate or plan
without bound: every size a reader allocates is bounded by what the schema declares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.codecs.packet_index import ROW_BYTES
from mmdata.errors import StoreError
from mmdata.schema import AudioStream, DatasetSchema, LowdimStream, VideoStream
from mmdata.store.manifest import LEGACY_PACKET_INDEX, ORIGIN, episode_key, manifest_schema, packets_column

MAX_EPISODE_SECONDS = 7 * 24 * 3600.0
# A stream's span may exceed its sample count times its period this many times (dropped frames,
# pauses), and no more: a manifest cannot claim hours of time for a handful of stored frames.
MAX_SPAN_STRETCH = 100.0
NPY_HEADER_MAX = 65536 + 16
TIME_TOLERANCE = 1e-6
SHARD_PATTERN = r"^shards/[A-Za-z0-9_.-]+\.tar$"
CHECKSUM_PATTERN = r"^[0-9a-f]{16}$"
_ANY_SHARD = "shards/<any>.tar"  # where a WebDataset stream added from another store names its pieces
_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)  # a row number's digits: one more than the powers below it


def optional_columns(schema: DatasetSchema) -> set[str]:
    """Columns a store written by an earlier version lacks, and readers do without."""
    return {packets_column(stream.name) for stream in schema.streams if isinstance(stream, VideoStream)}


def check_manifest(table: pa.Table, schema: DatasetSchema, where: str, first_row: int | None = None) -> dict[int, str]:
    """Raise StoreError if the manifest's structure is wrong; return the damaged rows and why. `first_row` set:
    `table` is one row group of a larger manifest (its rows numbered from `first_row`), whose column types and
    row count were checked on their own (`check_manifest_columns`)."""
    if first_row is None:
        check_manifest_columns(table.schema, table.num_rows, schema, where)
    _check_numbering(table, where, first_row or 0)
    rows = _RowProblems(table.column("key").to_pylist(), first_row or 0)
    with np.errstate(over="ignore", invalid="ignore"):  # (a hostile row's huge or missing numbers are flagged)
        counts = _check_times(table, schema.streams, rows)
    for stream in schema.streams:
        added = stream.name in schema.stream_origins
        if isinstance(stream, VideoStream):
            _check_video(table, stream, counts[stream.name], schema.layout, rows, added)
        elif isinstance(stream, AudioStream):
            path = _piece_path(schema.layout, "audio", stream.name, added)
            _check_piece_column(table, f"{stream.name}/data", path, rows)
            limit = counts[stream.name] * stream.channels * 4 * 1.25 + 65536
            _check_piece_sizes(table, f"{stream.name}/data", 1, limit, rows)
        elif isinstance(stream, LowdimStream):
            _check_lowdim(table, stream, counts[stream.name], schema.layout, rows, added)
    if schema.layout == "wds":
        _check_members(table, rows)
    else:
        shard = pc.fill_null(pc.equal(table.column("shard"), pa.scalar("")), False).to_numpy(zero_copy_only=False)
        rows.flag(~shard, lambda i: "its 'shard' is not empty, as a Zarr store's rows are")
    if ORIGIN in table.column_names:
        declared = pc.is_in(table.column(ORIGIN), value_set=pa.array(["", *schema.origins], pa.string()))
        rows.flag(
            ~pc.fill_null(declared, False).to_numpy(zero_copy_only=False),
            lambda i: "its 'origin' is not a store dataset.json lists under 'origins'",
        )
    for name in ("source", "task", "metadata", "members"):
        column = table.column(name)
        if column.null_count:
            rows.flag(column.is_null().to_numpy(zero_copy_only=False), functools.partial(_missing, name))
    return rows.messages()


def duration_damage(durations: np.ndarray) -> dict[int, str]:
    """The rows whose duration (`durations`, every row's, in order) no episode can have (not a number, infinite,
    negative, longer than `MAX_EPISODE_SECONDS`), and why, worded as `check_manifest` words it: what a manifest read
    by row group finds in its planning column before any of its rows is read."""
    bad = np.flatnonzero(~((durations >= 0) & (durations <= MAX_EPISODE_SECONDS)))
    return {
        int(row): f"episode '{episode_key(int(row))}' (row {int(row)}) has an inconsistent manifest row: duration"
        f" {durations[row]:g} s is not within [0, {MAX_EPISODE_SECONDS:g}]"
        for row in bad
    }


def time_problems(table: pa.Table, streams: list) -> dict[int, list[str]]:
    """The rows of `table` (`key`, `duration` and each stream's count and span) whose times a reader would
    refuse, and why: what a conversion checks of each episode before it writes it."""
    rows = _RowProblems(table.column("key").to_pylist())
    _check_times(table, streams, rows)
    return rows.problems


def _check_times(table: pa.Table, streams: list, rows: _RowProblems) -> dict[str, np.ndarray]:
    """Duration and every stream's count and span; returns the counts by stream."""
    duration = _column(table, "duration", rows)
    rows.flag(
        ~np.isfinite(duration) | (duration < 0) | (duration > MAX_EPISODE_SECONDS),
        lambda i: f"duration {duration[i]:g} s is not within [0, {MAX_EPISODE_SECONDS:g}]",
    )
    latest_end = np.zeros(table.num_rows)
    counts = {}
    for stream in streams:
        if stream.kind == "text":
            continue
        counts[stream.name], end = _check_span(table, stream, duration, rows)
        latest_end = np.maximum(latest_end, np.nan_to_num(end, nan=0.0))
    off = np.abs(duration - latest_end) > TIME_TOLERANCE * np.maximum(1.0, np.abs(duration))
    rows.flag(
        off & bool(counts) & np.isfinite(duration),
        lambda i: f"duration {duration[i]:.6f} s is not the end of its longest stream ({latest_end[i]:.6f} s)",
    )
    return counts


def _missing(column: str, row: int) -> str:
    return f"'{column}' is missing"


class _RowProblems:
    def __init__(self, keys: list[str], first_row: int = 0):
        self.keys, self.first_row = keys, first_row
        self.problems: dict[int, list[str]] = {}

    def flag(self, mask: np.ndarray, message: Callable[[int], str]) -> None:
        for row in np.flatnonzero(mask):
            self.problems.setdefault(int(row), []).append(message(int(row)))

    def messages(self) -> dict[int, str]:
        damaged = {}
        for row, problems in self.problems.items():
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            number = self.first_row + row
            damaged[number] = f"episode '{self.keys[row]}' (row {number}) has an inconsistent manifest row: {shown}"
        return damaged


def check_manifest_columns(found_schema: pa.Schema, num_rows: int, schema: DatasetSchema, where: str) -> None:
    """Raise StoreError unless the manifest has every column `schema` implies, with its type, and one row per
    episode `dataset.json` counts."""
    expected = manifest_schema(schema.streams)
    optional = optional_columns(schema)
    for field in expected:
        if field.name in optional and field.name not in found_schema.names:
            continue
        if field.name not in found_schema.names:
            raise StoreError(f"{where} lacks column '{field.name}'; the store is damaged: convert it again")
        found = found_schema.field(field.name).type
        if field.name in optional and found == pa.list_(LEGACY_PACKET_INDEX):
            continue
        if found != field.type:
            raise StoreError(f"{where}: column '{field.name}' is {found}, not {field.type}; convert the store again")
    if schema.origins and (ORIGIN not in found_schema.names or found_schema.field(ORIGIN).type != pa.string()):
        raise StoreError(f"{where} lacks the string column '{ORIGIN}' its origins need; the store is damaged")
    if num_rows != schema.num_episodes:
        raise StoreError(
            f"{where} holds {num_rows} rows but dataset.json says {schema.num_episodes} episodes;"
            " rows were lost or duplicated: restore the manifest or convert again"
        )
    if num_rows == 0:
        raise StoreError(f"{where} holds no episode")


def _check_numbering(table: pa.Table, where: str, first_row: int) -> None:
    """Rows are episodes first_row.. in order, each keyed by its number."""
    index = table.column("episode_index")
    keys = table.column("key")
    if index.null_count or keys.null_count:
        raise StoreError(f"{where}: episode_index or key is missing in some rows; convert the store again")
    numbers = index.to_numpy()
    rows = np.arange(first_row, first_row + table.num_rows)
    wrong = np.flatnonzero(numbers != rows)
    if len(wrong):
        row = int(wrong[0])
        raise StoreError(
            f"{where}: row {first_row + row} holds episode_index {int(numbers[row])}; rows must be episodes 0..N-1 in"
            " order (rows were duplicated, dropped or reordered): restore the manifest or convert again"
        )
    prefix = pc.fill_null(pc.match_substring_regex(keys, r"^episode_[0-9]{6,}$"), False).to_numpy(zero_copy_only=False)
    if prefix.all():
        numbers = pc.cast(pc.utf8_slice_codeunits(keys, len("episode_")), pa.int64(), safe=False).to_numpy()
        digits = np.maximum(6, 1 + np.searchsorted(_POWERS_OF_TEN, rows, side="right"))
        prefix = (numbers == rows) & (pc.utf8_length(keys).to_numpy() == len("episode_") + digits)
    wrong = np.flatnonzero(~prefix)
    if len(wrong):
        row, key = first_row + int(wrong[0]), keys[int(wrong[0])].as_py()
        raise StoreError(f"{where}: row {row} has key {key!r}, not '{episode_key(row)}'; convert the store again")


def _column(table: pa.Table, name: str, rows: _RowProblems) -> np.ndarray:
    """An integer or float column as float64, missing values flagged and read as NaN."""
    column = table.column(name)
    values = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False).astype(np.float64)
    if column.null_count:
        missing = column.is_null().to_numpy(zero_copy_only=False)
        rows.flag(missing, lambda i: f"'{name}' is missing")
        values[missing] = np.nan
    return values


def _check_span(table: pa.Table, stream, duration: np.ndarray, rows: _RowProblems) -> tuple[np.ndarray, ...]:
    """A stream's count and span against the episode's duration and its rate; returns (count, t_end)."""
    name = stream.name
    count = _column(table, f"{name}/count", rows)
    start = _column(table, f"{name}/t_start", rows)
    end = _column(table, f"{name}/t_end", rows)
    minimum = 1 if isinstance(stream, VideoStream) else 0
    rows.flag(~(count >= minimum), lambda i: f"'{name}/count' is {count[i]:g}, not at least {minimum}")
    bad = ~np.isfinite(start) | ~np.isfinite(end) | ~(start <= end) | ~(np.abs(start) <= MAX_EPISODE_SECONDS)
    rows.flag(bad, lambda i: f"stream '{name}' spans [{start[i]:g}, {end[i]:g}) s, not a finite interval")
    rows.flag(
        end > duration + TIME_TOLERANCE * np.maximum(1.0, np.abs(duration)),
        lambda i: f"stream '{name}' ends at {end[i]:.6f} s, after the episode's duration {duration[i]:.6f} s",
    )
    period = _period(stream)
    if period is not None:
        span = end - start
        if isinstance(stream, AudioStream):
            off = np.abs(span - count * period) > TIME_TOLERANCE * np.maximum(1.0, span)
            rows.flag(off, lambda i: f"audio '{name}' spans {span[i]:.6f} s, its {count[i]:.0f} samples say otherwise")
        else:
            rows.flag(
                span > (count + 1) * period * MAX_SPAN_STRETCH,
                lambda i: f"stream '{name}' spans {span[i]:.3f} s for only {count[i]:.0f} values at {1 / period:g} Hz",
            )
    return count, end


def _period(stream) -> float | None:
    if isinstance(stream, VideoStream):
        return 1.0 / stream.fps
    if isinstance(stream, AudioStream):
        return 1.0 / stream.sample_rate
    if isinstance(stream, LowdimStream) and stream.rate:
        return 1.0 / stream.rate
    return None


def _piece_path(layout: str, group: str, name: str, added: bool) -> str | None:
    """The array every piece of a stream must name (Zarr); for WebDataset the row's shard (None), or any shard of
    the store holding a stream added from it (`_ANY_SHARD`: its shards are not the row's)."""
    if layout == "zarr":
        return f"{group}/{name}"
    return _ANY_SHARD if added else None


def _check_video(
    table: pa.Table, stream: VideoStream, count: np.ndarray, layout: str, rows: _RowProblems, added: bool
) -> None:
    name = stream.name
    _check_piece_column(table, f"{name}/timestamps", _piece_path(layout, "timestamps", name, added), rows)
    _check_rows_size(table, f"{name}/timestamps", count, 8, layout, rows)
    lists = table.column(f"{name}/segments").combine_chunks()
    if lists.null_count:
        rows.flag(lists.is_null().to_numpy(zero_copy_only=False), lambda i: f"'{name}/segments' is missing")
    lengths = pc.fill_null(lists.value_lengths(), 0).to_numpy(zero_copy_only=False)
    rows.flag((lengths == 0) & (count > 0), lambda i: f"camera '{name}' has {count[i]:.0f} frames but no segment")
    flat = lists.flatten()
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    _check_pieces(flat, parents, _piece_path(layout, "video", name, added), table, f"{name}/segments", rows)
    first = _field(flat, "first_frame")
    frames = _field(flat, "num_frames")
    bad = ~((frames >= 1) & (frames <= stream.segment_frames))
    rows.flag(_any_per_row(bad, parents, table.num_rows), lambda i: f"a segment of '{name}' holds a wrong frame count")
    before = np.cumsum(np.nan_to_num(frames)) - np.nan_to_num(frames)
    row_first = np.zeros(table.num_rows, np.int64)
    starts = np.cumsum(lengths) - lengths
    row_first[lengths > 0] = starts[lengths > 0]
    expected_first = before - before[row_first[parents]] if len(parents) else before
    rows.flag(
        _any_per_row(first != expected_first, parents, table.num_rows),
        lambda i: f"the segments of '{name}' do not tile its frames one after another",
    )
    totals = np.bincount(parents, weights=np.nan_to_num(frames), minlength=table.num_rows)
    rows.flag(
        (lengths > 0) & (totals != count),
        lambda i: f"the segments of '{name}' hold {totals[i]:.0f} frames, '{name}/count' says {count[i]:.0f}",
    )
    limit = stream.segment_frames * stream.coded_size[0] * stream.coded_size[1] * 3 + 65536
    sizes = _field(flat, "size")
    rows.flag(
        _any_per_row(~(sizes >= 1) | (sizes > limit), parents, table.num_rows),
        lambda i: f"a segment of '{name}' has a size outside [1, {limit}] bytes",
    )
    if packets_column(name) in table.column_names:
        _check_packet_indexes(table, name, lengths, frames, parents, rows)


def _check_packet_indexes(
    table: pa.Table, name: str, lengths: np.ndarray, frames: np.ndarray, parents: np.ndarray, rows: _RowProblems
) -> None:
    """A row's packet indexes, where present, are one per segment, each one packet per frame of it
    (their contents are checked against the segment's bytes when it is read)."""
    column = packets_column(name)
    lists = table.column(column).combine_chunks()
    present = ~lists.is_null().to_numpy(zero_copy_only=False)
    counts = pc.fill_null(lists.value_lengths(), 0).to_numpy(zero_copy_only=False)
    rows.flag(present & (counts != lengths), lambda i: f"'{column}' does not list one index per segment")
    aligned = present[parents] if len(parents) else np.zeros(0, bool)
    flat = lists.flatten()
    if len(flat) != int(aligned.sum()) or not len(flat):
        return
    blobs = flat.field("packets")
    size = pc.fill_null(pc.binary_length(blobs), 0).to_numpy(zero_copy_only=False)
    indexed = ~blobs.is_null().to_numpy(zero_copy_only=False)
    wrong = np.zeros(len(parents), bool)
    wrong[aligned] = indexed & (size != frames[aligned] * ROW_BYTES)
    rows.flag(
        _any_per_row(wrong, parents, table.num_rows),
        lambda i: f"a packet index of '{name}' does not list one packet per frame of its segment",
    )


def _check_lowdim(
    table: pa.Table, stream: LowdimStream, count: np.ndarray, layout: str, rows: _RowProblems, added: bool
) -> None:
    name = stream.name
    row_bytes = int(np.prod(stream.shape, dtype=np.int64)) * np.dtype(stream.dtype).itemsize
    _check_piece_column(table, f"{name}/data", _piece_path(layout, "data", name, added), rows)
    _check_piece_column(table, f"{name}/timestamps", _piece_path(layout, "timestamps", name, added), rows)
    _check_rows_size(table, f"{name}/data", count, row_bytes, layout, rows)
    _check_rows_size(table, f"{name}/timestamps", count, 8, layout, rows)


def _check_rows_size(table: pa.Table, column: str, count: np.ndarray, row_bytes: int, layout: str, rows) -> None:
    """A piece of `count` rows of `row_bytes` each: exactly that (Zarr), or that plus an .npy header."""
    payload = count * row_bytes
    header = 0 if layout == "zarr" else NPY_HEADER_MAX
    size = _field(table.column(column).combine_chunks(), "size")
    bad = ~((size >= payload) & (size <= payload + header))
    if layout == "wds":
        bad |= ~(size > payload)
    rows.flag(bad, lambda i: f"'{column}' is {size[i]:g} bytes, not {count[i]:.0f} rows of {row_bytes} bytes")


def _check_piece_sizes(table: pa.Table, column: str, low: float, high: np.ndarray, rows: _RowProblems) -> None:
    size = _field(table.column(column).combine_chunks(), "size")
    rows.flag(~((size >= low) & (size <= high)), lambda i: f"'{column}' has a size of {size[i]:g} bytes")


def _check_piece_column(table: pa.Table, column: str, array_path: str | None, rows: _RowProblems) -> None:
    pieces = table.column(column).combine_chunks()
    if pieces.null_count:
        rows.flag(pieces.is_null().to_numpy(zero_copy_only=False), lambda i: f"'{column}' is missing")
    _check_pieces(pieces, np.arange(table.num_rows), array_path, table, column, rows)


def _check_pieces(
    pieces: pa.StructArray, parents: np.ndarray, array_path: str | None, table: pa.Table, column: str, rows
) -> None:
    """Paths, offsets and checksums of pieces belonging to rows `parents`."""
    n = table.num_rows
    paths = pieces.field("path")
    if array_path is None:
        shards = table.column("shard").combine_chunks().take(pa.array(parents, pa.int64()))
        same = pc.fill_null(pc.equal(paths, shards), False).to_numpy(zero_copy_only=False)
        expected = "the row's shard"
    elif array_path == _ANY_SHARD:
        same = pc.fill_null(pc.match_substring_regex(paths, SHARD_PATTERN), False).to_numpy(zero_copy_only=False)
        expected = "a file shards/<name>.tar of the store it was added from"
    else:
        same = pc.fill_null(pc.equal(paths, pa.scalar(array_path)), False).to_numpy(zero_copy_only=False)
        expected = f"'{array_path}'"
    rows.flag(_any_per_row(~same, parents, n), lambda i: f"a piece of '{column}' names a path other than {expected}")
    offsets = _field(pieces, "offset")
    rows.flag(
        _any_per_row(~(offsets >= 0), parents, n), lambda i: f"a piece of '{column}' has a negative or missing offset"
    )
    checksums = pc.fill_null(pc.match_substring_regex(pieces.field("checksum"), CHECKSUM_PATTERN), False)
    rows.flag(
        _any_per_row(~checksums.to_numpy(zero_copy_only=False), parents, n),
        lambda i: f"a piece of '{column}' has no valid xxh64 checksum",
    )


def _check_members(table: pa.Table, rows: _RowProblems) -> None:
    shards = pc.fill_null(pc.match_substring_regex(table.column("shard"), SHARD_PATTERN), False)
    rows.flag(
        ~shards.to_numpy(zero_copy_only=False),
        lambda i: "its 'shard' is not a file shards/<name>.tar inside the store",
    )
    lists = table.column("members").combine_chunks()
    flat = lists.flatten()
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    offsets, sizes = _field(flat, "offset"), _field(flat, "size")
    bad = ~(offsets >= 0) | ~(sizes >= 0)
    rows.flag(_any_per_row(bad, parents, table.num_rows), lambda i: "a tar member has a negative or missing range")


def _field(pieces: pa.StructArray, name: str) -> np.ndarray:
    """A numeric field of struct pieces as float64, NaN where missing (so every comparison fails)."""
    values = pieces.field(name)
    return pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False).astype(np.float64)


def _any_per_row(mask: np.ndarray, parents: np.ndarray, rows: int) -> np.ndarray:
    return np.bincount(parents[mask], minlength=rows) > 0 if len(parents) else np.zeros(rows, bool)
