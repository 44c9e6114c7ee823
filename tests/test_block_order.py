"""The "blocks" order: a keyed permutation evaluated pointwise, blocks of samples dealt in turn, each rank reading
its own runs of positions, a sample index without a row per sample, and plans that resume exactly and at another
world size, planned per rank in the memory of its own steps."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

import mmdata
from mmdata.errors import ResumeError
from mmdata.planning import sample_index as sample_index_module
from mmdata.planning.lanes import LaneLayout
from mmdata.planning.orders import BlockOrder, KeyedPermutation, OrderRecipe
from mmdata.planning.planner import EpochPlan, PlannedSource, Planner, PlanSettings, RankSteps, Stretch
from mmdata.planning.sample_index import SampleIndex
from tests.sample_oracle import enumerate_samples

CAMERA_WINDOWS = mmdata.Windows(
    anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "action": mmdata.Values(offsets=[0.0])}
)


def manifest(durations: list[float]) -> pa.Table:
    """A manifest's planning columns: what a sample index and a block planner read."""
    count = len(durations)
    return pa.table(
        {
            "episode_index": np.arange(count),
            "key": [f"episode_{i:07d}" for i in range(count)],
            "shard": [f"shard-{i // 4:05d}.tar" for i in range(count)],
            "duration": np.asarray(durations, np.float64),
        }
    )


def planner(
    table: pa.Table, spec, batch: int, lanes: int = 2, open_blocks: int = 4, block: int = 5, drop_last: bool = False
) -> Planner:
    settings = PlanSettings(None, batch, shuffle="blocks", lanes=lanes, open_segments=open_blocks, drop_last=drop_last)
    index = SampleIndex(table, spec, None, None)
    recipe = OrderRecipe("blocks", block=block, open_blocks=open_blocks)
    return Planner([PlannedSource(index, table.column("shard"), recipe)], settings)


def assert_numbers_alike(index: SampleIndex, enumerated, tokens_per) -> None:
    """The index numbers the samples as the oracle enumerates them: each one's episode, chunk, span and cost."""
    numbers = np.arange(len(index))
    assert len(index) == len(enumerated)
    episodes, chunks = index.episodes_of(numbers)
    starts, ends = index.spans_of(numbers)
    assert np.array_equal(episodes, enumerated.episode) and np.array_equal(chunks, enumerated.chunk)
    assert np.allclose(starts, enumerated.start) and np.allclose(ends, enumerated.end)
    assert np.array_equal(index.costs_of(numbers), enumerated.costs(tokens_per))


def rank_samples(plan, steps=None) -> list[list[int]]:
    """Per rank, the sample numbers of its steps (the first `steps`, or all), in order."""
    taken = len(plan.plan) if steps is None else steps
    return [
        [n for step in range(plan.resume_step, taken) for n in plan.plan.micro_batch(step, rank).tolist()]
        for rank in range(plan.world_size)
    ]


def run_stretches(blocks: Planner, worlds: tuple[int, ...]) -> tuple[list[int], EpochPlan]:
    """A third of what is left run at each of `worlds` but the last: the slots those stretches read, and the plan of
    the rest of the epoch at the last world size."""
    stretches: list[Stretch] = []
    seen: list[int] = []
    for world in worlds[:-1]:
        plan = blocks.epoch_plan(4, 0, stretches, world)
        taken = plan.resume_step + (len(plan.plan) - plan.resume_step) // 3
        seen += [n for samples in rank_samples(plan, taken) for n in samples]
        stretches = [*plan.stretches[:-1], Stretch(world, taken)]
    return seen, blocks.epoch_plan(4, 0, stretches, worlds[-1])


def assert_rest_read_once(blocks: Planner, seen: list[int], last: EpochPlan) -> None:
    """With what the stretches before read (`seen`), `last` reads every slot of the epoch once or leaves it out."""
    seen = seen + [n for samples in rank_samples(last) for n in samples]
    assert len(seen) == len(set(seen))
    assert sorted(seen + last.left_out.tolist()) == list(range(blocks.slots))


