"""Every command that writes files keeps to its destination: a name from a store, a source or an option that
would lead outside it is refused before anything is written (export's feature keys, a store's version files),
and a destination that is a link, the current folder, or inside an unwritable folder is handled by name
(`view --out` and `bench --plot` are tested beside their commands)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest

import mmdata
from mmdata.errors import DestinationError, StoreError
from mmdata.exporters.lerobot_v3 import export_lerobot
from mmdata.tools.cli import main


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def sibling(tmp_path) -> Path:
    """Another LeRobot dataset beside the export's destination, which no export may touch."""
    video = tmp_path / "sibling" / "videos" / "observation.images.top" / "chunk-000" / "file-000.mp4"
    video.parent.mkdir(parents=True)
    video.write_bytes(b"someone else's video")
    return tmp_path / "sibling"


@pytest.mark.parametrize(
    "key",
    [
        "../../sibling/videos/observation.images.top",
        "../sibling",
        "..",
        ".",
        "a/b",
        "a\\b",
        "line\nbreak",
        " ",
        "x" * 300,
    ],
)
def test_export_refuses_a_feature_key_that_is_not_one_plain_folder_name(stores, tmp_path, sibling, key, capsys):
    before = tree(sibling)
    out = tmp_path / "exports" / "dataset"
    code = main(["export", str(stores["wds"]), str(out), "--quiet", "--rename", f"cam_high={key}"])
    assert code == 2 and "--rename" in capsys.readouterr().err
    assert tree(sibling) == before
    assert not (tmp_path / "exports").exists() or not list((tmp_path / "exports").iterdir())


def test_export_writes_only_inside_its_destination_whatever_the_keys(stores, tmp_path, sibling):
    before = tree(sibling)
    out = tmp_path / "dataset"
    rename = {"cam_high": "observation.images.top", "cam_wrist": "..observation", "state": "observation.state"}
    export_lerobot(str(stores["wds"]), out, episodes=[0], rename=rename, progress=False)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and sibling not in p.parents]
    assert written and all(out in p.parents for p in written)
    assert tree(sibling) == before


