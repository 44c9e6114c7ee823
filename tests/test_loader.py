"""mmdata.DataLoader: exactly-once epochs over ranks and workers, determinism, exact and elastic resume,
windows that hold the values at the requested times, and clear errors for bad input."""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import time

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

import mmdata
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.synthetic import episode_seconds, read_index_stripe, synthetic_audio, synthetic_lowdim
from tests.conftest import SMALL

LOWDIM_WINDOWS = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(offsets=[-0.1, 0.0])})
POLICY_WINDOWS = mmdata.Windows(
    anchor_fps=10,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[-0.1, 0.0]),
        "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
        "audio": mmdata.Audio(window=(-1.0, 0.0)),
    },
)
POLICY_TOKENS = {"cam_high": 64, "audio": 50}


def run(loader) -> list[dict]:
    return list(loader)


def sample_ids(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch["sample_index"]]


def assert_same_batches(first: list[dict], second: list[dict]) -> None:
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_planned_sample_is_seen_once_per_epoch_across_ranks(stores, world_size, workers):
    loaders = [
        mmdata.DataLoader(
            stores["wds"],
            LOWDIM_WINDOWS,
            num_workers=workers,
            batching=mmdata.Batching(tokens_per={"state": 5}, batch_tokens=40),
            runtime=mmdata.Runtime(rank=rank, world_size=world_size),
        )
        for rank in range(world_size)
    ]
    steps, left_out = len(loaders[0]), loaders[0].epoch_plan().left_out
    per_rank = [run(loader) for loader in loaders]
    assert all(len(batches) == steps for batches in per_rank)
    seen = [i for batches in per_rank for i in sample_ids(batches)]
    assert len(seen) == len(set(seen))
    assert sorted(seen + left_out.tolist()) == list(range(len(loaders[0].samples)))
    assert len(left_out) < world_size


def test_same_seed_gives_identical_batches_and_another_seed_or_epoch_does_not(stores):
    def build(seed):
        return mmdata.DataLoader(
            stores["wds"],
            POLICY_WINDOWS,
            seed=seed,
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=2048),
            num_workers=0,
        )

    first, again = run(build(0)), run(build(0))
    assert_same_batches(first, again)
    assert sample_ids(run(build(1))) != sample_ids(first)
    loader = build(0)
    run(loader)
    assert loader.epoch == 1
    assert sample_ids(run(loader)) != sample_ids(first)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_resume_after_k_steps_matches_the_uninterrupted_run(stores, layout, workers):
    def build():
        return mmdata.DataLoader(
            stores[layout],
            POLICY_WINDOWS,
            num_workers=workers,
            seed=3,
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
        )

    uninterrupted = run(build())
    interrupted = build()
    k = len(uninterrupted) // 2
    for step, _ in enumerate(interrupted):
        if step + 1 == k:
            break
    state = interrupted.state_dict()
    assert len(json.dumps(state)) < 4096
    resumed = build()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert_same_batches(run(resumed), uninterrupted[k:])
    assert resumed.epoch == 1


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 3)])
def test_elastic_resume_covers_the_rest_of_the_epoch_exactly_once(stores, before, after):
    def build(rank, world):
        return mmdata.DataLoader(
            stores["wds"],
            LOWDIM_WINDOWS,
            seed=7,
            batching=mmdata.Batching(tokens_per={"state": 5}, batch_tokens=20),
            runtime=mmdata.Runtime(rank=rank, world_size=world),
            num_workers=0,
        )

    first = [build(rank, before) for rank in range(before)]
    k = len(first[0]) // 2
    seen = []
    for loader in first:
        for step, batch in enumerate(loader):
            seen += sample_ids([batch])
            if step + 1 == k:
                break
    states = [loader.state_dict() for loader in first]
    assert all(state == states[0] for state in states)
    second = [build(rank, after) for rank in range(after)]
    for loader in second:
        loader.load_state_dict(states[0])
    total, left_out = len(second[0]), second[0].epoch_plan().left_out.tolist()
    rest = [run(loader) for loader in second]
    assert len({len(batches) for batches in rest}) == 1
    seen += [i for batches in rest for i in sample_ids(batches)]
    assert len(seen) == len(set(seen))
    assert sorted(seen + left_out) == list(range(len(second[0].samples)))
    assert total == k + len(rest[0])