def assert_stretches_consume_the_epoch_once(blocks: Planner, worlds: tuple[int, ...]) -> None:
    """A third of what is left run at each of `worlds` but the last, which runs the rest: every slot of the epoch
    is read once or left out."""
    seen, last = run_stretches(blocks, worlds)
    assert last.samples_before == len(seen)
    assert_rest_read_once(blocks, seen, last)


def first_step_resumed_at_half_the_world(blocks: Planner) -> tuple[EpochPlan, RankSteps, int]:
    """The epoch's plan for the last rank of 512 after 1,000 steps at 1,024, that rank's steps and the peak memory
    (tracemalloc) of planning them and making the first."""
    tracemalloc.start()
    plan = blocks.epoch_plan(1, 3, [Stretch(1024, 1000)], 512)
    steps = blocks.rank_steps(plan, 511)
    steps[0]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return plan, steps, peak


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 16, 17, 255, 1000, 4097])
def test_a_keyed_permutation_is_a_bijection_of_its_range_at_every_size(size):
    permutation = KeyedPermutation(size, key=12345)
    assert sorted(permutation(np.arange(size)).tolist()) == list(range(size))


def test_a_keyed_permutation_is_the_same_for_the_same_key_and_another_for_another():
    points = np.arange(1000)
    assert np.array_equal(KeyedPermutation(1000, 7)(points), KeyedPermutation(1000, 7)(points))
    assert not np.array_equal(KeyedPermutation(1000, 7)(points), KeyedPermutation(1000, 8)(points))
    assert KeyedPermutation(10**12, 3)(np.array([10**12 - 1]))[0] < 10**12
    with pytest.raises(IndexError):
        KeyedPermutation(10, 1)(np.array([10]))


def test_a_keyed_permutation_looks_random_to_a_neighbour_and_a_rank_test():
    values = KeyedPermutation(100_000, 99)(np.arange(100_000)).astype(np.float64)
    assert abs(np.corrcoef(np.arange(100_000), values)[0, 1]) < 0.02
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 0.02


@pytest.mark.parametrize(
    ("count", "block", "open_blocks"), [(1, 5, 4), (19, 5, 4), (40, 5, 4), (1234, 7, 8), (100, 1, 1)]
)
def test_the_block_order_holds_every_sample_once(count, block, open_blocks):
    order = BlockOrder(count, block, open_blocks, seed=3, epoch=1)
    assert sorted(order.samples_at(np.arange(count)).tolist()) == list(range(count))


