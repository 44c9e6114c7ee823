"""An epoch as steps per rank, and resuming it at any step with any world size.

The plan of an epoch is a pure function of the sample order, the packer and the world size, so
resuming at the same world size is "skip to step k". A run may also stop and come back with a
different world size: the epoch is then a list of stretches, each run at one world size for some
steps. Replaying the stretches tells exactly which samples were consumed; the rest of the epoch
is packed afresh for the new world size, so no sample repeats and none is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mmdata.errors import ResumeError


class RankPlan(Protocol):
    """What a packer returns: `len()` steps, each of one micro-batch of samples per rank, and the
    samples `deferred` at the epoch's end (fewer than would give every rank one more micro-batch), and how many
    samples the first `steps` steps hold over all ranks."""

    steps: np.ndarray
    deferred: np.ndarray

    def __len__(self) -> int: ...

    def micro_batch(self, step: int, rank: int) -> np.ndarray: ...

    def samples_in_steps(self, steps: int) -> int: ...


Packer = Callable[[np.ndarray, int, int], RankPlan]
"""(samples in the order to consume them, ranks, stretch number) -> plan."""


@dataclass(frozen=True)
class Stretch:
    """Part of an epoch run at one world size: `steps` steps were completed by every rank."""

    world_size: int
    steps: int


@dataclass
class EpochPlan:
    """The current stretch's plan, the stretches before it, and where in it to resume.

    Steps hold slot numbers; `slots` maps each to the sample it reads (identity when unset) and
    `draw` is the (seed, epoch) that random choices per slot are drawn from.
    """

    stretches: list[Stretch]
    plan: RankPlan
    steps_before: int
    samples_before: int
    slots: np.ndarray | None = None
    draw: tuple[int, int] = (0, 0)

    @property
    def world_size(self) -> int:
        return self.stretches[-1].world_size

    @property
    def resume_step(self) -> int:
        """Steps of the current plan already completed."""
        return self.stretches[-1].steps

    @property
    def left_out(self) -> np.ndarray:
        """Samples of the epoch that no step holds: too few at the end to give every rank one more."""
        return np.asarray(self.plan.deferred, dtype=np.int64)

    @property
    def total_steps(self) -> int:
        """Steps of the whole epoch at this world size, counting those of earlier stretches."""
        return self.steps_before + len(self.plan)

    def samples_consumed(self, steps_in_plan: int) -> int:
        """Samples consumed by all ranks since the epoch began, after `steps_in_plan` steps of this plan."""
        return self.samples_before + self.plan.samples_in_steps(min(steps_in_plan, len(self.plan)))


def plan_epoch(order: np.ndarray, pack: Packer, stretches: Sequence[Stretch], world_size: int) -> EpochPlan:
    """Replay the stretches run so far and plan the rest of the epoch for `world_size` ranks."""
    stretches = list(stretches) or [Stretch(world_size, 0)]
    if stretches[-1].world_size != world_size:
        stretches.append(Stretch(world_size, 0))
    remaining = np.asarray(order, dtype=np.int64)
    steps_before = samples_before = 0
    for number, stretch in enumerate(stretches[:-1]):
        plan = pack(remaining, stretch.world_size, number)
        _check_steps(stretch, plan)
        consumed = np.concatenate(
            [plan.micro_batch(s, r) for s in range(stretch.steps) for r in range(stretch.world_size)] or [[]]
        ).astype(np.int64)
        remaining = remaining[~np.isin(remaining, consumed)]
        steps_before += stretch.steps
        samples_before += len(consumed)
    plan = pack(remaining, world_size, len(stretches) - 1)
    _check_steps(stretches[-1], plan)
    return EpochPlan(stretches, plan, steps_before, samples_before)


def _check_steps(stretch: Stretch, plan: RankPlan) -> None:
    if not 0 <= stretch.steps <= len(plan):
        raise ResumeError(
            f"the saved state says {stretch.steps} steps were taken at world size {stretch.world_size},"
            f" but that part of the epoch has {len(plan)} steps; the state belongs to another run"
        )