def test_windows_hold_the_frames_values_and_audio_at_the_requested_times(stores):
    spec = mmdata.Windows(
        anchor_fps=7,
        streams={
            "cam_high": mmdata.Frames(offsets=[-0.2, -0.1, 0.0]),
            "state": mmdata.Values(offsets=[-0.3, 0.0]),
            "action": mmdata.Values(offsets=[0.0, 0.5, 1.0]),
            "audio": mmdata.Audio(window=(-0.5, 0.0)),
        },
    )
    loader = mmdata.DataLoader(stores["zarr"], spec, batch_size=8, seed=11, num_workers=0)
    seconds = episode_seconds(SMALL)
    dataset = mmdata.open_dataset(stores["zarr"])
    checked_edges = {"start": False, "end": False}
    for batch in loader:
        for row, (episode, anchor) in enumerate(zip(batch["episode_index"].tolist(), batch["time"].tolist())):
            source = int(dataset.manifest.row(episode)["source"].split("_")[-1])
            duration = seconds[source]
            frames = round(duration * SMALL.fps)
            for column, offset in enumerate([-0.2, -0.1, 0.0]):
                t = anchor + offset
                expected = min(max(round(t * SMALL.fps), 0), frames - 1)
                assert read_index_stripe(batch["cam_high"][row, column].numpy()) == expected
                assert bool(batch["cam_high_is_pad"][row, column]) == (t < -1e-9 or expected < round(t * SMALL.fps))
            state, action = synthetic_lowdim(duration, SMALL.lowdim_rate, SMALL.dof, SMALL.seed * 1000 + source)
            last = (len(state) - 1) / SMALL.lowdim_rate
            for name, values, offsets in (("state", state, [-0.3, 0.0]), ("action", action, [0.0, 0.5, 1.0])):
                for column, offset in enumerate(offsets):
                    t = anchor + offset
                    index = min(max(round(t * SMALL.lowdim_rate), 0), len(values) - 1)
                    np.testing.assert_array_equal(batch[name][row, column].numpy(), values[index])
                    pad = t < -1e-9 or t > last + 1e-9
                    assert bool(batch[f"{name}_is_pad"][row, column]) == pad
                    checked_edges["start" if t < 0 else "end"] |= pad
            audio = synthetic_audio(duration, SMALL.audio_rate).astype(np.float32) / 32768.0
            first = int(np.ceil((anchor - 0.5) * SMALL.audio_rate - 1e-6))
            indices = first + np.arange(int(0.5 * SMALL.audio_rate))
            inside = (indices >= 0) & (indices < len(audio))
            expected_audio = np.where(inside, audio[np.clip(indices, 0, len(audio) - 1)], 0.0)
            np.testing.assert_array_equal(batch["audio"][row, :, 0].numpy(), expected_audio)
            np.testing.assert_array_equal(batch["audio_is_pad"][row].numpy(), ~inside)
    assert checked_edges == {"start": True, "end": True}


@pytest.mark.slow
def test_sequences_are_chunked_packed_within_budget_and_cover_every_chunk_once(stores):
    spec = mmdata.Sequences(
        fps=10, max_seconds=1.0, streams={"cam_high": mmdata.Frames(), "action": mmdata.Values(rate=50)}
    )
    loader = mmdata.DataLoader(
        stores["wds"], spec, num_workers=2, batching=mmdata.Batching(tokens_per={"cam_high": 16}, batch_tokens=700)
    )
    seen, left_out = [], loader.epoch_plan().left_out.tolist()
    for batch in loader:
        assert int(batch["cu_seqlens"][-1]) <= 700
        frames_per_sample = torch.diff(batch["cam_high_cu_seqlens"])
        actions_per_sample = torch.diff(batch["action_cu_seqlens"])
        expected_tokens = frames_per_sample * 16 + actions_per_sample
        assert torch.equal(batch["seq_lens"].long(), expected_tokens.long())
        starts = batch["cam_high_cu_seqlens"][:-1].long()
        for start, anchor in zip(starts, batch["time"]):
            assert read_index_stripe(batch["cam_high"][start].numpy()) == round(float(anchor) * 30)
        seen += sample_ids([batch])
    assert sorted(seen + left_out) == list(range(len(loader.samples)))
    assert len(set(loader.samples.episodes_of(np.arange(len(loader.samples)))[1].tolist())) > 1