def test_a_group_of_the_block_order_deals_one_sample_from_each_of_its_runs_of_consecutive_samples_in_turn():
    block, open_blocks = 6, 4
    order = BlockOrder(10 * block * open_blocks, block, open_blocks, seed=5, epoch=0)
    group = order.samples_at(np.arange(block * open_blocks)).reshape(block, open_blocks)  # [turn, block]
    for column in group.T:  # each block: consecutive samples (the order turns them by an offset, modulo count)
        assert np.all(np.diff(column) % order.count == 1)
    assert len({int(column[0]) // 1 for column in group.T}) == open_blocks


@pytest.mark.parametrize("cuts", [[0, 130, 260, 333], [0, 333], [0, 50, 333]])
def test_the_block_order_deals_within_each_run_of_its_cuts_every_sample_once(cuts):
    order = BlockOrder(333, 5, 4, seed=2, epoch=0, turned=False, cuts=np.array(cuts))
    samples = order.samples_at(np.arange(333))
    assert sorted(samples.tolist()) == list(range(333))
    if min(np.diff(cuts)) >= 5 * 4:  # each block's samples lie in one run, but the one a cut falls in
        run_of = np.searchsorted(cuts, np.arange(333), side="right") - 1
        runs_per_block = [len(set(run_of[samples // 5 == number].tolist())) for number in range(333 // 5)]
        assert sum(count > 1 for count in runs_per_block) <= len(cuts) - 2
    else:  # a run shorter than a group: the epoch is dealt as one run
        assert np.array_equal(samples, BlockOrder(333, 5, 4, seed=2, epoch=0, turned=False).samples_at(np.arange(333)))


def test_a_short_last_group_of_a_run_still_mixes_its_blocks():
    order = BlockOrder(100, 10, 8, seed=1, epoch=0, turned=False)  # 100 positions: one group of 80, then 20
    tail = order.samples_at(np.arange(80, 100)) // 10
    assert len(set(tail[:4].tolist())) == 2, "the last 20 positions deal from its two runs of about a block in turn"


def test_the_block_order_changes_with_the_epoch_and_the_seed_only():
    positions = np.arange(500)
    first = BlockOrder(500, 5, 4, seed=1, epoch=0).samples_at(positions)
    assert np.array_equal(first, BlockOrder(500, 5, 4, seed=1, epoch=0).samples_at(positions))
    assert not np.array_equal(first, BlockOrder(500, 5, 4, seed=1, epoch=1).samples_at(positions))
    assert not np.array_equal(first, BlockOrder(500, 5, 4, seed=2, epoch=0).samples_at(positions))


def test_a_lane_layout_gives_each_rank_a_run_of_positions_and_its_steps_take_the_runs_lanes_in_turn():
    layout = LaneLayout(count=103, world=2, batch=4, lanes=3)
    assert layout.steps == 13
    rank_one = np.concatenate([layout.positions(step, 1) for step in range(layout.whole_steps)])
    assert sorted(rank_one.tolist()) == list(range(48, 96))
    assert layout.positions(0, 0).tolist() == [0, 1, 2, 3]
    assert layout.positions(1, 0).tolist() == [16, 17, 18, 19]  # lane 1 starts after lane 0's 4 steps
    assert layout.positions(3, 0).tolist() == [4, 5, 6, 7]  # lane 0's second step
    assert layout.left_over().tolist() == [] and layout.whole_steps == 12
    short = LaneLayout(count=103, world=2, batch=4, lanes=3, keep_last=True)
    assert short.steps == 13 and short.positions(12, 0).tolist() == [96, 97, 98, 99]
    assert short.positions(12, 1).tolist() == [100, 101, 102]
    dropped = LaneLayout(count=103, world=2, batch=4, lanes=3, keep_last=False)
    assert dropped.steps == 12 and dropped.left_over().tolist() == list(range(96, 103))


def test_what_a_stretch_consumed_leaves_the_rest_numbered_afresh_in_order():
    layout = LaneLayout(count=103, world=2, batch=4, lanes=3)
    consumed = layout.consumed(steps=5)
    taken = {int(p) for step in range(5) for rank in range(2) for p in layout.positions(step, rank)}
    rest = consumed.earlier(np.arange(103 - consumed.total))
    assert consumed.total == len(taken) == 40
    assert rest.tolist() == sorted(set(range(103)) - taken)
    everything = layout.consumed(steps=13)
    assert everything.total == 103 and len(everything.earlier(np.arange(0))) == 0
    with pytest.raises(ResumeError, match="another run"):
        layout.consumed(steps=14)


def test_the_sample_index_numbers_windows_as_a_plain_enumeration_does():
    table = manifest([0.0, 0.05, 1.0, 2.34, 7.5])
    spec = mmdata.Windows(anchor_fps=7.5, streams={"action": mmdata.Values(offsets=[0.0, 0.1])})
    rows = np.arange(table.num_rows)
    enumerated = enumerate_samples(table, spec, rows)
    assert_numbers_alike(SampleIndex(table, spec, None, None), enumerated, None)


@pytest.mark.parametrize(("max_seconds", "min_seconds"), [(None, 0.0), (1.0, 0.0), (1.0, 0.5), (0.7, 0.7), (0.3, 0.5)])
def test_the_sample_index_cuts_sequences_as_a_plain_enumeration_does(max_seconds, min_seconds):
    durations = [0.0, 0.2, 0.5, 1.0, 1.4, 2.0, 3.3, 10.01]
    table = manifest(durations)
    spec = mmdata.Sequences(
        fps=7,
        streams={"action": mmdata.Values(), "audio": mmdata.Audio()},
        max_seconds=max_seconds,
        min_seconds=min_seconds,
    )
    rows = np.array([1, 3, 4, 5, 6, 7])
    try:
        enumerated = enumerate_samples(table, spec, rows)
    except mmdata.errors.SpecError:
        with pytest.raises(mmdata.errors.SpecError, match="no sample"):
            SampleIndex(table, spec, rows, None)
        return
    assert_numbers_alike(SampleIndex(table, spec, rows, {"action": 2}), enumerated, {"action": 2})


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_sample_is_in_one_step_of_one_rank_or_left_out_and_ranks_have_equal_steps(world):
    table = manifest([3.3, 0.4, 12.0, 5.05, 7.0, 1.0])
    blocks = planner(table, mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()}), batch=4)
    plan = blocks.epoch_plan(seed=9, epoch=2, stretches=[], world_size=world)
    per_rank = rank_samples(plan)
    assert max(len(samples) for samples in per_rank) - min(len(samples) for samples in per_rank) <= 1
    seen = [n for samples in per_rank for n in samples]
    assert len(seen) == len(set(seen))
    assert sorted(seen + plan.left_out.tolist()) == list(range(blocks.slots))
    assert len(plan.left_out) < world, "only fewer samples than ranks are left out: the last step is shorter"
    assert plan.samples_consumed(3) == 3 * world * 4
    dropped = planner(table, blocks.sources[0].samples.spec, batch=4, drop_last=True).epoch_plan(9, 2, [], world)
    assert all(len(dropped.plan.micro_batch(step, 0)) == 4 for step in range(len(dropped.plan)))
    assert len(dropped.plan) == blocks.slots // (world * 4) and len(dropped.left_out) < world * 4


@pytest.mark.parametrize("worlds", [(4, 3), (2, 5), (3, 2, 4)])
def test_a_resume_at_another_world_size_consumes_the_rest_of_the_epoch_exactly_once(worlds):
    table = manifest([3.3, 0.4, 12.0, 5.05, 7.0, 1.0, 9.9])
    blocks = planner(table, mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()}), batch=3, lanes=3)
    assert_stretches_consume_the_epoch_once(blocks, worlds)


def test_a_resume_at_the_same_world_size_gives_the_same_steps_from_where_it_stopped():
    table = manifest([3.3, 0.4, 12.0, 5.05, 7.0])
    blocks = planner(table, mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()}), batch=4)
    whole = blocks.epoch_plan(1, 0, [], 2)
    resumed = blocks.epoch_plan(1, 0, [Stretch(2, 5)], 2)
    assert resumed.resume_step == 5 and resumed.samples_before == 0
    for step in range(5, len(whole.plan)):
        for rank in range(2):
            assert np.array_equal(resumed.plan.micro_batch(step, rank), whole.plan.micro_batch(step, rank))
    steps = blocks.rank_steps(resumed, 1)
    assert steps[0][0] == 5 and [s.index for s in steps[0][1]] == whole.plan.micro_batch(5, 1).tolist()


