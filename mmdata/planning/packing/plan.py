"""The packing plan: which samples form which micro-batch on which rank at every step.

A pure function of (token costs, seed, epoch, configuration). Samples are shuffled, then
packed window by window (so batches stay random rather than sorted by length over the epoch),
each window's micro-batches sorted by load and dealt out R at a time, so the ranks of a step
carry nearly equal work. Under-filled micro-batches are carried into the next window and packed
again with fresh samples; the last ones are spread over the ranks as a final step. Only when
fewer samples remain than there are ranks are they left out, and then they are reported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from mmdata.planning.packing.cost import Chunked, check_order, fit_to_budget
from mmdata.planning.packing.kernels import best_fit_decreasing, bin_loads, first_fit_decreasing, minimum_bin_slack

_KERNELS = {"ffd": first_fit_decreasing, "bfd": best_fit_decreasing, "mbs": minimum_bin_slack}
ALGORITHMS = ("auto", *_KERNELS)


@dataclass(frozen=True)
class PackingConfig:
    """How to pack: token budget per micro-batch, ranks, shuffle window, algorithm, balance target.

    `algorithm` is first-fit decreasing (`ffd`), best-fit decreasing (`bfd`), minimum bin
    slack (`mbs`, which completes each micro-batch with the best pair or triple), or `auto`:
    per window, whichever of FFD and MBS needs fewer micro-batches. FFD is best when samples
    are long against the budget; MBS when they come in a few sizes (policy windows), where FFD
    leaves each micro-batch short by up to the smallest sample.

    `fill` is the load (fraction of the budget) a micro-batch needs to be emitted before the
    last window; lighter ones are re-packed with the next window's samples.
    """

    budget: int
    ranks: int = 1
    window: int = 8192
    algorithm: Literal["auto", "ffd", "bfd", "mbs"] = "auto"
    balance: Literal["tokens", "attention"] = "tokens"
    long: Literal["split", "drop"] = "split"
    fill: float = 0.98

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"token budget must be at least 1, not {self.budget}")
        if self.ranks < 1:
            raise ValueError(f"ranks must be at least 1, not {self.ranks}")
        if self.window < 1:
            raise ValueError(f"shuffle window must hold at least 1 sample, not {self.window}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"packing algorithm is one of {', '.join(ALGORITHMS)}, not '{self.algorithm}'")
        if self.balance not in ("tokens", "attention"):
            raise ValueError(f"balance is 'tokens' or 'attention', not '{self.balance}'")
        if not 0.0 <= self.fill <= 1.0:
            raise ValueError(f"fill is a fraction of the budget in [0, 1], not {self.fill}")


@dataclass
class PackingPlan:
    """Micro-batches as index lists into `rows` (the chunked samples), arranged as steps x ranks."""

    config: PackingConfig
    rows: Chunked
    steps: np.ndarray  # [S, R] micro-batch index
    batch_offsets: np.ndarray  # micro-batch b holds members[batch_offsets[b]:batch_offsets[b + 1]]
    members: np.ndarray  # row indices
    deferred: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # rows left at epoch end

    def __len__(self) -> int:
        return len(self.steps)

    def micro_batch(self, step: int, rank: int) -> np.ndarray:
        """Row indices (into `rows`) of one rank's micro-batch at one step, in packing order."""
        batch = self.steps[step, rank]
        return self.members[self.batch_offsets[batch] : self.batch_offsets[batch + 1]]

    def samples_in_steps(self, steps: int) -> int:
        """Rows of the first `steps` steps, over all ranks (asked after every step: summed once)."""
        return int(self._rows_after[steps])

    @functools.cached_property
    def _rows_after(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.micro_batch_sizes())]).astype(np.int64)

    def micro_batch_sizes(self) -> np.ndarray:
        """Rows per step, summed over ranks."""
        return np.diff(self.batch_offsets)[self.steps].sum(axis=1)

    def lengths(self, step: int, rank: int) -> np.ndarray:
        return self.rows.tokens[self.micro_batch(step, rank)]

    @property
    def dropped_samples(self) -> np.ndarray:
        """Samples longer than the budget, dropped because `long="drop"`."""
        return self.rows.dropped

    @property
    def deferred_samples(self) -> np.ndarray:
        """Samples (of chunks) that did not fill a last step for every rank; they were not planned."""
        return np.unique(self.rows.sample[self.deferred])


