"""`mmdata edit STORE add-stream`: a store's next version with a stream of another store of the same episodes,
read where that store holds it (no media copied); episodes matched by source or order, refused by name when they do
not line up, published in one step (a failure at any step leaves the version before), in both layouts, locally and
in object storage; the stream kept through splits and merges, copied in by compact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.editing import added_streams
from mmdata.editing.added_streams import add_streams
from mmdata.editing.compaction import compact_store
from mmdata.editing.derived import ValidationChoice, merge_stores, split_store
from mmdata.editing.edits import edit_store, remove_stream
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import EditError, OptionError
from tests.conftest import LAYOUTS, run_cli
from tests.test_edit import SPEC, episode_data, fail_at
from tests.test_edit_stores import contents, same_contents
from tests.test_loader import assert_same_batches

BATCH_SIZE = 2


@pytest.fixture
def pair(stores, tmp_path) -> dict[str, tuple[Path, Path]]:
    """Per layout: a store without its 'cam_high' camera, and beside it a store of the same episodes with it."""
    made = {}
    for layout in LAYOUTS:
        robot = Path(shutil.copytree(stores[layout], tmp_path / f"robot.{layout}"))
        remove_stream(str(robot), "cam_high", progress=False)
        made[layout] = (robot, Path(shutil.copytree(stores[layout], tmp_path / f"cameras.{layout}")))
    return made


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_added_stream_reads_the_other_stores_media_as_the_store_it_came_from_does(pair, stores, layout):
    robot, cameras = pair[layout]
    media_before = {k: v for k, v in files_of(robot).items() if not k.startswith(("episodes", "stats", "dataset"))}
    other_before = files_of(cameras)
    report = add_streams(str(robot), str(cameras), ["cam_high"], progress=False)
    assert report.version == 2 and report.episodes_after == 3 and report.stats == "recomputed"
    edited = mmdata.open_dataset(str(robot))
    assert edited.schema.stream_origins == {"cam_high": f"../cameras.{layout}"}
    assert same_contents(contents(str(robot)), contents(str(stores[layout])))
    assert_same_batches(
        list(mmdata.DataLoader(str(robot), SPEC, seed=3, batch_size=BATCH_SIZE, num_workers=0)),
        list(mmdata.DataLoader(str(stores[layout]), SPEC, seed=3, batch_size=BATCH_SIZE, num_workers=0)),
    )
    after = files_of(robot)
    assert {k: after[k] for k in media_before} == media_before  # no media written into the store
    assert files_of(cameras) == other_before  # the other store is only read
    stats = json.loads((robot / edited.schema.stats_file).read_text())
    assert "cam_high" in stats["cameras"]
    assert run_cli("verify", str(robot)).returncode == 0


@pytest.mark.slow
def test_episodes_are_matched_by_source_whatever_their_numbers_and_by_order_only_where_counts_agree(pair, stores):
    robot, cameras = pair["wds"]
    edit_store(str(robot), "delete", EpisodeSelection(ids=[1]), progress=False)  # robot holds episodes 0 and 2
    with pytest.raises(EditError, match="holds 2 episodes and .* 3: matched by order"):
        add_streams(str(robot), str(cameras), ["cam_high"], match="order", progress=False)
    add_streams(str(robot), str(cameras), ["cam_high"], progress=False)
    original = mmdata.open_dataset(str(stores["wds"]))
    edited = mmdata.open_dataset(str(robot))
    for index, before in ((0, 0), (1, 2)):
        assert np.array_equal(
            edited.read_episode(index, ["cam_high"])["cam_high"].values,
            original.read_episode(before, ["cam_high"])["cam_high"].values,
        )
    fewer = cameras.parent / "fewer.wds"
    shutil.copytree(stores["wds"], fewer)
    edit_store(str(fewer), "delete", EpisodeSelection(ids=[2]), progress=False)
    other = cameras.parent / "other.wds"
    shutil.copytree(stores["wds"], other)
    remove_stream(str(other), "cam_high", progress=False)
    with pytest.raises(
        EditError, match=r"1 episode\(s\) of .* have no episode of the same source .* the first: episode 2"
    ):
        add_streams(str(other), str(fewer), ["cam_high"], progress=False)
    twice = cameras.parent / "twice.wds"
    halves = [str(cameras.parent / name) for name in ("rest.wds", "first.wds")]
    split_store(str(cameras), *halves, ValidationChoice(EpisodeSelection(ids=[0])), False, progress=False)
    merge_stores([str(cameras), halves[1]], str(twice), recompute_stats=False, progress=False)  # episode 0 twice
    with pytest.raises(EditError, match="holds 2 episodes of source .* each episode is matched to one"):
        add_streams(str(other), str(twice), ["cam_high"], progress=False)


@pytest.mark.slow
def test_episodes_matched_by_order_that_do_not_line_up_are_refused_naming_them(pair, tmp_path):
    robot, cameras = pair["wds"]
    train, validation, shuffled = (str(tmp_path / name) for name in ("train", "validation", "shuffled"))
    split_store(str(cameras), train, validation, ValidationChoice(EpisodeSelection(ids=[0])), progress=False)
    merge_stores([train, validation], shuffled, progress=False)  # episodes 1, 2, 0 of the store
    version = mmdata.open_dataset(str(robot)).schema.version
    with pytest.raises(EditError, match="episode 'episode_000000' .* duration .* not line up"):
        add_streams(str(robot), shuffled, ["cam_high"], match="order", progress=False)
    assert mmdata.open_dataset(str(robot)).schema.version == version
    add_streams(str(robot), shuffled, ["cam_high"], progress=False)  # by source: each its own
    edited = mmdata.open_dataset(str(robot))
    assert edited.schema.stream_origins == {"cam_high": "../cameras.wds"}  # where the media are, not the merge
    assert same_contents(contents(str(robot)), contents(str(cameras)))


@pytest.mark.slow
def test_a_stream_the_store_has_of_another_layout_text_or_unknown_is_refused_with_the_store_unchanged(pair, tmp_path):
    robot, cameras = pair["wds"]
    with pytest.raises(EditError, match="has a stream 'state' already; remove it first"):
        add_streams(str(robot), str(cameras), ["state"], progress=False)
    with pytest.raises(EditError, match="zarr store .* same layout"):
        add_streams(str(robot), str(pair["zarr"][1]), ["cam_high"], progress=False)
    with pytest.raises(EditError, match="task text"):
        add_streams(str(robot), str(cameras), ["task"], progress=False)
    with pytest.raises(EditError, match="no stream named 'depth'"):
        add_streams(str(robot), str(cameras), ["depth"], progress=False)
    with pytest.raises(OptionError, match="matched by source or order"):
        add_streams(str(robot), str(cameras), ["cam_high"], match="time", progress=False)
    inside = robot / "inner.wds"
    shutil.copytree(cameras, inside)
    with pytest.raises(EditError, match="beside it"):
        add_streams(str(robot), str(inside), ["cam_high"], progress=False)
    assert mmdata.open_dataset(str(robot)).schema.version == 1


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["write_rows", "compute_stats", "publish"])
def test_adding_a_stream_that_fails_at_any_step_leaves_the_version_before(pair, monkeypatch, failing):
    robot, cameras = pair["zarr"]
    fail_at(monkeypatch, failing, added_streams)
    with pytest.raises(OSError, match="went away"):
        add_streams(str(robot), str(cameras), ["cam_high"], progress=False)
    unchanged = mmdata.open_dataset(str(robot))
    assert unchanged.schema.version == 1 and "cam_high" not in [s.name for s in unchanged.schema.streams]
    assert len(
        list(
            mmdata.DataLoader(
                str(robot), mmdata.Windows(5, {"state": mmdata.Values()}), batch_size=BATCH_SIZE, num_workers=0
            )
        )
    )
    monkeypatch.undo()
    assert add_streams(str(robot), str(cameras), ["cam_high"], progress=False).version == 2


@pytest.mark.slow
def test_a_loader_reading_while_a_stream_is_added_goes_on_with_the_batches_of_its_version(pair):
    robot, cameras = pair["wds"]
    spec = mmdata.Windows(anchor_fps=5, streams={"state": mmdata.Values()})
    expected = list(mmdata.DataLoader(str(robot), spec, seed=2, batch_size=BATCH_SIZE, num_workers=0))
    got = []
    for step, batch in enumerate(mmdata.DataLoader(str(robot), spec, seed=2, batch_size=BATCH_SIZE, num_workers=0)):
        got.append(batch)
        if step == 1:
            add_streams(str(robot), str(cameras), ["cam_high"], progress=False)
    assert_same_batches(got, expected)
    assert len(list(mmdata.DataLoader(str(robot), SPEC, batch_size=BATCH_SIZE, num_workers=0))) > 0


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_added_stream_is_kept_through_a_split_and_copied_in_by_compact(pair, stores, layout, tmp_path):
    robot, cameras = pair[layout]
    add_streams(str(robot), str(cameras), ["cam_high"], recompute_stats=False, progress=False)
    train, validation = str(tmp_path / "train"), str(tmp_path / "validation")
    split_store(str(robot), train, validation, ValidationChoice(EpisodeSelection(ids=[1])), progress=False)
    assert mmdata.open_dataset(train).schema.stream_origins == {"cam_high": f"../cameras.{layout}"}
    original = contents(str(stores[layout]))
    assert same_contents(contents(train), [original[0], original[2]])
    with pytest.raises(EditError, match="from different places .* compact them first"):
        merge_stores([train, str(cameras)], str(tmp_path / "merged"), progress=False)
    merge_stores([validation, train], str(tmp_path / "merged"), progress=False)
    assert mmdata.open_dataset(str(tmp_path / "merged")).schema.stream_origins == {"cam_high": f"../cameras.{layout}"}
    compacted = tmp_path / "compacted"
    compact_store(str(robot), str(compacted), None, progress=False)
    shutil.rmtree(cameras)
    with pytest.raises(mmdata.StoreError, match=f"reads its episodes' media from the store at '../cameras.{layout}'"):
        mmdata.open_dataset(str(robot))
    alone = mmdata.open_dataset(str(compacted))
    assert alone.schema.stream_origins == {} and same_contents(contents(str(compacted)), original)


@pytest.mark.slow
def test_appending_to_a_store_with_an_added_stream_is_refused_with_the_way_on(pair, raw_dataset):
    robot, cameras = pair["wds"]
    add_streams(str(robot), str(cameras), ["cam_high"], recompute_stats=False, progress=False)
    done = run_cli("convert", str(raw_dataset), str(robot), "--append")
    assert done.returncode != 0 and "compact it first" in done.stderr


def test_stream_origins_that_name_no_stream_or_climb_nowhere_are_refused_when_the_store_opens(stores, tmp_path):
    store = Path(shutil.copytree(stores["wds"], tmp_path / "robot"))
    document = json.loads((store / "dataset.json").read_text())
    for hostile, why in (
        ({"depth": "../cameras"}, "not one of its streams"),
        ({"task": "../cameras"}, "not one of its streams"),
        ({"cam_high": "/etc"}, "not a path like ../store"),
        ({"cam_high": "s3://bucket/x"}, "not a path like ../store"),
        (["cam_high"], "not an object"),
    ):
        (store / "dataset.json").write_text(json.dumps({**document, "stream_origins": hostile}))
        with pytest.raises(mmdata.StoreError, match=why):
            mmdata.open_dataset(str(store))


@pytest.mark.slow
def test_the_edit_command_adds_a_stream_and_inspect_says_where_it_is_read(pair):
    robot, cameras = pair["wds"]
    done = run_cli("edit", str(robot), "add-stream", "--from", str(cameras), "--stream", "cam_high", "--no-progress")
    assert done.returncode == 0 and "version 2, 3 episodes" in done.stdout, done.stderr
    inspected = run_cli("inspect", str(robot))
    assert "media     of 'cam_high' in the store ../cameras.wds (added from)" in inspected.stdout
    missing = run_cli("edit", str(robot), "add-stream", "--from", str(cameras))
    assert missing.returncode == 2 and "--stream" in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_adding_a_stream_in_object_storage_gives_the_store_a_local_edit_gives(stores, tmp_path, layout):
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e .[dev])")
    from tests.s3_server import local_s3_bucket

    bucket = f"mmdata-add-stream-{layout}"
    with local_s3_bucket(bucket) as filesystem:
        for name in ("robot", "cameras"):
            filesystem.put(str(stores[layout]), f"{bucket}/{name}", recursive=True)
            shutil.copytree(stores[layout], tmp_path / name)
        for root in (f"s3://{bucket}", str(tmp_path)):
            remove_stream(f"{root}/robot", "cam_high", progress=False)
            add_streams(f"{root}/robot", f"{root}/cameras", ["cam_high"], progress=False)
        remote = mmdata.open_dataset(f"s3://{bucket}/robot")
        assert remote.schema.stream_origins == {"cam_high": "../cameras"} and remote.schema.version == 2
        assert_same_batches(
            list(mmdata.DataLoader(f"s3://{bucket}/robot", SPEC, seed=1, batch_size=BATCH_SIZE, num_workers=0)),
            list(mmdata.DataLoader(str(tmp_path / "robot"), SPEC, seed=1, batch_size=BATCH_SIZE, num_workers=0)),
        )
        assert np.array_equal(episode_data(remote, 1)[2], episode_data(mmdata.open_dataset(str(stores[layout])), 1)[2])
