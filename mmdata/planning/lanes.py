"""`batch_size` samples dealt per step: an epoch's positions laid out rank by rank and lane by lane, and what a
stretch of steps consumed, so that the rest of the epoch can be laid out afresh at another world size.

Rank r's steps read the r-th contiguous run of positions, cut into `lanes` runs that its steps take in turn, so that
a block of the "blocks" order stays with one rank and, when a multiple of the workers are lanes, with one worker,
whose frame cache decodes it once. The positions after the world's whole steps make one more, shorter step, split
evenly over the ranks (as PyTorch's last batch), unless they are fewer than the ranks or the loader drops its last
batch. Everything costs the ranks and lanes, not the samples.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from mmdata.errors import ResumeError
from mmdata.planning.orders import Order


@dataclass(frozen=True)
class LaneLayout:
    """`count` positions dealt as steps of `batch` per rank to `world` ranks (see the module); `keep_last`: the
    positions after the whole steps make a last, shorter step."""

    count: int
    world: int
    batch: int
    lanes: int
    keep_last: bool = True

    @property
    def whole_steps(self) -> int:
        return self.count // (self.world * self.batch)

    @property
    def rest(self) -> int:
        """Positions after the whole steps."""
        return self.count - self.whole_steps * self.world * self.batch

    @property
    def last_is_short(self) -> bool:
        return self.keep_last and self.rest >= self.world

    @property
    def steps(self) -> int:
        return self.whole_steps + self.last_is_short

    def positions(self, step: int, rank: int) -> np.ndarray:
        """The positions of `rank`'s micro-batch at `step`."""
        if not 0 <= step < self.steps or not 0 <= rank < self.world:
            raise IndexError(f"step {step} of {self.steps}, rank {rank} of {self.world}")
        if step == self.whole_steps:
            sizes = self.rest // self.world + (np.arange(self.world) < self.rest % self.world)
            first = self.whole_steps * self.world * self.batch + int(sizes[:rank].sum())
            return np.arange(first, first + int(sizes[rank]), dtype=np.int64)
        lane, turn = step % self.lanes, step // self.lanes
        first = rank * self.whole_steps * self.batch + self._lane_starts()[lane] + turn * self.batch
        return np.arange(first, first + self.batch, dtype=np.int64)

    def left_over(self) -> np.ndarray:
        """The positions no step holds."""
        if self.last_is_short:
            return np.empty(0, np.int64)
        return np.arange(self.count - self.rest, self.count, dtype=np.int64)

    def positions_in_steps(self, steps: int) -> int:
        """Positions the first `steps` steps hold over all ranks."""
        whole = min(steps, self.whole_steps)
        return whole * self.world * self.batch + (self.rest if steps > self.whole_steps else 0)

    def consumed(self, steps: int) -> Consumed:
        """What the first `steps` steps of every rank read: per rank and lane, a run from the lane's start (and
        the short last step's positions)."""
        if not 0 <= steps <= self.steps:
            raise ResumeError(
                f"the saved state says {steps} steps were taken at world size {self.world}, but that part of the"
                f" epoch has {self.steps} steps; the state belongs to another run"
            )
        whole = min(steps, self.whole_steps)
        lanes = np.arange(self.lanes)
        taken = (whole // self.lanes + (lanes < whole % self.lanes)) * self.batch
        ranks = np.arange(self.world)[:, None] * self.whole_steps * self.batch
        starts, lengths = (ranks + self._lane_starts()[None, :]).ravel(), np.tile(taken, self.world)
        if steps > self.whole_steps:
            starts, lengths = np.append(starts, self.count - self.rest), np.append(lengths, self.rest)
        return Consumed(starts, lengths)

    def cuts(self) -> np.ndarray:
        """The first position of each run of positions one rank's lane reads (rank by rank, lane by lane; the short
        last step's positions, read right after the last lane's, belong to it), the count last: what an order deals
        within."""
        ranks = np.arange(self.world)[:, None] * self.whole_steps * self.batch
        starts = (ranks + self._lane_starts()[None, :]).ravel()
        return np.unique(np.concatenate([[0], starts, [self.count]])).astype(np.int64)

    def _lane_starts(self) -> np.ndarray:
        lanes = np.arange(self.lanes)
        lane_steps = self.whole_steps // self.lanes + (lanes < self.whole_steps % self.lanes)
        return np.concatenate([[0], np.cumsum(lane_steps)[:-1]]) * self.batch


@dataclass(frozen=True)
class Consumed:
    """Runs of positions a stretch consumed (`starts`, ascending, and their `lengths`), and the positions it left,
    numbered afresh in order: the next stretch's positions."""

    starts: np.ndarray
    lengths: np.ndarray

    @property
    def total(self) -> int:
        return int(self.lengths.sum())

    def earlier(self, positions: np.ndarray) -> np.ndarray:
        """The positions, before this stretch, of the next stretch's `positions`."""
        before = self.starts - np.concatenate([[0], np.cumsum(self.lengths)[:-1]])  # positions left before each run
        skipped = np.concatenate([[0], np.cumsum(self.lengths)])
        return positions + skipped[np.searchsorted(before, positions, side="right")]


# Positions whose slots are worked out at once: a step's positions are a run, and a rank reads its runs in order, so
# one evaluation of the order (whose cost is mostly per call, not per position) serves hundreds of steps.
SLOTS_AT_ONCE = 4096
_KEPT_RUNS = 64  # (a rank reads its lanes in turn: a run kept per lane, 2 MB at most)


@dataclass
class DealtRankPlan:
    """One stretch's steps with `batch_size` samples dealt (a `RankPlan`): step `s` of rank `r` holds the slots of
    the layout's positions, traced back through the stretches before (`consumed`, first to last) to the order."""

    order: Order
    layout: LaneLayout
    consumed: list[Consumed]
    _runs: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return self.layout.steps

    @property
    def deferred(self) -> np.ndarray:
        return self._slots(self.layout.left_over())

    def micro_batch(self, step: int, rank: int) -> np.ndarray:
        positions = self.layout.positions(step, rank)
        if not len(positions):
            return self._slots(positions)
        first, last = int(positions[0]) // SLOTS_AT_ONCE, int(positions[-1]) // SLOTS_AT_ONCE
        slots = np.concatenate([self._run(number) for number in range(first, last + 1)])
        return slots[positions - first * SLOTS_AT_ONCE]

    def samples_in_steps(self, steps: int) -> int:
        return self.layout.positions_in_steps(steps)

    def _run(self, number: int) -> np.ndarray:
        """The slots of positions [number * SLOTS_AT_ONCE, (number + 1) * SLOTS_AT_ONCE) (fewer at the end); the
        last few kept."""
        run = self._runs.get(number)
        if run is None:
            start = number * SLOTS_AT_ONCE
            run = self._slots(np.arange(start, min(start + SLOTS_AT_ONCE, self.layout.count), dtype=np.int64))
            self._runs[number] = run
            while len(self._runs) > _KEPT_RUNS:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(number)
        return run

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_runs": OrderedDict()}

    def _slots(self, positions: np.ndarray) -> np.ndarray:
        for stretch in reversed(self.consumed):
            positions = stretch.earlier(positions)
        return self.order.samples_at(positions)
