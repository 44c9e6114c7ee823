"""The reading chain (`loading.chain.BatchReader`): a micro-batch fetched, aligned and read, its cameras decoded
where it is read or left pending for the process that decodes, then settled and collated. Where the video is
decoded does not change the batch, nor does the frame cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmdata
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.loading.chain import BatchReader

SPEC = mmdata.Windows(
    anchor_fps=10,
    streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "state": mmdata.Values(offsets=[-0.1, 0.0])},
)


@pytest.fixture(scope="module")
def planned(stores):
    loader = mmdata.DataLoader(stores["wds"], SPEC, batch_size=4, num_workers=0)
    plan = loader.planner.epoch_plan(0, 0, [], 1)
    steps = loader.planner.rank_steps(plan, 0)
    return loader, [steps[index][1] for index in range(3)]


def _reader(loader, **options) -> BatchReader:
    return BatchReader(loader.sources, SPEC, loader.fillers, PyAvDecoder(), **options)


def _same(one: dict, other: dict) -> bool:
    return one.keys() == other.keys() and all(
        torch.equal(one[k], other[k]) if isinstance(one[k], torch.Tensor) else np.array_equal(one[k], other[k])
        for k in one
        if k != "task"
    )


def test_a_read_micro_batch_holds_each_sample_in_plan_order_with_its_cameras_decoded(planned):
    loader, steps = planned
    batch = _reader(loader).read(0, steps[0])
    assert [sample.index for sample in batch.samples] == [sample.index for sample in steps[0]]
    assert not batch.pending and not batch.failed
    assert {"cam_high", "state"} <= set(batch.values) and len(batch.values["cam_high"]) == len(steps[0])


def test_video_left_pending_and_decoded_by_finish_gives_the_batch_decoded_where_it_was_read(planned):
    loader, steps = planned
    here, deferred = _reader(loader), _reader(loader, defer_video=True)
    for step, samples in enumerate(steps):
        pending = deferred.read(step, samples)
        assert set(pending.pending) == {"cam_high"}, "the camera waits for the process that decodes"
        assert _same(here.finish(here.read(step, samples)), deferred.finish(pending))


def test_the_frame_cache_changes_what_is_decoded_not_what_is_delivered(planned):
    loader, steps = planned
    plain, cached = _reader(loader), _reader(loader, frame_cache_bytes=64 << 20)
    horizons = [steps[step + 1 :] for step in range(len(steps))]
    for step, samples in enumerate(steps):
        batch = cached.read(step, samples, horizon=horizons[step])
        assert _same(plain.finish(plain.read(step, samples)), cached.finish(batch))
    assert cached.video_decoder.stats.frames_decoded <= plain.video_decoder.stats.frames_decoded


def test_a_ranks_steps_are_made_once_while_the_kept_ones_hold_at_most_their_bound_of_samples(planned, monkeypatch):
    loader, _ = planned
    made = []
    refs = loader.planner.refs

    def counted(plan, slots):
        made.append(len(slots))
        return refs(plan, slots)

    monkeypatch.setattr(loader.planner, "refs", counted)
    steps = loader.planner.rank_steps(loader.planner.epoch_plan(0, 0, [], 1), 0)
    first = [steps[index][1] for index in range(len(steps))]
    assert [steps[index][1] for index in range(len(steps))] == first and len(made) == len(steps), "made once each"
    monkeypatch.setattr(type(steps), "KEPT_SAMPLES", 8)  # two steps of 4
    small = loader.planner.rank_steps(loader.planner.epoch_plan(0, 0, [], 1), 0)
    made.clear()
    assert [small[index][1] for index in range(len(small))] == first
    assert sum(len(samples) for _, samples in small._made.values()) <= 8
    assert small[len(small) - 1][1] == first[-1] and len(made) == len(small), "the last step is still kept"
    assert small[0][1] == first[0] and len(made) == len(small) + 1, "the first was let go and is made again"


def test_a_lone_substitute_sample_is_read_in_a_scope_of_its_own_leaving_the_streams_scope_as_it_was(planned):
    loader, steps = planned
    reader = _reader(loader, defer_video=True, frame_cache_bytes=64 << 20)
    pending = reader.read(0, steps[0], horizon=steps[1:])
    scope = reader.scope
    kept = (scope.on_error, scope.defer_video, scope.frame_cache, dict(scope.aligned_ahead), scope.frame_cache.bytes)
    alone = reader._read_alone(0, steps[0][0])
    assert not alone.pending and not alone.failed, "decoded here, whatever the stream defers"
    assert (scope.on_error, scope.defer_video, scope.frame_cache, scope.aligned_ahead, scope.frame_cache.bytes) == kept
    assert reader.scope is scope and pending.pending


def test_each_stage_of_the_front_half_is_timed_under_its_own_name(planned):
    loader, steps = planned
    batch = _reader(loader).read(0, steps[0])
    assert {"fetch", "align", "lowdim", "decode_prepare", "decode"} == set(batch.seconds) == set(batch.cpu_seconds)
