"""Every order is a map from position to sample evaluated position by position: "none" the identity, "global" a keyed
permutation, "locality" a keyed permutation of shard runs taken in groups and of the samples within each group; one
planner deals or packs them all, reads every sample once an epoch, and resumes exactly at any world size."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import mmdata
from mmdata.planning.orders import (
    EpisodeBlockOrder,
    GlobalOrder,
    IdentityOrder,
    LocalityOrder,
    OrderRecipe,
    episode_blocks,
    shard_run_starts,
)
from mmdata.planning.planner import PlannedSource, Planner, PlanSettings, Stretch
from mmdata.planning.sample_index import SampleIndex
from tests.test_block_order import assert_stretches_consume_the_epoch_once, manifest, rank_samples

ACTIONS = mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()})
LOWDIM = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(offsets=[0.0]), "action": mmdata.Values()})


def recipe_for(mode: str, table: pa.Table, index: SampleIndex, shards_per_group: int = 2) -> OrderRecipe:
    if mode != "locality":
        return OrderRecipe(mode, block=3, open_blocks=2)
    shards = np.asarray(table.column("shard").to_pylist())
    return OrderRecipe(mode, run_starts=shard_run_starts(shards, index.firsts), shards_per_group=shards_per_group)


def single_planner(mode: str, durations: list[float], batch: int | None = 4, tokens: int | None = None) -> Planner:
    table = manifest(durations)
    spec = ACTIONS if tokens is None else mmdata.Sequences(fps=10, max_seconds=1.0, streams={"action": mmdata.Values()})
    index = SampleIndex(table, spec, None, None)
    settings = PlanSettings(tokens, batch if tokens is None else None, shuffle=mode, lanes=2, shuffle_window=64)
    return Planner([PlannedSource(index, table.column("shard"), recipe_for(mode, table, index))], settings)


@pytest.mark.parametrize("count", [1, 2, 7, 100, 1031])
def test_the_global_and_identity_orders_hold_every_sample_once(count):
    positions = np.arange(count)
    assert IdentityOrder(count).samples_at(positions).tolist() == list(range(count))
    shuffled = GlobalOrder(count, seed=4, epoch=2).samples_at(positions)
    assert sorted(shuffled.tolist()) == list(range(count))
    assert np.array_equal(shuffled, GlobalOrder(count, seed=4, epoch=2).samples_at(positions))
    if count > 10:
        assert not np.array_equal(shuffled, GlobalOrder(count, seed=4, epoch=3).samples_at(positions))


def test_the_locality_order_reads_a_group_of_shards_before_the_next_and_shuffles_within_it():
    runs = np.arange(0, 200, 10)  # 20 shards of 10 samples
    order = LocalityOrder(200, runs, shards_per_group=4, seed=1, epoch=0)
    samples = order.samples_at(np.arange(200))
    assert sorted(samples.tolist()) == list(range(200))
    for group in samples.reshape(5, 40):  # each 40 positions: the samples of exactly 4 shards
        assert len(set((group // 10).tolist())) == 4
        assert not np.array_equal(group, np.sort(group))
    again = LocalityOrder(200, runs, shards_per_group=4, seed=1, epoch=0).samples_at(np.arange(200))
    assert np.array_equal(samples, again)
    assert not np.array_equal(samples, LocalityOrder(200, runs, 4, seed=1, epoch=1).samples_at(np.arange(200)))


def test_a_locality_order_of_uneven_runs_evaluated_at_scattered_positions_agrees_with_the_whole():
    runs = np.array([0, 3, 4, 50, 51, 90])
    order = LocalityOrder(97, runs, shards_per_group=3, seed=8, epoch=5)
    whole = order.samples_at(np.arange(97))
    assert sorted(whole.tolist()) == list(range(97))
    picked = np.array([96, 0, 41, 3, 3, 77])
    assert np.array_equal(order.samples_at(picked), whole[picked])


def test_shard_runs_start_where_the_shard_changes_and_skip_episodes_without_samples():
    shards = np.array(["a", "a", "b", "b", "c", "a"])
    firsts = np.array([0, 5, 5, 9, 9, 12, 15])  # episodes 1 and 3 hold no sample
    assert shard_run_starts(shards, firsts).tolist() == [0, 5, 9, 12]
    assert shard_run_starts(np.array(["a", "b", "c"]), np.array([0, 3, 3, 5])).tolist() == [0, 3]  # b: empty
    assert shard_run_starts(np.array(["a", "b"]), np.array([0, 3, 3])).tolist() == [0]


@pytest.mark.parametrize("mode", ["none", "global", "locality", "blocks"])
@pytest.mark.parametrize("world", [1, 3])
def test_every_order_reads_every_sample_once_an_epoch_leaving_out_fewer_than_the_ranks(mode, world):
    planner = single_planner(mode, [3.3, 0.4, 12.0, 5.05, 7.0, 1.0, 2.2, 9.0])
    plan = planner.epoch_plan(seed=3, epoch=1, stretches=[], world_size=world)
    seen = [n for samples in rank_samples(plan) for n in samples]
    assert len(seen) == len(set(seen)) and len(plan.left_out) < world
    assert sorted(seen + plan.left_out.tolist()) == list(range(planner.slots))


def test_the_none_order_reads_the_samples_in_manifest_and_time_order():
    planner = single_planner("none", [3.3, 0.4, 12.0])
    plan = planner.epoch_plan(seed=3, epoch=0, stretches=[], world_size=1)
    assert [n for samples in rank_samples(plan) for n in samples] == list(range(planner.slots))


@pytest.mark.parametrize("mode", ["none", "global", "locality"])
@pytest.mark.parametrize("worlds", [(4, 3), (2, 5, 1)])
def test_every_order_resumed_at_another_world_size_consumes_the_rest_of_the_epoch_once(mode, worlds):
    assert_stretches_consume_the_epoch_once(single_planner(mode, [3.3, 0.4, 12.0, 5.05, 7.0, 1.0, 9.9]), worlds)


@pytest.mark.parametrize("mode", ["none", "global", "locality"])
def test_every_order_packs_sequences_within_the_budget_each_once(mode):
    planner = single_planner(mode, [3.3, 0.4, 12.0, 5.05, 7.0, 1.0, 2.2, 9.0], tokens=30)
    plan = planner.epoch_plan(seed=3, epoch=0, stretches=[], world_size=2)
    seen = []
    for step in range(len(plan.plan)):
        for rank in range(2):
            slots = plan.plan.micro_batch(step, rank)
            assert planner.slot_costs(plan.plan.order, slots).sum() <= 30
            seen += slots.tolist()
    assert len(seen) == len(set(seen))
    assert sorted(seen + plan.left_out.tolist()) == list(range(planner.slots))


def test_the_planner_of_ten_million_samples_travels_to_a_worker_as_its_episodes_arrays():
    import pickle

    durations = np.full(100_000, 10.0)  # 10^5 episodes of 100 windows
    table = pa.table({"shard": [f"s{i // 100}" for i in range(len(durations))], "duration": durations})
    index = SampleIndex(table, ACTIONS, None, None)
    recipe = OrderRecipe("locality", run_starts=shard_run_starts(np.asarray(table["shard"]), index.firsts))
    planner = Planner(
        [PlannedSource(index, table.column("shard"), recipe)], PlanSettings(None, 256, shuffle="locality")
    )
    assert planner.slots == 10**7
    assert len(pickle.dumps(planner)) < 8 * 1024 * 1024
    plan = planner.epoch_plan(0, 0, [Stretch(8, 100)], 4)
    assert len(planner.refs(plan, plan.plan.micro_batch(0, 3))) == 256


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "global", "locality"])
def test_a_loader_in_every_order_resumes_exactly_and_reads_each_sample_once(stores, mode):
    def build(rank=0, world=1, workers=0):
        return mmdata.DataLoader(
            stores["zarr"],
            LOWDIM,
            batch_size=8,
            shuffle=mode,
            num_workers=workers,
            seed=2,
            runtime=mmdata.Runtime(rank=rank, world_size=world),
        )

    whole = [batch["sample_index"].tolist() for batch in build()]
    assert sorted(i for batch in whole for i in batch) == list(range(len(build().samples)))
    stopped = build(workers=2)
    for step, _ in enumerate(stopped):
        if step == 4:
            break
    state = json.loads(json.dumps(stopped.state_dict()))
    stopped.close()
    resumed = build()
    resumed.load_state_dict(state)
    assert [batch["sample_index"].tolist() for batch in resumed] == whole[5:]


def test_the_blocks_order_by_episode_cuts_blocks_where_episodes_begin_and_spreads_their_remainders():
    firsts = np.array([0, 23, 23, 40, 75])  # episodes of 23, 0, 17 and 35 samples; blocks of 8
    blocks = episode_blocks(firsts, 8)
    assert blocks.whole_firsts.tolist() == [0, 2, 2, 4, 8]
    order = EpisodeBlockOrder(blocks, 2, seed=3, epoch=0)
    samples = order.samples_at(np.arange(75))
    assert sorted(samples.tolist()) == list(range(75))
    whole_blocks = {(0, 8), (8, 16), (23, 31), (31, 39), (40, 48), (48, 56), (56, 64), (64, 72)}
    remainders = set(range(16, 23)) | {39} | set(range(72, 75))
    in_blocks = [int(s) for s in samples if int(s) not in remainders]
    for first, end in whole_blocks:  # each whole block's samples come in time order
        mine = [s for s in in_blocks if first <= s < end]
        assert mine == list(range(first, end))
    for episode_rest in (list(range(16, 23)), [39], list(range(72, 75))):  # an episode's together, in time order
        assert [int(s) for s in samples if int(s) in episode_rest] == episode_rest
    positions = [int(p) for p, s in enumerate(samples.tolist()) if s in remainders]
    assert positions[0] < 20 and positions[-1] > 55, "the remainders are spread over the epoch, not left at its end"
    assert not np.array_equal(samples, EpisodeBlockOrder(blocks, 2, seed=3, epoch=1).samples_at(np.arange(75)))
