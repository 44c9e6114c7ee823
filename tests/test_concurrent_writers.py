"""Writers of one store at once never lose each other's work: the second writer of a local store is refused while the
first holds it, naming it (and the kernel lets go of a killed one); a writer whose store another published a version
of meanwhile (in object storage, or one that ignores the lock) is refused at the swap of `dataset.json`, its files
removed; the one refused runs again and its change applies to the new version. Every writer: edits, appends, split
and merge destinations, compaction, and uploads."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.conversion import pipeline
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.editing import derived, edits
from mmdata.editing.derived import merge_stores
from mmdata.editing.edits import edit_store, remove_stream
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import ConcurrentWriteError
from mmdata.importers import discover_episodes
from mmdata.schema import version_of_file
from mmdata.store.hold import hold_store
from tests.conftest import LAYOUTS, run_cli
from tests.test_edit import episode_data


@pytest.fixture
def copies(stores, tmp_path) -> dict[str, Path]:
    """A private copy of each layout's store, to write."""
    return {layout: Path(shutil.copytree(stores[layout], tmp_path / f"robot.{layout}")) for layout in LAYOUTS}


class Outcome(dict):
    """A paused writer's outcome ("value" or "error"), once `finish` let it end."""

    def __init__(self, go: threading.Event, thread: threading.Thread):
        super().__init__()
        self.go, self.thread = go, thread

    def finish(self) -> Outcome:
        """Let the writer go on, and wait for it to end."""
        self.go.set()
        self.thread.join(300)
        return self


@contextlib.contextmanager
def paused(monkeypatch, module, step: str, writer: Callable[[], object]) -> Iterator[Outcome]:
    """Run `writer` on a thread until it reaches `step` (a function of `module` it calls) and hold it there while
    the block runs (or until `finish`); then let it end. Yields its outcome, filled in once it ended."""
    reached, go = threading.Event(), threading.Event()
    original = getattr(module, step)

    def waiting(*args, **kwargs):
        reached.set()
        assert go.wait(120), "the test never let the writer go on"
        return original(*args, **kwargs)

    monkeypatch.setattr(module, step, waiting)

    def run() -> None:
        try:
            outcome["value"] = writer()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    outcome = Outcome(go, thread)
    thread.start()
    try:
        assert reached.wait(120), f"the writer never reached {step}: {outcome.get('error')!r}"
        monkeypatch.setattr(module, step, original)
        yield outcome
    finally:
        outcome.finish()


def unpublished_files(store: Path) -> list[str]:
    """Manifests and statistics in `store` of no version a reader can read: neither its version's nor, one each,
    the version before's."""
    schema = mmdata.open_store(str(store)).schema
    files = sorted(path.name for path in [*store.glob("episodes*.parquet"), *store.glob("stats*.json")])
    before = [name for name in files if version_of_file(name) == schema.version - 1]
    allowed = {schema.manifest_file, schema.stats_file, *(before if len(before) <= 2 else [])}
    return [name for name in files if name not in allowed]


@pytest.mark.slow
@pytest.mark.parametrize("second", ["delete", "remove-stream"])
def test_a_second_edit_while_one_writes_is_refused_naming_it_and_applies_when_run_again(copies, monkeypatch, second):
    store = copies["wds"]
    before = mmdata.open_dataset(str(store))
    kept = episode_data(before, 1)
    command = [
        "edit",
        str(store),
        *(["delete", "--episodes", "1"] if second == "delete" else ["remove-stream", "audio"]),
    ]
    with paused(
        monkeypatch, edits, "compute_stats", lambda: edit_store(str(store), "delete", EpisodeSelection(ids=[0]))
    ) as first:
        refused = run_cli(*command, "--no-progress")
    assert "error" not in first, first.get("error")
    assert first["value"].version == 1
    assert refused.returncode == 2
    assert "being written by another mmdata writer" in refused.stderr and f"edit {store} delete" in refused.stderr
    assert "process" in refused.stderr and "run it again when that one has ended" in refused.stderr
    assert mmdata.open_store(str(store)).schema.version == 1, "the refused edit changed nothing"
    again = run_cli(*command, "--no-progress")
    assert again.returncode == 0, again.stderr
    after = mmdata.open_dataset(str(store))
    assert after.schema.version == 2 and [e["edit"] for e in after.schema.history] == ["delete", second]
    if second == "delete":  # both deletions held: of episodes 0, 1, 2 only 1 is left
        assert len(after) == 1 and episode_data(after, 0)[0] == kept[0]
        assert np.array_equal(episode_data(after, 0)[1], kept[1])
    else:
        assert len(after) == 2 and "audio" not in [s.name for s in after.schema.streams]
    assert run_cli("verify", str(store)).returncode == 0
    assert unpublished_files(store) == []


