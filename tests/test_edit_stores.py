"""`mmdata edit ... split|merge|remove-stream|compact`: new stores whose rows name the stores holding their media, a
store's next version without a stream, and a store's episodes copied into a store of their own; each in both
layouts, locally and in object storage, each refused with the stores unchanged when it cannot be made, and each
leaving no store behind when it fails at any step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.editing import compaction, derived, edits
from mmdata.editing.compaction import compact_store
from mmdata.editing.derived import ValidationChoice, merge_stores, split_store
from mmdata.editing.edits import remove_stream
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError, OptionError
from mmdata.store.versions import NextVersion
from tests.conftest import LAYOUTS, run_cli
from tests.test_edit import SPEC, episode_data, fail_at
from tests.test_loader import assert_same_batches
from tests.test_packet_decoding import store_with_manifest


@pytest.fixture
def copies(stores, tmp_path) -> dict[str, Path]:
    """A private copy of each layout's store, in a folder of its own, to split, merge and edit."""
    return {layout: Path(shutil.copytree(stores[layout], tmp_path / f"robot.{layout}")) for layout in LAYOUTS}


def contents(url: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    dataset = mmdata.open_dataset(url)
    return [episode_data(dataset, index) for index in range(len(dataset))]


def same_contents(got: list, expected: list) -> bool:
    return len(got) == len(expected) and all(
        a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2]) for a, b in zip(got, expected)
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_split_by_fraction_gives_every_episode_to_one_store_reading_its_media_where_it_is(copies, layout, tmp_path):
    source = str(copies[layout])
    before = contents(source)
    train, validation = str(tmp_path / "train"), str(tmp_path / "validation")
    reports = split_store(source, train, validation, ValidationChoice(fraction=0.34, seed=3), progress=False)
    assert [(r.episodes_after, r.episodes_before) for r in reports] == [(2, 3), (1, 3)]
    held = ValidationChoice(fraction=0.34, seed=3).rows(mmdata.open_dataset(source).store)
    others = [i for i in range(3) if i not in held]
    assert same_contents(contents(validation), [before[i] for i in held])
    assert same_contents(contents(train), [before[i] for i in others])
    for url in (train, validation):
        opened = mmdata.open_dataset(url)
        assert opened.schema.origins == [f"../robot.{layout}"]
        assert not list(Path(url).glob("shards")) and not (Path(url) / "video").exists()  # no media copied
        assert run_cli("verify", url).returncode == 0
    assert len(list(mmdata.DataLoader(train, SPEC, batch_size=2, num_workers=0))) > 0
    assert same_contents(contents(source), before)  # the store split is untouched


def test_a_split_by_fraction_draws_the_same_episodes_from_the_same_seed_and_others_from_another(copies):
    store = mmdata.open_dataset(str(copies["wds"])).store
    drawn = {seed: ValidationChoice(fraction=0.5, seed=seed).rows(store).tolist() for seed in range(12)}
    assert ValidationChoice(fraction=0.5, seed=4).rows(store).tolist() == drawn[4]
    assert len(set(map(tuple, drawn.values()))) > 1 and all(len(rows) == 2 for rows in drawn.values())
    with pytest.raises(OptionError, match="between 0 and 1"):
        ValidationChoice(fraction=1.0)
    with pytest.raises(OptionError, match="one of the two"):
        ValidationChoice(EpisodeSelection(ids=[0]), fraction=0.5)


