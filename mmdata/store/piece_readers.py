"""Fetch stored pieces by their manifest address: byte ranges of shards, or Zarr elements and rows.

Both layouts read through `store/filesystem.py` (deadlines, retries of transient errors only)
and, with `verify` (the default), check every piece against the manifest's checksum, so a flipped
byte is an IntegrityError and never a wrong frame. Numeric rows are checked against the shape
and dtype the schema declares before anything is allocated for them.

From object storage, where each request costs a round trip, a reader can be told the pieces a
micro-batch will need (`prefetch`): WebDataset byte ranges of one shard that lie close together
are fetched as one request, several requests at a time (`ReadPolicy.concurrency`); the pieces
are then served from memory until `forget`. The pieces of later micro-batches are fetched in the background
(`prefetch_ahead`, told which read needs each): a WebDataset reader runs several such fetches at once and keeps
each piece until the last read that needs it, so that a request's latency is hidden however long it is, as long as
the reader is told far enough ahead. With `ReadPolicy.cache_dir`, pieces fetched from object storage are also kept
on local disk (`PieceCache`) and read from there next time.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import merge_offset_ranges

from mmdata.codecs.lowdim import NpyError, decode_npy
from mmdata.errors import IntegrityError, MmdataError
from mmdata.schema import Stream
from mmdata.store.checksum import checksum_array, checksum_bytes
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy, join, read_file, read_range
from mmdata.store.manifest import Piece
from mmdata.store.piece_cache import PieceCache
from mmdata.store.zarr_reader import HeldBytes, ZarrArrays

# A request of coalesced byte ranges holds at most this many bytes (how far apart ranges may be and still share one
# is the read policy's `coalesce_gap`).
COALESCE_MAX = 64 << 20
# The fetches ahead a WebDataset reader runs at once, and the bytes it holds for later reads before it starts no more.
MOST_FETCHES_AHEAD = 8
AHEAD_BYTES = 256 << 20


class PieceReader(Protocol):
    bytes_read: int  # running total of payload bytes fetched, for throughput figures
    verify: bool

    def read_bytes(self, piece: Piece) -> bytes:
        """An encoded blob: a video segment, an audio file, or (WebDataset) any member."""

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A numeric array of exactly `shape` and `dtype`: low-dim values or timestamps."""

    @property
    def fetches_ahead(self) -> bool:
        """Whether `prefetch` saves anything here (object storage; not local files)."""

    def prefetch(self, pieces: Iterable[Piece]) -> None:
        """Fetch these pieces ahead, in as few requests as sensible; failures are left to `read_bytes`."""

    @property
    def fetch_seconds(self) -> float | None:
        """How long the latest fetch ahead took (about a request's latency), None before one."""

    def prefetch_ahead(self, by_read: Sequence[Iterable[Piece]]) -> None:
        """Start fetching the pieces of later reads in the background (`by_read[i]`: those read i + 1 reads
        from now), while this one decodes; a later `prefetch` or read takes them."""

    def forget(self) -> None:
        """The read in progress is over: drop what it held that no later read was said to need."""


@dataclass
class CoalescedRange:
    """One request: bytes [start, end) of a shard, holding `members`."""

    path: str
    start: int
    end: int
    members: list[Piece] = field(default_factory=list)

    def holds(self, piece: Piece) -> bool:
        return piece.path == self.path and self.start <= piece.offset and piece.offset + piece.size <= self.end


def coalesce(
    pieces: Iterable[Piece], gap: int = DEFAULT_READ_POLICY.coalesce_gap, limit: int = COALESCE_MAX
) -> list[CoalescedRange]:
    """The pieces' byte ranges merged per shard where at most `gap` bytes apart (up to `limit` bytes a request,
    by fsspec's `merge_offset_ranges`), each range with the pieces it holds."""
    ordered = sorted(set(pieces), key=lambda p: (p.path, p.offset, p.size))
    if not ordered:
        return []
    paths, starts, ends = merge_offset_ranges(
        [p.path for p in ordered],
        [p.offset for p in ordered],
        [p.offset + p.size for p in ordered],
        max_gap=gap,
        max_block=limit,
        sort=False,
    )
    ranges = [CoalescedRange(path, start, end) for path, start, end in zip(paths, starts, ends)]
    current = 0
    for piece in ordered:  # ranges come in the pieces' order: each piece lies in the first one holding it
        while not ranges[current].holds(piece):
            current += 1
        ranges[current].members.append(piece)
    return ranges


