"""Token budgets over sequences in the "blocks" order: windows of the order packed each into a fixed number of
micro-batches, the lightest taking the next longest sample, numbered whatever the world size, so that a rank plans
its steps from its own windows, resumes exactly and at another world size, and no micro-batch exceeds the budget."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pytest

import mmdata
from mmdata.errors import ResumeError
from mmdata.planning.orders import OrderRecipe
from mmdata.planning.packed_windows import (
    PackedWindows,
    WindowPacking,
    fewest_bins,
    fit_into_bins,
    plan_window_packing,
)
from mmdata.planning.planner import PlannedSource, Planner, PlanSettings, Stretch
from mmdata.planning.sample_index import SampleIndex
from tests.sample_oracle import enumerate_samples
from tests.test_block_order import (
    assert_rest_read_once,
    first_step_resumed_at_half_the_world,
    rank_samples,
    run_stretches,
)
from tests.test_mixed_block_order import manifest

SEQUENCE_BLOCKS = OrderRecipe("blocks", block=1)  # a sequence is its own block
ACTION_SEQUENCES = mmdata.Sequences(fps=10, max_seconds=4.0, streams={"action": mmdata.Values()})


def packed_planner(durations, budget: int, window: int = 512, spec=ACTION_SEQUENCES, targets=None) -> Planner:
    """A "blocks" planner under a token budget over one store's sequences, or a mixture of stores (`durations`
    a list of lists, with `targets`)."""
    settings = PlanSettings(budget, None, shuffle="blocks", shuffle_window=window)
    groups = durations if targets is not None else [durations]
    sources = []
    for group in groups:
        table = manifest(list(group))
        sources.append(PlannedSource(SampleIndex(table, spec, None, None), table.column("shard"), SEQUENCE_BLOCKS))
    return Planner(sources, settings, None if targets is None else np.asarray(targets, np.int64))


def lognormal_durations(count: int, seed: int = 0) -> list[float]:
    return np.random.default_rng(seed).lognormal(2.0, 0.8, count).tolist()


def test_a_window_fits_exactly_its_micro_batches_at_the_smallest_capacity_that_holds_it():
    lengths = np.random.default_rng(1).integers(1, 40, 500).astype(np.int64)
    bins = fewest_bins(lengths, 100)
    assignment = fit_into_bins(lengths, 100, bins + 5)
    loads = np.bincount(assignment, weights=lengths, minlength=bins + 5)
    assert (assignment >= 0).all() and len(np.unique(assignment)) == bins + 5  # every one placed, none empty
    assert loads.max() <= 100 and loads.max() < 100 * bins / (bins + 5) + lengths.max()
    assert np.array_equal(assignment, fit_into_bins(lengths, 100, bins + 5))


def test_a_window_heavier_than_its_micro_batches_hold_leaves_out_the_lightest_extra_ones():
    lengths = np.full(30, 40, np.int64)  # two a micro-batch of 100: 15 needed
    assignment = fit_into_bins(lengths, 100, 12)
    assert (assignment == -1).sum() == 6 and np.bincount(assignment[assignment >= 0]).tolist() == [2] * 12


def test_a_window_of_few_samples_is_split_to_fill_every_micro_batch():
    lengths = np.array([10, 10, 10, 10, 10, 10], np.int64)  # one micro-batch would hold all six
    assignment = fit_into_bins(lengths, 100, 4)
    assert sorted(np.bincount(assignment).tolist()) == [1, 1, 2, 2]


def test_a_window_packing_refuses_a_budget_or_window_below_one_and_an_unknown_balance():
    with pytest.raises(mmdata.OptionError, match="at least 1"):
        WindowPacking(window=0, bins=1, budget=10)
    with pytest.raises(mmdata.OptionError, match="balance"):
        WindowPacking(window=8, bins=1, budget=10, balance="flops")
    assert WindowPacking(window=100, bins=10, budget=10).bins_in(25) == 3
    assert WindowPacking(window=100, bins=10, budget=10).bins_in(130) == 13


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_sequence_is_in_one_micro_batch_of_one_rank_or_left_out_within_the_budget(world):
    blocks = packed_planner(lognormal_durations(700), budget=300)
    index = blocks.sources[0].samples
    plan = blocks.epoch_plan(seed=3, epoch=1, stretches=[], world_size=world)
    per_rank = rank_samples(plan)
    assert all(len(plan.plan.micro_batch(s, r)) for s in range(len(plan.plan)) for r in range(world))  # none empty
    seen = [n for samples in per_rank for n in samples]
    assert len(seen) == len(set(seen))
    assert sorted(seen + plan.left_out.tolist()) == list(range(blocks.slots))
    loads = [
        int(index.costs_of(plan.plan.micro_batch(s, r)).sum()) for s in range(len(plan.plan)) for r in range(world)
    ]
    assert max(loads) <= 300 and np.mean(loads) > 0.95 * 300
    assert len(plan.left_out) < 0.01 * blocks.slots + world * 300 / index.mean_cost()


def test_the_ranks_of_a_step_carry_nearly_the_same_tokens():
    blocks = packed_planner(lognormal_durations(900, seed=2), budget=400)
    index = blocks.sources[0].samples
    plan = blocks.epoch_plan(seed=1, epoch=0, stretches=[], world_size=4)
    largest = index.max_cost()
    for step in range(len(plan.plan)):
        loads = [int(index.costs_of(plan.plan.micro_batch(step, rank)).sum()) for rank in range(4)]
        assert max(loads) - min(loads) <= largest


def test_the_micro_batches_do_not_depend_on_the_world_size():
    blocks = packed_planner(lognormal_durations(500), budget=250)
    one = blocks.epoch_plan(5, 2, [], 1)
    four = blocks.epoch_plan(5, 2, [], 4)
    assert [one.plan.micro_batch(s, 0).tolist() for s in range(8)] == [
        four.plan.micro_batch(s // 4, s % 4).tolist() for s in range(8)
    ]
    assert one.plan.micro_batch(0, 0).tolist() != blocks.epoch_plan(5, 3, [], 1).plan.micro_batch(0, 0).tolist()


@pytest.mark.parametrize("worlds", [(4, 3), (2, 5), (3, 2, 4), (1, 8)])
def test_a_packed_epoch_resumed_at_another_world_size_consumes_the_rest_exactly_once(worlds):
    blocks = packed_planner(lognormal_durations(600, seed=4), budget=200)
    seen, last = run_stretches(blocks, worlds)
    assert len(seen) <= last.samples_before <= len(seen) + len(last.left_out)  # positions passed, left-out included
    assert_rest_read_once(blocks, seen, last)
    with pytest.raises(ResumeError, match="another run"):
        blocks.epoch_plan(4, 0, [Stretch(worlds[0], 10**6)], worlds[-1])


def test_a_packed_resume_at_the_same_world_size_gives_the_same_steps_and_counts_the_positions_passed():
    blocks = packed_planner(lognormal_durations(400), budget=300, window=256)
    whole = blocks.epoch_plan(1, 0, [], 2)
    resumed = blocks.epoch_plan(1, 0, [Stretch(2, 5)], 2)
    assert resumed.resume_step == 5
    for step in range(5, len(whole.plan)):
        for rank in range(2):
            assert np.array_equal(resumed.plan.micro_batch(step, rank), whole.plan.micro_batch(step, rank))
    taken = sum(len(whole.plan.micro_batch(s, r)) for s in range(5) for r in range(2))
    assert whole.samples_consumed(5) == taken  # within the first window: the samples of the steps taken
    assert whole.samples_consumed(len(whole.plan)) == blocks.slots - len(whole.plan.deferred) + len(
        whole.plan.windows.left_out()
    )


def test_a_mixture_packed_in_the_blocks_order_gives_each_source_its_share_within_the_budget():
    blocks = packed_planner(
        [lognormal_durations(300, seed=5), lognormal_durations(100, seed=6)], budget=300, targets=[1500, 500]
    )
    plan = blocks.epoch_plan(2, 0, [], 2)
    slots = np.concatenate([plan.plan.micro_batch(s, r) for s in range(len(plan.plan)) for r in range(2)])
    assert len(slots) == len(set(slots.tolist()))
    assert sorted(slots.tolist() + plan.left_out.tolist()) == list(range(2000))
    sources = np.searchsorted([0, 1500, 2000], slots, side="right") - 1
    assert abs(np.mean(sources == 0) - 0.75) < 0.02
    order = blocks.order(2, 0)
    for step in range(len(plan.plan)):
        for rank in range(2):
            assert blocks.slot_costs(order, plan.plan.micro_batch(step, rank)).sum() <= 300


def test_planning_a_billion_sequences_costs_a_rank_the_memory_of_its_windows_not_of_the_epoch():
    durations = np.full(10_000_000, 400.0)  # ten million episodes of 100 sequences of 4 s
    table = pa.table(
        {
            "shard": pa.DictionaryArray.from_arrays(np.zeros(len(durations), np.int32), ["shard"]).cast(pa.string()),
            "duration": durations,
        }
    )
    index = SampleIndex(table, ACTION_SEQUENCES, None, None)
    settings = PlanSettings(4 * 40 + 10, None, shuffle="blocks", shuffle_window=8192)
    started = time.perf_counter()
    blocks = Planner([PlannedSource(index, table.column("shard"), SEQUENCE_BLOCKS)], settings)
    assert blocks.slots == 10**9 and blocks.packing is not None and blocks.packing.bins == 2048
    plan, steps, peak = first_step_resumed_at_half_the_world(blocks)
    first = steps[0][1]
    assert len(first) == 4 and sum(ref.cost for ref in first) <= settings.batch_tokens
    assert plan.samples_before == 1000 * 1024 * 4  # every window of one cost fills its micro-batches
    assert peak < 16 * 1024 * 1024, f"planning took {peak / 1e6:.0f} MB"
    assert time.perf_counter() - started < 60  # (generous: the figure is in benchmarks/scale_bench.py)


def test_packed_windows_count_positions_passed_window_by_window():
    identity = PackedWindows(
        lambda positions: positions, lambda slots: np.full(len(slots), 10), 100, WindowPacking(30, 3, 100)
    )
    windows = identity  # slot p at position p, each of 10 tokens: a window of 30 fills its 3 micro-batches
    assert windows.windows == 3 and windows.micro_batches == 3 + 3 + 4  # the last window takes the 10 after it
    assert windows.positions_passed(0) == 0 and windows.positions_passed(3) == 30
    assert windows.positions_passed(7) == 60 + 10 and windows.positions_passed(10) == 100
    assert [len(windows.slots(m)) for m in range(10)] == [10] * 10
    assert sorted(np.concatenate([windows.slots(m) for m in range(10)]).tolist()) == list(range(100))
    assert len(windows.left_out()) == 0


def test_a_sample_costlier_than_the_budget_is_refused_naming_its_cost(stores):
    with pytest.raises(mmdata.SpecError, match="costliest sample takes"):
        mmdata.DataLoader(
            stores["wds"],
            mmdata.Sequences(fps=10, max_seconds=2.0, streams={"action": mmdata.Values()}),
            shuffle="blocks",
            batching=mmdata.Batching(batch_tokens=5),
            num_workers=0,
        )


SEQUENCES = mmdata.Sequences(fps=10, max_seconds=0.5, streams={"action": mmdata.Values()})


def _packed_loader(store, rank: int = 0, world: int = 1, workers: int = 0) -> mmdata.DataLoader:
    return mmdata.DataLoader(
        store,
        SEQUENCES,
        shuffle="blocks",
        num_workers=workers,
        seed=6,
        batching=mmdata.Batching(batch_tokens=12),
        shuffling=mmdata.Shuffling(window=16),
        runtime=mmdata.Runtime(rank=rank, world_size=world),
    )


def _spans(batch) -> list[tuple[int, float]]:
    return list(zip(batch["episode_index"].tolist(), np.round(batch["time"].numpy(), 6).tolist()))


@pytest.mark.slow
def test_a_loader_packs_sequences_in_the_blocks_order_within_the_budget_each_once(stores):
    loader = _packed_loader(stores["zarr"], workers=2)
    assert loader.shuffle == "blocks"
    table = mmdata.open_dataset(stores["zarr"]).store.table
    expected = enumerate_samples(table, SEQUENCES, np.arange(len(table)))
    batches = list(loader)
    seen = [span for batch in batches for span in _spans(batch)]
    assert all(int(batch["seq_lens"].sum()) <= 12 for batch in batches)  # one token per action step
    left_out = [
        (int(expected.episode[n]), round(float(expected.start[n]), 6)) for n in loader.epoch_plan().left_out.tolist()
    ]
    assert len(seen) == len(set(seen))
    assert sorted(seen + left_out) == sorted(zip(expected.episode.tolist(), np.round(expected.start, 6).tolist()))


@pytest.mark.slow
def test_a_packed_loader_in_the_blocks_order_resumes_exactly_and_at_another_world_size(stores):
    whole = [_spans(batch) for batch in _packed_loader(stores["wds"])]
    stopped = _packed_loader(stores["wds"])
    for step, _ in enumerate(stopped):
        if step + 1 == 4:
            break
    state = json.loads(json.dumps(stopped.state_dict()))
    assert state["samples_consumed"] == sum(len(spans) for spans in whole[:4])
    resumed = _packed_loader(stores["wds"])
    resumed.load_state_dict(state)
    assert [_spans(batch) for batch in resumed] == whole[4:]
    wider = [_packed_loader(stores["wds"], rank, 3) for rank in range(3)]
    for loader in wider:
        loader.load_state_dict(state)
    left_out_slots = wider[0].epoch_plan().left_out.tolist()  # (before the loaders move on to the next epoch)
    rest = [[_spans(batch) for batch in loader] for loader in wider]
    assert len({len(batches) for batches in rest}) == 1  # equal steps on every rank
    table = mmdata.open_dataset(stores["wds"]).store.table
    expected = enumerate_samples(table, SEQUENCES, np.arange(len(table)))
    every = list(zip(expected.episode.tolist(), np.round(expected.start, 6).tolist()))
    left_out = [every[n] for n in left_out_slots]
    seen = [span for spans in whole[:4] for span in spans] + [s for batches in rest for b in batches for s in b]
    assert len(seen) == len(set(seen))
    assert sorted(seen + left_out) == sorted(every)


def test_reference_packing_scales_a_short_epoch_to_a_whole_window():
    costs = np.full(100, 10, np.int64)
    packing = plan_window_packing(lambda positions: costs[positions], 100, 400, 50, "tokens")
    assert packing.window == 100 and packing.bins == 20


def test_a_window_packed_for_attention_deals_the_micro_batches_of_most_squared_tokens_first():
    blocks = packed_planner(lognormal_durations(300, seed=8), budget=300)
    attention = Planner(
        blocks.sources, PlanSettings(300, None, balance="attention", shuffle="blocks", shuffle_window=512)
    )
    index = blocks.sources[0].samples
    plan = attention.epoch_plan(1, 0, [], 1)
    assert plan.plan.windows.windows == 1  # (one window: every micro-batch of the epoch is dealt from it)
    micro_batches = [plan.plan.micro_batch(m, 0) for m in range(len(plan.plan))]
    squares = [float((index.costs_of(slots).astype(float) ** 2).sum()) for slots in micro_batches]
    assert squares == sorted(squares, reverse=True)
    by_tokens = blocks.epoch_plan(1, 0, [], 1)
    assert sorted(np.concatenate(micro_batches).tolist()) == sorted(
        n for m in range(len(by_tokens.plan)) for n in by_tokens.plan.micro_batch(m, 0).tolist()
    )


@pytest.mark.slow
def test_a_mixture_of_sequences_under_a_token_budget_is_packed_in_the_blocks_order(stores):
    mixture = mmdata.Mixture(
        [mmdata.Source(stores["wds"], 3.0, name="wds"), mmdata.Source(stores["zarr"], 1.0, name="zarr")],
        epoch_samples=80,
    )
    loader = mmdata.DataLoader(
        mixture,
        SEQUENCES,
        shuffle="blocks",
        seed=3,
        batching=mmdata.Batching(batch_tokens=12),
        shuffling=mmdata.Shuffling(window=16),
        num_workers=0,
    )
    plan = loader.epoch_plan()
    sources = [source for batch in loader for source in batch["source"].tolist()]
    assert len(sources) + len(plan.left_out) == 80
    assert abs(sources.count(0) / len(sources) - 0.75) < 0.1