@pytest.mark.slow
def test_an_edit_and_an_append_at_once_one_is_refused_and_both_apply_one_after_the_other(
    copies, raw_dataset, monkeypatch
):
    store = copies["wds"]
    sources = discover_episodes(raw_dataset, "raw")
    appending = ConvertOptions(layout="wds", workers=1, progress=False, append=True)
    with paused(monkeypatch, pipeline, "complete_store", lambda: convert(sources, store, appending)) as append:
        refused = run_cli("edit", str(store), "delete", "--episodes", "0", "--no-progress")
    assert "error" not in append, append.get("error")
    assert refused.returncode == 2 and "convert --append" in refused.stderr
    assert len(mmdata.open_store(str(store))) == 6
    with (
        paused(
            monkeypatch, edits, "compute_stats", lambda: edit_store(str(store), "delete", EpisodeSelection(ids=[0]))
        ) as edit,
        pytest.raises(ConcurrentWriteError, match="being written by another mmdata writer .*edit .* delete"),
    ):
        convert(sources, store, appending)
    assert "error" not in edit, edit.get("error")
    assert not (store / ".mmdata-partial").exists(), "the refused append left nothing to resume"
    convert(sources, store, appending)
    after = mmdata.open_store(str(store))
    assert len(after) == 8 and [e.get("edit", "append") for e in after.schema.history] == ["append", "delete", "append"]
    assert run_cli("verify", str(store)).returncode == 0


@pytest.mark.slow
def test_a_writer_that_ignores_the_lock_is_caught_at_the_swap_and_its_rival_loses_nothing(
    copies, tmp_path, monkeypatch
):
    """Another host writing the store over a filesystem whose locks it does not share, or an older mmdata: the
    version it published is found changed when this writer swaps `dataset.json`, and kept whole."""
    store = copies["zarr"]
    elsewhere = Path(shutil.copytree(store, tmp_path / "elsewhere.zarr"))
    edit_store(str(elsewhere), "delete", EpisodeSelection(ids=[2]), progress=False)
    foreign = mmdata.open_store(str(elsewhere)).schema
    with paused(
        monkeypatch, edits, "compute_stats", lambda: edit_store(str(store), "delete", EpisodeSelection(ids=[0]))
    ) as ours:
        for name in (foreign.manifest_file, foreign.stats_file, "dataset.json"):  # its files, then its swap
            shutil.copyfile(elsewhere / name, store / name)
    error = ours.get("error")
    assert isinstance(error, ConcurrentWriteError), ours
    assert "another writer published version 1 (delete 1 episode (ids 2))" in str(error)
    assert "run it again to apply it" in str(error)
    now = mmdata.open_dataset(str(store))
    assert now.schema.manifest_file == foreign.manifest_file and len(now) == 2
    assert unpublished_files(store) == [], "the loser's manifest and statistics were removed"
    assert edit_store(str(store), "delete", EpisodeSelection(ids=[0]), progress=False).version == 2
    assert len(mmdata.open_store(str(store))) == 1


@pytest.mark.slow
def test_a_killed_writer_leaves_no_lock_and_the_next_one_is_told_who_holds_a_store(copies):
    store = copies["wds"]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom mmdata.store.hold import hold_store\n"
            f"with hold_store({str(store)!r}, 'a test writer'):\n    print('held', flush=True)\n    time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConcurrentWriteError, match=rf"'a test writer', process {holder.pid} on .* since "):
            remove_stream(str(store), "audio", progress=False)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    finally:
        holder.kill()
    assert (store / ".mmdata-writer.json").exists(), "a killed writer's record stays: only the lock counts"
    assert remove_stream(str(store), "audio", progress=False).version == 1
    assert not (store / ".mmdata-writer.json").exists()


@pytest.mark.slow
def test_two_merges_into_one_folder_the_second_is_refused_and_the_first_stands(copies, tmp_path, monkeypatch):
    twin = str(shutil.copytree(copies["wds"], tmp_path / "twin.wds"))
    into = tmp_path / "merged"
    sources = [str(copies["wds"]), twin]
    refused = pytest.raises(ConcurrentWriteError, match="being written by another mmdata writer")
    with paused(monkeypatch, derived, "compute_stats", lambda: merge_stores(sources, str(into))) as first, refused:
        merge_stores(list(reversed(sources)), str(into), progress=False)
    assert "error" not in first, first.get("error")
    merged = mmdata.open_store(str(into))
    assert len(merged) == 6 and merged.schema.created["from"] == sources