def plan_packing(
    costs: np.ndarray, config: PackingConfig, seed: int = 0, epoch: int = 0, order: np.ndarray | None = None
) -> PackingPlan:
    """Pack samples of `costs` tokens into micro-batches, balanced over `config.ranks` ranks.

    `order` lists the rows (after splitting) in the order windows are cut from, and may leave
    rows out (a loader's locality-aware shuffle, or the rest of an epoch); by default all rows
    in a random order drawn from (seed, epoch).
    """
    rows = fit_to_budget(costs, config.budget, config.long)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(rows)).astype(np.int64) if order is None else check_order(order, len(rows))
    batches: list[np.ndarray] = []
    step_batches: list[np.ndarray] = []
    carry = np.empty(0, np.int64)
    ranks = config.ranks
    starts = list(range(0, len(order), config.window)) or [0]
    for number, start in enumerate(starts):
        last = number == len(starts) - 1
        pool = np.concatenate([carry, order[start : start + config.window]])
        if len(pool) == 0:
            break
        tokens = rows.tokens[pool]
        assignment, count = pack_window(tokens, config.budget, config.algorithm)
        loads, squares = bin_loads(assignment, count, tokens)
        key = squares if config.balance == "attention" else loads.astype(np.float64)
        by_load = np.argsort(-key, kind="stable")
        if last:
            emit = (count // ranks) * ranks
        else:
            full = int(np.sum(loads >= config.fill * config.budget))
            emit = (full // ranks) * ranks
            # keep the carry below half a window, so a run of large samples cannot snowball
            rows_from = np.append(np.cumsum(np.bincount(assignment, minlength=count)[by_load][::-1])[::-1], 0)
            while emit + ranks <= count and rows_from[emit] > config.window // 2:
                emit += ranks
        members_of = _members_by_bin(assignment, count)
        groups = by_load[:emit].reshape(-1, ranks) if emit else np.empty((0, ranks), np.int64)
        for group in groups[rng.permutation(len(groups))]:
            ids = []
            for bin_index in rng.permutation(group):
                ids.append(len(batches))
                batches.append(pool[members_of[bin_index]])
            step_batches.append(np.asarray(ids, dtype=np.int64))
        left = by_load[emit:]
        carry = pool[np.concatenate([members_of[b] for b in left])] if len(left) else np.empty(0, np.int64)
        if last and len(carry):
            final = _spread_over_ranks(carry, rows.tokens, ranks, config.budget)
            if final is not None:
                ids = []
                for members in final:
                    ids.append(len(batches))
                    batches.append(members)
                step_batches.append(np.asarray(ids, dtype=np.int64))
                carry = np.empty(0, np.int64)
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    members = np.concatenate(batches) if batches else np.empty(0, np.int64)
    steps = np.stack(step_batches) if step_batches else np.empty((0, ranks), np.int64)
    return PackingPlan(config, rows, steps, offsets, members, deferred=carry)


def pack_window(tokens: np.ndarray, budget: int, algorithm: str) -> tuple[np.ndarray, int]:
    """Bin per sample of one window, and the number of bins."""
    if algorithm != "auto":
        return _KERNELS[algorithm](tokens, budget)
    first_fit = first_fit_decreasing(tokens, budget)
    slack = minimum_bin_slack(tokens, budget)
    return slack if slack[1] < first_fit[1] else first_fit


def _spread_over_ranks(rows: np.ndarray, tokens: np.ndarray, ranks: int, budget: int) -> list[np.ndarray] | None:
    """The epoch's last rows as one more step: longest first onto the lightest rank (LPT).

    None when some rank would get nothing (fewer rows than ranks) or a rank would overflow;
    those rows are then reported as deferred.
    """
    if len(rows) < ranks:
        return None
    loads = np.zeros(ranks, dtype=np.int64)
    members: list[list[int]] = [[] for _ in range(ranks)]
    for row in rows[np.argsort(-tokens[rows], kind="stable")]:
        rank = int(np.argmin(loads))
        loads[rank] += tokens[row]
        members[rank].append(int(row))
    if loads.max() > budget:
        return None
    return [np.asarray(m, dtype=np.int64) for m in members]


def _members_by_bin(assignment: np.ndarray, count: int) -> list[np.ndarray]:
    order = np.argsort(assignment, kind="stable")
    bounds = np.searchsorted(assignment[order], np.arange(count + 1))
    return [order[bounds[b] : bounds[b + 1]] for b in range(count)]
