"""Reading `episodes.parquet` by row group and by column, whatever its size, so that a rank of a job over ten
million episodes holds the columns it plans with and the row groups it reads rather than the whole manifest (whose
segment lists and packet indexes take kilobytes per episode), and a store of ten episodes is read by the same code.

The columns a planner asks for are read column by column (`columns`), and a row group is read and kept (within
`ROW_GROUP_CACHE_BYTES`) when one of its rows is first read (`row`). A manifest of at most `EAGER_ROWS` rows in a
file of at most `EAGER_BYTES` is read in one request and every row group of it checked when the store opens
(`checked_whole`): `Store.damaged` then lists every damaged episode. In a larger one a row is checked before it is
first read (on its own, or with its whole group once several of the group's rows were read): its damaged episodes
are found as they are read, and `mmdata verify` reads every one. A row group that cannot be read marks its rows
damaged, named, in either.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from cachetools import LRUCache
from fsspec.implementations.local import LocalFileSystem

from mmdata.errors import IntegrityError, MmdataError, StoreError
from mmdata.schema import DatasetSchema
from mmdata.store.filesystem import ReadPolicy, file_size, read_file, read_range
from mmdata.store.manifest import ORIGIN, rooted_in_origin
from mmdata.store.manifest_checks import check_manifest, check_manifest_columns, duration_damage

# Columns read as dictionaries when read whole from a large manifest: a few distinct values over millions of rows.
DICTIONARY_COLUMNS = ("shard", "task", "source", ORIGIN)
EAGER_ROWS = 1 << 17
EAGER_BYTES = 64 << 20
ROW_GROUP_CACHE_BYTES = 256 << 20
FETCH_THREADS = 16  # byte ranges of a large manifest in object storage read at once
ROWS_KEPT = 8192  # rows kept as dicts: a loader reads an episode's row for each of its samples
ROWS_CHECKED_ALONE = 4  # rows of a row group checked one by one before the whole group is
# A Parquet footer may not declare more than this many times its file's size in row data (zstd
# on a manifest gives 3-10x); beyond it the file is refused before its pages are decompressed.
MANIFEST_EXPANSION = 64

# What reading a manifest's row group may raise: damage (`is_damage`), or a read that failed
UNREADABLE = (pa.ArrowException, OSError, ValueError, IndexError, EOFError, MmdataError)


def is_damage(error: BaseException) -> bool:
    """Whether a row group that could not be read is damaged (pyarrow's errors, bytes that came back wrong), rather
    than a read that failed (a timeout, an unreachable store: the group is read again when asked again)."""
    return not isinstance(error, MmdataError) or isinstance(error, IntegrityError)


Check = Callable[[pa.Table, int], dict[int, str]]
"""(a row group, its first row's number) -> its damaged rows and why; raises StoreError."""


class RangeFile(io.RawIOBase):
    """A file of a store read by byte ranges, each with the store's timeouts and retries: what Parquet reads a
    large manifest's footer, columns and row groups through. Ranges `prefetch`ed together (a row group's span,
    a column's chunks, `FETCH_THREADS` at a time) serve the reads inside them, so that Parquet's read per column
    chunk is not a request each from object storage."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, policy: ReadPolicy):
        self.fs, self.path, self.size, self.policy = fs, path, size, policy
        self.position = 0
        self._spans: list[tuple[int, bytes]] = []  # (offset, bytes), ascending and apart

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Read the (offset, size) `ranges` (merged where they touch) for the reads that follow; until `forget`."""
        merged: list[list[int]] = []
        for offset, size in sorted(ranges):
            if merged and offset <= merged[-1][0] + merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], offset + size - merged[-1][0])
            else:
                merged.append([offset, size])
        with ThreadPoolExecutor(min(FETCH_THREADS, max(1, len(merged)))) as pool:
            read = list(pool.map(lambda span: read_range(self.fs, self.path, span[0], span[1], self.policy), merged))
        self._spans = sorted([*self._spans, *((offset, data) for (offset, _), data in zip(merged, read))])

    def forget(self) -> None:
        self._spans = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.position + size)
        data = self._prefetched(self.position, end)
        if data is None:
            data = read_range(self.fs, self.path, self.position, max(0, end - self.position), self.policy)
        self.position += len(data)
        return data

    def _prefetched(self, start: int, end: int) -> bytes | None:
        place = bisect.bisect_right(self._spans, (start, b"\xff")) - 1
        if place >= 0:
            offset, data = self._spans[place]
            if offset <= start and end <= offset + len(data):
                return data[start - offset : end - offset]
        return None

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class Manifest:
    """Read access to `episodes.parquet`: rows as plain dicts, columns as pyarrow arrays (see the module).

    `damaged` maps the rows that failed the manifest checks (so far, for a manifest read by row group) to why;
    reading one raises IntegrityError, so nothing is ever read through an inconsistent address.
    """

    def __init__(self, opener: ParquetOpener, check: Check, opened: tuple[pq.ParquetFile, Any] | None = None):
        """A manifest read by row group and column from the Parquet file `opener` opens (again in each process;
        `opened`: the file opened already in this process, and what it reads through)."""
        parquet, source = opened if opened is not None else opener()
        self.damaged: dict[int, str] = {}
        self.stream_origins: dict[str, str] = {}  # (set by `open_manifest` from the store's schema)
        self.num_rows = parquet.metadata.num_rows
        self.checked_whole = False
        self._opener, self._check = opener, check
        counts = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
        self._starts = [0, *itertools.accumulate(counts)][:-1] if counts else [0]
        self._setup_caches()
        self._parquet: pq.ParquetFile | None = parquet
        self._source: Any = source

    def check_whole(self) -> None:
        """Read and check every row group now, so that `damaged` lists every damaged row (a small manifest, when
        its store opens): read in one pass and kept as its groups, or, where that fails, group by group (a group
        that cannot be read marks its rows damaged); a structure that is wrong raises StoreError."""
        parquet, _ = self._file()
        try:
            whole: pa.Table | None = parquet.read(use_threads=False)
        except UNREADABLE as exc:
            if not is_damage(exc):
                raise
            whole = None
        for number, first in enumerate(self._starts):
            if self.num_rows == 0:
                break
            if whole is not None:
                group = whole.slice(first, self._group_rows(number))
                self._groups[number] = group
            else:
                try:
                    group, _ = self._group_of(first)
                except IntegrityError:  # (its rows are marked damaged, named)
                    continue
            self.damaged.update(self._check(group, first))
            self._checked_groups.add(number)
        self.checked_whole = True

    def _setup_caches(self) -> None:
        self._parquet = None
        self._source = None
        self._groups: LRUCache = LRUCache(maxsize=ROW_GROUP_CACHE_BYTES, getsizeof=lambda table: table.nbytes or 1)
        self._rows: LRUCache = LRUCache(maxsize=ROWS_KEPT)
        self._checked_groups: set[int] = set()  # row groups checked whole in this process
        self._checked_rows: set[int] = set()  # rows checked on their own in this process
        self._rows_checked_in: dict[int, int] = {}  # per row group, how many of its rows were checked on their own

    @property
    def in_memory(self) -> bool:
        """Whether every row group is held in memory (a small manifest, checked whole when opened): reading rows
        ahead gains nothing then."""
        return self.checked_whole and len(self._groups) == len(self._starts)

    def __len__(self) -> int:
        return self.num_rows

    def row(self, index: int) -> dict[str, Any]:
        """Episode `index`'s row, its pieces' paths relative to this store (those of another store's episodes
        in a split or merged store too: `rooted_in_origin`)."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"episode {index} out of range: the dataset has {self.num_rows} episodes")
        found = self._rows.get(index)
        if found is None:
            if index in self.damaged:
                raise IntegrityError(f"{self.damaged[index]}; run `mmdata verify` to list every damaged episode")
            group, start = self._group_of(index)
            found = self._kept_row(index, group, start)
        return found

    def read_ahead(self, indexes: Iterable[int]) -> None:
        """Read the rows `indexes` that are not kept yet, so that `row` finds them: of a manifest read by row group,
        the row groups holding them are read at once (`FETCH_THREADS` at a time, each once), which a loader whose
        frame cache plans many steps ahead otherwise reads one by one (and again, when 18 MB groups leave the cache
        between two of its rows). A damaged row is left for `row` to refuse."""
        if self.in_memory:
            return
        missing: dict[int, list[int]] = {}
        for index in sorted({int(i) for i in indexes}):
            if 0 <= index < self.num_rows and index not in self._rows and index not in self.damaged:
                missing.setdefault(bisect.bisect_right(self._starts, index) - 1, []).append(index)
        if not missing:
            return
        for number in [number for number in missing if number in self._groups]:
            self._keep_rows(missing.pop(number), self._groups[number], self._starts[number])
        if not missing:
            return
        parquet = self._file()[0]
        opener = self._opener

        def read(number: int) -> tuple[int, pa.Table | None]:
            opened, source = opener(metadata=parquet.metadata, native=True)  # a file of its own in each thread
            with contextlib.closing(source):
                try:
                    _prefetch(opened, source, [number], None)
                    return number, opened.read_row_group(number, use_threads=False)
                except UNREADABLE as exc:
                    if is_damage(exc):  # (else a read that failed: `row` reads the group again, and reports it)
                        self._damage_group(number, exc)
                    return number, None

        unread = list(missing)
        with ThreadPoolExecutor(min(FETCH_THREADS, len(unread))) as pool:
            for first in range(0, len(unread), FETCH_THREADS):  # (a group takes ~18 MB: a few held at a time)
                for number, group in pool.map(read, unread[first : first + FETCH_THREADS]):
                    if group is not None:
                        self._keep_rows(missing[number], group, self._starts[number])
        pa.default_memory_pool().release_unused()

    def _keep_rows(self, indexes: list[int], group: pa.Table, start: int) -> None:
        for index in indexes:
            with contextlib.suppress(IntegrityError):  # (left for `row` to refuse)
                self._kept_row(index, group, start)

    def _kept_row(self, index: int, group: pa.Table, start: int) -> dict[str, Any]:
        """Row `index` of `group` (whose first row is `start`), checked, as a dict, kept for the next read."""
        self._check_row(index, group, start)
        if index in self.damaged:
            raise IntegrityError(f"{self.damaged[index]}; run `mmdata verify` to list every damaged episode")
        row = group.slice(index - start, 1).to_pylist()[0]
        found = self._rows[index] = rooted_in_origin(row, self.stream_origins)
        return found

    @property
    def schema(self) -> pa.Schema:
        """The manifest's columns and their types, as its rows are read (from the footer: no row is read)."""
        return self._file()[0].schema_arrow.remove_metadata()

    @property
    def table(self) -> pa.Table:
        """The whole manifest as a table (every row group is read: tools that look at a whole store use it; loaders
        use `columns` and `row`)."""
        schema = self._file()[0].schema_arrow
        parts = []
        for number in range(len(self._starts)):
            try:
                parts.append(self._read_group(number))
            except IntegrityError:  # (its rows are damaged now, and missing values here)
                parts.append(_missing_rows(schema, self._group_rows(number)))
        return pa.concat_tables(parts)

    def columns(self, names: Sequence[str]) -> pa.Table:
        """The manifest's columns `names`, every row (read column by column, string columns of few values as
        dictionaries; not kept, as a loader reads each once). Reading them adds to `damaged` what they show: rows of
        a row group that cannot be read (given as missing values), and, when `duration` is among them, rows whose
        duration no episode can have."""
        present = self._file()[0].schema_arrow.names
        parquet, source = self._opener([name for name in DICTIONARY_COLUMNS if name in present])
        try:
            _prefetch(parquet, source, range(parquet.num_row_groups), names)
            read = parquet.read(columns=list(names), use_threads=False)
        except UNREADABLE as exc:
            if not is_damage(exc):
                raise
            read = self._columns_by_group(parquet, names)
        if isinstance(source, RangeFile):
            source.forget()
        pa.default_memory_pool().release_unused()  # the pages decoded on the way, kept by the allocator
        if "duration" in names:  # (what planning reads first: an episode no duration fits is damage, named now)
            durations = pc.cast(read.column("duration"), pa.float64()).to_numpy(zero_copy_only=False)
            for row, message in duration_damage(durations).items():
                self.damaged.setdefault(row, message)  # (a row group that could not be read says so first)
        return read

    def _columns_by_group(self, parquet: pq.ParquetFile, names: Sequence[str]) -> pa.Table:
        """The columns `names` read a row group at a time: a group that cannot be read gives its rows as missing
        values, each of them damaged (`_damage_group`), so that the others plan and read."""
        parts = []
        schema = pa.schema([parquet.schema_arrow.field(name) for name in names])
        for number in range(parquet.num_row_groups):
            try:
                parts.append(parquet.read_row_group(number, columns=list(names), use_threads=False))
            except UNREADABLE as exc:
                if not is_damage(exc):
                    raise
                self._damage_group(number, exc)
                parts.append(_missing_rows(schema, self._group_rows(number)))
        return pa.concat_tables(parts)

    def _group_rows(self, number: int) -> int:
        end = self._starts[number + 1] if number + 1 < len(self._starts) else self.num_rows
        return end - self._starts[number]

    def _damage_group(self, number: int, error: BaseException) -> IntegrityError:
        """Mark every row of row group `number`, which cannot be read (`error`), damaged; the error naming it."""
        first = self._starts[number]
        last = first + self._group_rows(number) - 1
        problem = f"{type(error).__name__}: {str(error)[:300]}"
        where = self._opener.where
        message = (
            f"row group {number} of {where} (episodes {first} to {last}) cannot be read ({problem}); the manifest"
            " is damaged: restore it or convert the store again"
        )
        for row in range(first, last + 1):
            self.damaged.setdefault(row, message)
        return IntegrityError(message)

    def take(self, indexes: np.ndarray, names: Sequence[str]) -> pa.Table:
        """The columns `names` of rows `indexes` (any order), as stored (not rooted in an origin), each row group
        they lie in read once: what an edit reads of another store's rows, a part at a time."""
        indexes = np.asarray(indexes, dtype=np.int64)
        numbers = np.searchsorted(np.asarray(self._starts), indexes, side="right") - 1
        parts, places = [], []
        for number in np.unique(numbers).tolist():
            chosen = np.flatnonzero(numbers == number)
            group, first = self._group_of(int(indexes[chosen[0]]))
            parts.append(group.select(list(names)).take(pa.array(indexes[chosen] - first)))
            places.append(chosen)
        if not parts:
            return self._file()[0].schema_arrow.empty_table().select(list(names))
        return pa.concat_tables(parts).take(pa.array(np.argsort(np.concatenate(places), kind="stable")))

    def row_groups(self) -> Iterator[tuple[int, pa.Table]]:
        """Every row, as (first row, rows) a row group at a time, each read when its turn comes and not kept
        (what copies a manifest of millions of rows in the memory of one group)."""
        for number, first in enumerate(self._starts):
            yield first, self._read_group(number)

    def _group_of(self, index: int) -> tuple[pa.Table, int]:
        """The row group holding row `index` (read and checked when first asked for) and its first row."""
        number = bisect.bisect_right(self._starts, index) - 1
        group = self._groups.get(number)
        if group is None:
            group = self._read_group(number)
            if group.nbytes <= ROW_GROUP_CACHE_BYTES:  # (a manifest written in larger groups is read again)
                self._groups[number] = group
        return group, self._starts[number]

    def _check_row(self, index: int, group: pa.Table, start: int) -> None:
        """Check row `index` (in `group`, whose first row is `start`) before it is first read: on its own while few
        rows of its group were read (a loader reading episodes all over a large manifest: 4 ms a row, where a group
        of 4,096 takes 18), then its whole group once (a reader going through the rows in order)."""
        if self.checked_whole:
            return
        number = bisect.bisect_right(self._starts, index) - 1
        if number in self._checked_groups or index in self._checked_rows:
            return
        rows_before = self._rows_checked_in.get(number, 0)
        if rows_before < ROWS_CHECKED_ALONE:
            self.damaged.update(self._check(group.slice(index - start, 1), index))
            self._checked_rows.add(index)
            self._rows_checked_in[number] = rows_before + 1
        else:
            self.damaged.update(self._check(group, start))
            self._checked_groups.add(number)

    def _read_group(self, number: int) -> pa.Table:
        """Row group `number`, read as one span of the file."""
        parquet, source = self._file()
        try:
            _prefetch(parquet, source, [number], None)
            group = parquet.read_row_group(number, use_threads=False)
        except UNREADABLE as exc:
            if not is_damage(exc):
                raise
            raise self._damage_group(number, exc) from exc
        finally:
            if isinstance(source, RangeFile):
                source.forget()
        return group

    def _file(self) -> tuple[pq.ParquetFile, Any]:
        """The manifest file and what it reads through (opened again in a new process)."""
        if self._parquet is None:
            self._parquet, self._source = self._opener()
        return self._parquet, self._source

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_parquet=None, _source=None, _groups=None, _rows=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup_caches()


