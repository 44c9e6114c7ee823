"""An epoch's order under a token budget: the epoch's positions cut into windows of `window` positions, each
packed on its own into the same number of micro-batches, so that micro-batch m of the epoch is worked out from its
own window alone, at any world size and after any stretch.

The number of micro-batches per window (`bins`) is the most that any of up to `REFERENCE_WINDOWS` windows of a
reference order needs (the order of seed 0, epoch 0: the data's, not the run's) by the packer's own count. A window
is packed into exactly that many at the smallest capacity that holds it (`fit_into_bins`), so its micro-batches end
about equally heavy. A window of more tokens than the reference's heaviest may hold samples that fit no micro-batch:
they are left out of the epoch (reported in the plan's `left_out`; another epoch's order puts them in another
window). Micro-batches are
numbered window after window, heaviest first within a window, and dealt to the ranks R at a time, so the R of a step
carry nearly the same tokens.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mmdata.errors import OptionError
from mmdata.planning.orders import Order
from mmdata.planning.packing.kernels import bin_loads, first_fit_decreasing, minimum_bin_slack

# Names the way windows are packed (part of a loader state's fingerprint): changes with the micro-batches made.
WINDOW_PACKING_VERSION = "windows packed into a fixed number of micro-batches 1"
REFERENCE_WINDOWS = 32
_KEPT_WINDOWS = 4

SlotCosts = Callable[[np.ndarray], np.ndarray]
"""slots -> each slot's tokens."""


@dataclass(frozen=True)
class WindowPacking:
    """How an order is packed under a token budget: `window` positions of the order at a time, each window
    into `bins` micro-batches of at most `budget` tokens, dealt heaviest first by `balance` ("tokens", or
    "attention": the sum of squared lengths)."""

    window: int
    bins: int
    budget: int
    balance: str = "tokens"

    def __post_init__(self):
        if self.window < 1 or self.bins < 1 or self.budget < 1:
            raise OptionError(f"a window packing needs a window, bins and a budget of at least 1, not {self}")
        if self.balance not in ("tokens", "attention"):
            raise OptionError(f"balance is 'tokens' or 'attention', not '{self.balance}'")

    def bins_in(self, length: int) -> int:
        """Micro-batches of a window of `length` positions (the epoch's last window, which takes the positions
        after the last whole window, is longer; an epoch shorter than a window is one shorter window)."""
        return max(1, min(length, math.ceil(self.bins * length / self.window)))