def checked(piece: Piece, checksum: str) -> None:
    """Raise IntegrityError, naming the piece, when what was read is not what the writer stored."""
    if checksum != piece.checksum:
        raise IntegrityError(
            f"{piece.path} at {piece.offset} ({piece.size} bytes): checksum mismatch ({checksum} read, the manifest"
            f" says {piece.checksum}); the store is damaged: restore the file or convert again"
        )


def piece_cache(fs: fsspec.AbstractFileSystem, root: str, policy: ReadPolicy) -> PieceCache | None:
    """The disk cache `policy` asks for, for a store in object storage (a local store is read in place)."""
    if policy.cache_dir is None or isinstance(fs, LocalFileSystem):
        return None
    return PieceCache(policy.cache_dir, policy.cache_max_bytes, fs.unstrip_protocol(root))


def cached_bytes(cache: PieceCache | None, piece: Piece, verify: bool) -> bytes | None:
    """`piece` from the disk cache; an entry that fails its checksum is removed and reads as a miss."""
    if cache is None:
        return None
    data = cache.get(piece)
    if data is not None and verify and checksum_bytes(data) != piece.checksum:
        cache.discard(piece)
        return None
    return data


class BackgroundFetch:
    """One fetch at a time on a thread of its own (the next micro-batch's, while this one decodes). A forked
    or unpickled copy starts a thread of its own: the parent's does not exist there."""

    def __init__(self) -> None:
        self._future: Future | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._owner = os.getpid()

    def busy(self) -> bool:
        return self._owner == os.getpid() and self._future is not None and not self._future.done()

    def start(self, fetch: Callable[[], Any]) -> None:
        if self._thread is None or self._owner != os.getpid():
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="mmdata-fetch-ahead")
            self._owner = os.getpid()
        self._future = self._thread.submit(fetch)

    def take(self) -> Any | None:
        """What the fetch returned (waiting for it), or None: none started, or it failed (a fetch ahead is an
        optimisation; the reads themselves report any failure)."""
        future, self._future = self._future, None
        if future is None or self._owner != os.getpid():
            return None
        try:
            return future.result()
        except Exception:
            return None

    def __getstate__(self) -> dict:
        return {"_future": None, "_thread": None, "_owner": -1}


FetchedPieces = tuple[dict[Piece, bytes], int]  # (the pieces fetched, the requests it took)


