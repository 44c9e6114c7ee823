"""The frame cache's bound follows the plan (the frames of the reads it plans ahead) within a stated share of the
memory, shortens its horizon rather than evict when the memory is short, and a run that decodes frames again
and again is named with its cause and fix."""

from __future__ import annotations

import math

import pytest

import mmdata
from mmdata.errors import OptionError
from mmdata.loading import frame_budget as frame_budget_module
from mmdata.loading.frame_budget import (
    LONGEST_HORIZON,
    MEMORY_SHARE,
    MOST_READS_AHEAD,
    UNSIZED_BOUND,
    available_host_memory,
    horizon_for,
    plan_frame_budget,
    waste_cause,
)
from mmdata.loading.frame_cache import HORIZON
from tests.test_frame_cache import WINDOWS, loader
from tests.test_loader import assert_same_batches

MIB = 1 << 20
GIB = 1 << 30


def test_the_bound_is_the_frames_of_the_reads_planned_ahead_when_the_memory_holds_them():
    budget = plan_frame_budget(read_bytes=3 * MIB, caches=2, ring_bytes=64 * MIB, given=None, available=16 * GIB)
    assert budget.bound == budget.working_set == (LONGEST_HORIZON + 1) * 3 * MIB
    assert budget.horizon == LONGEST_HORIZON
    assert budget.total == int(16 * GIB * MEMORY_SHARE) and budget.share == budget.total // 2 - 64 * MIB
    assert not budget.given and "the working set of the plan" in budget.describe()


def test_short_memory_shortens_the_horizon_instead_of_evicting():
    budget = plan_frame_budget(read_bytes=10 * MIB, caches=4, ring_bytes=10 * MIB, given=None, available=2 * GIB)
    assert budget.share == int(2 * GIB * MEMORY_SHARE) // 4 - 10 * MIB  # 118 MiB per cache
    assert budget.horizon == 10 and budget.bound == 11 * 10 * MIB <= budget.share
    assert f"horizon shortened to 10 of {LONGEST_HORIZON} reads" in budget.describe()
    starved = plan_frame_budget(read_bytes=10 * MIB, caches=4, ring_bytes=200 * MIB, given=None, available=2 * GIB)
    assert starved.horizon == 1 and starved.bound == starved.share == 0


def test_a_given_bound_is_kept_and_an_unknown_read_size_gets_the_fixed_one():
    given = plan_frame_budget(read_bytes=MIB, caches=1, ring_bytes=0, given=5000, available=GIB)
    assert given.bound == 5000 and given.given and given.horizon == HORIZON and "given" in given.describe()
    unsized = plan_frame_budget(read_bytes=None, caches=1, ring_bytes=0, given=None, available=64 * GIB)
    assert unsized.bound == UNSIZED_BOUND and unsized.working_set is None


def test_each_cause_of_waste_is_named_with_its_fix():
    roomy = plan_frame_budget(read_bytes=MIB, caches=1, ring_bytes=0, given=None, available=64 * GIB)
    short = plan_frame_budget(read_bytes=MIB, caches=1, ring_bytes=0, given=None, available=80 * MIB)
    given = plan_frame_budget(read_bytes=MIB, caches=1, ring_bytes=0, given=MIB, available=64 * GIB)
    off = plan_frame_budget(read_bytes=MIB, caches=1, ring_bytes=0, given=0, available=64 * GIB)
    sizes = "cam 640x480"
    assert waste_cause(1.4, 100, given, sizes) is None
    assert "given) is below the frames of the next 32 reads (33 MiB)" in waste_cause(4.8, 100, given, sizes)
    assert "frame_cache_bytes='auto'" in waste_cause(4.8, 100, given, sizes)
    assert "frame cache is off" in waste_cause(2.6, 0, off, sizes)
    assert f"holds only 19 of {LONGEST_HORIZON} reads' frames" in waste_cause(2.0, 0, short, sizes)
    assert "--access windows" in waste_cause(2.0, 0, roomy, sizes)
    assert "cam 640x480" in waste_cause(2.0, 0, roomy, sizes)


def test_the_loaders_bound_follows_its_batch_and_frame_sizes(stores):
    frame_bytes = 2 * 224 * 224 * 3 + 208 * 160 * 3  # cam_high twice, cam_wrist once per sample
    for batch_size in (2, 4):
        made = mmdata.DataLoader(str(stores["wds"]), WINDOWS, batch_size=batch_size, num_workers=0)
        next(iter(made))
        budget = made.stats()["frame_cache"]
        assert budget["longest"] >= LONGEST_HORIZON  # a segment's life in the main process's reads
        assert budget["bound"] == budget["working_set"] == (budget["longest"] + 1) * batch_size * frame_bytes
        assert budget["memory"] == "host" and budget["caches"] == 1
        made.close()


