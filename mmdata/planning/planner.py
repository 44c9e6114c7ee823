"""Stage 1 of the loading chain, plan (the main process; workers plan the epochs after the first):
the plan side of a loader: its samples and their token costs, and how an epoch is composed,
ordered, packed and split into one rank's steps. A pure function of (seed, epoch, stretches, world
size), small enough to hand to worker processes, which plan the epochs after the first themselves.

An epoch is a list of slots, each one sample of the table: all samples once for a single store, or
a mixture's composition (`mmdata.planning.mixture.epoch_composition`), where a sample may fill
several slots. Ordering and packing work on slots, so resuming never confuses two copies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from mmdata.planning.epoch_plan import EpochPlan, Stretch, plan_epoch
from mmdata.planning.order import Shuffle, sample_order, segment_order
from mmdata.planning.packing import PackingConfig, plan_packing, plan_padded
from mmdata.planning.samples import SampleRef, SampleTable
from mmdata.planning.segments import segment_life_steps

Composition = Callable[[int, int], np.ndarray]
"""(seed, epoch) -> the sample of each slot of the epoch."""


@dataclass(frozen=True)
class PlanSettings:
    """How samples become micro-batches: a token budget (`batch_tokens`) or a sample count (`batch_size`)."""

    batch_tokens: int | None
    batch_size: int | None
    balance: Literal["tokens", "attention"] = "tokens"
    shuffle: Shuffle = "locality"
    shuffle_window: int = 8192
    shards_per_group: int = 8
    lanes: int = 1
    open_segments: int = 8


class Planner(Protocol):
    """What the loading chain asks of a loader's planner (`LoaderPlanner`, or `BlockPlanner` for the "blocks"
    order): any epoch's plan, a rank's steps of it, the samples of a step, and how long a segment stays open."""

    batching: PlanSettings

    def epoch_plan(self, seed: int, epoch: int, stretches: list[Stretch], world_size: int) -> EpochPlan: ...

    def rank_steps(self, plan: EpochPlan, rank: int) -> RankSteps: ...

    def refs(self, plan: EpochPlan, slots: np.ndarray) -> list[SampleRef]: ...

    def segment_life_steps(self, world_size: int) -> int | None: ...


class LoaderPlanner:
    """Orders and packs the samples of a loader for any epoch, world size and point of resumption."""

    def __init__(
        self,
        samples: SampleTable,
        costs: np.ndarray,
        keys: list[list[str]],
        shards: list[list[str]],
        batching: PlanSettings,
        composition: Composition | None = None,
        blocks: np.ndarray | None = None,
    ):
        self.samples = samples
        self.costs = costs
        self.keys = keys  # per source, per manifest row
        self.shards = shards
        self.batching = batching
        self.composition = composition
        self.blocks = blocks  # per sample, its segment (the "segments" order)

    def slots(self, seed: int, epoch: int) -> np.ndarray:
        """The sample in each slot of the epoch."""
        if self.composition is None:
            return np.arange(len(self.samples), dtype=np.int64)
        return self.composition(seed, epoch)

    def epoch_plan(self, seed: int, epoch: int, stretches: list[Stretch], world_size: int) -> EpochPlan:
        """The epoch's plan at `world_size`, after the `stretches` already run (see `plan_epoch`);
        its steps hold slot numbers, `plan.slots` maps them to samples."""
        b = self.batching
        slots = self.slots(seed, epoch)
        costs = self.costs[slots]
        if b.shuffle == "segments":
            step_samples = (b.batch_size or 1) * world_size
            order = segment_order(self.blocks[slots], seed, epoch, b.lanes, b.open_segments, step_samples)
        else:
            order = sample_order(self.samples.shard[slots], seed, epoch, b.shuffle, b.shards_per_group)
        plan = plan_epoch(
            order,
            lambda rows, ranks, stretch: self._pack(costs, rows, ranks, stretch, seed, epoch),
            stretches,
            world_size,
        )
        plan.slots = slots
        plan.draw = (seed, epoch)
        return plan

    def rank_steps(self, plan: EpochPlan, rank: int) -> RankSteps:
        """The steps `rank` has left in `plan`; each step's samples are made when it is read."""
        return RankSteps(self, plan, rank)

    def refs(self, plan: EpochPlan, slots: np.ndarray) -> list[SampleRef]:
        """The samples in `slots` of `plan` (built column by column: a step costs microseconds, not a loop of
        lookups per sample)."""
        table = self.samples
        index = np.asarray(plan.slots, dtype=np.int64)[slots]
        episode, source = table.episode[index], table.source[index]
        seed, epoch = plan.draw
        return [
            SampleRef(i, e, self.keys[src][e], self.shards[src][e], start, end, chunk, cost, src, (seed, epoch, slot))
            for i, e, src, start, end, chunk, cost, slot in zip(
                index.tolist(),
                episode.tolist(),
                source.tolist(),
                table.start[index].tolist(),
                table.end[index].tolist(),
                table.chunk[index].tolist(),
                self.costs[index].astype(np.int64).tolist(),
                np.asarray(slots).tolist(),
            )
        ]

    def segment_life_steps(self, world_size: int) -> int | None:
        """How many of its lane's steps a segment stays open in the "segments" order (None in the others)."""
        b = self.batching
        if b.shuffle != "segments" or self.blocks is None or not b.batch_size:
            return None
        return segment_life_steps(self.blocks, b.open_segments, b.batch_size * world_size)

    def _pack(self, costs: np.ndarray, order: np.ndarray, ranks: int, stretch: int, seed: int, epoch: int):
        if stretch:
            seed = int(np.random.SeedSequence([seed, stretch]).generate_state(1)[0])
        b = self.batching
        if b.batch_tokens is not None:
            config = PackingConfig(b.batch_tokens, ranks, b.shuffle_window, balance=b.balance, long="drop")
            return plan_packing(costs, config, seed, epoch, order)
        boundaries = np.unique(np.ceil(np.quantile(self.costs, np.linspace(0, 1, 9)[1:]))).astype(np.int64)
        max_len = int(self.costs.max())
        return plan_padded(
            costs,
            b.batch_size,
            boundaries,
            ranks,
            seed,
            epoch,
            b.shuffle_window,
            max_len,
            order,
            b.shuffle in ("none", "segments"),
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

    def __getitem__(self, position: int) -> tuple[int, list[SampleRef]]:
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
