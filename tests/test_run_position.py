"""A loader's run position (`loading.state.RunPosition`), alone: the epoch's plan is made once per position and
moved on step by step, a saved position loads back to the same place (at another world size too), and a state
made for other data is refused with the way to go on."""

from __future__ import annotations

import numpy as np
import pytest

import mmdata
from mmdata.errors import ResumeError
from mmdata.loading.state import RunPosition
from mmdata.planning.loader_plan import LoaderPlan

SPEC = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(offsets=[0.0]), "action": mmdata.Values()})


def loader_plan(store, batch_size: int = 4) -> LoaderPlan:
    loader = mmdata.DataLoader(store, SPEC, batch_size=batch_size, num_workers=0)
    return loader._position.plan


def samples_in_order(epoch_plan) -> np.ndarray:
    """The samples the plan's steps read, in order (rank 0 of a one-rank plan)."""
    slots = np.concatenate([epoch_plan.plan.micro_batch(step, 0) for step in range(len(epoch_plan.plan))])
    return slots


@pytest.fixture(scope="module")
def plan(stores) -> LoaderPlan:
    return loader_plan(stores["wds"])


def test_the_epochs_plan_is_made_once_per_position_and_kept_while_the_run_advances(plan):
    position = RunPosition(plan, seed=7, world_size=1)
    first, made = position.epoch_plan()
    again, made_again = position.epoch_plan()
    assert made and not made_again and again is first
    position.advance(first)
    position.advance(first)
    kept, made = position.epoch_plan()
    assert kept is first and not made
    assert position.state.steps_in_epoch == 2 and kept.resume_step == 2
    assert position.state.samples_consumed == first.samples_consumed(2) > 0


def test_after_an_epochs_last_step_the_position_stands_at_the_next_epoch_with_a_new_plan(plan):
    position = RunPosition(plan, seed=7, world_size=1)
    first, _ = position.epoch_plan()
    for _ in range(first.total_steps):
        position.advance(first)
    assert position.state.epoch == 1 and position.state.stretches == [] and position.state.samples_consumed == 0
    second, made = position.epoch_plan()
    assert made and second.resume_step == 0
    assert (first.draw, second.draw) == ((7, 0), (7, 1))
    assert not np.array_equal(samples_in_order(second), samples_in_order(first))  # another epoch, another order


def test_setting_the_epoch_moves_the_position_only_when_it_differs(plan):
    position = RunPosition(plan, seed=7, world_size=1)
    epoch_plan, _ = position.epoch_plan()
    position.advance(epoch_plan)
    assert not position.set_epoch(0) and position.state.steps_in_epoch == 1
    assert position.set_epoch(3)
    assert (position.state.epoch, position.state.stretches, position.state.samples_consumed) == (3, [], 0)
    assert position.epoch_plan()[1], "a new epoch's plan is made"


def test_a_saved_position_loads_back_to_the_same_step_at_its_own_world_size_and_at_another(plan, stores):
    store = mmdata.Store(stores["wds"])
    position = RunPosition(plan, seed=11, world_size=2)
    epoch_plan, _ = position.epoch_plan()
    for _ in range(3):
        position.advance(epoch_plan)
    saved = position.to_dict([store])
    assert saved["episodes"] == [len(store)] and saved["world_size"] == 2

    same = RunPosition(plan, seed=0, world_size=2)
    same.load(saved, [store])
    resumed, _ = same.epoch_plan()
    assert resumed.resume_step == 3 and len(resumed.plan) == len(epoch_plan.plan)
    assert all(
        np.array_equal(resumed.plan.micro_batch(s, r), epoch_plan.plan.micro_batch(s, r))
        for s in range(len(resumed.plan))
        for r in range(2)
    )
    assert same.state.samples_consumed == position.state.samples_consumed

    elastic = RunPosition(plan, seed=0, world_size=1)
    elastic.load(saved, [store])
    regrouped, _ = elastic.epoch_plan()
    assert regrouped.world_size == 1 and regrouped.resume_step == 0
    assert regrouped.steps_before == 3 and regrouped.samples_before == position.state.samples_consumed


def test_a_fresh_positions_saved_state_names_its_world_size(plan, stores):
    saved = RunPosition(plan, seed=5, world_size=4).to_dict([mmdata.Store(stores["wds"])])
    assert saved["world_size"] == 4 and saved["stretches"] == [] and saved["epoch"] == 0


def test_a_state_for_other_data_or_settings_is_refused_and_the_position_is_unchanged(plan, stores):
    store = mmdata.Store(stores["wds"])
    other = RunPosition(loader_plan(stores["wds"], batch_size=3), seed=1, world_size=1)
    other.advance(other.epoch_plan()[0])
    position = RunPosition(plan, seed=1, world_size=1)
    with pytest.raises(ResumeError, match="other data or other sampling/batching settings"):
        position.load(other.to_dict([store]), [store])
    assert position.state.steps_in_epoch == 0
    saved = position.to_dict([store])
    with pytest.raises(ResumeError, match="were appended"):
        position.load({**saved, "fingerprint": "elsewhere", "episodes": [len(store) - 1]}, [store])
    with pytest.raises(ResumeError, match="not an mmdata.DataLoader state"):
        position.load({"epoch": 2}, [store])