def test_export_into_a_link_to_an_empty_folder_is_refused_before_writing(stores, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link_dst"
    link.symlink_to(target)
    with pytest.raises(DestinationError, match="is a symbolic link .* export into a new folder"):
        export_lerobot(str(stores["wds"]), link, progress=False)
    assert not list(target.iterdir()) and not (tmp_path / "link_dst.partial").exists()


def test_export_into_the_current_empty_folder_fills_it_and_keeps_it(stores, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert main(["export", str(stores["wds"]), ".", "--quiet", "--episodes", "1"]) == 0
    assert here.stat().st_ino == inode, "the folder the user stands in is kept, not replaced"
    assert sorted(p.name for p in here.iterdir()) == ["data", "meta", "videos"]
    info = json.loads((here / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 1 and not list(tmp_path.glob("*.partial"))


def test_an_existing_empty_folder_left_by_an_interrupted_export_is_taken_again(stores, tmp_path, monkeypatch):
    out = tmp_path / "made"
    out.mkdir()
    from mmdata.exporters import lerobot_v3

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(lerobot_v3._Writer, "finish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_lerobot(str(stores["wds"]), out, episodes=[0], progress=False)
    assert out.is_dir() and not list(out.iterdir()), "nothing half-written is left"
    monkeypatch.undo()
    export_lerobot(str(stores["wds"]), out, episodes=[0], progress=False)
    assert (out / "meta" / "info.json").exists()


def test_export_into_a_folder_that_cannot_be_written_is_a_destination_error(stores, tmp_path, monkeypatch, capsys):
    def refused(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused)
    assert main(["export", str(stores["wds"]), str(tmp_path / "locked" / "dataset"), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "permission denied; export elsewhere" in error and "Traceback" not in error


def test_export_episode_lists_that_are_empty_or_huge_are_refused_quickly(stores, tmp_path, capsys):
    assert main(["export", str(stores["wds"]), str(tmp_path / "none"), "--episodes", ""]) == 2
    assert "'' is not an episode number" in capsys.readouterr().err
    started = time.perf_counter()
    forty = ",".join(f"{n * 10_000_000}-{(n + 1) * 10_000_000 - 1}" for n in range(40))
    assert main(["export", str(stores["wds"]), str(tmp_path / "huge"), "--episodes", forty]) == 2
    assert "episode 3 is not in" in capsys.readouterr().err
    assert time.perf_counter() - started < 10, "the ranges are not made whole"
    assert not (tmp_path / "none").exists() and not (tmp_path / "huge").exists()


@pytest.mark.parametrize("field", ["stats", "manifest"])
@pytest.mark.parametrize("name", ["../escape.json", "/tmp/escape.json", "stats/../../x.json"])
def test_a_store_naming_version_files_outside_itself_is_refused_by_every_command(stores, tmp_path, field, name, capsys):
    store = shutil.copytree(stores["wds"], tmp_path / "store.wds")
    document = json.loads((store / "dataset.json").read_text())
    document[field] = name
    (store / "dataset.json").write_text(json.dumps(document))
    before = tree(tmp_path)
    with pytest.raises(StoreError, match=f"'{field}'"):
        mmdata.open_store(str(store))
    for command in (["stats", str(store)], ["view", str(store), "--out", str(tmp_path / "v")], ["verify", str(store)]):
        assert main(command) == 2
        assert "Traceback" not in capsys.readouterr().err
    assert tree(tmp_path) == before and not os.path.exists("/tmp/escape.json")


def test_a_feature_key_is_one_plain_folder_name():
    from mmdata.exporters.lerobot_v3 import feature_key_problem

    assert feature_key_problem("observation.images.top") is None and feature_key_problem("..top") is None
    for key in ("../x", "", "a\x00b", "..", "a/b"):
        assert feature_key_problem(key), key


PLANTED = (
    "dataset.json.tmp",
    "episodes-000001.parquet.tmp",
    "stats-000001.json.tmp",
    "episodes.parquet.tmp",
    "stats.json.tmp",
)


def plant_links(folder: Path, victim: Path, names=PLANTED) -> None:
    """Links to `victim` at the temporary names writers used to write through."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).symlink_to(victim)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["delete", "remove-stream", "split", "merge", "append", "compact", "convert"])
def test_links_planted_at_temporary_names_are_never_written_through(stores, raw_dataset, tmp_path, writer):
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.editing.compaction import compact_store
    from mmdata.editing.derived import ValidationChoice, merge_stores, split_store
    from mmdata.editing.edits import edit_store, remove_stream
    from mmdata.editing.selection import EpisodeSelection
    from mmdata.importers import discover_episodes
    from mmdata.store.verification import verify_dataset

    victim = tmp_path / "victim.txt"
    victim.write_text("not the store's")
    store = Path(shutil.copytree(stores["wds"], tmp_path / "robot.wds"))
    plant_links(store, victim)
    (store / "shards" / "shard-000003.tar.tmp").symlink_to(victim)  # (the next shard's name while it is written)
    written = [store]
    if writer == "delete":
        edit_store(str(store), "delete", EpisodeSelection(ids=[1]), progress=False)
    elif writer == "remove-stream":
        remove_stream(str(store), "audio", progress=False)
    elif writer == "split":
        written = [tmp_path / "train", tmp_path / "validation"]
        for folder in written:
            plant_links(folder, victim)
        choice = ValidationChoice(EpisodeSelection(ids=[0]))
        split_store(str(store), str(written[0]), str(written[1]), choice, progress=False)
    elif writer == "merge":
        written = [tmp_path / "merged"]
        plant_links(written[0], victim)
        twin = shutil.copytree(stores["wds"], tmp_path / "twin.wds")
        merge_stores([str(store), str(twin)], str(written[0]), progress=False)
    elif writer == "append":
        convert(discover_episodes(raw_dataset, "raw"), store, ConvertOptions(workers=1, progress=False, append=True))
    elif writer == "compact":
        written = [tmp_path / "compacted"]
        compact_store(str(store), str(written[0]), progress=False)
    else:
        written = [tmp_path / "converted.wds"]
        convert(discover_episodes(raw_dataset, "raw"), written[0], ConvertOptions(workers=1, progress=False))
    assert victim.read_text() == "not the store's"
    for folder in written:
        assert not (folder / "dataset.json").is_symlink() and (folder / "dataset.json").is_file()
        opened = mmdata.open_store(str(folder))
        for name in (opened.schema.manifest_file, opened.schema.stats_file):
            assert not (folder / name).is_symlink() and (folder / name).is_file()
        assert verify_dataset(str(folder), progress=False).ok