def pack_window(costs: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """Micro-batch per sample of one window, and the number of micro-batches: whichever of first-fit decreasing
    and minimum bin slack needs fewer. FFD is best when samples are long against the budget; minimum bin slack when
    they come in a few sizes (policy windows), where FFD leaves each micro-batch short by up to the smallest one."""
    first_fit = first_fit_decreasing(costs, budget)
    slack = minimum_bin_slack(costs, budget)
    return slack if slack[1] < first_fit[1] else first_fit


def fewest_bins(costs: np.ndarray, budget: int) -> int:
    """The micro-batches of at most `budget` tokens the packer needs for every sample of `costs`."""
    return max(1, pack_window(np.asarray(costs, dtype=np.int64), budget)[1])


def fit_into_bins(costs: np.ndarray, budget: int, bins: int) -> np.ndarray:
    """Micro-batch per sample among exactly `bins` micro-batches of at most `budget` tokens, -1 for a sample left
    out. The packer runs with the smallest capacity at which `bins` hold every sample (found by bisection, as
    multifit schedules do), so the micro-batches end about as heavy as one another; where even `budget` needs
    more, the samples of the lightest extra micro-batches are left out."""
    costs = np.asarray(costs, dtype=np.int64)
    assignment, used = pack_window(costs, budget)
    if used > bins:
        loads = np.bincount(assignment, weights=costs, minlength=used)
        renumbered = np.full(used, -1, np.int64)
        renumbered[np.argsort(-loads, kind="stable")[:bins]] = np.arange(bins)
        return renumbered[assignment]
    low, high = max(int(costs.max(initial=1)), -(-int(costs.sum()) // bins)), budget
    while low < high:
        middle = (low + high) // 2
        trial, count = pack_window(costs, middle)
        if count <= bins:
            high, assignment, used = middle, trial, count
        else:
            low = middle + 1
    return _split_to(assignment, used, bins)


def _split_to(assignment: np.ndarray, used: int, bins: int) -> np.ndarray:
    """`assignment` over `used` micro-batches made `bins` (no more than the samples): the micro-batches of the most
    samples are halved, every other of their samples moved to a new one, until there are `bins`."""
    assignment = assignment.copy()
    while used < bins:
        members = np.bincount(assignment, minlength=used)
        halved = np.argsort(-members, kind="stable")[: min(bins - used, int((members >= 2).sum()))]
        if not len(halved):
            break
        new = np.full(used, -1, np.int64)
        new[halved] = used + np.arange(len(halved))
        for bin_number in halved.tolist():
            mine = np.flatnonzero(assignment == bin_number)
            assignment[mine[1::2]] = new[bin_number]
        used += len(halved)
    return assignment


def plan_window_packing(
    reference: Callable[[np.ndarray], np.ndarray], count: int, window: int, budget: int, balance: str
) -> WindowPacking:
    """The packing of an epoch of `count` positions: `bins` is the most that any of the first
    `REFERENCE_WINDOWS` windows of the `reference` order (positions -> their costs) needs, scaled to a whole window
    when the epoch is shorter than one."""
    window = max(1, min(window, count))
    windows = max(1, min(REFERENCE_WINDOWS, count // window))
    needed = 1
    for number in range(windows):
        positions = np.arange(number * window, min(count, (number + 1) * window), dtype=np.int64)
        needed = max(needed, math.ceil(fewest_bins(reference(positions), budget) * window / len(positions)))
    return WindowPacking(window, min(needed, window), budget, balance)


@dataclass
class PackedWindows:
    """The micro-batches of one epoch of `count` positions under `packing`: `slots(m)` gives micro-batch m's slots
    (`order(positions)`: the slot at each position; `costs`: each slot's tokens). A window is packed when one of its
    micro-batches is first asked for; the last few stay packed."""

    order: Callable[[np.ndarray], np.ndarray]
    costs: SlotCosts
    count: int
    packing: WindowPacking
    _packed: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)

    @property
    def windows(self) -> int:
        return max(1, self.count // self.packing.window)

    @property
    def micro_batches(self) -> int:
        return (self.windows - 1) * self.packing.bins + self.packing.bins_in(self.count - self._start(self.windows - 1))

    def slots(self, micro_batch: int) -> np.ndarray:
        """The slots of micro-batch `micro_batch`, longest first."""
        window, place = self._located(micro_batch)
        offsets, members, _ = self._window(window)
        return members[offsets[place] : offsets[place + 1]]

    def positions_passed(self, micro_batch: int) -> int:
        """Positions of the order before micro-batch `micro_batch` (the count of micro-batches: every position):
        every position of the windows before its own, samples left out by their packing included, and the samples
        of the micro-batches before it in its own window."""
        if micro_batch >= self.micro_batches:
            return self.count
        window, place = self._located(micro_batch)
        return self._start(window) + (int(self._window(window)[0][place]) if place else 0)

    def left_out(self) -> np.ndarray:
        """The slots no micro-batch holds, window after window: this packs the whole epoch (for checks and
        reports, not for every step)."""
        return np.concatenate([self._window(w)[2] for w in range(self.windows)] or [np.empty(0, np.int64)])

    def _located(self, micro_batch: int) -> tuple[int, int]:
        if not 0 <= micro_batch < self.micro_batches:
            raise IndexError(f"micro-batch {micro_batch} of {self.micro_batches}")
        window = min(micro_batch // self.packing.bins, self.windows - 1)
        return window, micro_batch - window * self.packing.bins

    def _start(self, window: int) -> int:
        return window * self.packing.window

    def _end(self, window: int) -> int:
        return self.count if window == self.windows - 1 else (window + 1) * self.packing.window

    def _window(self, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window `window` packed: its micro-batches' offsets into `members` (slots), and its slots left out."""
        packed = self._packed.get(window)
        if packed is not None:
            self._packed.move_to_end(window)
            return packed
        slots = self.order(np.arange(self._start(window), self._end(window), dtype=np.int64))
        costs = np.asarray(self.costs(slots), dtype=np.int64)
        bins = self.packing.bins_in(len(slots))
        assignment = fit_into_bins(costs, self.packing.budget, bins)
        placed = assignment >= 0
        loads, squares = bin_loads(assignment[placed], bins, costs[placed])
        heaviest = np.argsort(-(squares if self.packing.balance == "attention" else loads), kind="stable")
        rank_of = np.empty(bins, np.int64)
        rank_of[heaviest] = np.arange(bins)
        by_bin = np.lexsort((-costs[placed], rank_of[assignment[placed]]))  # heaviest bin first, longest first
        members = slots[placed][by_bin]
        offsets = np.concatenate([[0], np.cumsum(np.bincount(rank_of[assignment[placed]], minlength=bins))])
        packed = (offsets.astype(np.int64), members, slots[~placed])
        self._packed[window] = packed
        while len(self._packed) > _KEPT_WINDOWS:
            self._packed.popitem(last=False)
        return packed


@dataclass
class PackedRankPlan:
    """One stretch's steps under a token budget (a `RankPlan`): the epoch's micro-batches
    (`windows`) from the `first` that the stretches before consumed, dealt `world` a step (rank r takes the r-th).
    The micro-batches do not depend on the world size, so a stretch consumed a run of them and nothing else.

    What it counts as consumed is positions of the order passed (`PackedWindows.positions_passed`): the samples
    of the micro-batches taken and, for windows passed, the few their packing left out."""

    order: Order
    windows: PackedWindows
    world: int
    first: int

    def __len__(self) -> int:
        return max(0, self.windows.micro_batches - self.first) // self.world

    @property
    def deferred(self) -> np.ndarray:
        """The slots no step holds: those the packing left out and those of the micro-batches after the last whole
        step (packs the whole epoch)."""
        after = range(self.first + len(self) * self.world, self.windows.micro_batches)
        return np.concatenate([self.windows.left_out(), *(self.windows.slots(m) for m in after)]).astype(np.int64)

    def micro_batch(self, step: int, rank: int) -> np.ndarray:
        if not 0 <= step < len(self) or not 0 <= rank < self.world:
            raise IndexError(f"step {step} of {len(self)}, rank {rank} of {self.world}")
        return self.windows.slots(self.first + step * self.world + rank)

    def samples_in_steps(self, steps: int) -> int:
        passed = self.windows.positions_passed
        return passed(self.first + steps * self.world) - passed(self.first)
