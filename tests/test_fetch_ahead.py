"""Fetching from object storage several reads ahead: a WebDataset piece reader runs several fetches for later reads at
once and keeps each piece until the last read that needs it, and the fetch stage asks as many reads ahead as a
request's measured latency takes reads, so that a slow store's latency is hidden."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from fsspec.implementations.memory import MemoryFileSystem

from mmdata.loading.fetching import LEAST_READS_AHEAD, MOST_READS_AHEAD, Fetcher
from mmdata.store.checksum import checksum_bytes
from mmdata.store.filesystem import ReadPolicy
from mmdata.store.manifest import Piece
from mmdata.store.piece_readers import WdsPieceReader

LATENCY = 0.2


class SlowMemory(MemoryFileSystem):
    """An in-memory store whose every request takes LATENCY seconds, as a distant object store's does."""

    requests = 0
    lock = threading.Lock()

    def cat_file(self, path, start=None, end=None, **kwargs):
        with SlowMemory.lock:
            SlowMemory.requests += 1
        time.sleep(LATENCY)
        return super().cat_file(path, start=start, end=end, **kwargs)


def _reader_and_pieces(count: int) -> tuple[WdsPieceReader, list[Piece]]:
    fs = SlowMemory(skip_instance_cache=True)
    pieces = []
    for number in range(count):  # one shard per piece: none coalesced with another
        data = bytes([number]) * 1000
        fs.pipe_file(f"/store/shards/shard-{number:06d}.tar", data)
        pieces.append(Piece(f"shards/shard-{number:06d}.tar", 0, 1000, checksum_bytes(data)))
    return WdsPieceReader(fs, "/store", policy=ReadPolicy()), pieces


def test_pieces_fetched_for_later_reads_are_held_until_the_last_read_that_needs_them():
    reader, (now, soon, later) = _reader_and_pieces(3)
    reader.prefetch([now])
    reader.prefetch_ahead([[soon], [], [later]])
    reader.prefetch([soon])  # (waits for the fetch that brings it)
    reader.forget()
    assert set(reader._ready) == {soon, later}, "the read over let go of its piece only"
    requests = SlowMemory.requests
    assert reader.read_bytes(soon) == bytes([1]) * 1000
    reader.forget()
    reader.forget()
    assert reader.read_bytes(later) == bytes([2]) * 1000 and SlowMemory.requests == requests, "held, not fetched again"
    reader.forget()
    assert not reader._ready and not reader._until and reader._held_bytes == 0


def test_fetches_for_several_later_reads_run_at_once_so_a_read_waits_about_one_latency():
    reader, pieces = _reader_and_pieces(6)
    started = time.perf_counter()
    for reads_on, piece in enumerate(pieces, 1):  # as six reads each ask for the read entering their window
        reader.prefetch_ahead([[]] * (reads_on - 1) + [[piece]])
    assert time.perf_counter() - started < LATENCY, "the fetches were started, not waited for"
    assert reader._ahead.fetching() == set(pieces), "six fetches at once"
    for number, piece in enumerate(pieces):
        reader.forget()
        reader.prefetch([piece])
        assert reader.read_bytes(piece) == bytes([number]) * 1000
    assert time.perf_counter() - started < 3 * LATENCY, "six pieces took about one latency, not six"
    assert reader.fetch_seconds is not None and reader.fetch_seconds >= LATENCY


def test_the_fetch_stage_asks_as_many_reads_ahead_as_a_requests_latency_takes_reads():
    pieces = SimpleNamespace(fetch_seconds=None, fetches_ahead=True, forget=lambda: None)
    fetcher = Fetcher([SimpleNamespace(store=SimpleNamespace(pieces=pieces))], stored_names=None)
    assert fetcher.reads_ahead == LEAST_READS_AHEAD, "nothing measured yet"
    fetcher._interval = 0.01
    pieces.fetch_seconds = 0.1
    assert fetcher.reads_ahead == MOST_READS_AHEAD  # (11 reads' worth: as many as it goes)
    pieces.fetch_seconds = 0.035
    assert fetcher.reads_ahead == 5  # ceil(3.5) + 1
    fetcher._interval = 1.0  # a slow training loop: the next read is far off
    assert fetcher.reads_ahead == LEAST_READS_AHEAD
