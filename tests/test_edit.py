"""`mmdata edit`: a store's next version without some episodes, or with only some, pointing at the same media;
published in one step (a failure at any step leaves the version before), read by readers that opened it before,
in both layouts, locally, by row group for a large manifest, and in object storage."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.editing import edits
from mmdata.editing.edits import edit_store
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError
from mmdata.store import manifest_reader
from mmdata.store import versions as store_versions
from mmdata.store.scaled_store import write_scaled_store
from mmdata.store.versions import NextVersion
from tests.conftest import LAYOUTS, run_cli
from tests.test_loader import assert_same_batches

SPEC = mmdata.Windows(anchor_fps=5, streams={"cam_high": mmdata.Frames(offsets=[0.0]), "state": mmdata.Values()})


@pytest.fixture
def copies(stores, tmp_path) -> dict[str, Path]:
    """A private copy of each layout's store, to edit."""
    return {layout: Path(shutil.copytree(stores[layout], tmp_path / f"copy.{layout}")) for layout in LAYOUTS}


def episode_data(dataset, index: int) -> tuple[str, np.ndarray, np.ndarray]:
    """What identifies an episode's content: its task, its state values and its first camera frame."""
    episode = dataset.read_episode(index, ["state", "cam_high"])
    return episode.task, episode["state"].values, episode["cam_high"].values[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_deleting_an_episode_leaves_the_others_renumbered_reading_what_they_held(copies, layout):
    before = mmdata.open_dataset(str(copies[layout]))
    expected = [episode_data(before, i) for i in (0, 2)]
    report = edit_store(str(copies[layout]), "delete", EpisodeSelection(ids=[1]), progress=False)
    after = mmdata.open_dataset(str(copies[layout]))
    assert (report.version, report.episodes_before, report.episodes_after) == (1, 3, 2)
    assert after.schema.version == 1 and len(after) == 2 and after.schema.history[-1]["edit"] == "delete"
    for index, (task, state, frame) in enumerate(expected):
        got_task, got_state, got_frame = episode_data(after, index)
        assert got_task == task and np.array_equal(got_state, state) and np.array_equal(got_frame, frame)
    assert after.store.manifest.row(1)["key"] == "episode_000001"
    verified = run_cli("verify", str(copies[layout]))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    stats = mmdata.open_dataset(str(copies[layout])).schema.stats_file
    assert stats.startswith("stats-000001-") and (copies[layout] / stats).exists()


@pytest.mark.slow
def test_keeping_episodes_by_duration_and_task_keeps_exactly_those(copies):
    url = str(copies["wds"])
    before = mmdata.open_dataset(url)
    durations = before.store.table.column("duration").to_pylist()
    tasks = before.store.table.column("task").to_pylist()
    cut = sorted(durations)[1]
    edit_store(url, "keep", EpisodeSelection(min_seconds=cut), progress=False)
    after = mmdata.open_dataset(url)
    assert after.store.table.column("duration").to_pylist() == [d for d in durations if d >= cut - 1e-9]
    kept_tasks = after.store.table.column("task").to_pylist()
    edit_store(url, "keep", EpisodeSelection(tasks=[kept_tasks[0]]), recompute_stats=False, progress=False)
    final = mmdata.open_dataset(url)
    assert final.schema.version == 2 and set(final.store.table.column("task").to_pylist()) == {kept_tasks[0]}
    assert sum(t == kept_tasks[0] for t in kept_tasks) == len(final) <= len(tasks)
    assert "before_edit" in (copies["wds"] / final.schema.stats_file).read_text()
    assert not (copies["wds"] / "episodes.parquet").exists(), "versions before the one before are removed"


@pytest.mark.slow
def test_a_reader_that_opened_the_store_before_an_edit_keeps_reading_its_version(copies):
    url = str(copies["zarr"])
    reader = mmdata.open_dataset(url)
    before = [episode_data(reader, i)[1] for i in range(3)]
    edit_store(url, "delete", EpisodeSelection(ids=[0, 2]), progress=False)
    assert len(mmdata.open_dataset(url)) == 1
    again = mmdata.open_dataset(url)
    assert np.array_equal(episode_data(again, 0)[1], before[1])
    for index in range(3):
        assert np.array_equal(episode_data(reader, index)[1], before[index])


def fail_at(monkeypatch, failing: str, module=edits) -> None:
    """Make the step `failing` of an edit raise OSError: "write_rows" (its manifest, written by `module` or the edits
    it shares the writer of), "compute_stats" (`module`'s), "write_stats" and "publish" (the statistics and the swap
    of `dataset.json` every writer's version ends with: `store.versions`); `monkeypatch.undo()` restores it."""

    def fail(*args, **kwargs):
        raise OSError("the machine went away")

    if failing == "publish":
        monkeypatch.setattr(NextVersion, "publish", fail)
    elif failing == "write_stats":
        monkeypatch.setattr(store_versions, "write_stats", fail)
    elif failing == "write_rows":
        for owner in {module, edits}:
            if hasattr(owner, "write_rows"):
                monkeypatch.setattr(owner, "write_rows", fail)
    else:
        monkeypatch.setattr(module, failing, fail)


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["write_rows", "compute_stats", "publish"])
def test_an_edit_that_fails_at_any_step_leaves_the_version_before_and_can_be_made_again(copies, monkeypatch, failing):
    url = str(copies["wds"])
    fail_at(monkeypatch, failing)
    with pytest.raises(OSError, match="went away"):
        edit_store(url, "delete", EpisodeSelection(ids=[1]), progress=False)
    unchanged = mmdata.open_dataset(url)
    assert unchanged.schema.version == 0 and len(unchanged) == 3
    assert sorted(path.name for path in copies["wds"].glob("episodes*")) == ["episodes.parquet"], "its files removed"
    assert len(list(mmdata.DataLoader(url, SPEC, batch_size=4, num_workers=0))) > 0
    monkeypatch.undo()
    assert edit_store(url, "delete", EpisodeSelection(ids=[1]), progress=False).episodes_after == 2


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["write_rows", "write_stats", "publish"])
def test_removing_a_stream_that_fails_at_any_step_leaves_the_version_before(copies, monkeypatch, failing):
    url = str(copies["zarr"])
    fail_at(monkeypatch, failing)
    with pytest.raises(OSError, match="went away"):
        edits.remove_stream(url, "audio", progress=False)
    unchanged = mmdata.open_dataset(url)
    assert unchanged.schema.version == 0 and "audio" in [stream.name for stream in unchanged.schema.streams]
    monkeypatch.undo()
    assert edits.remove_stream(url, "audio", progress=False).version == 1


