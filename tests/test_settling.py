"""The settle stage (`loading.settling`): with `on_error="skip"`, a failed sample's place goes to a copy of the
costliest read sample of its micro-batch that fits its cost (the next one after it among equals), a sample
nothing fits is removed, and a micro-batch that failed whole borrows the first fitting sample planned after it.
Each choice depends only on the plan and on which samples failed."""

from __future__ import annotations

import numpy as np
import pytest

from mmdata.errors import SampleError
from mmdata.loading.micro_batch import MicroBatch
from mmdata.loading.settling import replace_failed, settle
from mmdata.planning.samples import SampleRef


def _sample(index: int, cost: int) -> SampleRef:
    return SampleRef(index, index, f"episode-{index}", "shard-0", 0.0, 0.0, 0, cost)


def _batch(costs: list[int], failed: list[int], fallback: list[SampleRef] = ()) -> MicroBatch:
    samples = [_sample(i, cost) for i, cost in enumerate(costs)]
    values = {"state": [np.full(2, i, np.float32) for i in range(len(costs))]}
    is_pad = {"state": [np.zeros(2, bool) for _ in costs]}
    return MicroBatch(
        step=7,
        samples=samples,
        tasks=[f"task {i}" for i in range(len(costs))],
        values=values,
        is_pad=is_pad,
        failed={p: f"sample {p} is broken" for p in failed},
        fallback=list(fallback),
    )


def _never_read(step: int, sample: SampleRef) -> MicroBatch:
    raise AssertionError("a micro-batch with samples that read borrows nothing")


def test_a_failed_sample_becomes_a_copy_of_the_costliest_sample_that_fits_its_cost():
    batch = _batch([10, 30, 20, 25], failed=[1])
    settle(batch, _never_read)
    assert batch.replaced == [(1, 3)], "25 is the costliest of 10, 20, 25 that fits in 30"
    assert batch.samples[1].index == 3 and batch.tasks[1] == "task 3"
    assert batch.values["state"][1][0] == 3


def test_among_equal_costs_the_next_sample_after_the_failed_one_stands_in():
    batch = _batch([5, 5, 5, 5], failed=[2])
    replace_failed(batch)
    assert batch.replaced == [(2, 3)]
    wrapped = _batch([5, 5, 5, 5], failed=[3])
    replace_failed(wrapped)
    assert wrapped.replaced == [(3, 0)], "after the last comes the first"


def test_a_failed_sample_that_nothing_fits_is_removed_and_the_rest_keep_their_order():
    batch = _batch([10, 2, 10], failed=[1])
    replace_failed(batch)
    assert [sample.index for sample in batch.samples] == [0, 2]
    assert [values[0] for values in batch.values["state"]] == [0, 2]


def test_a_micro_batch_that_failed_whole_borrows_the_first_fitting_sample_planned_after_it():
    fallback = [_sample(10, 99), _sample(11, 4), _sample(12, 4)]
    reads = []

    def read_alone(step: int, sample: SampleRef) -> MicroBatch:
        reads.append(sample.index)
        alone = _batch([sample.cost], failed=[0] if sample.index == 11 else [])
        alone.values["state"][0][:] = sample.index
        return alone

    batch = _batch([5, 4], failed=[0, 1], fallback=fallback)
    settle(batch, read_alone)
    assert reads == [11, 12], "10 costs more than the costliest failed sample; 11 fails to read"
    assert batch.borrowed == {0: fallback[2]}
    assert [sample.index for sample in batch.samples] == [12, 12], "the other failed sample copies the borrowed one"


def test_a_micro_batch_that_failed_whole_with_nothing_to_borrow_names_its_step_and_first_failure():
    batch = _batch([5, 4], failed=[0, 1], fallback=[_sample(10, 99)])
    with pytest.raises(SampleError, match="step 7.*sample 0 is broken"):
        settle(batch, _never_read)