class AheadFetches:
    """Fetches for later reads, up to `most` at once on threads of their own, each with the pieces it brings, and
    how long the latest one that made requests took. A forked or unpickled copy starts threads of its own: the
    parent's do not exist there."""

    def __init__(self, most: int = MOST_FETCHES_AHEAD) -> None:
        self.most = most
        self.seconds: float | None = None
        self._running: list[tuple[Future, frozenset[Piece]]] = []
        self._threads: ThreadPoolExecutor | None = None
        self._owner = os.getpid()

    def fetching(self) -> set[Piece]:
        return set().union(*(pieces for _, pieces in self._mine()))

    def full(self) -> bool:
        return len(self._mine()) >= self.most

    def start(self, pieces: frozenset[Piece], fetch: Callable[[list[Piece]], FetchedPieces]) -> None:
        if self._threads is None or self._owner != os.getpid():
            self._threads = ThreadPoolExecutor(self.most, thread_name_prefix="mmdata-fetch-ahead")
            self._owner, self._running = os.getpid(), []

        def timed() -> FetchedPieces:
            started = time.perf_counter()
            fetched = fetch(sorted(pieces, key=lambda p: (p.path, p.offset)))
            if fetched[1]:
                self.seconds = time.perf_counter() - started
            return fetched

        self._running.append((self._threads.submit(timed), pieces))

    def finished(self) -> list[FetchedPieces]:
        """What the fetches that are done brought (those still running stay)."""
        return self._collect([entry for entry in self._mine() if entry[0].done()])

    def wait_for(self, pieces: set[Piece]) -> list[FetchedPieces]:
        """What the fetches bringing any of `pieces` brought, waiting for them, and what the finished ones did."""
        return self._collect([entry for entry in self._mine() if entry[0].done() or entry[1] & pieces])

    def _mine(self) -> list[tuple[Future, frozenset[Piece]]]:
        return self._running if self._owner == os.getpid() else []

    def _collect(self, entries: list[tuple[Future, frozenset[Piece]]]) -> list[FetchedPieces]:
        results = []
        for entry in entries:
            self._running.remove(entry)
            try:
                results.append(entry[0].result())
            except Exception:
                continue  # (a fetch ahead is an optimisation; the reads themselves report any failure)
        return results

    def __getstate__(self) -> dict:
        return {"most": self.most, "seconds": None, "_running": [], "_threads": None, "_owner": -1}


