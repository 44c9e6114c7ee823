"""The "blocks" order: an epoch of any size planned per rank in the time and memory of the rank's own steps.

The epoch is a list of positions, each evaluated on its own (nothing of the size of the epoch is made):

- the samples, numbered in manifest and time order and turned by a random offset per epoch, are cut into
  blocks of `block` consecutive samples (about a stored segment's worth, so that one decode serves a block);
- a keyed permutation (`KeyedPermutation`) orders the blocks, and each run of `open_blocks` blocks of that
  order is a group whose samples are dealt one from each block in turn (a micro-batch of 8 from a group of
  8 holds 8 blocks, about 8 episodes); the blocks left over from whole groups close the epoch as one smaller
  group, and the samples left over from whole blocks after them, in order;
- the world's steps are laid out rank by rank (`LaneLayout`): rank r's steps read the r-th contiguous run of
  positions, cut into `lanes` runs that its steps take in turn, so that a block's samples stay with one rank
  and, when a multiple of the workers are lanes, with one worker, whose frame cache decodes it once.

Resuming at another world size replays the layouts of the stretches run before: what they consumed is a few
runs of positions per rank and lane (`Consumed`), and the rest of the epoch is the positions between them, in
order, laid out afresh. Both cost the ranks and lanes of each stretch, not the samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmdata.errors import OptionError, ResumeError
from mmdata.planning.permutation import KeyedPermutation

_BLOCK_STREAM = 0xB10C
# Names the way `BlockOrder` and `LaneLayout` make an epoch's steps; it is part of a loader state's fingerprint, so a
# state saved by another way is refused by name rather than resumed into other steps. Changes with the steps made.
BLOCK_ORDER_VERSION = "blocks 1"


@dataclass(frozen=True)
class BlockOrder:
    """The "blocks" order of one epoch of `count` samples: the sample at any position (see the module)."""

    count: int
    block: int
    open_blocks: int
    seed: int
    epoch: int

    def __post_init__(self):
        if self.block < 1 or self.open_blocks < 1:
            raise OptionError("a block holds at least 1 sample and at least 1 block is open")
        keys = np.random.SeedSequence([self.seed, self.epoch, _BLOCK_STREAM]).generate_state(3, np.uint64)
        span = self.block * self.open_blocks
        groups = self.count // span
        object.__setattr__(self, "_main", groups * span)
        object.__setattr__(self, "_blocks", KeyedPermutation(groups * self.open_blocks, int(keys[0])))
        object.__setattr__(self, "_tail", KeyedPermutation((self.count - groups * span) // self.block, int(keys[1])))
        object.__setattr__(self, "_turn", int(keys[2] % max(1, self.count)))

    def samples_at(self, positions: np.ndarray) -> np.ndarray:
        """The sample number (manifest and time order) at each of `positions` in [0, count)."""
        positions = np.asarray(positions, dtype=np.int64)
        virtual = np.empty(len(positions), np.int64)
        grouped = positions < self._main
        inside = positions[grouped]
        group, offset = np.divmod(inside, self.block * self.open_blocks)
        turn, slot = np.divmod(offset, self.open_blocks)
        virtual[grouped] = self._blocks(group * self.open_blocks + slot) * self.block + turn
        virtual[~grouped] = self._main + self._in_tail(positions[~grouped] - self._main)
        return (virtual + self._turn) % self.count

    def _in_tail(self, offsets: np.ndarray) -> np.ndarray:
        """Where the positions after the whole groups lie past them: the last whole blocks dealt in turn, then
        the samples of no whole block."""
        blocks = len(self._tail)
        dealt = offsets < blocks * self.block
        turn, slot = np.divmod(offsets[dealt], max(1, blocks))
        placed = offsets.copy()
        placed[dealt] = self._tail(slot) * self.block + turn
        return placed


@dataclass(frozen=True)
class LaneLayout:
    """`count` positions dealt as steps of `batch` per rank to `world` ranks: rank r's steps read the r-th run of
    `steps * batch` positions, whose `lanes` consecutive runs its steps take in turn (step k from lane k % lanes).
    The positions after the world's runs (fewer than one step of the world) are `left_over`."""

    count: int
    world: int
    batch: int
    lanes: int

    @property
    def steps(self) -> int:
        return self.count // (self.world * self.batch)

    def positions(self, step: int, rank: int) -> np.ndarray:
        """The positions of `rank`'s micro-batch at `step`."""
        if not 0 <= step < self.steps or not 0 <= rank < self.world:
            raise IndexError(f"step {step} of {self.steps}, rank {rank} of {self.world}")
        lane, turn = step % self.lanes, step // self.lanes
        first = rank * self.steps * self.batch + self._lane_starts()[lane] + turn * self.batch
        return np.arange(first, first + self.batch, dtype=np.int64)

    def left_over(self) -> np.ndarray:
        return np.arange(self.world * self.steps * self.batch, self.count, dtype=np.int64)

    def consumed(self, steps: int) -> Consumed:
        """What the first `steps` steps of every rank read: per rank and lane, a run from the lane's start."""
        if not 0 <= steps <= self.steps:
            raise ResumeError(
                f"the saved state says {steps} steps were taken at world size {self.world}, but that part of the"
                f" epoch has {self.steps} steps; the state belongs to another run"
            )
        lanes = np.arange(self.lanes)
        taken = (steps // self.lanes + (lanes < steps % self.lanes)) * self.batch
        ranks = np.arange(self.world)[:, None] * self.steps * self.batch
        return Consumed((ranks + self._lane_starts()[None, :]).ravel(), np.tile(taken, self.world))

    def _lane_starts(self) -> np.ndarray:
        lanes = np.arange(self.lanes)
        lane_steps = self.steps // self.lanes + (lanes < self.steps % self.lanes)
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
