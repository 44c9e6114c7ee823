"""An epoch as steps per rank, and resuming it at any step with any world size.

The plan of an epoch is a pure function of the order, the dealing or packing and the world size, so resuming at the
same world size is "skip to step k". A run may also stop and come back with a different world size: the epoch is
then a list of stretches, each run at one world size for some steps. What the stretches consumed is worked out from
their layouts, and the rest of the epoch is laid out afresh for the new world size, so no sample repeats and none
is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mmdata.planning.orders import Order


class RankPlan(Protocol):
    """One stretch's steps: `len()` steps, each of one micro-batch of slots per rank, the epoch's `order`, the slots
    `deferred` at the epoch's end (no step holds them), and how many positions the first `steps` steps hold over
    all ranks."""

    order: Order

    @property
    def deferred(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def micro_batch(self, step: int, rank: int) -> np.ndarray: ...

    def samples_in_steps(self, steps: int) -> int: ...


@dataclass(frozen=True)
class Stretch:
    """Part of an epoch run at one world size: `steps` steps were completed by every rank."""

    world_size: int
    steps: int


@dataclass
class EpochPlan:
    """The current stretch's plan, the stretches before it, and where in it to resume. Steps hold slot numbers (a
    mixture's slots are numbered source by source; a single store's are its samples); `draw` is the (seed, epoch)
    that random choices per slot are drawn from."""

    stretches: list[Stretch]
    plan: RankPlan
    steps_before: int
    samples_before: int
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
        """Slots of the epoch that no step holds."""
        return np.asarray(self.plan.deferred, dtype=np.int64)

    @property
    def total_steps(self) -> int:
        """Steps of the whole epoch at this world size, counting those of earlier stretches."""
        return self.steps_before + len(self.plan)

    def samples_consumed(self, steps_in_plan: int) -> int:
        """Samples consumed by all ranks since the epoch began, after `steps_in_plan` steps of this plan."""
        return self.samples_before + self.plan.samples_in_steps(min(steps_in_plan, len(self.plan)))
