"""`mmdata convert --append`: new episodes after the store's own, nothing it holds rewritten, one version
published whole, an interrupted append resumed to the same bytes, old readers and loader states safe."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import DestinationError, OptionError, ResumeError, SourceError
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.statistics import compute_stats, read_stats
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import CameraSpec, SynthSpec, write_synthetic_dataset
from tests.conftest import run_cli
from tests.test_resume import kill_when

FIRST = SynthSpec(episodes=3, min_seconds=1.0, max_seconds=2.0, seed=11)
SECOND = SynthSpec(episodes=3, min_seconds=1.0, max_seconds=2.0, seed=12)
ARGS = ("--workers", "1", "--quiet")
EPOCH = {"SOURCE_DATE_EPOCH": "1767225600"}  # 2026-01-01: both runs of the kill test stamp the same time


@pytest.fixture(scope="module")
def raws(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("append-raw")
    made = {}
    for name, spec in (("first", FIRST), ("second", SECOND)):
        write_synthetic_dataset(root / name, spec)
        made[name] = root / name
    other = SynthSpec(episodes=1, min_seconds=1.0, max_seconds=1.5, cameras=(CameraSpec("cam_high", 224, 224),))
    write_synthetic_dataset(root / "one_camera", other)
    made["one_camera"] = root / "one_camera"
    smaller = SynthSpec(
        episodes=1,
        min_seconds=1.0,
        max_seconds=1.5,
        cameras=(CameraSpec("cam_high", 112, 112), CameraSpec("cam_wrist", 208, 160)),
    )
    write_synthetic_dataset(root / "smaller", smaller)
    made["smaller"] = root / "smaller"
    return made


def converted(raw: Path, destination: Path, layout: str, **options) -> Path:
    settings = dict(layout=layout, shard_bytes=60_000, workers=1, progress=False) | options
    convert(discover_raw_episodes(raw), destination, ConvertOptions(**settings), source_root=raw)
    return destination


def appended(raw: Path, destination: Path, **options) -> mmdata.conversion.pipeline.ConversionReport:
    settings = dict(workers=1, progress=False, append=True) | options
    return convert(discover_raw_episodes(raw), destination, ConvertOptions(**settings), source_root=raw)


def episode_values(dataset, index: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    episode = dataset.read_episode(index)
    return {name: (np.asarray(data.values), np.asarray(data.timestamps)) for name, data in episode.streams.items()}


def assert_same_episode(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name][0], b[name][0]) and np.array_equal(a[name][1], b[name][1]), name


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_appended_episodes_follow_the_stores_own_and_read_as_a_store_of_their_own(raws, tmp_path, layout):
    store = converted(raws["first"], tmp_path / "store", layout)
    alone = converted(raws["second"], tmp_path / "alone", layout)
    before = mmdata.open_dataset(str(store))
    old = [episode_values(before, i) for i in range(len(before))]
    old_rows = before.table.to_pylist()
    old_shards = {p.name: p.read_bytes() for p in (store / "shards").glob("*.tar")} if layout == "wds" else {}

    report = appended(raws["second"], store)
    assert (report.converted, report.first_episode) == (3, 3)

    after = mmdata.open_dataset(str(store))
    assert len(after) == 6 and after.schema.num_episodes == 6
    assert after.table.to_pylist()[:3] == old_rows  # the old episodes' rows, pieces and checksums as they were
    for index in range(3):
        assert_same_episode(episode_values(after, index), old[index])
    reference = mmdata.open_dataset(str(alone))
    for index in range(3):
        assert_same_episode(episode_values(after, 3 + index), episode_values(reference, index))
    assert after.table.column("key").to_pylist() == [f"episode_{i:06d}" for i in range(6)]
    for name, data in old_shards.items():  # existing shards are never rewritten
        assert (store / "shards" / name).read_bytes() == data
    assert verify_dataset(str(store), progress=False).ok

    entry = after.schema.history[-1]
    assert entry["episodes"] == 3 and entry["first_episode"] == 3 and entry["source"] == str(raws["second"])
    assert re.fullmatch(r"episodes-000001-[0-9a-f]{8}\.parquet", after.schema.manifest_file), "version 1, its writer's"
    assert not (store / ".mmdata-partial").exists()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_the_appended_statistics_equal_those_of_the_whole_store_computed_afresh(raws, tmp_path, layout):
    store = converted(raws["first"], tmp_path / "store", layout)
    appended(raws["second"], store)
    dataset = mmdata.open_dataset(str(store))
    saved = read_stats(dataset)
    fresh = compute_stats(dataset)
    assert saved["episodes"] == fresh["episodes"] == 6
    for name, figures in fresh["lowdim"].items():
        for key in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(saved["lowdim"][name][key], figures[key], rtol=1e-12, atol=1e-12)
        assert saved["lowdim"][name]["count"] == figures["count"]
        assert saved["lowdim"][name]["q01"] == figures["q01"] and saved["lowdim"][name]["q99"] == figures["q99"]
        assert saved["moments"][name]["count"] == figures["count"]
    assert saved["cameras"].keys() == fresh["cameras"].keys()


@pytest.mark.slow
def test_episodes_with_other_streams_are_refused_before_anything_is_written(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds")
    before = file_digests(store)
    with pytest.raises(SourceError, match=r"missing \['cam_wrist'\]"):
        appended(raws["one_camera"], store)
    assert file_digests(store) == before

    with pytest.raises(SourceError, match=r"stream 'cam_high' differs.*width 112 \(earlier episodes: 224\)"):
        appended(raws["smaller"], store)
    assert file_digests(store) == before, "a refused append leaves nothing behind"
    assert len(mmdata.open_dataset(str(store))) == 3  # readers still see the store as it was
    appended(raws["second"], store)  # (was refused as an interrupted append)
    assert len(mmdata.open_dataset(str(store))) == 6


@pytest.mark.slow
def test_an_append_refused_after_episodes_were_kept_resumes_and_never_suggests_overwrite(raws, tmp_path):
    import shutil

    store = converted(raws["first"], tmp_path / "store", "wds", shard_bytes=1)  # an episode per shard
    source = shutil.copytree(raws["second"], tmp_path / "second")
    last = sorted(p for p in source.iterdir() if p.is_dir())[-1]
    np.save(last / "state.npy", np.load(last / "state.npy").astype(np.float64))
    with pytest.raises(SourceError, match="state"):
        appended(source, store)
    assert (store / ".mmdata-partial").exists(), "two episodes were kept for --resume"
    with pytest.raises(DestinationError, match="was interrupted; pass --resume") as refused:
        appended(raws["first"], store)
    with pytest.raises(DestinationError, match="cannot resume") as changed:
        appended(raws["first"], store, resume=True)
    for error in (refused.value, changed.value):
        assert "--overwrite" not in str(error) and "give the interrupted append up" in str(error)
    np.save(last / "state.npy", np.load(last / "state.npy").astype(np.float32))  # the episode fixed
    appended(source, store, resume=True)
    assert len(mmdata.open_dataset(str(store))) == 6 and verify_dataset(str(store), progress=False).ok


@pytest.mark.slow
def test_append_options_that_would_store_episodes_otherwise_are_refused(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds")
    with pytest.raises(OptionError, match="--overwrite replaces it"):
        ConvertOptions(append=True, overwrite=True)
    with pytest.raises(OptionError, match="local engine"):
        ConvertOptions(append=True, engine="ray")
    refused = run_cli("convert", str(raws["second"]), str(store), "--append", "--crf", "30", *ARGS)
    assert refused.returncode != 0 and "drop --crf" in refused.stderr
    refused = run_cli("convert", str(raws["second"]), str(store), "--append", "--to", "zarr", *ARGS)
    assert refused.returncode != 0 and "is a wds store" in refused.stderr


@pytest.mark.slow
def test_appending_to_an_empty_destination_converts_a_new_store(raws, tmp_path):
    report = appended(raws["first"], tmp_path / "new")
    assert report.converted == 3 and report.first_episode == 0
    assert len(mmdata.open_dataset(str(tmp_path / "new"))) == 3


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_killed_append_resumes_to_the_bytes_of_an_uninterrupted_one(raws, tmp_path, layout):
    reference = converted(raws["first"], tmp_path / "reference", layout)
    resumed = converted(raws["first"], tmp_path / "resumed", layout)
    assert file_digests(reference) == file_digests(resumed)
    environment = {**os.environ, **EPOCH}
    command = [sys.executable, "-m", "mmdata", "convert", str(raws["second"])]
    done = subprocess.run([*command, str(reference), "--append", *ARGS], env=environment, capture_output=True)
    assert done.returncode == 0, done.stderr

    partial = resumed / ".mmdata-partial"
    if layout == "wds":
        first_new = len(list((resumed / "shards").glob("*.tar")))

        def ready():
            return (partial / f"shard-{first_new:06d}.json").exists()
    else:

        def ready():
            return len(list((partial / "episodes").glob("*.episode"))) >= 2

    original = mmdata.open_dataset(str(resumed))
    old = [episode_values(original, i) for i in range(3)]
    os.environ.update(EPOCH)
    try:
        kill_when([*command, str(resumed), "--append", *ARGS], ready)
    finally:
        del os.environ["SOURCE_DATE_EPOCH"]
    assert partial.exists(), "the append finished before it could be killed"
    during = mmdata.open_dataset(str(resumed))  # the store as it was, whole
    assert len(during) == 3
    for index in range(3):
        assert_same_episode(episode_values(during, index), old[index])
    refused = run_cli("convert", str(raws["second"]), str(resumed), "--append", *ARGS)
    assert refused.returncode != 0 and "--resume" in refused.stderr

    finished = subprocess.run(
        [*command, str(resumed), "--append", "--resume", *ARGS], env=environment, capture_output=True, text=True
    )
    assert finished.returncode == 0, finished.stderr
    assert "appended 3 episodes" in finished.stdout
    assert file_digests(resumed) == file_digests(reference)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_reader_opened_before_the_append_keeps_reading_the_old_episodes(raws, tmp_path, layout):
    store = converted(raws["first"], tmp_path / "store", layout)
    reader = mmdata.open_dataset(str(store), cache_bytes=1 << 20)
    expected = [episode_values(reader, i) for i in range(3)]
    appended(raws["second"], store)
    appended(raws["first"], store)  # a second append: the first version's files may go, the one before stays
    assert len(reader) == 3
    for index in range(3):
        assert_same_episode(episode_values(reader, index), expected[index])
    latest = mmdata.open_dataset(str(store))
    assert len(latest) == 9
    manifests = sorted(path.name for path in store.glob("episodes*.parquet"))
    assert manifests == sorted(
        [latest.schema.manifest_file, *(m for m in manifests if m.startswith("episodes-000001-"))]
    )
    assert len(manifests) == 2, "version 2's manifest and the one before's; version 0's is gone"


@pytest.mark.slow
def test_a_loader_state_saved_before_an_append_is_refused_and_new_epochs_hold_the_new_episodes(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds")
    spec = mmdata.Windows(anchor_fps=4, streams={"state": mmdata.Values(offsets=[0.0])})
    loader = mmdata.DataLoader(str(store), spec, batch_size=2, num_workers=0)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    appended(raws["second"], store)

    grown = mmdata.DataLoader(str(store), spec, batch_size=2, num_workers=0)
    with pytest.raises(ResumeError, match=r"held 3 episodes then and holds 6 now.*set_epoch\(1\)"):
        grown.load_state_dict(state)
    grown.set_epoch(state["epoch"] + 1)
    episodes = {int(e) for batch in grown for e in np.asarray(batch["episode_index"])}
    assert episodes == set(range(6))

    same = mmdata.DataLoader(str(store), spec, batch_size=2, num_workers=0)
    same.load_state_dict(grown.state_dict())  # a state saved after the append resumes as ever


@pytest.mark.slow
def test_inspect_lists_each_append(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds")
    appended(raws["second"], store)
    shown = run_cli("inspect", str(store))
    assert shown.returncode == 0, shown.stderr
    assert "converted             episodes 0-2" in shown.stdout
    assert f"appended 3 episodes (3-5) from {raws['second']}" in shown.stdout


def renumbered_shards(store: Path, first: int) -> None:
    """The store's shards renamed to start at number `first` (a store after many appends), manifest and all."""
    from tests.hostile.tampering import edit_manifest

    names = {path.name: f"shard-{first + number:06d}.tar" for number, path in enumerate(sorted(store.glob("shards/*")))}

    def renamed(value):
        if isinstance(value, str):
            for old, new in names.items():
                value = value.replace(f"shards/{old}", f"shards/{new}")
            return value
        if isinstance(value, list):
            return [renamed(item) for item in value]
        if isinstance(value, dict):
            return {key: renamed(item) for key, item in value.items()}
        return value

    edit_manifest(store, lambda rows: rows.__setitem__(slice(None), [renamed(row) for row in rows]))
    for old, new in names.items():
        (store / "shards" / old).rename(store / "shards" / new)