@pytest.mark.slow
def test_a_split_by_task_sends_that_task_to_validation_with_statistics_of_each_part(copies, tmp_path):
    source = str(copies["zarr"])
    task = mmdata.open_dataset(source).read_episode(1, ["state"]).task
    choice = ValidationChoice(EpisodeSelection(tasks=[task]))
    split_store(source, str(tmp_path / "train"), str(tmp_path / "validation"), choice, progress=False)
    validation = mmdata.open_dataset(str(tmp_path / "validation"))
    assert [validation.read_episode(i, ["state"]).task for i in range(len(validation))] == [task]
    own = json.loads((tmp_path / "validation" / validation.schema.stats_file).read_text())
    assert own["episodes"] == 1 and "before_edit" not in own
    train = mmdata.open_dataset(str(tmp_path / "train"))
    assert task not in {train.read_episode(i, ["state"]).task for i in range(len(train))}


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_merging_stores_gives_their_episodes_in_order_from_their_own_media(copies, layout, tmp_path):
    first = str(copies[layout])
    second = str(shutil.copytree(copies[layout], tmp_path / f"second.{layout}"))
    edits.edit_store(second, "delete", EpisodeSelection(ids=[0]), progress=False)
    merged = str(tmp_path / "merged")
    report = merge_stores([first, second], merged, progress=False)
    assert (report.episodes_after, report.episodes_before) == (5, 5)
    assert same_contents(contents(merged), contents(first) + contents(second))
    opened = mmdata.open_dataset(merged)
    assert sorted(opened.schema.origins) == sorted([f"../robot.{layout}", f"../second.{layout}"])
    assert opened.schema.history[-1]["edit"] == "merge"
    assert run_cli("verify", merged).returncode == 0
    batches = list(mmdata.DataLoader(merged, SPEC, batch_size=2, seed=2, num_workers=0))
    assert sum(len(batch["episode_index"]) for batch in batches) > 0


@pytest.mark.slow
def test_a_store_made_from_split_stores_names_the_stores_holding_the_media_not_the_splits(copies, tmp_path):
    source = str(copies["wds"])
    train, validation = str(tmp_path / "train"), str(tmp_path / "validation")
    split_store(source, train, validation, ValidationChoice(EpisodeSelection(ids=[2])), progress=False)
    merged = str(tmp_path / "again")
    merge_stores([train, validation], merged, recompute_stats=False, progress=False)
    assert mmdata.open_dataset(merged).schema.origins == ["../robot.wds"]
    assert same_contents(contents(merged), contents(source))
    shutil.rmtree(train)
    shutil.rmtree(validation)
    assert same_contents(contents(merged), contents(source))  # the splits were never read through


def test_stores_with_different_streams_are_refused_naming_the_streams_that_differ(copies, tmp_path):
    other = str(shutil.copytree(copies["wds"], tmp_path / "other.wds"))
    remove_stream(other, "audio", progress=False)
    with pytest.raises(EditError, match=r"'audio' only in .*robot\.wds"):
        merge_stores([str(copies["wds"]), other], str(tmp_path / "merged"), progress=False)
    with pytest.raises(EditError, match="within one layout"):
        merge_stores([str(copies["wds"]), str(copies["zarr"])], str(tmp_path / "merged"), progress=False)
    assert not (tmp_path / "merged").exists()


@pytest.mark.slow
def test_a_destination_that_is_a_store_holds_other_files_or_lies_inside_a_source_is_refused(copies, tmp_path):
    source = str(copies["wds"])
    choice = ValidationChoice(EpisodeSelection(ids=[0]))
    with pytest.raises(EditError, match="is a store already"):
        split_store(source, str(copies["zarr"]), str(tmp_path / "validation"), choice, progress=False)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    twin = str(shutil.copytree(copies["wds"], tmp_path / "twin.wds"))
    with pytest.raises(EditError, match=r"holds files \(notes.txt\)"):
        merge_stores([source, twin], str(tmp_path / "busy"), progress=False)
    with pytest.raises(EditError, match="not inside one"):
        split_store(source, str(copies["wds"] / "train"), str(tmp_path / "validation"), choice, progress=False)
    with pytest.raises(EditError, match="two places"):
        split_store(source, str(tmp_path / "same"), str(tmp_path / "same"), choice, progress=False)
    zarr_twin = str(shutil.copytree(copies["zarr"], tmp_path / "twin.zarr"))
    (copies["zarr"] / "stats.json").unlink()
    with pytest.raises(EditError, match="no statistics to keep"):
        merge_stores([str(copies["zarr"]), zarr_twin], str(tmp_path / "kept"), False, progress=False)
    assert not (tmp_path / "kept").exists(), "refused before anything was written"
    with pytest.raises(EditError, match="lies inside .*side by side"):
        split_store(source, str(tmp_path / "both" / "train"), str(tmp_path / "both"), choice, progress=False)
    assert not (tmp_path / "both" / "train").exists()
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine" and not (copies["wds"] / "train").exists()
    assert mmdata.open_dataset(str(copies["zarr"])).schema.version == 0


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["write_rows", "compute_stats", "publish"])
def test_a_split_that_fails_at_any_step_leaves_no_store_and_runs_again(copies, tmp_path, monkeypatch, failing):
    source = str(copies["zarr"])
    fail_at(monkeypatch, failing, derived)
    train, validation = tmp_path / "train", tmp_path / "validation"
    choice = ValidationChoice(fraction=0.5, seed=1)
    with pytest.raises(OSError, match="went away"):
        split_store(source, str(train), str(validation), choice, progress=False)
    assert not (train / "dataset.json").exists() and not (validation / "dataset.json").exists()
    with pytest.raises(mmdata.StoreError, match="no dataset.json"):
        mmdata.open_dataset(str(train))
    monkeypatch.undo()
    reports = split_store(source, str(train), str(validation), choice, progress=False)
    assert sum(report.episodes_after for report in reports) == 3
    assert mmdata.open_dataset(source).schema.version == 0