@pytest.mark.slow
def test_writers_in_object_storage_publish_by_a_conditional_write_and_the_loser_is_told(stores, tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    bucket = "mmdata-concurrent"
    with local_s3_bucket(bucket) as filesystem:
        filesystem.put(str(stores["wds"]), f"{bucket}/robot", recursive=True)
        filesystem.put(str(stores["wds"]), f"{bucket}/twin", recursive=True)
        filesystem.put(str(stores["wds"]), f"{bucket}/third", recursive=True)
        url = f"s3://{bucket}/robot"
        with paused(
            monkeypatch, edits, "compute_stats", lambda: edit_store(url, "delete", EpisodeSelection(ids=[0]))
        ) as slow:
            assert remove_stream(url, "audio", progress=False).version == 1  # no lock: both write, one publishes
        error = slow.get("error")
        assert isinstance(error, ConcurrentWriteError) and "remove stream 'audio'" in str(error), slow
        now = mmdata.open_dataset(url)
        assert now.schema.version == 1 and len(now) == 3 and "audio" not in [s.name for s in now.schema.streams]
        manifests = [path.rsplit("/", 1)[-1] for path in filesystem.glob(f"{bucket}/robot/episodes*.parquet")]
        assert sorted(manifests) == sorted(["episodes.parquet", now.schema.manifest_file]), "the loser's removed"
        assert edit_store(url, "delete", EpisodeSelection(ids=[0]), progress=False).version == 2

        into = f"s3://{bucket}/merged"
        sources = [f"s3://{bucket}/twin", f"s3://{bucket}/third"]
        with paused(monkeypatch, derived, "compute_stats", lambda: merge_stores(sources, into)) as first:
            merge_stores(list(reversed(sources)), into, progress=False)
        assert isinstance(first.get("error"), ConcurrentWriteError), first
        merged = mmdata.open_store(into)
        assert merged.schema.created["from"] == list(reversed(sources)) and len(merged) == 6
        assert len(filesystem.glob(f"{bucket}/merged/episodes*.parquet")) == 1

        leased = hold_store(f"s3://{bucket}/twin", "mmdata convert --append into it", lease=True)
        refused = pytest.raises(ConcurrentWriteError, match=r"convert --append .* delete .*\.mmdata-writer\.json")
        with leased, refused:
            edit_store(f"s3://{bucket}/twin", "delete", EpisodeSelection(ids=[0]), progress=False)
        assert edit_store(f"s3://{bucket}/twin", "delete", EpisodeSelection(ids=[0]), progress=False).version == 1


@pytest.mark.slow
def test_an_append_to_object_storage_overtaken_by_an_edit_gives_itself_up_and_runs_again(
    stores, raw_dataset, tmp_path, monkeypatch
):
    """An edit that began before the append recorded itself publishes first: the append's swap fails, its uploaded
    shards and its staging are removed, and the same command then appends to the edited store."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    bucket = "mmdata-overtaken"
    sources = discover_episodes(raw_dataset, "raw")
    appending = ConvertOptions(layout="wds", workers=1, progress=False, append=True, staging=str(tmp_path / "stage"))
    with local_s3_bucket(bucket) as filesystem:
        filesystem.put(str(stores["wds"]), f"{bucket}/robot", recursive=True)
        url = f"s3://{bucket}/robot"
        shards = sorted(filesystem.glob(f"{bucket}/robot/shards/*.tar"))
        editing = paused(
            monkeypatch, edits, "compute_stats", lambda: edit_store(url, "delete", EpisodeSelection(ids=[0]))
        )
        appending_paused = paused(monkeypatch, pipeline, "complete_store", lambda: convert(sources, url, appending))
        with editing as edit, appending_paused as append:
            assert len(filesystem.glob(f"{bucket}/robot/shards/*.tar")) > len(shards), "its shards uploaded"
            assert "error" not in edit.finish(), edit.get("error")  # the edit publishes first
        assert edit["value"].version == 1
        assert isinstance(append.get("error"), ConcurrentWriteError), append
        assert "another writer published version 1 (delete 1 episode" in str(append["error"])
        assert sorted(filesystem.glob(f"{bucket}/robot/shards/*.tar")) == shards, "its uploaded shards removed"
        assert not (tmp_path / "stage" / ".mmdata-partial").exists()
        assert not filesystem.exists(f"{bucket}/robot/.mmdata-writer.json")
        convert(sources, url, appending)
        after = mmdata.open_store(url)
        assert len(after) == 5 and [e.get("edit", "append") for e in after.schema.history] == ["delete", "append"]


@pytest.mark.slow
def test_a_second_export_into_one_place_is_refused_and_leaves_the_first_whole(stores, tmp_path, monkeypatch):
    from mmdata.errors import DestinationError
    from mmdata.exporters import lerobot_v3
    from mmdata.exporters.lerobot_v3 import export_lerobot

    into = tmp_path / "lerobot"
    first_export = lambda: export_lerobot(str(stores["wds"]), into, progress=False)  # noqa: E731
    with paused(monkeypatch, lerobot_v3, "write_episode_video", first_export) as first:
        with pytest.raises(DestinationError, match="another export is writing .* wait for it to end"):
            export_lerobot(str(stores["wds"]), into, progress=False)
        assert (tmp_path / "lerobot.partial").is_dir(), "the first export's work is untouched"
    assert "error" not in first, first.get("error")
    assert (into / "meta" / "info.json").exists() and not (tmp_path / "lerobot.partial").exists()
