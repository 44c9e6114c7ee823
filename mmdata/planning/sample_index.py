"""The samples of a spec over a store's manifest, numbered as `SampleTable` numbers them (manifest, then time
order), without a row per sample: per episode its first sample's number, and a sample's episode, time span,
chunk and cost worked out when it is asked for. A billion samples over a million episodes cost the
episodes' arrays (tens of MB), not the samples' (tens of GB)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mmdata.errors import SpecError
from mmdata.planning.packing.cost import TokensPer, token_costs
from mmdata.planning.specs import Audio, Sequences, Spec, Windows

_EPS = 1e-6  # as `samples.enumerate_samples`: times closer than a microsecond compare equal
_COUNTED_AT_ONCE = 1 << 20  # episodes worked on together where every episode is (bounds the temporary arrays)


class SampleIndex:
    """The samples of `spec` in the manifest rows `rows` of `table` (ascending; None: every row), one source."""

    def __init__(self, table: pa.Table, spec: Spec, rows: np.ndarray | None, tokens_per: TokensPer | None):
        if not isinstance(spec, (Windows, Sequences)):
            raise SpecError(f"spec must be mmdata.Windows or mmdata.Sequences, not {type(spec).__name__}")
        durations = table.column("duration").to_numpy()
        durations = durations if rows is None else durations[rows]
        self.spec, self.rows = spec, rows
        self.durations = None  # (a window's span does not need it: kept for sequences only)
        if isinstance(spec, Windows):
            counts = durations * spec.anchor_fps  # (in place from here: at ten million episodes each array is 80 MB)
            del durations
            counts -= _EPS
            np.ceil(counts, out=counts)
            np.maximum(counts, 1, out=counts)
            counts = counts.astype(np.int64)
        else:
            self.durations = durations
            counts = _sequence_counts(durations, spec.max_seconds, spec.min_seconds)
        self.firsts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self.firsts[1:])
        if self.firsts[-1] == 0:
            raise SpecError("the spec yields no sample from the selected episodes (are they shorter than min_seconds?)")
        per = {name: 1.0 for name in spec.streams}
        unknown = [name for name in (tokens_per or {}) if name not in per]
        if unknown:
            raise SpecError(f"tokens_per names streams the spec does not read: {', '.join(unknown)}")
        self.tokens_per = {**per, **(tokens_per or {})}

    def __len__(self) -> int:
        return int(self.firsts[-1])

    def episodes_of(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's manifest row and its number within the episode (its chunk)."""
        place, local = self._placed(numbers)
        rows = place if self.rows is None else self.rows[place]
        return rows.astype(np.int64), local

    def spans_of(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's time span [start, end) in its episode (start == end for a window's anchor)."""
        return self._spans(*self._placed(numbers))

    def _spans(self, place: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        if isinstance(spec, Windows):
            start = local / spec.anchor_fps
            return start, start.copy()
        assert self.durations is not None, "a sequence's span is cut from its episode's duration"
        durations = self.durations[place]
        step = durations if spec.max_seconds is None else spec.max_seconds  # (None: a whole episode)
        start = local * step
        return start, np.minimum(start + step, durations)

    def locate(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The samples `numbers`: source (0: one store), episode (manifest row), start and end."""
        episodes, _ = self.episodes_of(numbers)
        starts, ends = self.spans_of(numbers)
        return np.zeros(len(episodes), np.int64), episodes, starts, ends

    def costs_of(self, numbers: np.ndarray) -> np.ndarray:
        """Each sample's tokens (streams missing from `tokens_per` count one token per unit)."""
        return self._costs(*self.spans_of(numbers))

    def described(self, numbers: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each sample's manifest row, chunk, start, end and tokens, each sample located once (what a step's
        samples are made from)."""
        place, local = self._placed(numbers)
        start, end = self._spans(place, local)
        rows = place if self.rows is None else self.rows[place]
        return rows.astype(np.int64), local, start, end, self._costs(start, end)

    def _costs(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        return token_costs({name: self._lengths(name, start, end) for name in self.spec.streams}, self.tokens_per)

    def mean_cost(self) -> float:
        """The mean of every sample's tokens, exactly, in the time of the episodes: within an episode every sample
        but its first and last spans the same time, so costs as much as any other's middle samples."""
        total = 0.0
        for counts, first, last, second in self._edge_costs():
            total += float(first.sum()) + float(last[counts >= 2].sum())
            three = counts >= 3
            total += float(np.dot(second[three], counts[three] - 2))
        return total / len(self)

    def max_cost(self) -> int:
        """The tokens of the costliest sample: within an episode every sample but its last spans the same time,
        so the costliest is an episode's first or last."""
        return max(int(max(first.max(), last.max())) for _, first, last, _ in self._edge_costs())

    def _edge_costs(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """For each run of episodes (`_COUNTED_AT_ONCE` at a time, so the arrays stay small), those with samples:
        their sample counts and the tokens of their first, last and second samples (the second is the first again
        in an episode of one)."""
        for begin in range(0, len(self.firsts) - 1, _COUNTED_AT_ONCE):
            firsts = self.firsts[begin : begin + _COUNTED_AT_ONCE + 1]
            counts = np.diff(firsts)
            having = np.flatnonzero(counts)
            if not len(having):
                continue
            counts, starts = counts[having], firsts[having]
            second = starts + np.minimum(counts - 1, 1)
            yield counts, self.costs_of(starts), self.costs_of(starts + counts - 1), self.costs_of(second)

    def _placed(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's episode among the index's (its place in `firsts`) and its number within it."""
        numbers = np.asarray(numbers, dtype=np.int64)
        place = np.searchsorted(self.firsts, numbers, side="right") - 1
        return place, numbers - self.firsts[place]

    def _lengths(self, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        stream = self.spec.streams[name]
        if isinstance(self.spec, Windows):
            width = stream.window[1] - stream.window[0] if isinstance(stream, Audio) else len(stream.offsets)
            return np.full(len(start), float(width))
        if isinstance(stream, Audio):
            return end - start
        return np.maximum(1.0, np.ceil((end - start) * self.spec.rate_of(name) - 1e-6))


@dataclass(frozen=True)
class SourceSampleIndexes:
    """A mixture's sample indexes, one per source, its samples numbered one source after another (as a sample
    table of the mixture numbers them)."""

    indexes: tuple[SampleIndex, ...]

    def __len__(self) -> int:
        return int(self.firsts[-1])

    @functools.cached_property
    def firsts(self) -> np.ndarray:
        """The number of each source's first sample, and the count of all after them."""
        return np.concatenate([[0], np.cumsum([len(index) for index in self.indexes])]).astype(np.int64)

    def locate(self, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The samples `numbers`: source, episode (manifest row), start and end (as `SampleTable.locate`)."""
        numbers = np.asarray(numbers, dtype=np.int64)
        firsts = self.firsts
        source = np.searchsorted(firsts, numbers, side="right") - 1
        episodes, starts, ends = np.empty(len(numbers), np.int64), np.empty(len(numbers)), np.empty(len(numbers))
        for number in np.unique(source).tolist():
            chosen = source == number
            _, episodes[chosen], starts[chosen], ends[chosen] = self.indexes[number].locate(
                numbers[chosen] - firsts[number]
            )
        return source, episodes, starts, ends


def _sequence_counts(durations: np.ndarray, step: float | None, min_seconds: float) -> np.ndarray:
    """Chunks per episode as `enumerate_samples` cuts them: every `step` seconds from 0 (None: the whole episode),
    the last one cut at the episode's end and left out when shorter than `min_seconds` (all are, when `step` is)."""
    counts = np.empty(len(durations), np.int64)
    for begin in range(0, len(durations), _COUNTED_AT_ONCE):
        part = durations[begin : begin + _COUNTED_AT_ONCE]
        steps = part if step is None else step
        with np.errstate(divide="ignore", invalid="ignore"):
            cut = np.where(part > _EPS, np.ceil((part - _EPS) / steps), 0).astype(np.int64)
        last_start = np.maximum(cut - 1, 0) * steps
        last_length = np.minimum(last_start + steps, part) - last_start
        keeps_last = (cut > 0) & (last_length + _EPS >= min_seconds) & (last_length > 0)
        keeps_whole = steps + _EPS >= min_seconds
        counts[begin : begin + len(part)] = np.where(keeps_whole, np.maximum(cut - 1, 0), 0) + keeps_last
    return counts