class WdsPieceReader:
    """Pieces of WebDataset shards: each one is one byte-range read, checked against its checksum
    when `verify` is set (xxHash64 runs at several GB/s, far below the cost of decoding). From object storage it
    holds each piece fetched ahead until the last read said to need it (`_until`, in reads since it was made)."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
    ):
        self.fs = fs
        self.root = root
        self.verify = verify
        self.policy = policy
        self.bytes_read = 0
        self.requests = 0
        self.cache = piece_cache(fs, root, policy)
        self._ready: dict[Piece, bytes] = {}
        self._until: dict[Piece, int] = {}  # the last read that needs each piece held or being fetched
        self._read = 0  # reads over (`forget`)
        self._held_bytes = 0
        self._ahead = AheadFetches()

    def read_bytes(self, piece: Piece) -> bytes:
        data = self._ready.get(piece)
        if data is None:
            data = cached_bytes(self.cache, piece, self.verify)
            if data is not None:
                self.bytes_read += len(data)
                return data
            data = read_range(self.fs, join(self.root, piece.path), piece.offset, piece.size, self.policy)
            self.requests += 1
            self._keep(piece, data)
        self.bytes_read += len(data)
        if self.verify:
            checked(piece, checksum_bytes(data))
        return data

    def _keep(self, piece: Piece, data: bytes) -> None:
        if self.cache is not None and (not self.verify or checksum_bytes(data) == piece.checksum):
            self.cache.put(piece, data)

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        data = self.read_bytes(piece)
        try:
            return decode_npy(data, shape, dtype)
        except NpyError as exc:
            raise IntegrityError(f"{piece.path} at {piece.offset}: {exc}; restore the file or convert again") from exc

    @property
    def fetches_ahead(self) -> bool:
        return not isinstance(self.fs, LocalFileSystem)  # a local read costs microseconds: nothing to save

    @property
    def fetch_seconds(self) -> float | None:
        return self._ahead.seconds

    def prefetch(self, pieces: Iterable[Piece]) -> None:
        if not self.fetches_ahead:
            return
        wanted = set(pieces)
        for piece in wanted:
            self._until[piece] = max(self._until.get(piece, self._read), self._read)
        self._hold(self._ahead.wait_for(wanted - self._ready.keys()))
        self._hold([self._fetch([p for p in wanted if p not in self._ready])])

    def prefetch_ahead(self, by_read: Sequence[Iterable[Piece]]) -> None:
        if not self.fetches_ahead:
            return
        self._hold(self._ahead.finished())
        fetching = self._ahead.fetching()
        new: set[Piece] = set()
        for reads_on, pieces in enumerate(by_read, 1):
            for piece in pieces:
                self._until[piece] = max(self._until.get(piece, 0), self._read + reads_on)
                if piece not in self._ready and piece not in fetching:
                    new.add(piece)
        if new and not self._ahead.full() and self._held_bytes < AHEAD_BYTES:
            self._ahead.start(frozenset(new), self._fetch)
        else:
            for piece in new:  # (asked again, by the later reads that still need them)
                self._until.pop(piece, None)

    def _hold(self, results: Iterable[FetchedPieces]) -> None:
        """Keep what fetches brought for the reads that still need it."""
        for fetched, requests in results:
            self.requests += requests
            for piece, data in fetched.items():
                if self._until.get(piece, -1) >= self._read and piece not in self._ready:
                    self._ready[piece] = data
                    self._held_bytes += len(data)

    def forget(self) -> None:
        self._read += 1
        for piece in [piece for piece, until in self._until.items() if until < self._read]:
            del self._until[piece]  # (one still being fetched is dropped when its fetch is taken in)
            data = self._ready.pop(piece, None)
            if data is not None:
                self._held_bytes -= len(data)

    def _fetch(self, wanted: list[Piece]) -> tuple[dict[Piece, bytes], int]:
        """`wanted` from the disk cache, else in coalesced requests, several at a time; (pieces, requests)."""
        fetched: dict[Piece, bytes] = {}
        if self.cache is not None:
            for piece in set(wanted):
                data = cached_bytes(self.cache, piece, self.verify)
                if data is not None:
                    fetched[piece] = data
            wanted = [p for p in wanted if p not in fetched]
        ranges = coalesce(wanted, self.policy.coalesce_gap)
        if not ranges:
            return fetched, 0

        def fetch(span: CoalescedRange) -> tuple[CoalescedRange, bytes | None]:
            try:
                return span, read_range(
                    self.fs, join(self.root, span.path), span.start, span.end - span.start, self.policy
                )
            except (MmdataError, OSError):
                return span, None  # read again alone by read_bytes, which reports it as usual

        with ThreadPoolExecutor(min(self.policy.concurrency, len(ranges)), thread_name_prefix="mmdata-fetch") as pool:
            for span, data in pool.map(fetch, ranges):
                if data is None:
                    continue
                for piece in span.members:
                    fetched[piece] = data[piece.offset - span.start : piece.offset - span.start + piece.size]
                    self._keep(piece, fetched[piece])
        return fetched, len(ranges)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ready": {}, "_until": {}, "_held_bytes": 0}


class ZarrPieceReader:
    """Pieces of a Zarr v3 store: elements of byte arrays, row ranges of numeric arrays."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
    ):
        self.arrays = ZarrArrays(fs, root, policy)
        self.verify = verify
        self.bytes_read = 0
        self.requests = 0
        self.cache = piece_cache(fs, root, policy)
        self._ahead = BackgroundFetch()

    def read_bytes(self, piece: Piece) -> bytes:
        data = cached_bytes(self.cache, piece, self.verify)
        if data is None:
            data = self.arrays.element(piece.path, piece.offset, piece.size)
            if self.verify:
                checked(piece, checksum_bytes(data))
            if self.cache is not None:
                self.cache.put(piece, data)
        self.bytes_read += len(data)
        return data

    def read_rows(self, piece: Piece, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        cache = self.cache
        data = cache.get(piece) if cache is not None else None
        if cache is not None and data is not None:
            values = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
            if not self.verify or checksum_array(values) == piece.checksum:
                self.bytes_read += values.nbytes
                return values.copy()
            cache.discard(piece)
        values = self.arrays.rows(piece.path, piece.offset, shape[0], shape[1:], dtype)
        self.bytes_read += values.nbytes
        if self.verify:
            checked(piece, checksum_array(values))
        if self.cache is not None:
            self.cache.put(piece, np.ascontiguousarray(values).tobytes())
        return values

    @property
    def fetches_ahead(self) -> bool:
        return not isinstance(self.arrays.fs, LocalFileSystem)

    def prefetch(self, pieces: Iterable[Piece]) -> None:
        if not self.fetches_ahead:
            return
        self._take_ahead()
        held, requests = self._fetch(set(pieces), self.arrays.held)
        self.arrays.held.add(held)
        self.requests += requests

    @property
    def fetch_seconds(self) -> float | None:
        return None  # (one fetch ahead at a time: nothing to deepen)

    def prefetch_ahead(self, by_read: Sequence[Iterable[Piece]]) -> None:
        """The next two reads' pieces, one fetch at a time (a call while one runs does nothing)."""
        if not self.fetches_ahead or self._ahead.busy():
            return
        pieces = {piece for wanted in by_read[:2] for piece in wanted}
        carried = self.arrays.held.copy()  # what this micro-batch holds outlives `forget`
        self._take_ahead()

        def fetch() -> tuple[HeldBytes, int]:
            held, requests = self._fetch(pieces, carried)
            held.add(carried)
            return held, requests

        self._ahead.start(fetch)

    def _take_ahead(self) -> None:
        taken = self._ahead.take()
        if taken is not None:
            held, requests = taken
            self.arrays.held.add(held)
            self.requests += requests

    def _fetch(self, pieces: Iterable[Piece], have: HeldBytes) -> tuple[HeldBytes, int]:
        """The shard-file spans and chunk files holding `pieces` that neither `have` nor the disk cache holds,
        spans of one file at most the read policy's `coalesce_gap` apart in one request, several requests at a
        time."""
        elements, rows = [], []
        for piece in pieces:
            if self.cache is not None and self.cache.contains(piece):
                continue
            layout = self.arrays.layout(piece.path)
            if layout.dtype is None:
                elements.append((piece.path, piece.offset))
            else:
                row_bytes = layout.dtype.itemsize * math.prod(layout.shape[1:])
                rows.append((piece.path, piece.offset, piece.size // row_bytes if row_bytes else 0))
        plan = self.arrays.locate(elements, rows)
        spans = [
            Piece(path, start, size, "") for path, start, size in plan.spans if have.span(path, start, size) is None
        ]
        files = [(path, limit) for path, limit in plan.files if path not in have.files]
        ranges = coalesce(spans, self.arrays.policy.coalesce_gap)
        held = HeldBytes()

        def fetch(job: CoalescedRange | tuple[str, int]) -> None:
            try:
                if isinstance(job, CoalescedRange):
                    data = read_range(self.arrays.fs, job.path, job.start, job.end - job.start, self.arrays.policy)
                    held.spans.setdefault(job.path, []).append((job.start, data))
                else:
                    held.files[job[0]] = read_file(self.arrays.fs, job[0], job[1], self.arrays.policy)
            except (MmdataError, OSError):
                pass  # read again alone by the read itself, which reports it as usual

        jobs = [*ranges, *files]
        if jobs:
            with ThreadPoolExecutor(min(self.arrays.policy.concurrency, len(jobs)), "mmdata-fetch") as pool:
                list(pool.map(fetch, jobs))
        return held, len(jobs)

    def forget(self) -> None:
        self.arrays.held = HeldBytes()


def zarr_array_paths(streams: Sequence[Stream]) -> list[str]:
    """The Zarr arrays holding `streams` (checked when the store is opened; appended to by an append)."""
    groups = {"video": ("video", "timestamps"), "audio": ("audio",), "lowdim": ("data", "timestamps")}
    return [f"{group}/{stream.name}" for stream in streams for group in groups.get(stream.kind, ())]


def piece_reader(
    layout: str, fs: fsspec.AbstractFileSystem, root: str, verify: bool = True, policy: ReadPolicy = DEFAULT_READ_POLICY
) -> PieceReader:
    reader = WdsPieceReader if layout == "wds" else ZarrPieceReader
    return reader(fs, root, verify, policy)