class ParquetOpener:
    """Opens a store's manifest file for reading by range (picklable: a worker process opens it again)."""

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        size: int,
        policy: ReadPolicy,
        where: str,
        data: pa.Buffer | None = None,
    ):
        self.fs, self.path, self.size, self.policy, self.where = fs, path, size, policy, where
        self.data = data  # the whole file, read in one request (a small manifest), else None: read by range

    def __call__(
        self, dictionaries: Sequence[str] = (), metadata: pq.FileMetaData | None = None, native: bool = False
    ) -> tuple[pq.ParquetFile, Any]:
        """The file, and what it reads through; string columns named in `dictionaries` read as dictionaries;
        `metadata`: its footer, read already (not read again). `native`: a local file is read by Arrow itself,
        which reads without the interpreter's lock (threads reading row groups then use both cores)."""
        source: Any
        if self.data is not None:
            source = pa.BufferReader(self.data)
        elif native and isinstance(self.fs, LocalFileSystem):
            source = pa.OSFile(self.path)
        else:
            source = RangeFile(self.fs, self.path, self.size, self.policy)
        return _parquet_file(source, self.where, dictionaries, metadata), source


def open_manifest(
    fs: fsspec.AbstractFileSystem, path: str, policy: ReadPolicy, schema: DatasetSchema, where: str
) -> Manifest:
    """The manifest at `path` of a store of `schema`, read by row group and column (see the module): in one
    request, every row group checked now, when it is small. A footer that declares far more row data than the file
    could hold is refused before any page is decompressed."""
    size = file_size(fs, path, policy)
    data = arrow_owned(read_file(fs, path, EAGER_BYTES, policy)) if size <= EAGER_BYTES else None
    source: Any = pa.BufferReader(data) if data is not None else RangeFile(fs, path, size, policy)
    parquet = _parquet_file(source, where)
    metadata = parquet.metadata
    declared = sum(metadata.row_group(g).total_byte_size for g in range(parquet.num_row_groups))
    if declared > MANIFEST_EXPANSION * size + (64 << 20):
        raise StoreError(
            f"{where} declares {declared} bytes of rows in a {size}-byte file;"
            " it is damaged or hostile: restore it or convert again"
        )
    check_manifest_columns(parquet.schema_arrow, metadata.num_rows, schema, where)

    def check(group: pa.Table, first_row: int) -> dict[int, str]:
        return check_manifest(group, schema, where, first_row)

    opener = ParquetOpener(fs, path, size, policy, where, data)
    manifest = Manifest(opener, check, (parquet, source))
    manifest.stream_origins = dict(schema.stream_origins)
    if size <= EAGER_BYTES and metadata.num_rows <= EAGER_ROWS:
        manifest.check_whole()
    return manifest


