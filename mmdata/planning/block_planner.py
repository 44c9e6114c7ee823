"""Stage 1 of the loading chain for stores too large to order whole: the "blocks" order (`planning.block_order`)
planned per rank. An epoch's plan at any world size, after any stretches, is a few arrays of the size of the world
(its layouts and what each stretch consumed), and a step's samples are worked out when the step is read, from
the sample index (`planning.sample_index`): planning a billion samples costs a rank what planning its first step
does. A mixture's sources are ordered each in its own blocks and interleaved (`planning.mixed_order`). The
counterpart of `LoaderPlanner`, with the same surface (`epoch_plan`, `rank_steps`, `refs`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mmdata.planning.block_order import BlockOrder, Consumed, LaneLayout
from mmdata.planning.epoch_plan import EpochPlan, Stretch
from mmdata.planning.mixed_order import MixedBlockOrder
from mmdata.planning.planner import PlanSettings, RankSteps
from mmdata.planning.sample_index import SampleIndex, SourceSampleIndexes
from mmdata.planning.samples import SampleRef
from mmdata.store.manifest import episode_key


@dataclass
class BlockRankPlan:
    """One stretch's steps in the "blocks" order (a `RankPlan`): step `s` of rank `r` holds the samples of the
    layout's positions, traced back through the stretches before (`consumed`, first to last) to the order."""

    order: BlockOrder | MixedBlockOrder
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


@dataclass(frozen=True)
class BlockSource:
    """One store as the "blocks" order plans it: its samples, its manifest's shard column (read per step) and the
    samples of a block. An episode's key is its row's (`episode_key`: the manifest's checks hold every row to it)."""

    samples: SampleIndex
    shards: pa.ChunkedArray
    block: int


class BlockPlanner:
    """Orders and packs (`batch_size` samples per micro-batch) the samples of one store, or of a mixture's sources
    (`targets`: each source's slots in an epoch; `mixed_order`), in the "blocks" order for any epoch, world size and
    point of resumption."""

    def __init__(self, sources: list[BlockSource], batching: PlanSettings, targets: np.ndarray | None = None):
        if targets is None and len(sources) != 1:
            raise ValueError("the sources of a mixture need their slots per epoch (targets)")
        self.sources, self.batching, self.targets = sources, batching, targets
        self.samples = SourceSampleIndexes(tuple(source.samples for source in sources))  # numbered source by source

    @property
    def slots(self) -> int:
        """Slots of an epoch: every sample of a single store, or the mixture's targets."""
        return len(self.samples) if self.targets is None else int(self.targets.sum())

    def order(self, seed: int, epoch: int) -> BlockOrder | MixedBlockOrder:
        """The epoch's order of slots."""
        open_blocks = self.batching.open_segments
        if self.targets is None:
            return BlockOrder(self.slots, self.sources[0].block, open_blocks, seed, epoch)
        counts = tuple(len(source.samples) for source in self.sources)
        blocks = tuple(source.block for source in self.sources)
        return MixedBlockOrder(counts, tuple(self.targets.tolist()), blocks, open_blocks, seed, epoch)

    def epoch_plan(self, seed: int, epoch: int, stretches: list[Stretch], world_size: int) -> EpochPlan:
        """The epoch's plan at `world_size` after the `stretches` already run; its steps hold slot numbers."""
        b = self.batching
        stretches = list(stretches) or [Stretch(world_size, 0)]
        if stretches[-1].world_size != world_size:
            stretches.append(Stretch(world_size, 0))
        left, consumed, steps_before = self.slots, [], 0
        for stretch in stretches[:-1]:
            taken = LaneLayout(left, stretch.world_size, b.batch_size, b.lanes).consumed(stretch.steps)
            consumed.append(taken)
            left -= taken.total
            steps_before += stretch.steps
        layout = LaneLayout(left, world_size, b.batch_size, b.lanes)
        layout.consumed(stretches[-1].steps)  # refuses a step count the layout does not have
        plan = BlockRankPlan(self.order(seed, epoch), layout, consumed)
        return EpochPlan(stretches, plan, steps_before, self.slots - left, None, (seed, epoch))

    def rank_steps(self, plan: EpochPlan, rank: int) -> RankSteps:
        """The steps `rank` has left in `plan`; each step's samples are made when it is read."""
        return RankSteps(self, plan, rank)

    def refs(self, plan: EpochPlan, slots: np.ndarray) -> list[SampleRef]:
        """The samples of `slots` (a step of `plan`), numbered one source after another as a sample table numbers
        them; their random choices are drawn by slot, so a sample crops alike wherever a resume at another world
        size puts it."""
        slots = np.asarray(slots, dtype=np.int64)
        order = plan.plan.order
        if isinstance(order, MixedBlockOrder):
            owners, numbers = order.sources_of(slots)
        else:
            owners, numbers = np.zeros(len(slots), np.int64), slots
        seed, epoch = plan.draw
        made: list[SampleRef | None] = [None] * len(slots)
        for owner in np.unique(owners).tolist():
            places = np.flatnonzero(owners == owner)
            refs = self._source_refs(owner, numbers[places], slots[places], (seed, epoch))
            for place, ref in zip(places.tolist(), refs):
                made[place] = ref
        return made  # type: ignore[return-value]

    def _source_refs(
        self, owner: int, numbers: np.ndarray, slots: np.ndarray, draw: tuple[int, int]
    ) -> list[SampleRef]:
        source = self.sources[owner]
        episodes, chunks = source.samples.episodes_of(numbers)
        starts, ends = source.samples.spans_of(numbers)
        costs = source.samples.costs_of(numbers)
        keys = [episode_key(e) for e in episodes.tolist()]
        shards = source.shards.take(pa.array(episodes)).to_pylist()
        seed, epoch = draw
        first = int(self.samples.firsts[owner])
        return [
            SampleRef(first + n, e, key, shard, start, end, chunk, cost, owner, (seed, epoch, slot))
            for n, e, key, shard, start, end, chunk, cost, slot in zip(
                numbers.tolist(),
                episodes.tolist(),
                keys,
                shards,
                starts.tolist(),
                ends.tolist(),
                chunks.tolist(),
                costs.tolist(),
                slots.tolist(),
            )
        ]

    def segment_life_steps(self, world_size: int) -> int | None:
        """How many of its lane's steps a block stays open: its samples, one per turn of the open blocks, in
        the share of the positions its source holds."""
        b = self.batching
        if self.targets is None:
            return math.ceil(self.sources[0].block * b.open_segments / b.batch_size)
        slots = self.slots
        return max(
            math.ceil(source.block * b.open_segments * slots / (target * b.batch_size))
            for source, target in zip(self.sources, self.targets.tolist())
            if target
        )
