"""Stage 1 of the loading chain for stores too large to order whole: the "blocks" order (`planning.block_order`)
planned per rank. An epoch's plan at any world size, after any stretches, is a few arrays of the size of the world
(its layouts and what each stretch consumed), and a step's samples are worked out when the step is read, from
the sample index (`planning.sample_index`): planning a billion samples costs a rank what planning its first step
does. A mixture's sources are ordered each in its own blocks and interleaved (`planning.mixed_order`). Under a
token budget the order is packed window by window into micro-batches numbered whatever the world size
(`planning.packed_windows`). The counterpart of `LoaderPlanner`, with the same surface (`epoch_plan`, `rank_steps`,
`refs`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mmdata.errors import ResumeError
from mmdata.planning.block_order import BlockOrder, Consumed, LaneLayout
from mmdata.planning.epoch_plan import EpochPlan, Stretch
from mmdata.planning.mixed_order import MixedBlockOrder
from mmdata.planning.packed_windows import PackedWindows, WindowPacking, plan_window_packing
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


@dataclass
class PackedRankPlan:
    """One stretch's steps in the "blocks" order under a token budget (a `RankPlan`): the epoch's micro-batches
    (`windows`) from the `first` that the stretches before consumed, dealt `world` a step (rank r takes the r-th).
    The micro-batches do not depend on the world size, so a stretch consumed a run of them and nothing else.

    What it counts as consumed is positions of the order passed (`PackedWindows.positions_passed`): the samples
    of the micro-batches taken and, for windows passed, the few their packing left out."""

    order: BlockOrder | MixedBlockOrder
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
        if batching.batch_size is None and batching.batch_tokens is None:
            raise ValueError("the 'blocks' order deals a batch size or packs a token budget")
        self.sources, self.batching, self.targets = sources, batching, targets
        self.samples = SourceSampleIndexes(tuple(source.samples for source in sources))  # numbered source by source
        self.packing: WindowPacking | None = None
        if batching.batch_size is None:
            reference = self.order(0, 0)
            self.packing = plan_window_packing(
                lambda positions: self.slot_costs(reference, reference.samples_at(positions)),
                self.slots,
                batching.shuffle_window,
                batching.batch_tokens,
                batching.balance,
            )

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
        if self.packing is not None:
            return self._packed_plan(seed, epoch, stretches)
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

    def _packed_plan(self, seed: int, epoch: int, stretches: list[Stretch]) -> EpochPlan:
        """The epoch's plan under a token budget: each stretch consumed the next `steps * world` micro-batches."""
        assert self.packing is not None
        order = self.order(seed, epoch)
        windows = PackedWindows(order.samples_at, functools.partial(self.slot_costs, order), self.slots, self.packing)
        first = steps_before = 0
        for number, stretch in enumerate(stretches):
            plan = PackedRankPlan(order, windows, stretch.world_size, first)
            if not 0 <= stretch.steps <= len(plan):
                raise ResumeError(
                    f"the saved state says {stretch.steps} steps were taken at world size {stretch.world_size},"
                    f" but that part of the epoch has {len(plan)} steps; the state belongs to another run"
                )
            if number < len(stretches) - 1:
                first += stretch.steps * stretch.world_size
                steps_before += stretch.steps
        return EpochPlan(stretches, plan, steps_before, windows.positions_passed(first), None, (seed, epoch))

    def slot_costs(self, order: BlockOrder | MixedBlockOrder, slots: np.ndarray) -> np.ndarray:
        """Each of `slots`' tokens (`order`: the epoch's order, which says a mixture's slot's sample)."""
        slots = np.asarray(slots, dtype=np.int64)
        if not isinstance(order, MixedBlockOrder):
            return self.sources[0].samples.costs_of(slots)
        owners, numbers = order.sources_of(slots)
        costs = np.empty(len(slots), np.int64)
        for owner in np.unique(owners).tolist():
            mine = owners == owner
            costs[mine] = self.sources[owner].samples.costs_of(numbers[mine])
        return costs

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
        the share of the positions its source holds; None under a token budget (a sequence, its own block, reads
        whole segments itself, and the micro-batches of a window go to every rank)."""
        b = self.batching
        if b.batch_size is None:
            return None
        if self.targets is None:
            return math.ceil(self.sources[0].block * b.open_segments / b.batch_size)
        slots = self.slots
        return max(
            math.ceil(source.block * b.open_segments * slots / (target * b.batch_size))
            for source, target in zip(self.sources, self.targets.tolist())
            if target
        )