def test_padded_layout_pads_sequences_to_the_longest_and_flags_the_padding(stores):
    spec = mmdata.Sequences(fps=5, max_seconds=2.0, streams={"state": mmdata.Values()})
    batches = run(
        mmdata.DataLoader(
            stores["wds"], spec, batch_size=4, shuffle="none", batching=mmdata.Batching(layout="padded"), num_workers=0
        )
    )
    for batch in batches:
        lengths = batch["state_lengths"]
        assert batch["state"].shape[:2] == (len(lengths), int(lengths.max()))
        for row, length in enumerate(lengths.tolist()):
            assert not batch["state_is_pad"][row, :length].any()
            assert batch["state_is_pad"][row, length:].all()
            assert batch["key_padding_mask"][row].sum() == batch["seq_lens"][row]


@pytest.mark.slow
def test_decoding_in_the_main_process_gives_the_same_batches_as_in_workers(stores):
    def build(decode_in):
        return mmdata.DataLoader(
            stores["wds"],
            POLICY_WINDOWS,
            num_workers=2,
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
            runtime=mmdata.Runtime(decode_in=decode_in),
        )

    assert_same_batches(run(build("main")), run(build("workers")))


def test_batches_from_workers_are_the_tensors_an_in_process_loader_gives(stores):
    """Small tensors cross from workers inside the message as arrays; they arrive as tensors again."""

    def build(workers):
        return mmdata.DataLoader(stores["zarr"], POLICY_WINDOWS, batch_size=4, shuffle="none", num_workers=workers)

    in_process, from_workers = run(build(0)), run(build(2))
    assert_same_batches(in_process, from_workers)
    for batch in from_workers:
        assert not any(isinstance(value, np.ndarray) for value in batch.values())
        assert batch["state"].dtype == torch.float32 and batch["sample_index"].dtype == torch.int64


def test_episode_filters_select_by_id_task_and_manifest_expression(stores):
    dataset = mmdata.open_dataset(stores["wds"])
    tasks = dataset.table.column("task").to_pylist()
    durations = dataset.table.column("duration").to_pylist()

    def episodes_seen(episodes):
        loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=16, episodes=episodes, num_workers=0)
        return {int(e) for batch in loader for e in batch["episode_index"]}

    assert episodes_seen(mmdata.Episodes(ids=[0, 2])) == {0, 2}
    assert episodes_seen(mmdata.Episodes(tasks=[tasks[1]])) == {i for i, t in enumerate(tasks) if t == tasks[1]}
    longest = max(durations)
    assert episodes_seen(mmdata.Episodes(where=pc.field("duration") >= longest)) == {durations.index(longest)}
    assert episodes_seen(mmdata.Episodes(where=lambda row: row["episode_index"] != 0)) == {1, 2}


def test_a_spec_naming_a_missing_stream_fails_when_the_loader_is_built(stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"cam_top": mmdata.Frames()})
    with pytest.raises(mmdata.SpecError, match="no stream named 'cam_top'.*cam_high"):
        mmdata.DataLoader(stores["wds"], spec, batch_size=4, num_workers=0)


def test_a_stream_read_as_the_wrong_kind_fails_naming_the_right_spec(stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Frames()})
    with pytest.raises(mmdata.SpecError, match="stream 'state' is lowdim.*Values"):
        mmdata.DataLoader(stores["wds"], spec, batch_size=4, num_workers=0)


