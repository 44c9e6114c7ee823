"""The packer: the kernels against plain Python, and the epoch's windows packed over random lengths (every sample
once or reported, within the budget, dense, the ranks of a step even), bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdata.planning.orders import GlobalOrder
from mmdata.planning.packed_windows import PackedRankPlan, PackedWindows, pack_window, plan_window_packing
from mmdata.planning.packing import token_costs
from mmdata.planning.packing.kernels import first_fit_decreasing, minimum_bin_slack

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


@settings(max_examples=60, deadline=None)
@given(lengths_strategy, st.integers(3000, 9000))
def test_segment_tree_ffd_matches_plain_first_fit_decreasing(lengths, capacity):
    assignment, bins = first_fit_decreasing(np.array(lengths, dtype=np.int64), capacity)
    assert (assignment.tolist(), bins) == python_first_fit_decreasing(lengths, capacity)


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


def packed_epoch(costs: np.ndarray, budget: int, window: int, ranks: int, seed: int = 0, balance: str = "tokens"):
    """The epoch of `costs` in a global order packed window by window and dealt to `ranks`, as the planner packs it."""
    order = GlobalOrder(len(costs), seed, 0)

    def costs_at(slots: np.ndarray) -> np.ndarray:
        return costs[slots]

    packing = plan_window_packing(lambda p: costs[order.samples_at(p)], len(costs), window, budget, balance)
    windows = PackedWindows(order.samples_at, costs_at, len(costs), packing)
    return PackedRankPlan(order, windows, ranks, 0)


def step_loads(plan: PackedRankPlan, costs: np.ndarray, power: int = 1) -> np.ndarray:
    """[steps, ranks] tokens (or sums of squared tokens) of each micro-batch."""
    return np.array(
        [
            [
                float((costs[plan.micro_batch(step, rank)].astype(np.float64) ** power).sum())
                for rank in range(plan.world)
            ]
            for step in range(len(plan))
        ]
    )


def test_auto_packing_is_as_dense_as_the_better_of_its_two_packers():
    windows = policy_window_costs(20000, seed=1)
    long_chunks = np.exp(np.random.default_rng(2).uniform(np.log(200), np.log(16384), 3000)).astype(np.int64)
    for costs in (windows, long_chunks):
        _, auto = pack_window(costs, 16384)
        assert auto == min(first_fit_decreasing(costs, 16384)[1], minimum_bin_slack(costs, 16384)[1])


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=600),
    budget=st.integers(5000, 9000),
    ranks=st.integers(1, 8),
    window=st.integers(8, 300),
    seed=st.integers(0, 2**16),
)
def test_every_sample_is_packed_once_within_the_budget_or_reported(lengths, budget, ranks, window, seed):
    costs = np.array(lengths, np.int64)
    plan = packed_epoch(costs, budget, window, ranks, seed)
    packed = [plan.micro_batch(step, rank) for step in range(len(plan)) for rank in range(ranks)]
    seen = np.concatenate([*packed, plan.deferred]).astype(np.int64)
    assert np.array_equal(np.sort(seen), np.arange(len(costs))), "each sample once, packed or reported"
    assert all(costs[slots].sum() <= budget for slots in packed)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(200, 2000), min_size=200, max_size=400), seed=st.integers(0, 1000))
def test_a_packed_epoch_is_a_pure_function_of_seed_and_epoch(lengths, seed):
    # (an epoch of several windows: a window's micro-batches are those of its samples' costs, whatever their order)
    costs = np.array(lengths, np.int64)

    def micro_batches(plan) -> list[list[int]]:
        return [plan.micro_batch(step, rank).tolist() for step in range(len(plan)) for rank in range(2)]

    first = micro_batches(packed_epoch(costs, 4096, 64, 2, seed))
    assert first == micro_batches(packed_epoch(costs, 4096, 64, 2, seed))
    assert first != micro_batches(packed_epoch(costs, 4096, 64, 2, seed + 1))


def test_a_packed_epoch_of_log_normal_lengths_is_dense_and_balanced():
    rng = np.random.default_rng(0)
    costs = np.exp(rng.normal(6.5, 1.0, size=20000)).astype(np.int64).clip(1, 16384)
    plan = packed_epoch(costs, 16384, 8192, 8)
    loads = step_loads(plan, costs)
    efficiency = loads.sum() / (loads.size * 16384)
    spread = float(np.mean(loads.max(axis=1) / loads.mean(axis=1) - 1))
    assert efficiency > 0.97 and spread < 0.02, (efficiency, spread)
    assert len(plan.deferred) < 0.01 * len(costs)


def test_balancing_attention_cost_evens_sum_of_squares():
    rng = np.random.default_rng(1)
    costs = np.exp(rng.normal(6.0, 1.2, size=20000)).astype(np.int64).clip(1, 16384)

    def squares_spread(balance: str) -> float:
        squares = step_loads(packed_epoch(costs, 16384, 8192, 8, balance=balance), costs, power=2)
        return float(np.mean(squares.max(axis=1) / squares.mean(axis=1) - 1))

    assert squares_spread("attention") < squares_spread("tokens")


def test_token_costs_add_streams_with_rates_and_callables():
    costs = token_costs(
        {"cam": np.array([16, 4]), "action": np.array([50, 50]), "audio": np.array([1.0, 0.5])},
        {"cam": 256, "action": 1, "audio": lambda seconds: np.ceil(seconds * 50)},
    )
    assert costs.tolist() == [16 * 256 + 50 + 50, 4 * 256 + 50 + 25]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: token_costs({"cam": np.array([1])}, {"state": 1}), "tokens_per names streams with no lengths"),
        (lambda: token_costs({"cam": np.array([1])}, {}), "tokens_per is empty"),
    ],
)
def test_bad_input_raises_clear_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
