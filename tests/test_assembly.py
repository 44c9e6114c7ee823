"""The loading chain's assembly (`loading.assembly.ChainAssembly`), alone: where it decodes, the feed it starts
over a rank's steps (those steps in order, then the next epoch's), its frame budget, and the reads ahead it
works out once per plan."""

from __future__ import annotations

import pytest
import torch

import mmdata
import mmdata.loading.assembly as assembly
from mmdata.errors import OptionError
from mmdata.loading.step_record import StepRecord
from mmdata.planning.planner import Stretch
from tests.test_frame_cache import WINDOWS
from tests.test_loader import assert_same_batches


def new_loader(store, **runtime) -> mmdata.DataLoader:
    return mmdata.DataLoader(
        store, WINDOWS, batch_size=4, runtime=mmdata.Runtime(decoder="pyav", **runtime), num_workers=0
    )


def test_a_cpu_decoder_decodes_where_the_samples_are_read_unless_told_to_decode_in_the_main_process(stores):
    assert not new_loader(stores["wds"]).chain.decode_in_main
    assert new_loader(stores["wds"], decode_in="main").chain.decode_in_main
    with pytest.raises(OptionError, match="decode_in"):
        new_loader(stores["wds"], decode_in="elsewhere")


@pytest.mark.slow
def test_a_feed_started_at_a_step_yields_the_loaders_batches_from_that_step_then_the_next_epochs(stores):
    loader = new_loader(stores["wds"])
    epoch_zero = list(loader)
    epoch_one = list(loader)
    start = 2
    resumed = loader.planner.epoch_plan(0, 0, [Stretch(1, start)], 1)  # epoch 0 of seed 0, two steps run
    feed = loader.chain.start(loader.planner, 0, (0, 1), 0, loader.planner.rank_steps(resumed, 0))
    try:
        items = [feed.next() for _ in range(len(epoch_zero) - start + len(epoch_one))]
    finally:
        feed.close()
    assert [(epoch, step) for epoch, step, _, _ in items] == [
        *((0, step) for step in range(start, len(epoch_zero))),
        *((1, step) for step in range(len(epoch_one))),
    ]
    assert_same_batches([batch for _, _, batch, _ in items], [*epoch_zero[start:], *epoch_one])
    assert all(item[3].main_seconds == {} for item in items)  # decoded in the reader, nothing moved to a device


def test_its_frame_budget_is_set_by_the_feed_it_starts_and_reported_in_its_stats(stores):
    loader = new_loader(stores["wds"])
    assert loader.chain.frame_budget is None
    next(iter(loader))
    budget = loader.chain.frame_budget
    assert budget is not None and budget.bound > 0 and budget.horizon >= 1
    stats = loader.chain.stats(decode_waste=1.0, frames_evicted=0)
    assert stats["decoder"].startswith("pyav") and stats["frame_cache"] == budget.snapshot()
    assert stats["decode_waste_cause"] is None
    loader.close()


def test_the_reads_ahead_of_a_plan_are_worked_out_once_for_every_feed_it_starts(stores, monkeypatch):
    calls = []
    original = assembly.reads_ahead

    def counted(planner, world_size, runtime):
        calls.append(world_size)
        return original(planner, world_size, runtime)

    monkeypatch.setattr(assembly, "reads_ahead", counted)
    loader = new_loader(stores["wds"])
    list(loader)
    loader.set_epoch(3)  # a new feed
    next(iter(loader))
    loader.close()
    assert calls == [1]


def test_finishing_an_item_moves_its_tensors_to_the_device_and_times_the_move(stores, monkeypatch):
    loader = new_loader(stores["wds"])
    chain = loader.chain
    moved = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, non_blocking=False: moved.append(device) or self)
    chain.device = torch.device("meta")
    batch = {"frames": torch.zeros(2, 3), "task": ["a", "b"]}
    record = StepRecord(0, 1, 2, 2, {}, {}, 0, {}, {}, busy=0.0, bytes_read=0, read_retries=0)
    epoch, step, output, record = chain.finish((0, 5, batch, record))
    assert (epoch, step) == (0, 5) and output["task"] == ["a", "b"]
    assert moved == [torch.device("meta")] and set(record.main_seconds) == {"h2d"}
