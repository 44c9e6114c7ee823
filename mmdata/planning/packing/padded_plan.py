"""The plan for the padded layout: samples bucketed by length, `batch_size` per micro-batch.

For models that want `[B, T_max]` rows: each micro-batch holds samples of one length bucket, so
little of it is padding, and a step deals R micro-batches of the same bucket to the R ranks, so
their work is even. Like the packed plan, a pure function of (costs, seed, epoch, settings),
shuffled within windows; leftovers roll into the next window, the last ones are spread over
the ranks, and only fewer than R samples can be left out (reported).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmdata.planning.packing.cost import Chunked, check_order, fit_to_budget
from mmdata.planning.packing.kernels import bucket_indices


@dataclass
class PaddedPlan:
    rows: Chunked
    steps: np.ndarray  # [S, R] micro-batch index
    batches: list[np.ndarray]  # row indices per micro-batch
    deferred: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)

    def micro_batch(self, step: int, rank: int) -> np.ndarray:
        return self.batches[self.steps[step, rank]]

    def samples_in_steps(self, steps: int) -> int:
        """Rows of the first `steps` steps, over all ranks (asked after every step: summed once)."""
        return int(self._rows_after[steps])

    @functools.cached_property
    def _rows_after(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.micro_batch_sizes())]).astype(np.int64)

    def micro_batch_sizes(self) -> np.ndarray:
        """Rows per step, summed over ranks."""
        return np.array([len(b) for b in self.batches], dtype=np.int64)[self.steps].sum(axis=1)

    def padding_fraction(self) -> float:
        """Share of the padded `[B, T_max]` tokens, over the whole plan, that are padding."""
        real = padded = 0
        for batch in self.batches:
            tokens = self.rows.tokens[batch]
            real += int(tokens.sum())
            padded += int(tokens.max()) * len(tokens)
        return 1.0 - real / padded if padded else 0.0


def plan_padded(
    costs: np.ndarray,
    batch_size: int,
    boundaries: Sequence[int],
    ranks: int = 1,
    seed: int = 0,
    epoch: int = 0,
    window: int = 8192,
    max_len: int | None = None,
    order: np.ndarray | None = None,
    keep_order: bool = False,
) -> PaddedPlan:
    """Micro-batches of `batch_size` samples from one length bucket (`boundaries`, ascending).

    Samples longer than `max_len` (default: the last boundary) are split into chunks first.
    `order` is the sequence rows are taken in (possibly a subset), as for `plan_packing`. The
    micro-batches of each window are shuffled, unless `keep_order` (an unshuffled epoch: samples of
    equal cost then come in `order`, batch after batch).
    """
    if batch_size < 1 or ranks < 1 or window < 1:
        raise ValueError("batch_size, ranks and window must each be at least 1")
    bounds = np.asarray(sorted(boundaries), dtype=np.int64)
    if len(bounds) == 0 or bounds[0] < 1:
        raise ValueError("give at least one positive bucket boundary")
    rows = fit_to_budget(costs, int(max_len or bounds[-1]))
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(rows)).astype(np.int64) if order is None else check_order(order, len(rows))
    bucket_of = bucket_indices(rows.tokens, bounds)
    batches: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    carry = np.empty(0, np.int64)
    starts = list(range(0, len(order), window)) or [0]
    for number, start in enumerate(starts):
        pool = np.concatenate([carry, order[start : start + window]])
        blocks: list[np.ndarray] = []
        left: list[np.ndarray] = []
        for bucket in np.flatnonzero(np.bincount(bucket_of[pool], minlength=len(bounds) + 1)):
            members = pool[bucket_of[pool] == bucket]
            whole = len(members) // batch_size * batch_size
            blocks.append(members[:whole].reshape(-1, batch_size))
            left.append(members[whole:])
        full = np.concatenate(blocks) if blocks else np.empty((0, batch_size), np.int64)
        emit = len(full) // ranks * ranks
        left += list(full[emit:])
        groups = np.arange(emit).reshape(-1, ranks)
        if not keep_order:
            # the same draws as shuffling the groups, then each group's ranks (one rank: nothing to draw)
            groups = groups[rng.permutation(len(groups))]
            if ranks > 1:
                groups = np.stack([rng.permutation(group) for group in groups]) if len(groups) else groups
        steps.append(len(batches) + np.arange(emit, dtype=np.int64).reshape(-1, ranks))
        batches += list(full[groups.reshape(-1)])
        carry = np.concatenate(left) if left else np.empty(0, np.int64)
        if number == len(starts) - 1 and len(carry) >= ranks:
            by_length = carry[np.argsort(rows.tokens[carry], kind="stable")]
            steps.append(len(batches) + np.arange(ranks, dtype=np.int64)[None])
            batches += list(np.array_split(by_length, ranks))
            carry = np.empty(0, np.int64)
    step_array = np.concatenate(steps) if steps else np.empty((0, ranks), np.int64)
    return PaddedPlan(rows, step_array, batches, carry)
