"""The decoded-frame cache changes how often a segment is decoded, never what a batch holds: batches are
bit-identical with it on and off (workers or not, both layouts, windows and sequences, across exact and
elastic resumes, and with a bound smaller than one segment), it stays within its byte bound, and on a
plan whose steps share segments it serves frames instead of decoding them again."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import mmdata
from mmdata.errors import OptionError, ResumeError
from mmdata.loading.frame_cache import FrameCache
from mmdata.loading.timing import Stage
from tests.test_loader import assert_same_batches

WINDOWS = mmdata.Windows(
    anchor_fps=15,
    streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "cam_wrist": mmdata.Frames(offsets=[0.0])},
)
SEQUENCES = mmdata.Sequences(fps=10, max_seconds=0.6, streams={"cam_high": mmdata.Frames(), "state": mmdata.Values()})
SPECS = {"windows": (WINDOWS, 4), "sequences": (SEQUENCES, 2)}  # (spec, batch_size)


def loader(store, kind: str, cache_bytes: int, workers: int = 0, shuffle="global", **options) -> mmdata.DataLoader:
    spec, batch_size = SPECS[kind]
    return mmdata.DataLoader(
        str(store),
        spec,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=workers,
        seed=5,
        shuffling=mmdata.Shuffling(lanes=2 if shuffle == "blocks" else None),
        runtime=mmdata.Runtime(decoder="pyav", **options),
        reading=mmdata.Reading(frame_cache_bytes=cache_bytes),
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SPECS))
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_batches_are_identical_with_the_cache_on_and_off_in_one_process(stores, layout, kind):
    for shuffle in ("none", "global"):
        off = list(loader(stores[layout], kind, 0, shuffle=shuffle))
        on = loader(stores[layout], kind, 64 << 20, shuffle=shuffle)
        assert_same_batches(list(on), off)
        if shuffle == "none":
            assert on.stats()["frames_decoded"] < loader_stats_of(stores[layout], kind)["frames_decoded"]


def loader_stats_of(store, kind: str) -> dict:
    run = loader(store, kind, 0, shuffle="none")
    list(run)
    return run.stats()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SPECS))
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_batches_are_identical_with_the_cache_on_and_off_with_two_workers(stores, layout, kind):
    off = list(loader(stores[layout], kind, 0, workers=2))
    assert_same_batches(list(loader(stores[layout], kind, 64 << 20, workers=2)), off)


def test_a_segment_the_cache_serves_whole_is_not_read_again(stores):
    def bytes_read(cache_bytes: int) -> int:
        run = loader(stores["wds"], "windows", cache_bytes, shuffle="none")
        list(run)
        return run.stats()["bytes_read"]

    with_cache, without = bytes_read(64 << 20), bytes_read(0)
    assert with_cache < 0.5 * without  # 0.22 on this store


def test_a_cache_smaller_than_one_segment_still_gives_identical_batches(stores):
    off = list(loader(stores["wds"], "windows", 0, shuffle="none"))
    tiny = loader(stores["wds"], "windows", 1000, shuffle="none")  # less than one 224x224 frame
    assert_same_batches(list(tiny), off)
    assert tiny.stats()["frame_cache_peak_bytes"] <= 1000


def test_the_cache_never_holds_more_than_its_bound(stores):
    bound = 3 * 224 * 224 * 3 + 100  # three frames of cam_high
    run = loader(stores["wds"], "windows", bound, shuffle="none")
    list(run)
    assert 0 < run.stats()["frame_cache_peak_bytes"] <= bound


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_an_exact_resume_with_the_cache_gives_the_uninterrupted_batches(stores, kind):
    whole = list(loader(stores["zarr"], kind, 64 << 20))
    first = loader(stores["zarr"], kind, 64 << 20)
    k = len(whole) // 2
    for step, _ in enumerate(first):
        if step + 1 == k:
            break
    resumed = loader(stores["zarr"], kind, 64 << 20)
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(list(resumed), whole[k:])


@pytest.mark.slow
def test_an_elastic_resume_with_the_cache_gives_the_batches_it_gives_without(stores):
    def resumed_at(world: int, cache_bytes: int) -> list[list[dict]]:
        first = [loader(stores["wds"], "windows", cache_bytes, rank=rank, world_size=2) for rank in range(2)]
        for run in first:
            for step, _ in enumerate(run):
                if step + 1 == 3:
                    break
        second = [loader(stores["wds"], "windows", cache_bytes, rank=rank, world_size=world) for rank in range(world)]
        for run in second:
            run.load_state_dict(first[0].state_dict())
        return [list(run) for run in second]

    for with_cache, without in zip(resumed_at(3, 64 << 20), resumed_at(3, 0)):
        assert_same_batches(with_cache, without)


def _decoded(frames: int = 1) -> np.ndarray:
    """A decoder's output of `frames` frames of 100 bytes, in memory of its own."""
    return np.zeros((frames, 100), np.uint8)


