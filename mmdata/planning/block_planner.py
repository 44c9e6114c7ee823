"""Stage 1 of the loading chain for stores too large to order whole: the "blocks" order (`planning.block_order`)
planned per rank. An epoch's plan at any world size, after any stretches, is a few arrays of the size of the world
(its layouts and what each stretch consumed), and a step's samples are worked out when the step is read, from
the sample index (`planning.sample_index`): planning a billion samples costs a rank what planning its first step
does. The counterpart of `LoaderPlanner`, with the same surface (`epoch_plan`, `rank_steps`, `refs`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mmdata.planning.block_order import BlockOrder, Consumed, LaneLayout
from mmdata.planning.epoch_plan import EpochPlan, Stretch
from mmdata.planning.planner import PlanSettings, RankSteps
from mmdata.planning.sample_index import SampleIndex
from mmdata.planning.samples import SampleRef
from mmdata.store.manifest import episode_key


@dataclass
class BlockRankPlan:
    """One stretch's steps in the "blocks" order (a `RankPlan`): step `s` of rank `r` holds the samples of the
    layout's positions, traced back through the stretches before (`consumed`, first to last) to the order."""

    order: BlockOrder
    layout: LaneLayout
    consumed: list[Consumed]

    def __len__(self) -> int:
        return self.layout.steps

    @property
    def deferred(self) -> np.ndarray:
        return self._samples(self.layout.left_over())

    def micro_batch(self, step: int, rank: int) -> np.ndarray:
        return self._samples(self.layout.positions(step, rank))

    def samples_in_steps(self, steps: int) -> int:
        return steps * self.layout.world * self.layout.batch

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        for stretch in reversed(self.consumed):
            positions = stretch.earlier(positions)
        return self.order.samples_at(positions)


class BlockPlanner:
    """Orders and packs (`batch_size` samples per micro-batch) the samples of one store in the "blocks" order for
    any epoch, world size and point of resumption. `shards` is the manifest's column, read per step; an episode's
    key is its row's (`episode_key`: the manifest's checks hold every row to it)."""

    def __init__(self, samples: SampleIndex, shards: pa.ChunkedArray, batching: PlanSettings, block: int):
        self.samples, self.shards, self.batching, self.block = samples, shards, batching, block

    def epoch_plan(self, seed: int, epoch: int, stretches: list[Stretch], world_size: int) -> EpochPlan:
        """The epoch's plan at `world_size` after the `stretches` already run; its steps hold sample numbers."""
        b = self.batching
        stretches = list(stretches) or [Stretch(world_size, 0)]
        if stretches[-1].world_size != world_size:
            stretches.append(Stretch(world_size, 0))
        order = BlockOrder(len(self.samples), self.block, b.open_segments, seed, epoch)
        left, consumed, steps_before = len(self.samples), [], 0
        for stretch in stretches[:-1]:
            taken = LaneLayout(left, stretch.world_size, b.batch_size, b.lanes).consumed(stretch.steps)
            consumed.append(taken)
            left -= taken.total
            steps_before += stretch.steps
        layout = LaneLayout(left, world_size, b.batch_size, b.lanes)
        layout.consumed(stretches[-1].steps)  # refuses a step count the layout does not have
        plan = BlockRankPlan(order, layout, consumed)
        return EpochPlan(stretches, plan, steps_before, len(self.samples) - left, None, (seed, epoch))

    def rank_steps(self, plan: EpochPlan, rank: int) -> RankSteps:
        """The steps `rank` has left in `plan`; each step's samples are made when it is read."""
        return RankSteps(self, plan, rank)

    def refs(self, plan: EpochPlan, numbers: np.ndarray) -> list[SampleRef]:
        """The samples numbered `numbers` (a step of `plan`); their random choices are drawn by sample number, so a
        sample crops alike wherever a resume at another world size puts it."""
        numbers = np.asarray(numbers, dtype=np.int64)
        episodes, chunks = self.samples.episodes_of(numbers)
        starts, ends = self.samples.spans_of(numbers)
        costs = self.samples.costs_of(numbers)
        keys = [episode_key(e) for e in episodes.tolist()]
        shards = self.shards.take(pa.array(episodes)).to_pylist()
        seed, epoch = plan.draw
        return [
            SampleRef(n, e, key, shard, start, end, chunk, cost, 0, (seed, epoch, n))
            for n, e, key, shard, start, end, chunk, cost in zip(
                numbers.tolist(),
                episodes.tolist(),
                keys,
                shards,
                starts.tolist(),
                ends.tolist(),
                chunks.tolist(),
                costs.tolist(),
            )
        ]

    def segment_life_steps(self, world_size: int) -> int | None:
        """How many of its lane's steps a block stays open: its samples, one per turn of the open blocks."""
        return math.ceil(self.block * self.batching.open_segments / self.batching.batch_size)
