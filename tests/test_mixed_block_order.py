"""Mixtures in the "blocks" order: sources spread evenly over the epoch, each read in its own blocks pass by pass,
every slot in one step of one rank, resumed exactly and at another world size, planned per rank in the memory of
its steps, and loaders that deliver each source its share."""

from __future__ import annotations

import collections
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import mmdata
from mmdata.errors import OptionError
from mmdata.planning.mixed_order import MixedOrder
from mmdata.planning.orders import MAX_MIXED_SLOTS, OrderRecipe, SourceInterleave
from mmdata.planning.planner import PlannedSource, Planner, PlanSettings
from mmdata.planning.sample_index import SampleIndex
from tests.sample_oracle import enumerate_samples
from tests.test_block_order import (
    assert_stretches_consume_the_epoch_once,
    first_step_resumed_at_half_the_world,
    rank_samples,
)

ACTIONS = mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()})
LOWDIM = mmdata.Windows(anchor_fps=30, streams={"state": mmdata.Values(offsets=[0.0]), "action": mmdata.Values()})


def manifest(durations: list[float]) -> pa.Table:
    count = len(durations)
    return pa.table(
        {
            "key": [f"episode_{i:07d}" for i in range(count)],
            "shard": [f"shard-{i // 4:05d}.tar" for i in range(count)],
            "duration": np.asarray(durations, np.float64),
        }
    )


def blocks_of(block: int, open_blocks: int = 3) -> OrderRecipe:
    return OrderRecipe("blocks", block=block, open_blocks=open_blocks)


def mixed_planner(durations: list[list[float]], targets: list[int], batch: int, lanes: int = 2) -> Planner:
    settings = PlanSettings(None, batch, shuffle="blocks", lanes=lanes, open_segments=3)
    tables = [manifest(d) for d in durations]
    sources = [PlannedSource(SampleIndex(t, ACTIONS, None, None), t.column("shard"), blocks_of(4)) for t in tables]
    return Planner(sources, settings, np.asarray(targets, np.int64))


@pytest.mark.parametrize("targets", [(5, 3, 2), (1, 0, 1, 1000), (333, 1, 77, 5000, 2), (7,)])
def test_an_interleave_gives_each_source_its_slots_in_order_and_spreads_them_evenly(targets):
    total = sum(targets)
    source, slot = SourceInterleave(targets).place(np.arange(total))
    assert np.array_equal(np.bincount(source, minlength=len(targets)), targets)
    for number in range(len(targets)):
        assert np.array_equal(slot[source == number], np.arange(targets[number]))
    for length in (n for n in (7, 50, 300) if n <= total):
        for start in range(0, total - length + 1, 5):
            counts = np.bincount(source[start : start + length], minlength=len(targets))
            assert np.abs(counts - length * np.asarray(targets) / total).max() < len(targets)