def test_offsets_denser_than_the_recorded_rate_fail_naming_the_rate(stores):
    dense_values = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values(offsets=[0.0, 0.01])})
    with pytest.raises(mmdata.SpecError, match="recorded at 50 Hz.*interpolation='linear'"):
        mmdata.DataLoader(stores["wds"], dense_values, batch_size=4, num_workers=0)
    dense_frames = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[0.0, 0.01])})
    with pytest.raises(mmdata.SpecError, match="recorded at 30 frames/s"):
        mmdata.DataLoader(stores["wds"], dense_frames, batch_size=4, num_workers=0)
    resampled = mmdata.Windows(
        anchor_fps=10, streams={"state": mmdata.Values(offsets=[0.0, 0.01], interpolation="linear")}
    )
    assert len(mmdata.DataLoader(stores["wds"], resampled, batch_size=4, num_workers=0)) > 0


def test_a_token_budget_smaller_than_one_sample_fails_with_the_sample_cost(stores):
    with pytest.raises(mmdata.SpecError, match="smaller than one sample.*takes 614 tokens"):
        mmdata.DataLoader(
            stores["wds"],
            POLICY_WINDOWS,
            batching=mmdata.Batching(tokens_per={"cam_high": 256, "audio": 50}, batch_tokens=600),
            num_workers=0,
        )


def test_bad_loader_arguments_are_value_errors(stores):
    with pytest.raises(ValueError, match="give the batch: batch_size="):
        mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, num_workers=0)
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        mmdata.DataLoader(
            stores["wds"], LOWDIM_WINDOWS, batch_size=2, runtime=mmdata.Runtime(rank=2, world_size=2), num_workers=0
        )
    with pytest.raises(mmdata.SpecError, match="tokens_per names streams the spec does not read: audio"):
        mmdata.DataLoader(
            stores["wds"],
            LOWDIM_WINDOWS,
            batching=mmdata.Batching(batch_tokens=64, tokens_per={"audio": 1}),
            num_workers=0,
        )


@pytest.mark.parametrize(
    "option, value",
    [
        ("batch_size", 2.5),
        ("shuffling.window", 0),
        ("shuffling.shards_per_group", -1),
        ("prefetch_factor", 0),
        ("reading.cache_bytes", -1),
        ("seed", -1),
        ("seed", True),
        ("num_workers", -2),
        ("batch_size", 10**15),
        ("num_workers", 10**6),
        ("prefetch_factor", 10**9),
    ],
)
def test_counts_that_are_not_whole_numbers_in_range_are_named(stores, option, value):
    from mmdata.errors import OptionError

    group, _, name = option.rpartition(".")
    groups = {"shuffling": mmdata.Shuffling, "reading": mmdata.Reading}
    with pytest.raises(
        OptionError, match=f"{'shuffle_window' if name == 'window' else name} is .*(not an integer|outside)"
    ):
        options = {"batch_size": 2, **({group: groups[group](**{name: value})} if group else {name: value})}
        mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, **options)


@pytest.mark.parametrize("tokens", [float("nan"), float("inf"), -3, 0, "8"])
def test_a_token_cost_that_is_not_a_positive_number_is_named(stores, tokens):
    with pytest.raises(ValueError, match="tokens_per\\['state'\\] is a positive number of tokens"):
        mmdata.DataLoader(
            stores["wds"],
            LOWDIM_WINDOWS,
            batching=mmdata.Batching(batch_tokens=64, tokens_per={"state": tokens}),
            num_workers=0,
        )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: mmdata.Values(offsets=[float("nan")]), r"an offset is nan, outside"),
        (lambda: mmdata.Frames(offsets=[0.0, float("inf")]), r"an offset is inf, outside"),
        (lambda: mmdata.Frames(offsets=["soon"]), r"an offset is 'soon', not a number"),
        (lambda: mmdata.Frames(tolerance=float("nan")), r"tolerance is nan"),
        (lambda: mmdata.Values(rate=0), r"rate must be positive"),
        (lambda: mmdata.Audio(window=(float("-inf"), 0.0)), r"an audio window's end is -inf"),
        (lambda: mmdata.Audio(sample_rate=10**9), r"sample_rate is a whole number of Hz"),
        (lambda: mmdata.Windows(anchor_fps=float("inf"), streams={"state": mmdata.Values()}), r"anchor_fps is inf"),
        (lambda: mmdata.Sequences(fps=float("nan"), streams={"state": mmdata.Values()}), r"fps is nan"),
        (lambda: mmdata.Sequences(fps=10, max_seconds=float("nan"), streams={"state": mmdata.Values()}), "max_seconds"),
        (lambda: mmdata.Resize((100_000, 100_000)), r"resize size \(height, width\) is 100000, outside \[1, 8192\]"),
    ],
)
def test_specs_refuse_numbers_that_are_not_finite_or_out_of_range(make, message):
    with pytest.raises(mmdata.SpecError, match=message):
        make()