@pytest.mark.slow
def test_a_split_stopped_between_its_two_stores_is_completed_by_running_it_again(copies, tmp_path, monkeypatch):
    source = str(copies["wds"])
    choice = ValidationChoice(EpisodeSelection(ids=[1]))
    written = []
    original = NextVersion.publish

    def once(version, *args, **kwargs):
        if written:
            raise OSError("the machine went away")
        written.append(version)
        return original(version, *args, **kwargs)

    monkeypatch.setattr(NextVersion, "publish", once)
    with pytest.raises(OSError):
        split_store(source, str(tmp_path / "train"), str(tmp_path / "validation"), choice, progress=False)
    assert len(mmdata.open_dataset(str(tmp_path / "train"))) == 2
    monkeypatch.undo()
    split_store(source, str(tmp_path / "train"), str(tmp_path / "validation"), choice, progress=False)
    assert len(mmdata.open_dataset(str(tmp_path / "validation"))) == 1
    other = ValidationChoice(EpisodeSelection(ids=[0]))
    with pytest.raises(EditError, match="is a store already"):
        split_store(source, str(tmp_path / "train"), str(tmp_path / "v2"), other, progress=False)


@pytest.mark.slow
def test_a_store_whose_origin_is_gone_or_undeclared_is_refused_naming_it(copies, tmp_path):
    source = str(copies["wds"])
    split_store(source, str(tmp_path / "t"), str(tmp_path / "v"), ValidationChoice(fraction=0.5), progress=False)
    document = json.loads((tmp_path / "t" / "dataset.json").read_text())
    for hostile in (["/etc"], ["../../../etc/passwd\n"], ["s3://bucket/x"], ["../robot.wds", "../robot.wds"]):
        (tmp_path / "t" / "dataset.json").write_text(json.dumps({**document, "origins": hostile}))
        with pytest.raises(mmdata.StoreError, match="origin"):
            mmdata.open_dataset(str(tmp_path / "t"))
    (tmp_path / "t" / "dataset.json").write_text(json.dumps({**document, "origins": []}))
    undeclared = mmdata.open_dataset(str(tmp_path / "t"))
    with pytest.raises(mmdata.IntegrityError, match="'origin' is not a store dataset.json lists"):
        undeclared.read_episode(0, ["state"])
    (tmp_path / "t" / "dataset.json").write_text(json.dumps(document))
    shutil.move(source, tmp_path / "moved")
    with pytest.raises(mmdata.StoreError, match=r"'\.\./robot\.wds'.*not there"):
        mmdata.open_dataset(str(tmp_path / "t"))


