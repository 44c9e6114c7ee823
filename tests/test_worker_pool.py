"""The loader's own worker pool and `num_workers="auto"`: workers that join or leave mid-epoch change nothing in
the batches, resume stays exact under auto and across worker counts, each lane's steps go to one worker, and a
worker that dies or fails is reported, not waited for."""

from __future__ import annotations

import json
import os
import signal

import pytest

import mmdata
from mmdata.errors import MmdataError, OptionError
from mmdata.loading.loader_options import WorkerCount, worker_count
from mmdata.loading.worker_pool import StepOwners
from tests.test_loader import POLICY_WINDOWS, assert_same_batches, run


def build(store, workers, **options) -> mmdata.DataLoader:
    return mmdata.DataLoader(
        store,
        POLICY_WINDOWS,
        batch_size=4,
        num_workers=workers,
        seed=5,
        runtime=mmdata.Runtime(decoder="pyav"),
        **options,
    )


def test_each_lane_is_read_by_one_worker_and_the_workers_share_the_steps_evenly():
    owners = StepOwners(lanes=8, workers=4)
    assert {owners.owner(step) for step in range(0, 800, 8)} == {0}  # lane 0's steps, turn after turn
    assert [sum(owners.owner(s) == w for s in range(800)) for w in range(4)] == [200] * 4
    assert owners.after(5, 40, 3) == [9, 13, 17]  # worker 1's next steps
    more = StepOwners(lanes=8, workers=12)  # more workers than lanes: each lane cut into turns
    assert len({more.owner(step) for step in range(96)}) == 12
    assert StepOwners(lanes=1, workers=3).after(0, 10, 5) == [3, 6, 9]


@pytest.mark.slow
def test_workers_that_join_and_leave_mid_epoch_change_nothing_in_the_batches(stores):
    expected = run(build(stores["wds"], 0))
    loader = build(stores["wds"], 3)
    got = []
    for step, batch in enumerate(loader):
        got.append(batch)
        pool = loader._feed.pool
        if step == 3:
            pool.resize(1)
        elif step == len(expected) // 2:
            pool.resize(3)
    assert_same_batches(got, expected)


@pytest.mark.slow
def test_auto_gives_the_batches_of_a_fixed_count_and_its_settings_in_the_stats(stores):
    assert_same_batches(run(build(stores["wds"], "auto")), run(build(stores["wds"], 2)))
    loader = build(stores["wds"], "auto")
    run(loader)
    stats = loader.stats()
    assert 1 <= stats["workers"] <= os.cpu_count()
    assert stats["autotune"]["most_workers"] == len(os.sched_getaffinity(0))


def test_a_loader_given_no_worker_count_chooses_its_workers_while_it_runs(stores):
    loader = mmdata.DataLoader(stores["wds"], POLICY_WINDOWS, batch_size=4, seed=5)
    first = next(iter(loader))
    stats = loader.stats()
    assert stats["workers"] >= 1 and stats["autotune"]["most_workers"] >= stats["workers"]
    loader.close()
    in_process = mmdata.DataLoader(stores["wds"], POLICY_WINDOWS, batch_size=4, seed=5, num_workers=0)
    assert_same_batches([first], [next(iter(in_process))])


@pytest.mark.slow
@pytest.mark.parametrize("then", ["auto", 2, 0])
def test_a_run_saved_under_auto_resumes_exactly_with_auto_or_any_fixed_count(stores, then):
    uninterrupted = run(build(stores["wds"], 0))
    interrupted = build(stores["wds"], "auto")
    k = len(uninterrupted) // 2
    for step, _ in enumerate(interrupted):
        if step + 1 == k:
            break
    state = json.loads(json.dumps(interrupted.state_dict()))
    interrupted.close()
    resumed = build(stores["wds"], then)
    resumed.load_state_dict(state)
    assert_same_batches(run(resumed), uninterrupted[k:])


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_is_reported_by_slot_and_signal(stores):
    loader = build(stores["wds"], 2)
    iterator = iter(loader)
    next(iterator)
    os.kill(loader._feed.pool.pids()[0], signal.SIGKILL)
    with pytest.raises(MmdataError, match=r"loader worker 0 \(pid \d+\) was killed by signal 9"):
        for _ in range(len(loader)):
            next(iterator)
    loader.close()


@pytest.mark.parametrize("workers", ["many", -1, 1.5, True])
def test_num_workers_is_a_count_or_auto(stores, workers):
    with pytest.raises(OptionError, match="num_workers"):
        build(stores["wds"], workers)


@pytest.mark.parametrize("budget", [0, 2.5, "all"])
def test_the_cpu_budget_is_a_whole_number_of_cores(budget):
    with pytest.raises(OptionError, match="cpu_budget"):
        mmdata.Runtime(cpu_budget=budget)


def test_auto_shares_the_cores_among_the_ranks_of_a_node_unless_given_a_budget(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert worker_count("auto", None).most == cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))  # more ranks than cores: one worker each
    assert worker_count("auto", None) == WorkerCount(1, 1, True)
    assert worker_count("auto", 6) == WorkerCount(2, 6, True)
    assert worker_count(3, None) == WorkerCount(3, 3, False)  # a count is exactly that count