def test_a_state_from_another_spec_is_refused(stores):
    loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=4, num_workers=0)
    other = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=8, num_workers=0)
    with pytest.raises(mmdata.ResumeError, match="other data or other sampling"):
        other.load_state_dict(loader.state_dict())
    with pytest.raises(mmdata.ResumeError, match="not an mmdata.DataLoader state"):
        other.load_state_dict({"epoch": 3})


@pytest.fixture
def damaged_store(stores, tmp_path):
    """The WebDataset store with one video segment of one episode overwritten with noise."""
    copy = tmp_path / "damaged.wds"
    shutil.copytree(stores["wds"], copy)
    row = mmdata.open_dataset(copy).manifest.row(1)
    segment = row["cam_high/segments"][0]
    with open(copy / segment["path"], "r+b") as shard:
        shard.seek(segment["offset"] + 64)
        shard.write(np.random.default_rng(0).integers(0, 256, segment["size"] - 64, dtype=np.uint8).tobytes())
    return copy, row["key"], segment["path"]


def test_a_corrupt_shard_met_mid_epoch_stops_the_run_naming_shard_and_episode(damaged_store):
    path, key, shard = damaged_store
    loader = mmdata.DataLoader(
        path,
        POLICY_WINDOWS,
        shuffle="none",
        batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
        num_workers=0,
    )
    with pytest.raises(mmdata.SampleError, match=rf"shard '{shard}', episode '{key}', stream 'cam_high'.*checksum"):
        run(loader)


@pytest.mark.slow
def test_skipping_corrupt_samples_replaces_them_deterministically_and_keeps_ranks_in_step(damaged_store):
    path, _, _ = damaged_store

    def build(rank):
        return mmdata.DataLoader(
            path,
            POLICY_WINDOWS,
            num_workers=2,
            on_error="skip",
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
            runtime=mmdata.Runtime(rank=rank, world_size=2),
        )

    loaders = [build(0), build(1)]
    steps = len(loaders[0])
    per_rank = [run(loader) for loader in loaders]
    assert len(per_rank[0]) == len(per_rank[1]) == steps
    skipped = sum(loader.stats()["skipped_samples"] for loader in loaders)
    assert skipped > 0
    assert all("checksum" in message for loader in loaders for message in loader.stats()["skipped"])
    for batches in per_rank:
        for batch in batches:
            assert int(batch["cu_seqlens"][-1]) <= 1024
    assert_same_batches(run(build(0)), per_rank[0])


def test_the_default_rank_comes_from_torchrun_environment(stores, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=4, num_workers=0)
    assert (loader.rank, loader.world_size) == (1, 3)


@pytest.mark.slow
def test_a_corrupt_shard_stops_the_run_when_video_is_decoded_in_the_main_process(damaged_store):
    path, key, shard = damaged_store
    loader = mmdata.DataLoader(
        path,
        POLICY_WINDOWS,
        shuffle="none",
        num_workers=2,
        batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
        runtime=mmdata.Runtime(decode_in="main"),
        reading=mmdata.Reading(verify=False),
    )
    with pytest.raises(mmdata.SampleError, match=rf"shard '{shard}', episode '{key}', stream 'cam_high'"):
        run(loader)


def test_a_cuda_device_without_index_follows_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert mmdata.Runtime(device="cuda").resolved_device() == torch.device("cuda", 3)
    assert mmdata.Runtime(device="cuda:1").resolved_device() == torch.device("cuda", 1)
    assert mmdata.Runtime(device="cpu").resolved_device() == torch.device("cpu")


