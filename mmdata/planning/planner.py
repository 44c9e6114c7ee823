"""Stage 1 of the loading chain, plan (the main process; workers plan the epochs after the first): the one planner.

An epoch's plan at any world size, after any stretches, is a few arrays of the size of the world (its layouts and
what each stretch consumed), and a step's samples are worked out when the step is read: the epoch's order gives the
slot at each position (`planning.orders`; a mixture's sources interleaved, `planning.mixed_order`), the sample index
the sample of each slot (`planning.sample_index`). `batch_size` samples are dealt per step (`planning.lanes`); under
a token budget the order is packed window by window into micro-batches numbered whatever the world size
(`planning.packed_windows`). Planning a billion samples costs a rank what planning its first step does, and the
planner travels to worker processes as its sources' per-episode arrays.

An epoch's plan resumes at any step with any world size: the epoch is a list of stretches, each run at one world
size for some steps; what they consumed is worked out from their layouts, and the rest of the epoch is laid out
afresh for the new world size, so no sample repeats and none is dropped.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import ResumeError
from mmdata.planning.lanes import DealtRankPlan, LaneLayout
from mmdata.planning.mixed_order import MixedOrder
from mmdata.planning.orders import Order, OrderRecipe, Shuffle
from mmdata.planning.packed_windows import PackedRankPlan, PackedWindows, WindowPacking, plan_window_packing
from mmdata.planning.sample_index import SampleIndex, SourceSampleIndexes
from mmdata.planning.samples import SampleRef
from mmdata.store.manifest import episode_key


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


@dataclass(frozen=True)
class PlanSettings:
    """How samples become micro-batches: a token budget (`batch_tokens`) or a sample count (`batch_size`, the
    last, shorter step left out with `drop_last`), in which order, over how many lanes."""

    batch_tokens: int | None
    batch_size: int | None
    balance: Literal["tokens", "attention"] = "tokens"
    shuffle: Shuffle = "auto"
    shuffle_window: int = 8192
    shards_per_group: int = 8
    lanes: int = 1
    open_segments: int = 8
    drop_last: bool = False


@dataclass(frozen=True)
class PlannedSource:
    """One store as the planner plans it: its samples, its manifest's shard column and how its samples are ordered.
    An episode's key is its row's (`episode_key`: the manifest's checks hold every row to it)."""

    samples: SampleIndex
    shards: pa.ChunkedArray
    recipe: OrderRecipe
    _shard_codes: np.ndarray = field(init=False, repr=False, compare=False)
    _shard_names: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        encoded = pc.dictionary_encode(pc.fill_null(self.shards, "")).combine_chunks()
        object.__setattr__(self, "_shard_codes", encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32))
        object.__setattr__(self, "_shard_names", encoded.dictionary.to_pylist())

    def shards_of(self, episodes: np.ndarray) -> list[str]:
        """The shard of each of `episodes` (manifest rows): a few names over every episode, kept as their codes."""
        names = self._shard_names
        return [names[code] for code in self._shard_codes[episodes].tolist()]


