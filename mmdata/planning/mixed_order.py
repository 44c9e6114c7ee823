"""The order of a mixture: each source's samples in its own order (`planning.orders`), the sources interleaved.

An epoch of a mixture holds `targets[s]` slots of source s (`mixture.source_targets`). Its positions are dealt
to the sources by a chain of even spreads (`SourceInterleave`): source 0 takes every position where
floor(p * t0 / N) steps up, the others share the rest in the same way, so every stretch of the epoch holds each
source in its share, within a slot for each source before it in the chain. A source's k-th slot reads position
k % n of the source's order over its n samples, a fresh one for each whole pass (k // n), so a source weighed up
reads each sample once per pass and a source weighed down reads a random part of its order. Everything is worked out per
position, as in the order of a single store: an epoch of billions of slots costs a rank the arrays of its sources'
episodes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from mmdata.errors import OptionError
from mmdata.planning.orders import Order, OrderRecipe, SourceInterleave

_PASS_STREAM = 0x313C
_KEPT_PASSES = 64


@dataclass(frozen=True)
class MixedOrder:
    """The order of one epoch of a mixture (see the module): the slot at any position, numbered one source after
    another (source s's slots from `sum(targets[:s])`), and the sample each slot reads (`recipes`: how each source's
    samples are ordered)."""

    counts: tuple[int, ...]
    targets: tuple[int, ...]
    recipes: tuple[OrderRecipe, ...]
    seed: int
    epoch: int
    cuts: np.ndarray | None = field(default=None, compare=False)  # each lane's first position, `sum(targets)` last
    _passes: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False, compare=False)
    _interleave: SourceInterleave = field(init=False, repr=False, compare=False)
    _firsts: np.ndarray = field(init=False, repr=False, compare=False)  # each source's first slot, then the count
    _source_cuts: np.ndarray | None = field(init=False, repr=False, compare=False)  # [cut, source]: slots before

    def __post_init__(self):
        if not len(self.counts) == len(self.targets) == len(self.recipes):
            raise OptionError("a mixture's order needs a sample count, a slot count and an order per source")
        fed = [s for s, (count, target) in enumerate(zip(self.counts, self.targets)) if target and not count]
        if fed:
            raise OptionError(f"source {fed[0]} of the mixture has slots in the epoch but no sample")
        object.__setattr__(self, "_interleave", SourceInterleave(tuple(self.targets)))
        object.__setattr__(self, "_firsts", np.concatenate([[0], np.cumsum(self.targets)]).astype(np.int64))
        cuts = None if self.cuts is None else self._interleave.counts_before(np.asarray(self.cuts, np.int64))
        object.__setattr__(self, "_source_cuts", cuts)

    @property
    def count(self) -> int:
        return int(self._firsts[-1])

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        """The slot at each of `positions` in [0, count)."""
        source, slot = self._interleave.place(np.asarray(positions, dtype=np.int64))
        return self._firsts[source] + slot

    def sources_of(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each slot's source and the number of the sample it reads in that source."""
        slots = np.asarray(slots, dtype=np.int64)
        source = np.searchsorted(self._firsts, slots, side="right") - 1
        passes, within = np.divmod(slots - self._firsts[source], np.asarray(self.counts, np.int64)[source])
        sample = np.empty(len(slots), np.int64)
        keys = source * (int(passes.max(initial=0)) + 1) + passes
        for key in np.unique(keys).tolist():
            chosen = keys == key
            first = int(np.flatnonzero(chosen)[0])
            sample[chosen] = self._pass(int(source[first]), int(passes[first])).samples_at(within[chosen])
        return source, sample

    def _pass_cuts(self, source: int, number: int) -> np.ndarray | None:
        """Where the lanes of the epoch fall in source `source`'s pass `number`, as positions of that pass's order."""
        if self._source_cuts is None:
            return None
        count = self.counts[source]
        slots = self._source_cuts[:, source] - number * count
        return np.unique(np.concatenate([[0], np.clip(slots, 0, count), [count]])).astype(np.int64)

    def _pass(self, source: int, number: int) -> Order:
        """Source `source`'s order of its pass `number` through its samples (the last few kept)."""
        made = self._passes.get((source, number))
        if made is None:
            seed = int(np.random.SeedSequence([self.seed, source, number, _PASS_STREAM]).generate_state(1)[0])
            made = self.recipes[source].order(self.counts[source], seed, self.epoch, self._pass_cuts(source, number))
            self._passes[(source, number)] = made
            while len(self._passes) > _KEPT_PASSES:
                self._passes.popitem(last=False)
        return made