def test_a_loader_short_of_memory_plans_fewer_reads_ahead_and_gives_the_same_batches(stores, monkeypatch):
    expected = list(loader(stores["wds"], "windows", 0, shuffle="blocks"))
    monkeypatch.setattr(frame_budget_module, "available_host_memory", lambda: 8 * MIB)
    short = loader(stores["wds"], "windows", "auto", shuffle="blocks")
    assert_same_batches(list(short), expected)
    budget = short.stats()["frame_cache"]
    assert budget["horizon"] < LONGEST_HORIZON
    assert 0 < short.stats()["frame_cache_peak_bytes"] <= budget["bound"] <= 2 * MIB


def test_a_thrashing_run_names_its_cause_and_the_default_does_not_thrash(stores):
    tiny = loader(stores["wds"], "windows", 1000, shuffle="blocks")
    list(tiny)
    stats = tiny.stats()
    assert stats["decode_waste"] > 1.5 and "1,000 bytes per cache, given" in stats["decode_waste_cause"]
    assert "cam_high 224x224" in stats["decode_waste_cause"]
    sized = loader(stores["wds"], "windows", "auto", shuffle="blocks")
    list(sized)
    assert sized.stats()["decode_waste"] < 1.5 and sized.stats()["decode_waste_cause"] is None
    assert sized.stats()["frames_evicted"] == 0


def test_the_memory_of_a_node_is_shared_among_its_ranks(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    whole = available_host_memory()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert abs(available_host_memory() - whole / 8) < whole / 40  # MemAvailable moves a little between reads


@pytest.mark.parametrize("value", [None, "big", -1, 1.5, True])
def test_frame_cache_bytes_is_auto_or_a_count_of_bytes(value):
    with pytest.raises(OptionError, match="frame_cache_bytes"):
        mmdata.Reading(frame_cache_bytes=value)
    assert mmdata.Reading().frame_cache_bytes == "auto"


def test_each_step_of_the_horizon_is_made_once_not_once_per_read(stores, monkeypatch):
    from mmdata.planning.planner import Planner

    made = []
    refs = Planner.refs

    def counted(self, plan, slots):
        made.append(len(slots))
        return refs(self, plan, slots)

    monkeypatch.setattr(Planner, "refs", counted)
    run = mmdata.DataLoader(str(stores["wds"]), WINDOWS, batch_size=1, num_workers=0)
    steps = sum(1 for _ in run)
    budget = run.stats()["frame_cache"]
    assert budget["horizon"] == budget["longest"] >= LONGEST_HORIZON and steps > 50
    # a step is made when it enters the horizon, when it is read and for the fallback samples of the reads before it
    # (was: every read made the samples of all 128 steps ahead of it again: 2,512 here, 11 times more)
    assert len(made) <= 4 * steps


def test_a_cache_plans_as_many_reads_ahead_as_a_segment_stays_open_in_its_reads():
    assert horizon_for(32, lanes=8, workers=2) == 128  # 4 lanes per worker, a lane's step every 4th read
    assert horizon_for(32, lanes=8, workers=0) == 256  # all 8 lanes in the main process
    assert horizon_for(4, lanes=8, workers=2) == LONGEST_HORIZON and horizon_for(None, 8, 0) == LONGEST_HORIZON
    assert horizon_for(10_000, lanes=8, workers=0) == MOST_READS_AHEAD
    budget = plan_frame_budget(MIB, caches=1, ring_bytes=0, given=None, available=64 * GIB, longest=256)
    assert budget.horizon == 256 and budget.bound == 257 * MIB
    short = plan_frame_budget(MIB, caches=1, ring_bytes=0, given=None, available=400 * MIB, longest=256)
    assert f"horizon shortened to {short.horizon} of 256 reads" in short.describe()


def test_a_loaders_caches_plan_ahead_over_a_segments_life_in_their_own_reads(stores):
    fps = mmdata.open_dataset(str(stores["wds"])).schema.stream("cam_high").fps
    spec = mmdata.Windows(anchor_fps=fps, streams={"cam_high": mmdata.Frames(offsets=[0.0])})
    longest = {}
    for workers in (0, 2):
        run = mmdata.DataLoader(str(stores["wds"]), spec, batch_size=1, num_workers=workers)
        next(iter(run))
        recipe = run.planner.sources[0].recipe  # a block's samples, one per turn of 8 open blocks, spread out by
        life = math.ceil(recipe.block * 8 * recipe.block_spread())  # the episodes' last segments' samples between
        assert run.planner.segment_life_steps(1) == life
        longest[workers] = run.chain.frame_budget.longest
        assert longest[workers] == min(1024, max(LONGEST_HORIZON, life * 8 // max(1, workers)))
        run.close()
    assert longest[0] == 2 * longest[2] or longest[0] == 1024, "8 lanes in one process: each segment open twice as long"