@pytest.mark.slow
def test_workers_carry_on_into_the_next_epoch_with_the_batches_a_fresh_loader_gives(stores):
    def build():
        return mmdata.DataLoader(
            stores["wds"],
            POLICY_WINDOWS,
            num_workers=2,
            seed=4,
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
        )

    loader = build()
    run(loader)
    second_epoch = run(loader)
    assert len(loader.stats()["worker_pids"]) == 2
    fresh = build()
    fresh.set_epoch(1)
    assert_same_batches(second_epoch, run(fresh))


@pytest.mark.slow
def test_dropping_a_loader_stops_its_workers(stores):
    import multiprocessing

    already_running = set(multiprocessing.active_children())  # another test's, not this loader's
    loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=8, num_workers=2)
    next(iter(loader))

    def workers() -> set:
        return set(multiprocessing.active_children()) - already_running

    assert len(workers()) >= 2
    del loader
    deadline = time.time() + 10
    while workers() and time.time() < deadline:
        time.sleep(0.05)
    assert not workers()


class _DestroyedOnlyWhereMade:
    """A stand-in for a native object (a DALI pipeline) whose destructor crashes outside the process that made it."""

    def __init__(self):
        self.owner = os.getpid()
        self.cycle = self

    def __del__(self):
        if os.getpid() != self.owner:
            os.kill(os.getpid(), signal.SIGSEGV)


class _CollectingPyAv(PyAvDecoder):
    """PyAV that runs a full garbage collection before each batch, as a busy worker eventually does."""

    def _decode_batch(self, requests, on_error):
        gc.collect()
        return super()._decode_batch(requests, on_error)


@pytest.mark.slow
def test_workers_never_destroy_what_the_parent_left_as_garbage(stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[0.0])})
    gc.disable()
    try:
        _DestroyedOnlyWhereMade()  # garbage in a cycle, inherited by the workers forked next
        loader = mmdata.DataLoader(
            stores["wds"], spec, batch_size=8, num_workers=2, runtime=mmdata.Runtime(decoder=_CollectingPyAv())
        )
        assert sum(len(batch["sample_index"]) for batch in loader) == len(loader.samples)
    finally:
        gc.enable()
    gc.collect()  # here, in the process that made it, it is destroyed


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_store_behind_an_fsspec_url_gives_the_same_batches_as_on_disk(stores, workers):
    import fsspec

    fs = fsspec.filesystem("memory")
    target = f"/loader-stores/{stores['wds'].name}-{workers}"
    fs.put(str(stores["wds"]), target, recursive=True)

    def build(location):
        return mmdata.DataLoader(
            location,
            POLICY_WINDOWS,
            num_workers=workers,
            seed=9,
            batching=mmdata.Batching(tokens_per=POLICY_TOKENS, batch_tokens=1024),
        )

    remote = build(f"memory://{target}")
    assert_same_batches(run(remote), run(build(stores["wds"])))
    assert remote.stats()["bytes_read"] > 0


def test_an_epoch_with_no_step_for_the_ranks_is_a_clear_error(stores):
    spec = mmdata.Windows(anchor_fps=0.2, streams={"state": mmdata.Values()})
    loader = mmdata.DataLoader(
        stores["wds"], spec, batch_size=4, runtime=mmdata.Runtime(rank=0, world_size=64), num_workers=0
    )
    with pytest.raises(mmdata.SpecError, match="no step for 64 rank"):
        run(loader)


def test_a_loader_closed_mid_epoch_continues_at_the_next_step(stores):
    spec = mmdata.Windows(anchor_fps=10, streams={"state": mmdata.Values()})
    whole = [
        b["sample_index"].tolist() for b in mmdata.DataLoader(str(stores["wds"]), spec, batch_size=4, num_workers=0)
    ]
    loader = mmdata.DataLoader(str(stores["wds"]), spec, batch_size=4, num_workers=0)
    iterator = iter(loader)
    head = [next(iterator)["sample_index"].tolist() for _ in range(3)]
    loader.close()
    tail = [b["sample_index"].tolist() for b in loader]
    assert head + tail == whole