def test_a_block_stays_with_one_lane_of_one_rank_but_where_lanes_meet():
    table = manifest([40.0] * 20)  # 8,000 samples: blocks of 5, 4 open, 2 ranks x 2 lanes
    blocks = planner(table, mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()}), batch=4)
    plan = blocks.epoch_plan(2, 0, [], 2)
    turn, count = plan.plan.order._turn, blocks.slots  # (a block is 5 consecutive numbers from the epoch's turn)
    owner: dict[int, set] = {}
    for step in range(len(plan.plan)):
        for rank in range(2):
            for n in plan.plan.micro_batch(step, rank).tolist():
                owner.setdefault((n - turn) % count // 5, set()).add((rank, step % 2))
    # the order deals within each rank's lanes: a block is cut only where two lanes meet (and a lane's last group)
    shared = sum(len(lanes) > 1 for lanes in owner.values())
    assert shared <= 2 * 2 * 2 + 1, shared


def test_planning_a_billion_samples_costs_a_rank_the_memory_of_its_first_step_not_of_the_epoch():
    durations = np.full(1_000_000, 100.0)  # a million episodes of 1,000 windows
    table = pa.table({"key": pa.array(["k"] * 1), "shard": pa.array(["s"] * 1), "duration": pa.array([1.0])})
    del table
    big = pa.table(
        {
            "key": pa.DictionaryArray.from_arrays(np.zeros(len(durations), np.int32), ["episode"]).cast(pa.string()),
            "shard": pa.DictionaryArray.from_arrays(np.zeros(len(durations), np.int32), ["shard"]).cast(pa.string()),
            "duration": durations,
        }
    )
    blocks = planner(
        big, mmdata.Windows(anchor_fps=10, streams={"action": mmdata.Values()}), batch=8, lanes=8, block=32
    )
    assert blocks.slots == 10**9
    _, steps, peak = first_step_resumed_at_half_the_world(blocks)
    first = steps[0][1]
    assert len(first) == 8 and len(steps) == -(-(10**9 - 1000 * 1024 * 8) // (512 * 8))  # the last step shorter
    assert peak < 16 * 1024 * 1024, f"planning took {peak / 1e6:.0f} MB"


@pytest.mark.slow
def test_a_loader_in_the_blocks_order_reads_every_sample_once_per_epoch_with_workers_and_decodes_a_frame_about_once(
    stores,
):
    loader = mmdata.DataLoader(stores["wds"], CAMERA_WINDOWS, batch_size=4, shuffle="blocks", num_workers=2, seed=3)
    assert loader.shuffle == "blocks"
    plan = loader.epoch_plan()
    seen = [i for batch in loader for i in batch["sample_index"].tolist()]
    assert len(seen) == len(set(seen))
    assert sorted(seen + plan.left_out.tolist()) == list(range(len(loader.samples)))
    alone = mmdata.DataLoader(stores["wds"], CAMERA_WINDOWS, batch_size=4, shuffle="blocks", seed=3, num_workers=0)
    for _ in range(2):  # (a run's first read plans 2 steps ahead, for a sooner first batch: its segments' frames
        for _ in alone:  # the later steps need are decoded again, once a run, a large share of this small epoch)
            pass
    assert alone.stats()["decode_waste"] < 1.2


@pytest.mark.slow
def test_a_loader_in_the_blocks_order_resumes_exactly_and_at_another_world_size(stores):
    def build(rank=0, world=1):
        return mmdata.DataLoader(
            stores["zarr"],
            CAMERA_WINDOWS,
            batch_size=2,
            shuffle="blocks",
            seed=5,
            shuffling=mmdata.Shuffling(lanes=2),
            runtime=mmdata.Runtime(rank=rank, world_size=world),
            num_workers=0,
        )

    uninterrupted = [batch["sample_index"].tolist() for batch in build()]
    interrupted = build()
    for step, _ in enumerate(interrupted):
        if step + 1 == 7:
            break
    state = json.loads(json.dumps(interrupted.state_dict()))
    resumed = build()
    resumed.load_state_dict(state)
    assert [batch["sample_index"].tolist() for batch in resumed] == uninterrupted[7:]
    wider = [build(rank, 3) for rank in range(3)]
    for loader in wider:
        loader.load_state_dict(state)
    left_out = wider[0].epoch_plan().left_out.tolist()
    rest = [[i for batch in loader for i in batch["sample_index"].tolist()] for loader in wider]
    seen = [i for batch in uninterrupted[:7] for i in batch] + [i for samples in rest for i in samples]
    assert len({len(samples) for samples in rest}) == 1
    assert len(seen) == len(set(seen))
    assert sorted(seen + left_out) == list(range(len(wider[0].samples)))


@pytest.mark.slow
def test_a_state_saved_in_another_order_is_refused_by_the_blocks_order(stores):
    segments = mmdata.DataLoader(stores["wds"], CAMERA_WINDOWS, batch_size=4, shuffle="locality", num_workers=0)
    next(iter(segments))
    blocks = mmdata.DataLoader(stores["wds"], CAMERA_WINDOWS, batch_size=4, shuffle="blocks", num_workers=0)
    with pytest.raises(ResumeError):
        blocks.load_state_dict(segments.state_dict())


@pytest.mark.slow
def test_a_token_budget_over_windows_in_the_blocks_order_holds_as_many_windows_as_fit(stores):
    def indices(**batch) -> list[list[int]]:
        loader = mmdata.DataLoader(stores["zarr"], CAMERA_WINDOWS, shuffle="blocks", seed=2, num_workers=0, **batch)
        assert loader.shuffle == "blocks"
        return [batch["sample_index"].tolist() for batch in loader]

    # a window costs 2 camera frames x 3 + 1 action = 7 tokens: 50 tokens hold 7 windows
    budget = mmdata.Batching(batch_tokens=50, tokens_per={"cam_high": 3})
    assert indices(batching=budget) == indices(batch_size=7)
    with pytest.raises(mmdata.SpecError, match="costliest sample takes 7 tokens"):
        indices(batching=mmdata.Batching(batch_tokens=6, tokens_per={"cam_high": 3}))


@pytest.mark.slow
def test_sequences_of_some_episodes_in_the_blocks_order_are_each_read_once(stores):
    spec = mmdata.Sequences(fps=10, streams={"action": mmdata.Values()}, max_seconds=0.5)
    loader = mmdata.DataLoader(
        stores["zarr"],
        spec,
        batch_size=2,
        shuffle="blocks",
        episodes=mmdata.Episodes(ids=[0, 2]),
        seed=1,
        num_workers=0,
    )
    table = mmdata.open_dataset(stores["zarr"]).store.table
    expected = enumerate_samples(table, spec, np.array([0, 2]))
    plan = loader.epoch_plan()
    seen = [(e, round(t, 6)) for b in loader for e, t in zip(b["episode_index"].tolist(), b["time"].tolist())]
    left_out = [(int(expected.episode[n]), round(float(expected.start[n]), 6)) for n in plan.left_out.tolist()]
    assert len(seen) == len(set(seen)) and {e for e, _ in seen} == {0, 2}
    assert sorted(seen + left_out) == sorted(zip(expected.episode.tolist(), np.round(expected.start, 6).tolist()))


@pytest.mark.slow
def test_the_decode_floor_of_a_loader_in_the_blocks_order_is_measured(stores):
    from mmdata.measure.floor import decode_floor

    loader = mmdata.DataLoader(stores["wds"], CAMERA_WINDOWS, batch_size=4, shuffle="blocks", num_workers=0)
    floor = decode_floor(loader, range(0, len(loader.samples), 5))
    assert floor is not None and floor.frames > 0 and floor.samples == len(range(0, len(loader.samples), 5))


def test_the_sample_index_counts_and_costs_alike_whatever_the_episodes_worked_on_at_once(monkeypatch):
    table = manifest(np.random.default_rng(3).lognormal(1.0, 1.0, 257).tolist())
    spec = mmdata.Sequences(fps=10, max_seconds=2.0, min_seconds=0.5, streams={"action": mmdata.Values()})
    whole = SampleIndex(table, spec, None, None)
    firsts, mean, most = whole.firsts, whole.mean_cost(), whole.max_cost()
    monkeypatch.setattr(sample_index_module, "_COUNTED_AT_ONCE", 10)
    chunked = SampleIndex(table, spec, None, None)
    assert np.array_equal(firsts, chunked.firsts)
    costs = enumerate_samples(table, spec, np.arange(len(table))).costs(None)
    assert chunked.max_cost() == most == costs.max()
    assert chunked.mean_cost() == pytest.approx(mean) == pytest.approx(costs.mean())