def test_frames_no_planned_read_needs_are_dropped_and_the_furthest_use_goes_first():
    cache = FrameCache(max_bytes=3 * 100)
    now = cache.start_read()
    cache.expect(now + 1, [("near", (0, 1))])
    cache.expect(now + 2, [("near", (1,))])
    cache.expect(now + 9, [("far", (0,))])
    cache.keep_decoded("near", (0, 1), _decoded(2))
    cache.keep_decoded("unplanned", (0,), _decoded())  # no planned read needs it: not kept
    cache.keep_decoded("far", (0,), _decoded())
    assert cache.bytes == 300 and set(cache.cached("near")) == {0, 1}
    cache.expect(now + 1, [("nearest", (5,))])
    cache.keep_decoded("nearest", (5,), _decoded())  # over the bound: "far" (needed last) is dropped
    assert cache.bytes == 300 and not cache.cached("far") and cache.stats.evicted == 1
    cache.start_read()
    cache.start_read()  # read 1 is done: frame 0 of "near" and all of "nearest" are needed by no planned read
    assert set(cache.cached("near")) == {1} and cache.bytes == 200  # frame 1 still views the output of two


def test_kept_frames_view_an_output_mostly_kept_and_copy_out_of_one_mostly_not():
    cache = FrameCache(max_bytes=1 << 20)
    now = cache.start_read()
    cache.expect(now + 1, [("dense", (0, 1, 2)), ("sparse", (7,))])
    dense, sparse = _decoded(4), _decoded(8)
    cache.keep_decoded("dense", (0, 1, 2, 3), dense)
    cache.keep_decoded("sparse", tuple(range(8)), sparse)
    assert all(np.shares_memory(cache.cached("dense")[frame], dense) for frame in (0, 1, 2))
    assert not np.shares_memory(cache.cached("sparse")[7], sparse)
    assert cache.bytes == 400 + 100  # the dense output whole, once; the sparse one's kept frame alone
    ring = np.zeros(1000, np.uint8)  # memory that is written again (a frame ring): never viewed
    cache.expect(now + 1, [("ring", (0,))])
    cache.keep_decoded("ring", (0,), np.frombuffer(ring.data, np.uint8)[:100].reshape(1, 100))
    assert not np.shares_memory(cache.cached("ring")[0], ring)
    cache.start_read()
    cache.start_read()
    assert cache.bytes == 0 and not cache.cached("dense")


def test_the_default_order_is_blocks_where_the_spec_reads_a_camera_and_locality_elsewhere(stores):
    def shuffle_of(spec=WINDOWS, **batch) -> str:
        return mmdata.DataLoader(str(stores["wds"]), spec, **batch).shuffle

    assert shuffle_of(batch_size=4) == "blocks"
    assert shuffle_of(batching=mmdata.Batching(batch_tokens=64)) == "blocks"
    lowdim = mmdata.Windows(anchor_fps=15, streams={"state": mmdata.Values(offsets=[0.0])})
    assert shuffle_of(lowdim, batch_size=4) == "locality"


