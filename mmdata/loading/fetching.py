"""Stage 2 of the loading chain, fetch (runs where the micro-batch is read): bring the pieces a
micro-batch reads from object storage in a few coalesced requests, and the next ones ahead.

Everything fetched comes from the plans: the manifest rows name the pieces aligning needs
(timestamps, low-dim and audio data), and the align stage's frame plans name the segments. A
worker fetches the rows and segments of its next reads in the background while it decodes, so the plan that
fetches a segment is the plan that decodes it, as many reads ahead as a request's measured latency takes reads
(`reads_ahead`: at least two, at most `MOST_READS_AHEAD`); and the cameras' timestamps of the step that enters its
frame cache's horizon at the next read, so that the cache plans as far ahead from object storage as from a local
disk. A local store fetches nothing ahead: a local read costs microseconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from mmdata.planning.mixture import OpenSource
from mmdata.planning.samples import SampleRef
from mmdata.store.manifest import Piece

# The fewest and the most reads ahead whose pieces are fetched in the background.
LEAST_READS_AHEAD = 2
MOST_READS_AHEAD = 8
# How much of each new interval between reads the running figure takes in.
INTERVAL_WEIGHT = 0.2


class Fetcher:
    """Hands each source's piece reader what a micro-batch (or the next ones) will read. `stored_names(sample,
    only)` names the stored streams of the sample's source that the spec reads (of spec type `only`, None: all)."""

    def __init__(self, sources: Sequence[OpenSource], stored_names):
        self.sources = list(sources)
        self.stored_names = stored_names
        self._interval: float | None = None  # seconds between two reads' ends, a running figure
        self._last_read: float | None = None

    @property
    def reads_ahead(self) -> int:
        """How many later reads to fetch for: enough that a fetch started now (taking about a request's latency, as
        the piece readers last measured it) ends before the read that needs it begins."""
        latencies = [source.store.pieces.fetch_seconds for source in self.sources]
        latency = max((seconds for seconds in latencies if seconds is not None), default=None)
        if latency is None or not self._interval:
            return LEAST_READS_AHEAD
        return min(MOST_READS_AHEAD, max(LEAST_READS_AHEAD, math.ceil(latency / self._interval) + 1))

    @property
    def fetches_ahead(self) -> bool:
        return any(source.store.pieces.fetches_ahead for source in self.sources)

    def rows(self, samples: Iterable[SampleRef], only: type | None = None) -> dict[int, list[Piece]]:
        """Per source, the pieces the samples' manifest rows point to for the spec's streams (of type `only`:
        `Frames` gives the cameras' timestamps, what aligning a sample's frames reads)."""
        wanted: dict[int, list[Piece]] = {}
        seen: set[tuple[int, int]] = set()  # a block's samples share their episode's row: its pieces once
        for sample in samples:
            if (sample.source, sample.episode) in seen:
                continue
            seen.add((sample.source, sample.episode))
            pieces = self.sources[sample.source].store.row_pieces(sample.episode, self.stored_names(sample, only))
            wanted.setdefault(sample.source, []).extend(pieces)
        return wanted

    def now(self, *wanted: dict[int, list[Piece]]) -> None:
        """Fetch `wanted` (per source) and wait, taking in what was being fetched ahead first."""
        for number, pieces in _merged(wanted).items():
            self.sources[number].store.pieces.prefetch(pieces)

    def ahead(self, by_read: Sequence[Sequence[dict[int, list[Piece]]]]) -> None:
        """Start fetching in the background what later reads will read: `by_read[i]`, the parts (per source) of the
        read i + 1 reads from now."""
        merged = [_merged(parts) for parts in by_read]
        for number in {number for parts in merged for number in parts}:
            self.sources[number].store.pieces.prefetch_ahead([parts.get(number, []) for parts in merged])

    def forget(self) -> None:
        """The micro-batch is read: drop what it fetched that no later read needs."""
        now = time.perf_counter()
        if self._last_read is not None:
            interval = now - self._last_read
            self._interval = (
                interval if self._interval is None else self._interval + INTERVAL_WEIGHT * (interval - self._interval)
            )
        self._last_read = now
        for source in self.sources:
            source.store.pieces.forget()


def _merged(parts: Sequence[dict[int, list[Piece]]]) -> dict[int, list[Piece]]:
    """Per source, the pieces of every part."""
    merged: dict[int, list[Piece]] = {}
    for part in parts:
        for number, pieces in part.items():
            merged.setdefault(number, []).extend(pieces)
    return merged
