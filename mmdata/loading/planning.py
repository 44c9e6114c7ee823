"""The plan side of a loader: its samples and their token costs, and how an epoch is ordered,
packed and split into one rank's steps. A pure function of (seed, epoch, stretches, world size),
small enough to hand to worker processes, which plan the epochs after the first themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mmdata.loading.read import SampleRef
from mmdata.loading.samples import SampleTable
from mmdata.packing import PackingConfig, plan_packing, plan_padded
from mmdata.sharding.epoch_plan import EpochPlan, Stretch, plan_epoch
from mmdata.sharding.order import Shuffle, sample_order

RankSteps = list[tuple[int, list[SampleRef]]]


@dataclass(frozen=True)
class Batching:
    """How samples become micro-batches: a token budget (`batch_tokens`) or a sample count (`batch_size`)."""

    batch_tokens: int | None
    batch_size: int | None
    balance: Literal["tokens", "attention"] = "tokens"
    shuffle: Shuffle = "locality"
    shuffle_window: int = 8192
    shards_per_group: int = 8


class LoaderPlanner:
    """Orders and packs the samples of a loader for any epoch, world size and point of resumption."""

    def __init__(self, samples: SampleTable, costs: np.ndarray, keys: list[str], shards: list[str], batching: Batching):
        self.samples = samples
        self.costs = costs
        self.keys = keys
        self.shards = shards
        self.batching = batching

    def epoch_plan(self, seed: int, epoch: int, stretches: list[Stretch], world_size: int) -> EpochPlan:
        """The epoch's plan at `world_size`, after the `stretches` already run (see `plan_epoch`)."""
        b = self.batching
        order = sample_order(self.samples.shard, seed, epoch, b.shuffle, b.shards_per_group)
        return plan_epoch(
            order, lambda rows, ranks, stretch: self._pack(rows, ranks, stretch, seed, epoch), stretches, world_size
        )

    def rank_steps(self, plan: EpochPlan, rank: int) -> RankSteps:
        """(epoch step number, samples) of each step `rank` has left in `plan`."""
        return [(step, self.refs(samples)) for step, samples in plan.rank_steps(rank)]

    def refs(self, samples: np.ndarray) -> list[SampleRef]:
        table = self.samples
        refs = []
        for index in samples.tolist():
            episode = int(table.episode[index])
            refs.append(
                SampleRef(
                    index,
                    episode,
                    self.keys[episode],
                    self.shards[episode],
                    float(table.start[index]),
                    float(table.end[index]),
                    int(table.chunk[index]),
                    int(self.costs[index]),
                )
            )
        return refs

    def _pack(self, order: np.ndarray, ranks: int, stretch: int, seed: int, epoch: int):
        if stretch:
            seed = int(np.random.SeedSequence([seed, stretch]).generate_state(1)[0])
        b = self.batching
        if b.batch_tokens is not None:
            config = PackingConfig(b.batch_tokens, ranks, b.shuffle_window, balance=b.balance, long="drop")
            return plan_packing(self.costs, config, seed, epoch, order)
        boundaries = np.unique(np.ceil(np.quantile(self.costs, np.linspace(0, 1, 9)[1:]))).astype(np.int64)
        max_len = int(self.costs.max())
        return plan_padded(self.costs, b.batch_size, boundaries, ranks, seed, epoch, b.shuffle_window, max_len, order)