@pytest.mark.slow
def test_appends_past_shard_999999_never_write_over_a_shard_and_lose_nothing(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds", shard_bytes=10**9)
    renumbered_shards(store, 999_999)
    assert verify_dataset(str(store), progress=False).ok
    appended(raws["second"], store)
    first_append = {p.name: p.read_bytes() for p in (store / "shards").glob("shard-1*.tar")}
    assert list(first_append) == ["shard-1000000.tar"]
    appended(raws["second"], store)
    assert {p.name: p.read_bytes() for p in (store / "shards").glob("shard-1000000.tar")} == first_append
    assert {p.name for p in (store / "shards").iterdir()} == {
        "shard-999999.tar",
        "shard-1000000.tar",
        "shard-1000001.tar",
    }
    assert verify_dataset(str(store), progress=False).ok
    dataset = mmdata.open_dataset(str(store))
    second = mmdata.open_dataset(str(converted(raws["second"], tmp_path / "second", "wds")))
    assert len(dataset) == 9
    for index in range(3):
        assert_same_episode(episode_values(dataset, 3 + index), episode_values(second, index))
        assert_same_episode(episode_values(dataset, 6 + index), episode_values(second, index))


@pytest.mark.slow
def test_an_append_never_writes_over_a_shard_file_no_row_names(raws, tmp_path):
    store = converted(raws["first"], tmp_path / "store", "wds")
    stray = store / "shards" / "shard-000042.tar"
    stray.write_bytes(b"a shard of an append that was given up")
    appended(raws["second"], store)
    assert stray.read_bytes() == b"a shard of an append that was given up"
    assert (store / "shards" / "shard-000043.tar").exists() and verify_dataset(str(store), progress=False).ok


def test_a_shard_is_never_published_over_an_existing_file(tmp_path):
    from mmdata.store.wds_writer import publish_without_replacing

    written, target = tmp_path / "new.tar.tmp", tmp_path / "shard-000001.tar"
    written.write_bytes(b"new")
    target.write_bytes(b"published")
    with pytest.raises(DestinationError, match="never written over"):
        publish_without_replacing(written, target)
    assert target.read_bytes() == b"published" and not written.exists()


def test_an_upload_never_writes_over_an_object_of_another_size(tmp_path):
    import fsspec

    from mmdata.store.staging import upload_new_files

    memory = fsspec.filesystem("memory")
    memory.pipe("/bucket/store/shards/shard-000003.tar", b"published by someone else")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard-000003.tar").write_bytes(b"ours")
    with pytest.raises(mmdata.ConcurrentWriteError, match="already exists .* never written over"):
        upload_new_files(tmp_path, "memory://bucket/store", {"shards/shard-000003.tar"}, progress=False)
    assert memory.cat("/bucket/store/shards/shard-000003.tar") == b"published by someone else"
    memory.pipe("/bucket/store/shards/shard-000003.tar", b"ours")  # what an interrupted run uploaded: kept
    assert upload_new_files(tmp_path, "memory://bucket/store", {"shards/shard-000003.tar"}, progress=False) == 0