def _missing_rows(schema: pa.Schema, rows: int) -> pa.Table:
    """`rows` rows of `schema`, every value missing: a damaged row group's place in the columns read."""
    return pa.table([pa.nulls(rows, field.type) for field in schema], schema=schema)


def arrow_owned(data: bytes) -> pa.Buffer:
    """`data` copied into memory Arrow owns. A buffer Arrow wraps around a Python object must take the interpreter
    lock to be freed, and a reader Arrow's thread pool frees while the interpreter shuts down then aborts the
    process ("terminate called without an active exception"); freeing Arrow's own memory needs no lock."""
    stream = pa.BufferOutputStream()
    stream.write(data)
    return stream.getvalue()


def _prefetch(parquet: pq.ParquetFile, source: Any, groups: Sequence[int], columns: Sequence[str] | None) -> None:
    """Have `source` (the file under `parquet`) read the column chunks of `columns` (None: all) in row `groups` in
    a few requests at once, when it is read by range."""
    if not isinstance(source, RangeFile):
        return
    ranges = []
    for group in groups:
        metadata = parquet.metadata.row_group(group)
        for number in range(metadata.num_columns):
            chunk = metadata.column(number)
            if columns is not None and chunk.path_in_schema.split(".")[0] not in columns:
                continue
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            ranges.append((start, chunk.total_compressed_size))
    source.prefetch(ranges)


def _parquet_file(
    source: Any, where: str, dictionaries: Sequence[str] = (), metadata: pq.FileMetaData | None = None
) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(source, pre_buffer=False, read_dictionary=list(dictionaries) or None, metadata=metadata)
    except (pa.ArrowException, OSError, ValueError, IndexError) as exc:
        raise StoreError(f"{where} is not a readable Parquet file ({exc}); restore it or convert again") from exc