@pytest.mark.slow
def test_shuffle_true_and_false_mean_the_default_shuffle_and_none_as_in_torch(stores):
    def order(shuffle):
        loader = mmdata.DataLoader(stores["wds"], POLICY_WINDOWS, batch_size=4, shuffle=shuffle, seed=1, num_workers=0)
        return [(e, t) for b in loader for e, t in zip(b["episode_index"].tolist(), b["time"].tolist())]

    assert order(True) == order("auto") == order("blocks") != order(False) == order("none")
    with pytest.raises(
        ValueError, match="shuffle is True, False or one of auto, blocks, locality, global, none, not 'yes'"
    ):
        mmdata.DataLoader(stores["wds"], POLICY_WINDOWS, batch_size=4, shuffle="yes", num_workers=0)


@pytest.mark.parametrize(
    "stretches",
    [[[0, 3]], [[-3, 3]], [[2, -1]], [["2", 3]], [[True, 3]], "two", [[2]]],
    ids=["world-0", "world-negative", "steps-negative", "text", "bool", "not-a-list", "short"],
)
def test_a_state_with_an_impossible_world_size_or_step_is_a_resume_error(stores, stretches):
    from mmdata.errors import ResumeError

    loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=2, num_workers=0)
    state = loader.state_dict() | {"stretches": stretches}
    with pytest.raises(ResumeError, match="the loader state is incomplete or damaged"):
        loader.load_state_dict(state)


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("stretches", [[1, 1]] * 1_000_000, "at most 4096"),
        ("epoch", 2**62, "epoch"),
        ("episodes", "three", "'episodes'"),
        ("episodes", [-1], "episode count"),
        ("episodes", [{"a": 1}], "episode count"),
    ],
    ids=["a-million-stretches", "epoch-2-62", "episodes-text", "episodes-negative", "episodes-object"],
)
def test_a_state_beyond_what_a_run_can_hold_is_refused_naming_its_field(stores, field, value, named):
    from mmdata.errors import ResumeError

    loader = mmdata.DataLoader(stores["wds"], LOWDIM_WINDOWS, batch_size=2, num_workers=0)
    with pytest.raises(ResumeError, match=f"incomplete or damaged: .*{named}"):
        loader.load_state_dict(loader.state_dict() | {field: value})
    with pytest.raises(mmdata.OptionError, match="set_epoch's epoch"):
        loader.set_epoch(2**62)


def test_stats_give_the_training_loops_own_time_per_step_apart_from_its_wait_for_data(stores):
    loader = mmdata.DataLoader(stores["wds"], POLICY_WINDOWS, batch_size=4, num_workers=0)
    for taken, _ in enumerate(loader):
        time.sleep(0.03)  # the training step
        if taken == 4:
            break
    stats = loader.stats()
    assert stats["loop_ms"]["p50"] >= 30 and stats["loop_seconds"] >= 4 * 0.03
    assert 0 < stats["wait_share"] < 1
    assert stats["wait_share"] == pytest.approx(
        stats["data_wait_seconds"] / (stats["data_wait_seconds"] + stats["loop_seconds"]), abs=1e-3
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_float_frames_are_the_uint8_frames_divided_by_255_in_float32(stores, workers):
    def frames(dtype):
        spec = mmdata.Windows(
            anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0], channels_first=True, dtype=dtype)}
        )
        loader = mmdata.DataLoader(stores["wds"], spec, batch_size=4, num_workers=workers, seed=2)
        return [batch["cam_high"] for _, batch in zip(range(6), loader)]

    for whole, unit in zip(frames("uint8"), frames("float32")):
        assert unit.dtype == torch.float32 and unit.shape == whole.shape
        assert torch.equal(unit, whole.to(torch.float32) / 255)


def test_a_cameras_dtype_is_uint8_or_float32():
    with pytest.raises(mmdata.SpecError, match="dtype"):
        mmdata.Frames(dtype="float16")