@pytest.mark.slow
def test_appending_to_a_merged_store_is_refused_with_the_way_on(copies, tmp_path, raw_dataset):
    merged = str(tmp_path / "merged")
    twin = str(shutil.copytree(copies["wds"], tmp_path / "twin.wds"))
    merge_stores([str(copies["wds"]), twin], merged, recompute_stats=False, progress=False)
    done = run_cli("convert", str(raw_dataset), merged, "--append")
    assert done.returncode != 0 and "merge the stores" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_removing_a_stream_drops_it_and_its_statistics_while_a_loader_of_the_version_before_goes_on(copies, layout):
    url = str(copies[layout])
    expected = list(mmdata.DataLoader(url, SPEC, batch_size=2, seed=4, num_workers=0))
    before = json.loads((copies[layout] / "stats.json").read_text())
    got = []
    for step, batch in enumerate(mmdata.DataLoader(url, SPEC, batch_size=2, seed=4, num_workers=0)):
        got.append(batch)
        if step == 0:
            report = remove_stream(url, "cam_high", progress=False)
    assert_same_batches(got, expected)
    assert report.version == 1 and report.episodes_after == 3
    edited = mmdata.open_dataset(url)
    assert "cam_high" not in [s.name for s in edited.schema.streams]
    assert not [c for c in edited.store.table.column_names if c.startswith("cam_high/")]
    stats = json.loads((copies[layout] / edited.schema.stats_file).read_text())
    assert "cam_high" not in stats["cameras"] and stats["lowdim"]["state"] == before["lowdim"]["state"]
    with pytest.raises(mmdata.SpecError, match="no stream named 'cam_high'"):
        mmdata.DataLoader(url, SPEC, batch_size=2, num_workers=0)
    with pytest.raises(EditError, match="no stream named 'depth'"):
        remove_stream(url, "depth", progress=False)


@pytest.mark.slow
def test_the_edit_command_splits_merges_and_removes_streams_and_names_what_it_needs(copies, tmp_path):
    source = str(copies["wds"])
    train, validation, merged = (str(tmp_path / name) for name in ("train", "validation", "merged"))
    done = run_cli("edit", source, "split", "--train", train, "--validation", validation, "--fraction", "0.3")
    assert done.returncode == 0, done.stderr
    assert "2 episodes (of 3)" in done.stdout and "1 episodes (of 3)" in done.stdout
    done = run_cli("edit", validation, "merge", train, "--into", merged, "--no-progress")
    assert done.returncode == 0, done.stderr
    inspected = run_cli("inspect", merged)
    assert "media     in the stores ../robot.wds" in inspected.stdout and "converted" not in inspected.stdout
    done = run_cli("edit", merged, "remove-stream", "audio", "--no-progress")
    assert done.returncode == 0 and "version 2, 3 episodes" in done.stdout, done.stderr
    compacted = str(tmp_path / "compacted")
    done = run_cli("edit", merged, "compact", "--into", compacted, "--layout", "zarr", "--no-progress")
    assert done.returncode == 0 and "3 episodes (of 3)" in done.stdout, done.stderr
    assert "audio" not in run_cli("inspect", compacted).stdout
    both = run_cli("edit", source, "split", "--train", "a", "--validation", "b", "--fraction", "0.5", "--episodes", "1")
    assert both.returncode == 2 and "one way, not both" in both.stderr
    lone = run_cli("edit", source, "merge", "--into", merged)
    assert lone.returncode == 2 and "others" in lone.stderr


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_edit_in_object_storage_gives_the_stores_the_same_edit_gives_locally(stores, tmp_path, layout):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    shutil.copytree(stores[layout], tmp_path / "robot")
    choice = ValidationChoice(fraction=0.5, seed=2)
    bucket = f"mmdata-edits-{layout}"
    with local_s3_bucket(bucket) as filesystem:
        filesystem.put(str(stores[layout]), f"{bucket}/robot", recursive=True)
        for root in (f"s3://{bucket}", str(tmp_path)):
            split_store(f"{root}/robot", f"{root}/train", f"{root}/validation", choice, progress=False)
            merge_stores([f"{root}/validation", f"{root}/train"], f"{root}/merged", progress=False)
            remove_stream(f"{root}/merged", "audio", progress=False)
            edits.edit_store(f"{root}/merged", "delete", EpisodeSelection(ids=[0]), progress=False)
        merged = mmdata.open_dataset(f"s3://{bucket}/merged")
        assert merged.schema.origins == ["../robot"] and merged.schema.version == 3 and len(merged) == 2
        assert "audio" not in [stream.name for stream in merged.schema.streams]
        for name in ("train", "merged"):
            assert_same_batches(
                list(mmdata.DataLoader(f"s3://{bucket}/{name}", SPEC, batch_size=2, num_workers=0)),
                list(mmdata.DataLoader(str(tmp_path / name), SPEC, batch_size=2, num_workers=0)),
            )


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compacting_a_merged_store_copies_exactly_its_episodes_into_a_store_of_its_own(copies, layout, tmp_path):
    source = str(copies[layout])
    edits.edit_store(source, "delete", EpisodeSelection(ids=[0]), progress=False)
    merged, compacted = str(tmp_path / "merged"), str(tmp_path / "compacted")
    twin = shutil.copytree(copies[layout], tmp_path / f"twin.{layout}")
    merge_stores([source, str(twin)], merged, recompute_stats=False, progress=False)
    expected = contents(merged)
    report = compact_store(merged, compacted, progress=False)
    assert (report.episodes_before, report.episodes_after) == (4, 4)
    shutil.rmtree(copies[layout])  # the compacted store reads nothing outside itself
    shutil.rmtree(twin)
    opened = mmdata.open_dataset(compacted)
    assert opened.schema.origins == [] and opened.schema.layout == layout
    assert same_contents(contents(compacted), expected)
    assert run_cli("verify", compacted).returncode == 0
    if layout == "wds":
        import tarfile

        with tarfile.open(next((tmp_path / "compacted" / "shards").glob("*.tar"))) as shard:
            keys = {name.split(".")[0] for name in shard.getnames()}
        assert keys == {f"episode_{i:06d}" for i in range(4)}


