"""`mmdata.lerobot.LeRobotLoader` against what LeRobot's own `LeRobotDataset` returned for the same indices and
`delta_timestamps` (recorded from lerobot into the fixture folder by `record_lerobot_items.py`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import IntegrityError, SpecError, StoreError
from mmdata.importers import discover_episodes, shipped_stats
from mmdata.lerobot import LeRobotLoader
from mmdata.store.dataset import open_dataset

FIXTURE = Path(__file__).parent / "fixtures" / "lerobot_small"
TASK_FIXTURES = [Path(__file__).parent / "fixtures" / name for name in ("lerobot_tasks", "lerobot_images")]
RECORDED = json.loads((FIXTURE / "lerobot_items.json").read_text())
STRIPE = json.loads((FIXTURE / "fixture_truth.json").read_text())["stripe_height_px"]
DECODE_TOLERANCE = 5.0  # mean absolute difference in levels: the store re-encodes LeRobot's AV1 as H.264


def _converted(source: Path, layout: str, folder: Path) -> str:
    """The LeRobot dataset at `source` converted as `mmdata convert` does (LeRobot's own statistics kept)."""
    path = folder / f"store.{layout}"
    options = ConvertOptions(layout=layout, workers=1, progress=False)
    convert(discover_episodes(source), path, options, source_stats=shipped_stats(source))
    return str(path)


@pytest.fixture(scope="module", params=["wds", "zarr"])
def store(request, tmp_path_factory) -> str:
    return _converted(FIXTURE, request.param, tmp_path_factory.mktemp("lerobot"))


def _by_index(loader: LeRobotLoader) -> dict[int, dict]:
    samples = {}
    for batch in loader:
        for row, index in enumerate(batch["index"].tolist()):
            samples[index] = {key: value[row] for key, value in batch.items()}
    return samples


def _top_stripe(frame: np.ndarray, height: int = STRIPE) -> float:
    """The mean level of a [3, H, W] frame's top stripe, which shows its frame number."""
    return float(frame[:, 2 : height - 2].mean())


@pytest.mark.slow
def test_batches_equal_lerobots_own_items_key_by_key(store):
    expected = np.load(FIXTURE / "lerobot_items.npz")
    loader = LeRobotLoader(store, RECORDED["delta_timestamps"], batch_size=8, shuffle=True, num_workers=2)
    samples = _by_index(loader)
    assert sorted(samples) == list(range(167)), "every frame of every episode is one sample, as in LeRobot"
    for index in RECORDED["indices"]:
        sample = samples[index]
        keys = sorted(name.split("/", 1)[1] for name in expected.files if name.startswith(f"{index}/"))
        assert sorted(set(sample) - {"task"}) == keys
        assert sample["task"] == RECORDED["tasks"][str(index)]
        for key in keys:
            want, got = expected[f"{index}/{key}"], sample[key].numpy()
            if key.startswith("observation.images.") and not key.endswith("_is_pad"):
                assert got.dtype == np.float32 and got.shape == want.shape and got.min() >= 0 and got.max() <= 1
                for ours, theirs in zip(got.reshape(-1, *got.shape[-3:]), want.reshape(-1, *want.shape[-3:])):
                    assert abs(_top_stripe(ours * 255) - _top_stripe(theirs)) <= 6, f"index {index} {key}: same frame"
                assert np.abs(got * 255 - want).mean() < DECODE_TOLERANCE, f"index {index} {key}"
            else:
                assert got.dtype == want.dtype and np.array_equal(got, want), f"index {index} {key}: {got} != {want}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
@pytest.mark.parametrize("fixture", TASK_FIXTURES, ids=lambda path: path.name)
def test_each_frame_has_its_own_task_and_one_value_features_are_scalars_as_in_lerobot(fixture, layout, tmp_path):
    """`lerobot_images` holds the same episodes with the camera as an `image` feature (PNGs in the data files).
    Both have a `string` feature, `language_instruction`, which LeRobot gives per frame."""
    recorded = json.loads((fixture / "lerobot_items.json").read_text())
    expected = np.load(fixture / "lerobot_items.npz")
    store = _converted(fixture, layout, tmp_path)
    samples = _by_index(LeRobotLoader(store, recorded["delta_timestamps"], batch_size=8, num_workers=1))
    assert sorted(samples) == list(range(recorded["frames"]))
    for index, sample in samples.items():
        keys = sorted(name.split("/", 1)[1] for name in expected.files if name.startswith(f"{index}/"))
        assert sorted(set(sample) - {"task", "language_instruction"}) == keys
        assert sample["task"] == recorded["tasks"][str(index)], f"index {index}: the frame's own task"
        assert sample["language_instruction"] == recorded["language_instruction"][str(index)], "a string feature"
        for key in keys:
            want, got = expected[f"{index}/{key}"], sample[key].numpy()
            if key == "observation.image":
                assert got.shape == want.shape and np.abs(got * 255 - want).mean() < DECODE_TOLERANCE
                for ours, theirs in zip(got * 255, want):
                    stripe = recorded["stripe_height_px"]
                    assert abs(_top_stripe(ours, stripe) - _top_stripe(theirs, stripe)) <= 3, f"index {index}"
            else:
                assert got.dtype == want.dtype and got.shape == want.shape, f"index {index} {key}: {got.shape}"
                assert np.array_equal(got, want), f"index {index} {key}: {got} != {want}"
    episode_tasks = [open_dataset(store).manifest.row(i)["task"] for i in range(3)]
    assert episode_tasks == [
        "pick up the cup",
        "open the drawer; close the drawer",
        "close the drawer; pick up the cup; wave",
    ], "an episode's tasks in the order its frames come"


@pytest.mark.parametrize(
    "damage",
    [
        {"lerobot_task_runs": "oops"},
        {"lerobot_task_runs": [[0, 1], [0, 2]]},
        {"lerobot_task_runs": [[3, 1]]},
        {"lerobot_task_runs": [[0, "2"]]},
        {"lerobot_task_runs": [[0, 1, 2]]},
        {"lerobot_text_runs": {"language_instruction": [[0, 7]]}},
        {"lerobot_text_runs": {"language_instruction": []}},
        {"lerobot_text_runs": ["phase 0"]},
    ],
    ids=["text", "repeat", "late", "str", "3", "text-number", "text-empty", "text-list"],
)
@pytest.mark.slow
def test_damaged_frame_runs_in_a_stores_metadata_are_named(damage, tmp_path):
    store = Path(_converted(TASK_FIXTURES[0], "wds", tmp_path))
    table = pq.read_table(store / "episodes.parquet")
    metadata = table.column("metadata").to_pylist()
    metadata[1] = json.dumps(json.loads(metadata[1]) | damage)
    table = table.set_column(table.schema.get_field_index("metadata"), "metadata", pa.array(metadata))
    pq.write_table(table, store / "episodes.parquet")
    with pytest.raises(
        IntegrityError, match=r"episode 'episode_000001': its metadata .*(lerobot_t|a task_index|a text)"
    ):
        LeRobotLoader(str(store), batch_size=4, num_workers=0)


def test_episodes_spread_over_data_files_read_back_as_lerobot_gives_them(tmp_path, monkeypatch):
    """Episodes 0 and 2 in one data file and episode 1 in another, discovery keeping one file's index columns
    at a time: the file of episodes 0 and 2 is read again after episode 1's, and every frame is still right."""
    import mmdata.importers.lerobot_folders as importer

    source = shutil.copytree(TASK_FIXTURES[0], tmp_path / "spread")
    data = pq.read_table(source / "data" / "chunk-000" / "file-000.parquet")
    owners = data.column("episode_index").to_numpy()
    pq.write_table(data.filter(pa.array(owners != 1)), source / "data" / "chunk-000" / "file-000.parquet")
    pq.write_table(data.filter(pa.array(owners == 1)), source / "data" / "chunk-000" / "file-001.parquet")
    episodes_path = source / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    episodes = pq.read_table(episodes_path)
    files = pa.array([0, 1, 0], episodes.schema.field("data/file_index").type)
    pq.write_table(
        episodes.set_column(episodes.schema.get_field_index("data/file_index"), "data/file_index", files), episodes_path
    )
    monkeypatch.setattr(importer, "DATA_FILES_KEPT", 1)
    recorded = json.loads((source / "lerobot_items.json").read_text())
    expected = np.load(source / "lerobot_items.npz")
    samples = _by_index(
        LeRobotLoader(_converted(source, "wds", tmp_path), recorded["delta_timestamps"], batch_size=8, num_workers=0)
    )
    assert sorted(samples) == list(range(recorded["frames"]))
    for index, sample in samples.items():
        assert sample["task"] == recorded["tasks"][str(index)]
        for key in ("action", "observation.state", "next.reward", "episode_index", "frame_index", "task_index"):
            assert np.array_equal(sample[key].numpy(), expected[f"{index}/{key}"]), f"index {index} {key}"


def test_episodes_are_chosen_by_lerobots_episode_index(tmp_path):
    recorded = json.loads((TASK_FIXTURES[0] / "lerobot_items.json").read_text())
    store = _converted(TASK_FIXTURES[0], "wds", tmp_path)
    samples = _by_index(LeRobotLoader(store, {"action": [0.0, 0.1]}, batch_size=4, episodes=[2, 0], num_workers=0))
    assert sorted(samples) == [*range(12), *range(27, 37)], "LeRobot's dataset-wide index of episodes 0 and 2"
    assert {int(s["episode_index"]) for s in samples.values()} == {0, 2}
    assert [samples[i]["task"] for i in (27, 31, 35)] == [recorded["tasks"][str(i)] for i in (27, 31, 35)]
    with pytest.raises(SpecError, match=r"episodes \[7\] are not in the store"):
        LeRobotLoader(store, batch_size=4, episodes=[0, 7], num_workers=0)


def test_dataset_stats_are_lerobots_own_or_else_mmdatas_in_lerobots_shapes(tmp_path):
    fixture = TASK_FIXTURES[0]
    store = Path(_converted(fixture, "wds", tmp_path))
    shipped = json.loads((fixture / "meta" / "stats.json").read_text())
    stats = LeRobotLoader(str(store), batch_size=4, streams={"action": "act"}, num_workers=0).dataset_stats
    assert set(stats) == {"act" if key == "action" else key for key in shipped}, "LeRobot's own, keys renamed"
    for key, figures in shipped.items():
        for name, value in figures.items():
            got = stats["act" if key == "action" else key][name]
            assert np.array_equal(got, np.asarray(value)) and got.dtype == np.asarray(value).dtype
    computed = json.loads((store / "stats.json").read_text())
    del computed["lerobot"]
    (store / "stats.json").write_text(json.dumps(computed))
    stats = LeRobotLoader(str(store), batch_size=4, num_workers=0).dataset_stats
    assert set(stats) == {"observation.image", "observation.state", "observation.gripper", "action"} | {
        "next.reward",
        "next.done",
    }
    assert stats["observation.image"]["mean"].shape == (3, 1, 1) and "min" not in stats["observation.image"]
    assert np.allclose(stats["action"]["mean"], computed["lowdim"]["action"]["mean"])
    assert stats["observation.state"]["max"].shape == (3,)


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (lambda s: s["lerobot"]["action"].update(mean=[[1.0], [2.0, 3.0]]), "lerobot/action/mean is not numbers"),
        (lambda s: s["lerobot"]["action"].update(std=["wide"]), "lerobot/action/std is not numbers"),
        (lambda s: s.pop("lerobot") and s["lowdim"]["action"].update(std=[-1.0] * 2), "negative std"),
        (lambda s: s.pop("lerobot") and s["cameras"].update({"observation.image": [0.5]}), r"is \[0.5\], not an"),
        (lambda s: s.pop("lerobot") and s.update(cameras=["oops"]), "'cameras' is \\['oops'\\], not an object"),
        (lambda s: s.pop("lerobot") and s["cameras"]["observation.image"].pop("std"), "has no std"),
        (lambda s: s.update(lerobot=["oops"]), "'lerobot' is \\['oops'\\], not an object"),
        (lambda s: s["lerobot"].update(action="oops"), "lerobot/action is 'oops', not an object"),
        (lambda s: s.pop("lerobot") and s["lowdim"].update(action=3), "lowdim/action is 3, not an object"),
    ],
    ids=[
        "ragged",
        "text",
        "negative-std",
        "camera-not-an-object",
        "cameras-a-list",
        "camera-without-std",
        "lerobot-a-list",
        "lerobot-entry-text",
        "lowdim-entry-number",
    ],
)
@pytest.mark.slow
def test_malformed_statistics_are_a_store_error_from_dataset_stats(tmp_path, edit, complaint):
    store = Path(_converted(TASK_FIXTURES[0], "wds", tmp_path))
    stats = json.loads((store / "stats.json").read_text())
    edit(stats)
    (store / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(StoreError, match=complaint):
        _ = LeRobotLoader(str(store), batch_size=4, num_workers=0).dataset_stats


@pytest.mark.slow
def test_uint8_images_unshuffled_order_and_an_unknown_delta_key(store):
    loader = LeRobotLoader(store, {"action": [0.0, 0.1]}, batch_size=16, shuffle=False, images="uint8", num_workers=0)
    batches = list(loader)
    assert [i for b in batches for i in b["index"].tolist()] == list(range(167)), "shuffle=False keeps LeRobot order"
    first = batches[0]
    assert first["observation.images.cam_high"].dtype.is_floating_point is False
    assert tuple(first["observation.images.cam_high"].shape) == (16, 3, 96, 128)
    assert tuple(first["action"].shape) == (16, 2, 14) and tuple(first["observation.state"].shape) == (16, 14)
    assert "observation.state_is_pad" not in first and "action_is_pad" in first
    with pytest.raises(SpecError, match=r"delta_timestamps names \['observation.image'\], which the store"):
        LeRobotLoader(store, {"observation.image": [0.0]}, batch_size=4, num_workers=0)
    with pytest.raises(SpecError, match=r"renames a stream to \['observation.state'\], a name another stream"):
        LeRobotLoader(store, batch_size=4, streams={"action": "observation.state"}, num_workers=0)
    with pytest.raises(SpecError, match=r"delta_timestamps\['action'\] holds nan, not a finite number"):
        LeRobotLoader(store, {"action": [float("nan")]}, batch_size=4, num_workers=0)


def test_offsets_that_decrease_or_repeat_come_back_in_the_order_given(store):
    def first_batch(deltas):
        return next(iter(LeRobotLoader(store, deltas, batch_size=8, shuffle=False, num_workers=0)))

    given = {"action": [0.1, 0.0, 0.1], "observation.images.cam_high": [0.0, -0.1, 0.0]}
    sorted_ = {"action": [0.0, 0.1], "observation.images.cam_high": [-0.1, 0.0]}
    odd, plain = first_batch(given), first_batch(sorted_)
    for key, positions in (("action", [1, 0, 1]), ("observation.images.cam_high", [1, 0, 1])):
        assert torch.equal(odd[key], plain[key][:, positions]), key
        assert torch.equal(odd[f"{key}_is_pad"], plain[f"{key}_is_pad"][:, positions]), key


@pytest.mark.parametrize(
    ("deltas", "complaint"),
    [
        (0.1, "maps stream names to lists of offsets in seconds, not float"),
        ([0.0, 0.1], "maps stream names to lists of offsets in seconds, not list"),
        ({"action": None}, r"delta_timestamps\['action'\] is a non-empty list of seconds, not None"),
        ({"action": 0.1}, r"delta_timestamps\['action'\] is a non-empty list of seconds, not 0.1"),
        ({"action": ["0.1"]}, r"holds '0.1', not a number of seconds"),
        ({"action": [True]}, r"holds True, not a number of seconds"),
        ({"action": [0.0] * 1_000_000}, r"lists 1000000 offsets; at most 4096"),
    ],
    ids=["scalar", "list", "none-offsets", "scalar-offsets", "text-offset", "bool-offset", "a-million"],
)
def test_delta_timestamps_of_the_wrong_shape_are_refused_naming_them(store, deltas, complaint):
    with pytest.raises(SpecError, match=complaint):
        LeRobotLoader(store, deltas, batch_size=4, num_workers=0)


def test_a_stream_map_gives_the_keys_a_policy_expects(store):
    plain = _by_index(LeRobotLoader(store, {"observation.state": [0.0]}, batch_size=8, shuffle=False, num_workers=0))
    renamed = LeRobotLoader(
        store,
        {"state": [0.0]},
        batch_size=8,
        shuffle=False,
        streams={"observation.images.cam_high": "observation.image", "observation.state": "state"},
        num_workers=0,
    )
    samples = _by_index(renamed)
    assert {"observation.image", "state", "state_is_pad"} <= set(samples[0])
    assert "observation.images.cam_high" not in samples[0]
    for index in (0, 45, 166):
        assert np.array_equal(samples[index]["state"], plain[index]["observation.state"])
        assert np.array_equal(samples[index]["observation.image"], plain[index]["observation.images.cam_high"])
        assert samples[index]["episode_index"] == plain[index]["episode_index"]


def test_float_frames_are_every_uint8_value_divided_as_lerobot_divides_them():
    from mmdata.lerobot.loader import to_unit_float

    frames = torch.arange(256, dtype=torch.uint8).repeat(6).reshape(2, 3, 16, 16)
    assert torch.equal(to_unit_float(frames), frames.to(torch.float32) / 255)
    assert torch.equal(to_unit_float(frames.permute(0, 2, 3, 1)), frames.permute(0, 2, 3, 1).to(torch.float32) / 255)