class Planner:
    """Orders and packs the samples of one store, or of a mixture's sources (`targets`: each source's slots in an
    epoch), for any epoch, world size and point of resumption."""

    def __init__(self, sources: list[PlannedSource], batching: PlanSettings, targets: np.ndarray | None = None):
        if targets is None and len(sources) != 1:
            raise ValueError("the sources of a mixture need their slots per epoch (targets)")
        if batching.batch_size is None and batching.batch_tokens is None:
            raise ValueError("a plan deals a batch size or packs a token budget")
        self.sources, self.batching, self.targets = sources, batching, targets
        self.samples = SourceSampleIndexes(tuple(source.samples for source in sources))  # numbered source by source
        self.packing: WindowPacking | None = None
        if batching.batch_size is None:
            assert batching.batch_tokens is not None
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

    @property
    def lanes(self) -> int:
        """Lanes of steps a rank's steps take in turn: the settings' in the "blocks" order, whose blocks a lane keeps
        with one worker; one in the others, whose steps then follow the order."""
        return self.batching.lanes if self.batching.shuffle == "blocks" else 1

    def order(self, seed: int, epoch: int, cuts: np.ndarray | None = None) -> Order:
        """The epoch's order of slots; `cuts`: the first position of each lane of the steps that read them, which a
        source's "blocks" order deals within (a mixture's sources each within the lanes' share of its slots)."""
        if self.targets is None:
            return self.sources[0].recipe.order(self.slots, seed, epoch, cuts)
        counts = tuple(len(source.samples) for source in self.sources)
        recipes = tuple(source.recipe for source in self.sources)
        return MixedOrder(counts, tuple(self.targets.tolist()), recipes, seed, epoch, cuts)

    def epoch_plan(self, seed: int, epoch: int, stretches: Sequence[Stretch], world_size: int) -> EpochPlan:
        """The epoch's plan at `world_size` after the `stretches` already run; its steps hold slot numbers."""
        b = self.batching
        stretches = list(stretches) or [Stretch(world_size, 0)]
        if stretches[-1].world_size != world_size:
            stretches.append(Stretch(world_size, 0))
        if self.packing is not None:
            return self._packed_plan(seed, epoch, stretches)
        assert b.batch_size is not None
        # the epoch's order deals its blocks within the lanes of its first stretch (resumed at another world size,
        # the next stretches read the positions left, in that order)
        order = self.order(seed, epoch, self._layout(self.slots, stretches[0].world_size).cuts())
        left, consumed, steps_before = self.slots, [], 0
        for stretch in stretches[:-1]:
            taken = self._layout(left, stretch.world_size).consumed(stretch.steps)
            consumed.append(taken)
            left -= taken.total
            steps_before += stretch.steps
        layout = self._layout(left, world_size)
        layout.consumed(stretches[-1].steps)  # refuses a step count the layout does not have
        plan = DealtRankPlan(order, layout, consumed)
        return EpochPlan(stretches, plan, steps_before, self.slots - left, (seed, epoch))

    def _layout(self, count: int, world_size: int) -> LaneLayout:
        b = self.batching
        assert b.batch_size is not None
        return LaneLayout(count, world_size, b.batch_size, self.lanes, not b.drop_last)

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
        return EpochPlan(stretches, plan, steps_before, windows.positions_passed(first), (seed, epoch))

    def slot_costs(self, order: Order, slots: np.ndarray) -> np.ndarray:
        """Each of `slots`' tokens (`order`: the epoch's order, which says a mixture's slot's sample)."""
        slots = np.asarray(slots, dtype=np.int64)
        if not isinstance(order, MixedOrder):
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

    def samples_of(self, plan: EpochPlan, slots: np.ndarray) -> np.ndarray:
        """The sample numbers (source by source) that `slots` of `plan` read."""
        slots = np.asarray(slots, dtype=np.int64)
        order = plan.plan.order
        if not isinstance(order, MixedOrder):
            return slots
        owners, numbers = order.sources_of(slots)
        return self.samples.firsts[owners] + numbers

    def refs(self, plan: EpochPlan, slots: np.ndarray) -> list[SampleRef]:
        """The samples of `slots` (a step of `plan`), numbered one source after another; their random choices are
        drawn by slot, so a sample crops alike wherever a resume at another world size puts it."""
        slots = np.asarray(slots, dtype=np.int64)
        order = plan.plan.order
        if isinstance(order, MixedOrder):
            owners, numbers = order.sources_of(slots)
        else:
            owners, numbers = np.zeros(len(slots), np.int64), slots
        made: list[SampleRef] = []
        places: list[np.ndarray] = []
        for owner in np.unique(owners).tolist():
            mine = np.flatnonzero(owners == owner)
            made += self._source_refs(owner, numbers[mine], slots[mine], plan.draw)
            places.append(mine)
        if len(places) == 1:
            return made
        arranged: list[SampleRef] = [made[0]] * len(slots)
        for place, ref in zip(np.concatenate(places).tolist(), made):
            arranged[place] = ref
        return arranged

    def _source_refs(
        self, owner: int, numbers: np.ndarray, slots: np.ndarray, draw: tuple[int, int]
    ) -> list[SampleRef]:
        source = self.sources[owner]
        episodes, chunks, starts, ends, costs = source.samples.described(numbers)
        keys = [episode_key(e) for e in episodes.tolist()]
        shards = source.shards_of(episodes)
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
        """How many of its lane's steps a block of the "blocks" order stays open: its samples, one per turn of the
        open blocks, in the share of the positions its source holds; None in the other orders and under a token
        budget (a sequence, its own block, reads whole segments itself, and the micro-batches of a window go to
        every rank)."""
        b = self.batching
        if b.batch_size is None or b.shuffle != "blocks":
            return None
        if self.targets is None:
            recipe = self.sources[0].recipe
            return math.ceil(recipe.block * b.open_segments * recipe.block_spread() / b.batch_size)
        slots = self.slots
        return max(
            math.ceil(
                source.recipe.block * b.open_segments * source.recipe.block_spread() * slots / (target * b.batch_size)
            )
            for source, target in zip(self.sources, self.targets.tolist())
            if target
        )


class RankSteps(Sequence):
    """One rank's steps of an epoch plan from its resume step on, as (epoch step number, samples). A step's
    samples are made when it is first asked for and kept while the kept steps hold at most `KEPT_SAMPLES`
    (a step is asked for as it enters the frame cache's horizon, up to a thousand reads ahead, again when it
    is read, and for the fallback of the steps before it), so an epoch of millions of samples costs nothing
    up front and travels to worker processes as the plan's arrays, not as millions of objects."""

    KEPT_SAMPLES = 1 << 16

    def __init__(self, planner: Planner, plan: EpochPlan, rank: int):
        self.planner, self.plan, self.rank = planner, plan, rank
        self.first = plan.resume_step
        self._made: dict[int, tuple[int, list[SampleRef]]] = {}
        self._kept_samples = 0

    def __len__(self) -> int:
        return max(0, len(self.plan.plan) - self.first)

    def __getitem__(self, position: int) -> tuple[int, list[SampleRef]]:  # type: ignore[override]
        if not 0 <= position < len(self):
            raise IndexError(f"step {position} of {len(self)}")
        made = self._made.get(position)
        if made is None:
            step = self.first + position
            slots = self.plan.plan.micro_batch(step, self.rank)
            made = (self.plan.steps_before + step, self.planner.refs(self.plan, slots))
            while self._made and self._kept_samples + len(made[1]) > self.KEPT_SAMPLES:
                self._kept_samples -= len(self._made.pop(next(iter(self._made)))[1])
            self._made[position] = made
            self._kept_samples += len(made[1])
        return made

    def samples_after(self, position: int, count: int) -> list[SampleRef]:
        """The first `count` samples of the steps after `position` (fewer at the epoch's end)."""
        found: list[SampleRef] = []
        for later in range(position + 1, len(self)):
            if len(found) >= count:
                break
            found += self[later][1]
        return found[:count]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_made": {}, "_kept_samples": 0}
