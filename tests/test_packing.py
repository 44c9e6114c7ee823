"""The packer: property tests over random lengths, kernels against plain Python, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdata.planning.packing import PackingConfig, fit_to_budget, plan_packing, plan_padded, plan_stats, token_costs
from mmdata.planning.packing.kernels import best_fit_decreasing, first_fit_decreasing, minimum_bin_slack

lengths_strategy = st.lists(st.integers(1, 3000), min_size=1, max_size=400)


def python_first_fit_decreasing(lengths: list[int], capacity: int) -> tuple[list[int], int]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    room: list[int] = []
    assignment = [0] * len(lengths)
    for item in order:
        for index, free in enumerate(room):
            if free >= lengths[item]:
                room[index] -= lengths[item]
                assignment[item] = index
                break
        else:
            room.append(capacity - lengths[item])
            assignment[item] = len(room) - 1
    return assignment, len(room)


def python_best_fit_decreasing_bins(lengths: list[int], capacity: int) -> int:
    room: list[int] = []
    for length in sorted(lengths, reverse=True):
        fits = [i for i, free in enumerate(room) if free >= length]
        if fits:
            best = min(fits, key=lambda i: room[i])
            room[best] -= length
        else:
            room.append(capacity - length)
    return len(room)


@settings(max_examples=60, deadline=None)
@given(lengths_strategy, st.integers(3000, 9000))
def test_segment_tree_ffd_matches_plain_first_fit_decreasing(lengths, capacity):
    assignment, bins = first_fit_decreasing(np.array(lengths, dtype=np.int64), capacity)
    assert (assignment.tolist(), bins) == python_first_fit_decreasing(lengths, capacity)


@settings(max_examples=60, deadline=None)
@given(lengths_strategy, st.integers(3000, 9000))
def test_best_fit_decreasing_never_overfills_and_matches_plain_bin_count(lengths, capacity):
    lengths_array = np.array(lengths, dtype=np.int64)
    assignment, bins = best_fit_decreasing(lengths_array, capacity)
    assert np.bincount(assignment, weights=lengths_array, minlength=bins).max() <= capacity
    assert bins == python_best_fit_decreasing_bins(lengths, capacity)


@settings(max_examples=60, deadline=None)
@given(lengths_strategy, st.integers(3000, 9000))
def test_minimum_bin_slack_packs_every_item_once_without_overfilling(lengths, capacity):
    lengths_array = np.array(lengths, dtype=np.int64)
    assignment, bins = minimum_bin_slack(lengths_array, capacity)
    loads = np.bincount(assignment, weights=lengths_array, minlength=bins)
    assert len(assignment) == len(lengths) and assignment.min() >= 0 and assignment.max() == bins - 1
    assert loads.max() <= capacity and loads.min() > 0, "no bin overfilled, none left empty"
    assert bins >= -(-sum(lengths) // capacity)


def policy_window_costs(count: int, seed: int) -> np.ndarray:
    """Policy windows come in few sizes: 2-4 cameras x 1-2 frames x 256 tokens + 64-114 action/state tokens."""
    rng = np.random.default_rng(seed)
    return rng.integers(2, 5, count) * rng.integers(1, 3, count) * 256 + rng.integers(64, 115, count)


def test_minimum_bin_slack_fills_policy_windows_where_first_fit_leaves_gaps():
    costs = policy_window_costs(4096, seed=0)
    lower_bound = -(-int(costs.sum()) // 16384)
    _, first_fit_bins = first_fit_decreasing(costs, 16384)
    _, slack_bins = minimum_bin_slack(costs, 16384)
    assert first_fit_bins > lower_bound * 1.01, "first fit leaves over 1% of the budget empty here"
    assert slack_bins <= lower_bound * 1.005


def test_auto_packing_is_as_dense_as_the_better_of_its_two_packers():
    windows = policy_window_costs(20000, seed=1)
    long_chunks = np.exp(np.random.default_rng(2).uniform(np.log(2000), np.log(200_000), 3000)).astype(np.int64)
    for costs in (windows, long_chunks):
        efficiency = {}
        for algorithm in ("auto", "ffd", "mbs"):
            config = PackingConfig(budget=16384, ranks=8, algorithm=algorithm)
            efficiency[algorithm] = plan_stats(plan_packing(costs, config)).efficiency
        assert efficiency["auto"] >= max(efficiency["ffd"], efficiency["mbs"]) - 0.001


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6000), min_size=1, max_size=600),
    budget=st.integers(1000, 5000),
    ranks=st.integers(1, 8),
    window=st.integers(8, 300),
    seed=st.integers(0, 2**16),
    algorithm=st.sampled_from(["auto", "ffd", "bfd", "mbs"]),
    long=st.sampled_from(["split", "drop"]),
)
def test_every_sample_is_planned_once_or_reported(lengths, budget, ranks, window, seed, algorithm, long):
    config = PackingConfig(budget=budget, ranks=ranks, window=window, algorithm=algorithm, long=long)
    plan = plan_packing(np.array(lengths), config, seed=seed, epoch=1)
    rows = plan.rows
    planned = np.concatenate([plan.members, plan.deferred])
    assert np.array_equal(np.sort(planned), np.arange(len(rows))), "each chunk once, planned or deferred"
    covered = set(rows.sample.tolist()) | set(plan.dropped_samples.tolist())
    assert covered == set(range(len(lengths))), "every sample is planned, split or reported dropped"
    for sample in set(rows.sample.tolist()):
        assert rows.tokens[rows.sample == sample].sum() == lengths[sample], "chunks add up to the sample"
    assert plan.steps.shape[1] == ranks, "every rank gets a micro-batch at every step"
    for step in range(len(plan)):
        for rank in range(ranks):
            assert plan.lengths(step, rank).sum() <= budget
    if long == "drop":
        assert set(plan.dropped_samples.tolist()) == {i for i, n in enumerate(lengths) if n > budget}


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 2000), min_size=50, max_size=400), seed=st.integers(0, 1000))
def test_plan_is_a_pure_function_of_seed_and_epoch(lengths, seed):
    config = PackingConfig(budget=4096, ranks=2, window=64)
    costs = np.array(lengths)

    def order(plan):
        return np.concatenate([plan.members, plan.deferred])

    first, again = plan_packing(costs, config, seed, 0), plan_packing(costs, config, seed, 0)
    assert np.array_equal(first.steps, again.steps) and np.array_equal(order(first), order(again))
    assert not np.array_equal(order(first), order(plan_packing(costs, config, seed, 1)))
    assert not np.array_equal(order(first), order(plan_packing(costs, config, seed + 1, 0)))


def test_plan_on_log_normal_lengths_is_dense_and_balanced():
    rng = np.random.default_rng(0)
    costs = np.exp(rng.normal(6.5, 1.0, size=20000)).astype(np.int64).clip(1, 60000)
    stats = plan_stats(plan_packing(costs, PackingConfig(budget=16384, ranks=8), seed=0))
    assert stats.efficiency > 0.995 and stats.rank_token_spread < 0.005
    assert stats.deferred_samples < 0.01 * len(costs)


def test_balancing_attention_cost_evens_sum_of_squares():
    rng = np.random.default_rng(1)
    costs = np.exp(rng.normal(6.0, 1.2, size=20000)).astype(np.int64).clip(1, 16384)
    by_tokens = plan_stats(plan_packing(costs, PackingConfig(budget=16384, ranks=8, balance="tokens")))
    by_attention = plan_stats(plan_packing(costs, PackingConfig(budget=16384, ranks=8, balance="attention")))
    assert by_attention.rank_attention_spread < by_tokens.rank_attention_spread


def test_long_samples_are_split_into_ordered_chunks():
    rows = fit_to_budget(np.array([10, 25, 7]), budget=10)
    assert rows.sample.tolist() == [0, 1, 1, 1, 2]
    assert rows.chunk.tolist() == [0, 0, 1, 2, 0]
    assert rows.tokens.tolist() == [10, 10, 10, 5, 7]


def test_long_samples_split_on_unit_boundaries():
    rows = fit_to_budget(np.array([1000, 300]), budget=600, unit=256)
    assert rows.sample.tolist() == [0, 0, 1] and rows.tokens.tolist() == [512, 488, 300]


def test_token_costs_add_streams_with_rates_and_callables():
    costs = token_costs(
        {"cam": np.array([16, 4]), "action": np.array([50, 50]), "audio": np.array([1.0, 0.5])},
        {"cam": 256, "action": 1, "audio": lambda seconds: np.ceil(seconds * 50)},
    )
    assert costs.tolist() == [16 * 256 + 50 + 50, 4 * 256 + 50 + 25]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fit_to_budget(np.array([3, 0, 2]), 10), "sample 1 costs 0 tokens"),
        (lambda: fit_to_budget(np.array([-4]), 10), "sample 0 costs -4 tokens"),
        (lambda: PackingConfig(budget=0), "token budget must be at least 1"),
        (lambda: PackingConfig(budget=100, ranks=0), "ranks must be at least 1"),
        (lambda: token_costs({"cam": np.array([1])}, {"state": 1}), "tokens_per names streams with no lengths"),
        (lambda: fit_to_budget(np.array([300]), 200, unit=256), "budget 200 is smaller than the smallest chunk"),
    ],
)
def test_bad_input_raises_clear_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_budget_smaller_than_every_sample_with_drop_reports_them_all():
    plan = plan_packing(np.array([50, 60]), PackingConfig(budget=10, long="drop"))
    assert len(plan) == 0 and plan.dropped_samples.tolist() == [0, 1]


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=500),
    batch_size=st.integers(1, 16),
    ranks=st.integers(1, 4),
    window=st.integers(16, 200),
    seed=st.integers(0, 1000),
)
def test_padded_plan_batches_one_bucket_each_and_loses_nothing(lengths, batch_size, ranks, window, seed):
    boundaries = [128, 512, 1024, 2048]
    plan = plan_padded(np.array(lengths), batch_size, boundaries, ranks=ranks, seed=seed, window=window)
    planned = np.concatenate([*plan.batches, plan.deferred]) if plan.batches else plan.deferred
    assert np.array_equal(np.sort(planned), np.arange(len(plan.rows)))
    assert len(plan.deferred) < ranks
    assert all(len(b) > 0 for b in plan.batches) and plan.steps.shape[1] == ranks
    last_step = set(plan.steps[-1].tolist()) if len(plan) else set()
    for index, batch in enumerate(plan.batches):
        if index not in last_step:
            assert len(batch) == batch_size
            assert len(np.unique(np.searchsorted(boundaries, plan.rows.tokens[batch]))) == 1


def test_bucketing_cuts_padding_against_random_batches():
    rng = np.random.default_rng(0)
    costs = np.exp(rng.normal(6.0, 1.0, size=5000)).astype(np.int64).clip(1, 4096)
    bucketed = plan_padded(costs, 16, [64, 128, 256, 512, 1024, 2048, 4096], seed=0)
    single_bucket = plan_padded(costs, 16, [4096], seed=0)
    assert bucketed.padding_fraction() < single_bucket.padding_fraction() / 2, "power-of-two buckets halve padding"