@pytest.mark.slow
def test_compacting_into_the_other_layout_gives_the_batches_of_the_store(copies, tmp_path):
    source = str(copies["wds"])
    compact_store(source, str(tmp_path / "as.zarr"), layout="zarr", progress=False)
    assert mmdata.open_dataset(str(tmp_path / "as.zarr")).schema.layout == "zarr"
    assert_same_batches(
        list(mmdata.DataLoader(str(tmp_path / "as.zarr"), SPEC, batch_size=2, seed=3, num_workers=0)),
        list(mmdata.DataLoader(source, SPEC, batch_size=2, seed=3, num_workers=0)),
    )


@pytest.mark.slow
def test_a_compaction_that_fails_removes_what_it_wrote_and_runs_again(copies, tmp_path, monkeypatch):
    source, into = str(copies["zarr"]), tmp_path / "compacted"
    original = compaction.stored_episode

    def fail_at_the_second(store, index):
        if index == 1:
            raise OSError("the machine went away")
        return original(store, index)

    monkeypatch.setattr(compaction, "stored_episode", fail_at_the_second)
    with pytest.raises(OSError, match="went away"):
        compact_store(source, str(into), progress=False)
    assert not into.exists(), "what the compaction wrote is removed"
    into.mkdir()
    with pytest.raises(OSError, match="went away"):
        compact_store(source, str(into), progress=False)
    assert into.is_dir() and not list(into.iterdir()), "an empty folder given is left empty"
    monkeypatch.undo()
    (into / "mine.txt").write_text("mine")
    with pytest.raises(EditError, match="a folder that is not empty"):
        compact_store(source, str(into), progress=False)
    assert (into / "mine.txt").read_text() == "mine"
    with pytest.raises(EditError, match="lies inside a store"):
        compact_store(source, str(copies["zarr"] / "compacted"), progress=False)
    (into / "mine.txt").unlink()
    assert compact_store(source, str(into), progress=False).episodes_after == 3
    assert mmdata.open_dataset(source).schema.version == 0


