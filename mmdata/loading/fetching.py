"""Stage 2 of the loading chain, fetch (runs where the micro-batch is read): bring the pieces a
micro-batch reads from object storage in a few coalesced requests, and the next ones ahead.

Everything fetched comes from the plans: the manifest rows name the pieces aligning needs
(timestamps, low-dim and audio data), and the align stage's frame plans name the segments. A
worker fetches a micro-batch's rows two of its steps ahead and its segments one step ahead, in the
background while it decodes, so the plan that fetches a segment is the plan that decodes it; and the
cameras' timestamps of the step that enters its frame cache's horizon at the next read, so that the
cache plans as far ahead from object storage as from a local disk. A local store fetches nothing
ahead: a local read costs microseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mmdata.planning.mixture import OpenSource
from mmdata.planning.samples import SampleRef
from mmdata.store.handle import FrameRequests
from mmdata.store.manifest import Piece


class Fetcher:
    """Hands each source's piece reader what a micro-batch (or the next) will read. `stored_names(sample, only)`
    names the stored streams of the sample's source that the spec reads (of spec type `only`, None: all)."""

    def __init__(self, sources: Sequence[OpenSource], stored_names):
        self.sources = list(sources)
        self.stored_names = stored_names

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

    @staticmethod
    def segments(plans: Iterable[tuple[int, FrameRequests]]) -> dict[int, list[Piece]]:
        """Per source, the segments (source number, plan) pairs name."""
        wanted: dict[int, list[Piece]] = {}
        for source, plan in plans:
            wanted.setdefault(source, []).extend(plan.pieces)
        return wanted

    def now(self, *wanted: dict[int, list[Piece]]) -> None:
        """Fetch `wanted` (per source) and wait, taking in what was being fetched ahead first."""
        for number, pieces in _merged(wanted).items():
            self.sources[number].store.pieces.prefetch(pieces)

    def ahead(self, *wanted: dict[int, list[Piece]]) -> None:
        """Start fetching `wanted` in the background, for the next micro-batch."""
        for number, pieces in _merged(wanted).items():
            self.sources[number].store.pieces.prefetch_ahead(pieces)

    def forget(self) -> None:
        """Drop what was fetched for the micro-batch just read (not what is being fetched ahead)."""
        for source in self.sources:
            source.store.pieces.forget()


def _merged(parts: Sequence[dict[int, list[Piece]]]) -> dict[int, list[Piece]]:
    """Per source, the pieces of every part."""
    merged: dict[int, list[Piece]] = {}
    for part in parts:
        for number, pieces in part.items():
            merged.setdefault(number, []).extend(pieces)
    return merged