def test_edits_that_name_nothing_everything_or_unknown_episodes_are_refused_with_the_store_unchanged(copies):
    url = str(copies["wds"])
    with pytest.raises(EditError, match=r"episode ids \[7, 9\] are not in the store"):
        edit_store(url, "delete", EpisodeSelection(ids=[1, 7, 9]), progress=False)
    with pytest.raises(EditError, match="would leave no episode"):
        edit_store(url, "keep", EpisodeSelection(tasks=["no such task"]), progress=False)
    with pytest.raises(EditError, match="no episode to delete"):
        edit_store(url, "delete", EpisodeSelection(max_seconds=0.01), progress=False)
    (copies["wds"] / ".mmdata-partial").mkdir()
    with pytest.raises(EditError, match="append in progress"):
        edit_store(url, "delete", EpisodeSelection(ids=[1]), progress=False)
    assert mmdata.open_dataset(url).schema.version == 0


@pytest.mark.slow
def test_the_edit_command_deletes_episodes_and_names_what_it_needs(copies):
    url = str(copies["zarr"])
    done = run_cli("edit", url, "delete", "--episodes", "0-1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "version 1, 1 episodes (of 3)" in done.stdout
    inspected = run_cli("inspect", url)
    assert "edited: delete 2 episodes (ids 0-1), 3 -> 1 episodes" in inspected.stdout
    bare = run_cli("edit", url, "keep")
    assert bare.returncode == 2 and "--episodes, --task" in bare.stderr
    wrong = run_cli("edit", url, "delete", "--episodes", "3-1")
    assert wrong.returncode == 2 and "range" in wrong.stderr


@pytest.mark.slow
def test_an_edit_of_a_manifest_read_by_row_group_keeps_every_other_row_in_order(stores, tmp_path, monkeypatch):
    url = str(write_scaled_store(stores["wds"], tmp_path / "scaled.wds", 40, row_group_rows=8))
    monkeypatch.setattr(manifest_reader, "EAGER_ROWS", 16)
    before = mmdata.open_dataset(url).store
    assert not before.manifest.checked_whole
    rows = before.table.to_pylist()
    deleted = list(range(0, 40, 3))
    edit_store(url, "delete", EpisodeSelection(ids=deleted), recompute_stats=False, progress=False)
    after = mmdata.open_dataset(url).store
    kept = [row for number, row in enumerate(rows) if number not in deleted]
    assert len(after) == len(kept)
    for number, row in enumerate(after.table.to_pylist()):
        assert row["key"] == f"episode_{number:06d}" and row["episode_index"] == number
        assert {k: v for k, v in row.items() if k not in ("key", "episode_index")} == {
            k: v for k, v in kept[number].items() if k not in ("key", "episode_index")
        }


@pytest.mark.slow
def test_an_edit_in_object_storage_gives_the_store_a_local_edit_gives(stores, tmp_path):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    local = shutil.copytree(stores["wds"], tmp_path / "local.wds")
    with local_s3_bucket("mmdata-edit") as filesystem:
        filesystem.put(str(stores["wds"]), "mmdata-edit/store.wds", recursive=True)
        remote = "s3://mmdata-edit/store.wds"
        for url in (remote, str(local)):
            edit_store(url, "delete", EpisodeSelection(ids=[0]), progress=False)
        assert mmdata.open_dataset(remote).schema.version == 1
        assert_same_batches(
            list(mmdata.DataLoader(remote, SPEC, batch_size=4, seed=1, num_workers=0)),
            list(mmdata.DataLoader(str(local), SPEC, batch_size=4, seed=1, num_workers=0)),
        )


@pytest.mark.slow
def test_a_loader_state_saved_before_an_edit_is_refused_over_the_edited_store_with_the_ways_on(copies):
    url = str(copies["wds"])
    loader = mmdata.DataLoader(url, SPEC, batch_size=2, seed=1, num_workers=0)
    next(iter(loader))
    state = loader.state_dict()
    loader.close()
    edit_store(url, "delete", EpisodeSelection(ids=[2]), progress=False)
    edited = mmdata.DataLoader(url, SPEC, batch_size=2, seed=1, num_workers=0)
    with pytest.raises(mmdata.ResumeError, match="set_epoch"):
        edited.load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_reading_while_an_edit_is_published_goes_on_with_the_batches_of_its_version(copies, workers):
    url = str(copies["zarr"])
    expected = list(mmdata.DataLoader(url, SPEC, batch_size=2, num_workers=workers, seed=4))
    loader = mmdata.DataLoader(url, SPEC, batch_size=2, num_workers=workers, seed=4)
    got = []
    for step, batch in enumerate(loader):
        got.append(batch)
        if step == 2:
            edit_store(url, "delete", EpisodeSelection(ids=[0, 1]), progress=False)
    assert_same_batches(got, expected)
    assert len(mmdata.open_dataset(url)) == 1


def test_a_history_entry_of_an_edit_that_no_edit_writes_is_refused_when_the_store_opens(copies):
    url = str(copies["wds"])
    edit_store(url, "delete", EpisodeSelection(ids=[1]), recompute_stats=False, progress=False)
    document = (copies["wds"] / "dataset.json").read_text()
    (copies["wds"] / "dataset.json").write_text(
        document.replace('"episodes_before": 3', '"episodes_before": "\\u001b[2J"')
    )
    with pytest.raises(mmdata.StoreError, match="episodes_before"):
        mmdata.open_dataset(url)


def test_episode_ids_past_a_number_or_a_range_of_billions_are_named_not_built(copies):
    url = str(copies["wds"])
    huge = run_cli("edit", url, "delete", "--episodes", "18446744073709551617")
    assert (
        huge.returncode == 2 and "is not an episode number or a range" in huge.stderr and "Traceback" not in huge.stderr
    )
    wide = run_cli("edit", url, "delete", "--episodes", "0-4000000000")
    assert wide.returncode == 2 and "episode ids [3, 4, 5" in wide.stderr and "MemoryError" not in wide.stderr
    with pytest.raises(EditError, match=r"episode ids \[3, 4, 5, 6, 7, 8, 9, 10, 11, 12\] are not in the store"):
        edit_store(url, "delete", EpisodeSelection(ids=[range(1, 10**12)]), progress=False)
    assert edit_store(url, "delete", EpisodeSelection(ids=[range(1, 3)]), progress=False).episodes_after == 1