@pytest.mark.parametrize("targets", [(5, 3, 2), (1, 0, 1, 1000), (333, 1, 77, 5000, 2)])
def test_an_interleave_counts_each_sources_slots_before_any_position_as_placing_them_does(targets):
    total = sum(targets)
    source, _ = SourceInterleave(targets).place(np.arange(total))
    positions = np.array([0, 1, total // 3, total // 2, total - 1, total])
    counted = SourceInterleave(targets).counts_before(positions)
    for row, position in zip(counted, positions.tolist()):
        assert row.tolist() == np.bincount(source[:position], minlength=len(targets)).tolist()


def test_a_mixtures_sources_deal_their_blocks_within_the_lanes_of_the_steps_that_read_them():
    planner = mixed_planner([[40.0] * 30, [40.0] * 20], [900, 400], batch=4, lanes=4)  # blocks of 4, 3 open
    plan = planner.epoch_plan(5, 0, [], 2)
    order = plan.plan.order
    owner: dict[tuple[int, int, int], set] = {}
    read = []
    for step in range(len(plan.plan)):
        for rank in range(2):
            slots = plan.plan.micro_batch(step, rank)
            read += slots.tolist()
            sources, samples = order.sources_of(slots)
            passes = (slots - order._firsts[sources]) // np.asarray(order.counts)[sources]
            for source, sample, number in zip(sources.tolist(), samples.tolist(), passes.tolist()):
                turn = order._pass(source, number)._turn  # (a block: 4 consecutive samples from the pass's turn)
                owner.setdefault((source, number, (sample - turn) // 4), set()).add((rank, step % 4))
    assert sorted(read + plan.left_out.tolist()) == list(range(1300))
    shared = sum(len(lanes) > 1 for lanes in owner.values())
    cuts = len(plan.plan.layout.cuts()) - 2  # (where two lanes meet: a block of each source cut there at most)
    assert shared <= 2 * cuts, f"{shared} blocks read by two lanes"


def test_an_interleave_of_more_slots_than_its_arithmetic_holds_is_refused_naming_epoch_samples():
    with pytest.raises(OptionError, match="epoch_samples"):
        SourceInterleave((MAX_MIXED_SLOTS, 1))
    big = SourceInterleave((MAX_MIXED_SLOTS // 2, MAX_MIXED_SLOTS // 2))
    source, slot = big.place(np.array([0, 1, MAX_MIXED_SLOTS - 2, MAX_MIXED_SLOTS - 1]))
    half = MAX_MIXED_SLOTS // 2
    assert source.tolist() == [1, 0, 1, 0] and slot.tolist() == [0, 0, half - 1, half - 1]


def test_a_mixed_order_reads_each_sample_once_per_pass_and_a_random_subset_in_the_last():
    order = MixedOrder(counts=(10, 100), targets=(25, 40), recipes=(blocks_of(2), blocks_of(4)), seed=3, epoch=0)
    slots = order.samples_at(np.arange(order.count))
    assert sorted(slots.tolist()) == list(range(65))
    source, sample = order.sources_of(slots)
    small = collections.Counter(sample[source == 0].tolist())
    assert sorted(small) == list(range(10)) and sorted(set(small.values())) == [2, 3] and small.total() == 25
    large = sample[source == 1]
    assert len(large) == 40 and len(set(large.tolist())) == 40
    ordered = np.sort(large)
    runs = 1 + int(np.sum(np.diff(ordered) != 1)) - int(ordered[0] == 0 and ordered[-1] == 99)
    assert runs <= 40 // 4 + 1, "a source weighed down reads whole blocks of consecutive samples"
    again = MixedOrder(counts=(10, 100), targets=(25, 40), recipes=(blocks_of(2), blocks_of(4)), seed=3, epoch=0)
    assert np.array_equal(again.sources_of(slots)[1], sample)
    other = MixedOrder(counts=(10, 100), targets=(25, 40), recipes=(blocks_of(2), blocks_of(4)), seed=3, epoch=1)
    assert not np.array_equal(other.sources_of(slots)[1], sample)


def test_a_mixed_order_refuses_slots_for_a_source_without_samples():
    with pytest.raises(OptionError, match="no sample"):
        MixedOrder(counts=(10, 0), targets=(5, 5), recipes=(blocks_of(2, 2), blocks_of(2, 2)), seed=0, epoch=0)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_slot_of_a_mixture_is_in_one_step_of_one_rank_or_left_out(world):
    blocks = mixed_planner([[3.3, 0.4, 12.0], [5.05, 7.0, 1.0, 2.2]], [200, 90], batch=4)
    plan = blocks.epoch_plan(seed=9, epoch=2, stretches=[], world_size=world)
    per_rank = rank_samples(plan)
    assert max(len(slots) for slots in per_rank) - min(len(slots) for slots in per_rank) <= 1
    seen = [n for slots in per_rank for n in slots]
    assert len(seen) == len(set(seen))
    assert sorted(seen + plan.left_out.tolist()) == list(range(290))
    refs = blocks.refs(plan, plan.plan.micro_batch(0, 0))
    counts = [len(source.samples) for source in blocks.sources]
    for ref, slot in zip(refs, plan.plan.micro_batch(0, 0).tolist()):
        assert ref.source == (slot >= 200) and ref.draw == (9, 2, slot)
        assert ref.index - (counts[0] if ref.source else 0) < counts[ref.source]


@pytest.mark.parametrize("worlds", [(4, 3), (2, 5), (3, 2, 4)])
def test_a_mixture_resumed_at_another_world_size_consumes_the_rest_of_the_epoch_exactly_once(worlds):
    blocks = mixed_planner([[3.3, 0.4, 12.0, 5.0], [5.05, 7.0, 1.0, 2.2], [9.9]], [300, 120, 61], batch=3, lanes=3)
    assert blocks.slots == 481
    assert_stretches_consume_the_epoch_once(blocks, worlds)


def test_planning_a_mixture_of_a_billion_slots_costs_a_rank_the_memory_of_its_first_step():
    def big(episodes: int, seconds: float) -> PlannedSource:
        table = pa.table(
            {
                "shard": pa.DictionaryArray.from_arrays(np.zeros(episodes, np.int32), ["s"]).cast(pa.string()),
                "duration": np.full(episodes, seconds),
            }
        )
        return PlannedSource(SampleIndex(table, ACTIONS, None, None), table.column("shard"), blocks_of(32, 8))

    settings = PlanSettings(None, 8, shuffle="blocks", lanes=8, open_segments=8)
    targets = np.array([600_000_000, 300_000_000, 100_000_000], np.int64)
    blocks = Planner([big(400_000, 100.0), big(100_000, 100.0), big(1_000, 1000.0)], settings, targets)
    _, steps, peak = first_step_resumed_at_half_the_world(blocks)
    first = steps[0][1]
    assert len(first) == 8 and blocks.slots == 10**9
    assert peak < 16 * 1024 * 1024, f"planning took {peak / 1e6:.0f} MB"


@pytest.mark.parametrize(("max_seconds", "min_seconds"), [(None, 0.0), (1.0, 0.0), (0.7, 0.5), (0.3, 0.0)])
def test_a_sample_index_gives_the_mean_cost_of_its_samples_exactly(max_seconds, min_seconds):
    table = manifest([3.3, 0.4, 12.0, 5.05, 0.05, 2.0])
    spec = mmdata.Sequences(
        fps=10,
        max_seconds=max_seconds,
        min_seconds=min_seconds,
        streams={"action": mmdata.Values(), "audio": mmdata.Audio()},
    )
    tokens_per = {"action": 2, "audio": 100}
    index = SampleIndex(table, spec, None, tokens_per)
    enumerated = enumerate_samples(table, spec, np.arange(table.num_rows))
    assert index.mean_cost() == pytest.approx(enumerated.costs(tokens_per).mean(), rel=1e-12)
    windows = SampleIndex(table, ACTIONS, None, {"action": 3})
    assert windows.mean_cost() == 3.0


def _two_sources(stores, **options) -> mmdata.Mixture:
    return mmdata.Mixture(
        [mmdata.Source(stores["wds"], 3.0, name="wds"), mmdata.Source(stores["zarr"], 1.0, name="zarr")], **options
    )


def _loader(mixture, rank=0, world=1, workers=0, mode="blocks") -> mmdata.DataLoader:
    return mmdata.DataLoader(
        mixture,
        LOWDIM,
        batch_size=8,
        shuffle=mode,
        num_workers=workers,
        seed=7,
        shuffling=mmdata.Shuffling(lanes=2),
        runtime=mmdata.Runtime(rank=rank, world_size=world),
    )


@pytest.mark.slow
def test_a_mixture_in_the_blocks_order_gives_each_source_its_share_in_every_stretch_of_steps(stores):
    loader = _loader(_two_sources(stores, epoch_samples=2000), workers=2)
    assert loader.shuffle == "blocks"
    plan = loader.epoch_plan()
    batches = list(loader)
    slots = [i for b in batches for i in b["sample_index"].tolist()]
    sources = np.concatenate([b["source"].numpy() for b in batches])
    assert len(sources) + len(plan.left_out) == 2000
    assert np.bincount(sources).tolist() == [1500 - (plan.left_out < 1500).sum(), 500 - (plan.left_out >= 1500).sum()]
    per_batch = np.array([np.bincount(b["source"].numpy(), minlength=2)[0] for b in batches])
    assert per_batch.min() >= 5 and per_batch.max() <= 7, "each batch of 8 holds about 6 of the source weighed 3"
    located = loader.samples.locate(batches[0]["sample_index"].numpy())
    assert batches[0]["source"].tolist() == located[0].tolist()
    assert batches[0]["episode_index"].tolist() == located[1].tolist()
    assert np.allclose(batches[0]["time"].numpy(), located[2])
    counts = collections.Counter(zip(sources.tolist(), slots))
    assert max(counts.values()) <= -(-1500 // len(loader.samples.indexes[0])) + 1
    stats = loader.stats()["sources"]
    assert set(stats) == {"wds", "zarr"}


@pytest.mark.slow
def test_a_mixture_in_the_blocks_order_resumes_exactly_and_at_another_world_size(stores):
    mixture = _two_sources(stores, epoch_samples=600)
    whole = [(b["source"].tolist(), b["sample_index"].tolist()) for b in _loader(mixture)]
    stopped = _loader(mixture)
    for step, _ in enumerate(stopped):
        if step + 1 == 9:
            break
    state = json.loads(json.dumps(stopped.state_dict()))
    resumed = _loader(mixture)
    resumed.load_state_dict(state)
    assert [(b["source"].tolist(), b["sample_index"].tolist()) for b in resumed] == whole[9:]
    wider = [_loader(mixture, rank, 3) for rank in range(3)]
    for loader in wider:
        loader.load_state_dict(state)
    plans = [loader.epoch_plan() for loader in wider]
    rest = [
        [slot for step in loader.planner.rank_steps(p, r) for slot in step[1]]
        for r, (loader, p) in enumerate(zip(wider, plans))
    ]
    assert len({len(slots) for slots in rest}) == 1
    taken = [ref.draw[2] for slots in rest for ref in slots]
    before = [slot for step in range(9) for slot in stopped.epoch_plan().plan.micro_batch(step, 0).tolist()]
    assert len(set(before + taken)) == len(before + taken)
    assert sorted(before + taken + plans[0].left_out.tolist()) == list(range(600))


def test_a_mixture_weighed_by_tokens_gets_the_same_slots_in_the_blocks_order_as_in_the_others(stores):
    spec = mmdata.Sequences(fps=30, max_seconds=0.5, streams={"state": mmdata.Values(), "action": mmdata.Values()})
    only_long = mmdata.Episodes(where=pc.field("duration") > 2.5)
    mixture = mmdata.Mixture(
        [
            mmdata.Source(stores["wds"], 1.0, name="all"),
            mmdata.Source(stores["zarr"], 1.0, name="long", episodes=only_long),
        ],
        epoch_samples=500,
        weight_by="tokens",
    )
    options = {"batch_size": 4, "seed": 1}
    blocks = mmdata.DataLoader(mixture, spec, shuffle="blocks", **options)
    locality = mmdata.DataLoader(mixture, spec, shuffle="locality", **options)
    assert blocks.source_targets.tolist() == locality.source_targets.tolist()


def test_a_mixture_source_without_samples_for_the_spec_is_refused_naming_it_in_every_order(stores):
    durations = mmdata.open_dataset(stores["zarr"]).store.columns(["duration"]).column("duration").to_numpy()
    shortest, longest = float(durations.min()), float(durations.max())
    whole_episodes = mmdata.Sequences(fps=30, min_seconds=(shortest + longest) / 2, streams={"action": mmdata.Values()})
    mixture = mmdata.Mixture(
        [
            mmdata.Source(stores["wds"], name="wds"),
            mmdata.Source(stores["zarr"], name="short", episodes=mmdata.Episodes(where=pc.field("duration") < longest)),
        ]
    )
    for mode in ("blocks", "locality"):
        with pytest.raises(mmdata.SpecError, match="source 'short': the spec yields no sample"):
            mmdata.DataLoader(mixture, whole_episodes, batch_size=1, shuffle=mode, num_workers=0)


@pytest.mark.parametrize("mode", ["blocks", "locality", "global", "none"])
def test_a_mixture_epoch_of_hundreds_of_millions_of_slots_is_planned_in_every_order(stores, mode):
    mixture = _two_sources(stores, epoch_samples=(1 << 28) + 1)
    plan = _loader(mixture, mode=mode).epoch_plan()
    assert plan.total_steps == -(-((1 << 28) + 1) // 8) and len(plan.plan.micro_batch(0, 0)) == 8


def test_a_token_budget_over_windows_deals_a_mixture_as_the_count_of_windows_it_holds(stores):
    def slots(**batch) -> list[list[int]]:
        loader = mmdata.DataLoader(
            _two_sources(stores, epoch_samples=300), LOWDIM, shuffle="blocks", num_workers=0, **batch
        )
        return [batch["sample_index"].tolist() for batch in loader]

    # a window is one state and one action value, 2 tokens each: 4 tokens, so 15 hold 3 windows
    budget = mmdata.Batching(batch_tokens=15, tokens_per={"state": 2, "action": 2}, layout="padded")
    assert slots(batching=budget) == slots(batch_size=3)