@pytest.mark.slow
def test_the_default_order_does_not_depend_on_the_worker_count(stores):
    def batches(workers: int) -> list[dict]:
        return list(
            mmdata.DataLoader(
                str(stores["wds"]), WINDOWS, batch_size=4, num_workers=workers, runtime=mmdata.Runtime(decoder="pyav")
            )
        )

    assert_same_batches(batches(3), batches(0))


def test_a_state_saved_before_the_one_planner_is_refused_by_name_with_how_to_go_on(stores):
    loader = mmdata.DataLoader(str(stores["wds"]), WINDOWS, batch_size=4, num_workers=0)
    next(iter(loader))
    state = {**loader.state_dict(), "version": 1, "epoch": 2}
    loader.close()
    with pytest.raises(ResumeError, match=r"no longer makes.*loader.set_epoch\(3\) instead of load_state_dict"):
        mmdata.DataLoader(str(stores["wds"]), WINDOWS, batch_size=4, num_workers=0).load_state_dict(state)


def test_the_segments_order_is_refused_naming_the_blocks_order_it_became():
    with pytest.raises(OptionError, match="'segments' order is now 'blocks'"):
        mmdata.Shuffling(mode="segments")


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_blocks_order_delivers_each_sample_once_and_the_cache_decodes_less(stores, workers):
    def run(mode, cache_bytes):
        loader_ = loader(stores["wds"], "windows", cache_bytes, workers=workers, shuffle=mode)
        batches = list(loader_)
        return loader_, batches

    segments, with_cache = run("blocks", 64 << 20)
    ids = [i for batch in with_cache for i in batch["sample_index"].tolist()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == len(segments.samples) - len(segments.epoch_plan().left_out)
    _, without_cache = run("blocks", 0)
    assert_same_batches(with_cache, without_cache)
    global_, _ = run("global", 64 << 20)
    assert segments.stats()["frames_decoded"] <= global_.stats()["frames_decoded"]


def test_a_resume_in_the_blocks_order_gives_the_uninterrupted_batches(stores):
    whole = list(loader(stores["zarr"], "windows", 64 << 20, shuffle="blocks"))
    first = loader(stores["zarr"], "windows", 64 << 20, shuffle="blocks")
    for step, _ in enumerate(first):
        if step + 1 == 3:
            break
    resumed = loader(stores["zarr"], "windows", 64 << 20, shuffle="blocks")
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(list(resumed), whole[3:])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_main_process_decoding_follows_the_workers_plan_and_decodes_what_worker_decoding_does(stores, workers):
    def run(cache_bytes: int, decode_in: str) -> tuple[mmdata.DataLoader, list]:
        made = loader(stores["wds"], "windows", cache_bytes, workers=workers, shuffle="blocks", decode_in=decode_in)
        return made, list(made)

    off, expected = run(0, "main")
    on, batches = run(64 << 20, "main")
    in_workers, worker_batches = run(64 << 20, "workers")
    assert_same_batches(batches, expected)
    assert_same_batches(worker_batches, expected)
    followed, planned = on.stats(), in_workers.stats()
    assert followed["frames_decoded"] == planned["frames_decoded"] < off.stats()["frames_decoded"]
    assert followed["decode_waste"] == planned["decode_waste"] < off.stats()["decode_waste"]
    assert 0 < followed["frame_cache_peak_bytes"] <= 64 << 20
    assert followed["decode_cpu_seconds"] > 0 and planned["decode_cpu_seconds"] > 0  # wherever it decoded
    for stats in (followed, planned):  # each stage's CPU wherever it ran, the decoding inside "decode"
        assert {"fetch", "align", "decode_prepare", "decode", "collate"} <= set(stats["stage_cpu_seconds"])
        assert stats["stage_cpu_seconds"]["decode"] >= stats["decode_cpu_seconds"] > 0


def stats_and_cpu_of_an_epoch(store) -> tuple[dict, float]:
    """The stats of a loader (frame cache on, no workers) after one epoch, and the process CPU the epoch took."""
    run = loader(store, "windows", 64 << 20)
    started = time.process_time()
    list(run)
    return run.stats(), time.process_time() - started


def test_the_loader_reports_the_cpu_its_decoder_spent_per_frame_decoded_within_the_cpu_the_run_took(stores):
    stats, spent = stats_and_cpu_of_an_epoch(stores["wds"])
    assert 0 < stats["decode_cpu_seconds"] <= spent
    per_frame = 1000 * stats["decode_cpu_seconds"] / stats["frames_decoded"]
    assert stats["decode_cpu_ms_per_frame"] == pytest.approx(per_frame, rel=1e-3)


def test_the_loader_reports_each_declared_stages_cpu_within_its_wall_time_and_the_cpu_the_run_took(stores):
    stats, spent = stats_and_cpu_of_an_epoch(stores["wds"])
    cpu, wall = stats["stage_cpu_seconds"], stats["worker_stage_seconds"]
    cameras_only = {"fetch", "align", "decode_prepare", "decode", "settle", "collate"}  # fetch told from align
    assert set(cpu) == set(wall) - {"plan"} == cameras_only
    assert cameras_only <= {stage.value for stage in Stage}
    assert all(0 < cpu[stage] <= wall[stage] + 1e-3 for stage in cpu if stage != "settle"), (cpu, wall)
    assert stats["decode_cpu_seconds"] <= cpu["decode"] and sum(cpu.values()) <= spent


@pytest.mark.slow
def test_a_gpu_decoder_in_the_main_process_keeps_the_frames_later_steps_need(stores):
    from mmdata.codecs.decoders.spdl_decoder import SpdlNvdecDecoder
    from tests.test_spdl_decoder import cpu_nvdec

    def run(decoder, cache_bytes: int) -> tuple[mmdata.DataLoader, list]:
        made = mmdata.DataLoader(
            str(stores["wds"]),
            WINDOWS,
            batch_size=4,
            shuffle="blocks",
            num_workers=2,
            seed=5,
            shuffling=mmdata.Shuffling(lanes=2),
            runtime=mmdata.Runtime(decoder=decoder),
            reading=mmdata.Reading(frame_cache_bytes=cache_bytes),
        )
        return made, list(made)

    gpu = SpdlNvdecDecoder(threads=2, decode_segment=cpu_nvdec())  # NVDEC stood in for: device "gpu", main process
    kept, batches = run(gpu, 64 << 20)
    assert kept.decode_in_main
    _, expected = run("pyav", 0)
    assert len(batches) == len(expected)
    for got, want in zip(batches, expected):
        for name in ("sample_index", "cam_high", "cam_wrist"):
            assert torch.equal(torch.as_tensor(got[name]), torch.as_tensor(want[name])), name
    without, _ = run(SpdlNvdecDecoder(threads=2, decode_segment=cpu_nvdec()), 0)
    assert kept.stats()["frames_decoded"] < 0.6 * without.stats()["frames_decoded"]
    assert kept.stats()["frame_cache_peak_bytes"] > 0


def test_frames_kept_for_steps_a_worker_no_longer_reads_stay_until_its_new_plan_and_then_only_those_it_needs():
    cache = FrameCache(1 << 20)
    key = ("episode", "cam", 0)
    cache.start_read()
    cache.expect(0, [(key, (0, 1))])
    cache.expect(1, [(key, (2, 3))])
    cache.keep_decoded(key, [0, 1, 2, 3], np.arange(32, dtype=np.uint8).reshape(4, 8))
    assert set(cache.cached(key)) == {2, 3}
    cache.forget_later()  # (the pool gave read 1's step to another worker)
    assert set(cache.cached(key)) == {2, 3} and not cache.knows(1)
    cache.start_read()
    cache.expect(1, [(key, (2,))])  # the new step needs one of them: served, not decoded again
    cache.release_unplanned()
    assert set(cache.cached(key)) == {2} and cache.bytes > 0