@pytest.mark.slow
def test_a_store_compacted_into_object_storage_reads_as_the_store_does(stores, tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    monkeypatch.setenv("MMDATA_STAGING", str(tmp_path / "staging"))
    with local_s3_bucket("mmdata-compact"):
        compact_store(str(stores["wds"]), "s3://mmdata-compact/robot", progress=False)
        assert_same_batches(
            list(mmdata.DataLoader("s3://mmdata-compact/robot", SPEC, batch_size=2, num_workers=0)),
            list(mmdata.DataLoader(str(stores["wds"]), SPEC, batch_size=2, num_workers=0)),
        )
        with pytest.raises(mmdata.MmdataError, match="already a complete store"):
            compact_store(str(stores["wds"]), "s3://mmdata-compact/robot", progress=False)
    assert not list((tmp_path / "staging").glob("*"))


@pytest.mark.slow
def test_a_merged_store_is_viewed_and_exported_from_its_origins_media(copies, tmp_path):
    from mmdata.viewer.pages import write_episode_page

    merged = str(tmp_path / "merged")
    twin = str(shutil.copytree(copies["wds"], tmp_path / "twin.wds"))
    merge_stores([str(copies["wds"]), twin], merged, recompute_stats=False, progress=False)
    page = write_episode_page(mmdata.open_store(merged), 4, tmp_path / "view")
    assert page.exists() and list((tmp_path / "view" / "media" / "episode_000004").glob("cam_high.*"))
    exported = run_cli("export", merged, str(tmp_path / "lerobot"), "--episodes", "2-4", "--quiet")
    assert exported.returncode == 0, exported.stderr


def test_a_store_with_damaged_episodes_is_not_compacted_and_the_way_on_is_named(stores, tmp_path):
    table = pq.read_table(stores["wds"] / "episodes.parquet")
    durations = table.column("duration").to_pylist()
    durations[1] = -1.0
    table = table.set_column(table.schema.get_field_index("duration"), "duration", pa.array(durations))
    damaged = store_with_manifest(stores["wds"], tmp_path / "damaged.wds", table)
    with pytest.raises(EditError, match=r"damaged episodes \(\[1\]; .*delete them first"):
        compact_store(str(damaged), str(tmp_path / "compacted"), progress=False)
    assert not (tmp_path / "compacted").exists()


def test_destinations_spelled_two_ways_links_and_a_store_merged_with_itself_are_refused(copies, tmp_path):
    source = str(copies["wds"])
    choice = ValidationChoice(EpisodeSelection(ids=[0]))
    (tmp_path / "a").mkdir()
    with pytest.raises(EditError, match="two places"):
        split_store(source, str(tmp_path / "a" / ".." / "t.wds"), str(tmp_path / "t.wds"), choice, progress=False)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(EditError, match=r"symbolic link .* not through a link"):
        split_store(source, str(tmp_path / "link"), str(tmp_path / "v.wds"), choice, progress=False)
    assert list((tmp_path / "elsewhere").iterdir()) == [], "nothing written through the link"
    with pytest.raises(EditError, match="are one store: a merge takes each store once"):
        merge_stores([source, str(tmp_path / "a" / ".." / copies["wds"].name)], str(tmp_path / "m"), progress=False)
    assert not (tmp_path / "m" / "dataset.json").exists() and not (tmp_path / "t.wds" / "dataset.json").exists()


@pytest.mark.slow
def test_a_killed_compaction_is_named_by_the_next_one_and_run_again_completes_it(copies, tmp_path):
    import subprocess
    import sys

    into = tmp_path / "compacted"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal\nfrom mmdata.editing import compaction\noriginal = compaction.stored_episode\n"
            "def dying(store, index):\n    if index == 2:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return original(store, index)\ncompaction.stored_episode = dying\n"
            f"compaction.compact_store({str(copies['wds'])!r}, {str(into)!r}, progress=False)",
        ],
        capture_output=True,
    )
    assert killed.returncode == -9 and (into / ".mmdata-partial" / "compaction.json").exists()
    with pytest.raises(EditError, match=r"interrupted compaction of '.*robot.wds' into wds .* run that compaction"):
        compact_store(str(copies["zarr"]), str(into), progress=False)
    report = compact_store(str(copies["wds"]), str(into), progress=False)
    assert report.episodes_after == 3 and run_cli("verify", str(into)).returncode == 0
    assert not (into / ".mmdata-partial").exists()
