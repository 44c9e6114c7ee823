"""`mmdata export --to lerobot`: a LeRobot v3.0 dataset that LeRobot itself reads as the store (checked against
`fixtures/lerobot_export/`, recorded with lerobot 0.4.4), that mmdata's importer reads back as the store, and
refusals for what LeRobot cannot hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.codecs.colour import to_rgb
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import DestinationError, ExportError, OptionError
from mmdata.exporters.lerobot_v3 import export_lerobot
from mmdata.importers import discover_episodes
from tests.conftest import run_cli
from tests.fixtures.lerobot_export.make_export import EPISODES, store_of_fixture

FIXTURE = Path(__file__).parent / "fixtures" / "lerobot_export"
FPS = 30
COLOUR_CONVERSION_LEVELS = 3.0  # mean |swscale's RGB - mmdata's RGB| of the same decoded frames, at most


@pytest.fixture(scope="module")
def lerobot_store(tmp_path_factory) -> Path:
    """The LeRobot fixture converted as `make_export.py` converts it."""
    return store_of_fixture(tmp_path_factory.mktemp("lerobot-store"))


def decoded(path: Path, convert=to_rgb) -> np.ndarray:
    """Every frame of a video file, in RGB by mmdata's colour conversion (or by `convert`)."""
    with av.open(str(path)) as container:
        return np.stack([convert(frame) for frame in container.decode(video=0)])


def swscale_rgb(frame: av.VideoFrame) -> np.ndarray:
    """RGB as FFmpeg's swscale makes it, as LeRobot's decoders (torchcodec, PyAV) give it."""
    return frame.to_ndarray(format="rgb24")


def video_files(root: Path) -> list[Path]:
    return sorted(root.glob("videos/*/chunk-*/file-*.mp4"))


@pytest.mark.slow
def test_todays_export_of_the_fixture_is_the_dataset_lerobot_read(lerobot_store, tmp_path):
    export_lerobot(str(lerobot_store), tmp_path / "now", episodes=EPISODES, progress=False)
    recorded, now = FIXTURE / "dataset", tmp_path / "now"
    for name in ("meta/info.json", "meta/stats.json"):
        assert json.loads((now / name).read_text()) == json.loads((recorded / name).read_text()), name
    for table in ("meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet", "data/chunk-000/file-000.parquet"):
        assert pq.read_table(now / table).equals(pq.read_table(recorded / table)), table
    assert [p.relative_to(now) for p in video_files(now)] == [p.relative_to(recorded) for p in video_files(recorded)]
    for a, b in zip(video_files(now), video_files(recorded)):
        assert np.array_equal(decoded(a), decoded(b)), a


def test_what_lerobot_read_from_the_export_is_the_store(lerobot_store):
    summary = json.loads((FIXTURE / "lerobot_items.json").read_text())
    items = np.load(FIXTURE / "lerobot_items.npz")
    store = mmdata.open_dataset(str(lerobot_store))
    counts = {episode: int(store.manifest.row(episode)["observation.images.cam_high/count"]) for episode in EPISODES}
    frames = [(episode, frame) for episode in EPISODES for frame in range(counts[episode])]
    assert summary["length"] == len(frames) and summary["num_episodes"] == len(EPISODES)
    assert summary["meta_tasks"] == {"push the blue block to the left": 0, "pick up the red cube": 1}
    values = {
        (episode, name): np.asarray(store.read_episode(episode, [name])[name].values)
        for episode in EPISODES
        for name in ("observation.state", "action")
    }
    videos = {
        (position, name): decoded(
            FIXTURE / "dataset" / "videos" / name / f"chunk-000/file-{position:03d}.mp4", swscale_rgb
        )
        for position in range(len(EPISODES))
        for name in ("observation.images.cam_high",)
    }
    image_error = []
    for index, (episode, frame) in enumerate(frames):
        position = EPISODES.index(episode)
        assert items[f"{index}/index"] == index and items[f"{index}/episode_index"] == position
        assert items[f"{index}/frame_index"] == frame
        assert items[f"{index}/timestamp"] == np.float32(frame / FPS)
        task = store.manifest.row(episode)["task"]
        assert summary["tasks"][index] == task and items[f"{index}/task_index"] == summary["meta_tasks"][task]
        for name, offsets in summary["delta_timestamps"].items():
            wanted = [frame + round(offset * FPS) for offset in offsets]
            count = int(store.manifest.row(episode)[f"{name}/count"])
            clamped = np.clip(wanted, 0, count - 1)
            pad = items[f"{index}/{name}_is_pad"]
            assert pad.tolist() == [not 0 <= w < count for w in wanted], (index, name)
            if name.startswith("observation.images."):
                if f"{index}/{name}" not in items:
                    continue
                read = items[f"{index}/{name}"]
                exported = videos[(position, name)][clamped].transpose(0, 3, 1, 2)
                assert np.array_equal(read, exported), f"index {index}: LeRobot read other frames than exported"
                times = store.timestamps_of(store.manifest.row(episode), name)[clamped]
                expected = np.asarray(store.frames_at(episode, name, times).values).transpose(0, 3, 1, 2)
                image_error.append(np.abs(read.astype(int) - expected).mean())
            else:
                assert np.array_equal(items[f"{index}/{name}"], values[(episode, name)][clamped]), (index, name)
    # the same decoded pictures; FFmpeg's swscale turns them into RGB ~2.3 levels away from mmdata's exact conversion
    assert image_error and max(image_error) <= COLOUR_CONVERSION_LEVELS, f"{max(image_error):.2f} levels apart"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_an_export_imported_again_holds_the_stores_values_and_frames(lerobot_store, tmp_path, layout):
    source = lerobot_store
    if layout == "zarr":
        source = tmp_path / "store.zarr"
        convert(
            discover_episodes(str(FIXTURE.parent / "lerobot_small")),
            source,
            ConvertOptions(layout="zarr", workers=1, progress=False),
        )
    report = export_lerobot(str(source), tmp_path / "export", progress=False)
    assert report.episodes == 3 and report.resampled == [] and len(report.remuxed) == 2
    store = mmdata.open_dataset(str(source))
    for path in video_files(tmp_path / "export"):  # remuxed: the store's frames, bit for bit
        camera, episode = path.parts[-3], int(path.stem.split("-")[1])
        assert np.array_equal(decoded(path), np.asarray(store.read_episode(episode, [camera])[camera].values))

    again = tmp_path / "again.wds"
    convert(discover_episodes(str(tmp_path / "export")), again, ConvertOptions(workers=1, progress=False))
    back = mmdata.open_dataset(str(again))
    assert len(back) == len(store)
    for index in range(len(store)):
        a, b = store.read_episode(index), back.read_episode(index)
        assert back.manifest.row(index)["task"] == store.manifest.row(index)["task"]
        for name in ("observation.state", "action"):
            assert np.array_equal(a[name].values, b[name].values)
            np.testing.assert_allclose(a[name].timestamps, b[name].timestamps, atol=1e-6)
        for name in ("observation.images.cam_high", "observation.images.cam_wrist"):
            error = np.abs(np.asarray(a[name].values, np.int16) - np.asarray(b[name].values, np.int16))
            assert error.mean() <= 1.5, (
                f"{name}: frames re-encoded by the import differ by {error.mean():.2f} on average"
            )


def test_streams_off_the_frame_clock_are_sampled_at_the_nearest_value_and_audio_is_left_out(stores, tmp_path):
    report = export_lerobot(str(stores["wds"]), tmp_path / "export", episodes=[1], progress=False,
                            rename={"state": "observation.state", "cam_high": "observation.images.top"})  # fmt: skip
    assert report.left_out == ["audio"] and set(report.resampled) == {"state", "action"}
    store = mmdata.open_dataset(str(stores["wds"]))
    row = store.manifest.row(1)
    clock = store.timestamps_of(row, "cam_high")
    state = store.read_episode(1, ["state"])["state"]
    nearest = np.abs(np.asarray(state.timestamps)[None, :] - clock[:, None]).argmin(1)
    data = pq.read_table(tmp_path / "export" / "data/chunk-000/file-000.parquet")
    assert np.array_equal(
        np.stack(data.column("observation.state").to_numpy(zero_copy_only=False)), np.asarray(state.values)[nearest]
    )
    assert data.column("episode_index").to_pylist() == [0] * len(clock)
    info = json.loads((tmp_path / "export" / "meta/info.json").read_text())
    assert "observation.images.top" in info["features"] and "audio" not in info["features"]
    assert (tmp_path / "export" / "videos/observation.images.top/chunk-000/file-000.mp4").exists()


def test_what_lerobot_cannot_hold_is_refused_and_nothing_is_left_behind(stores, vfr_store, tmp_path):
    with pytest.raises(ExportError, match="off the 50 fps grid|off the .* fps grid"):
        export_lerobot(str(vfr_store), tmp_path / "vfr", progress=False)
    assert not (tmp_path / "vfr").exists() and not (tmp_path / "vfr.partial").exists()
    with pytest.raises(OptionError, match="episode 99 is not in"):
        export_lerobot(str(stores["wds"]), tmp_path / "out", episodes=[99], progress=False)
    with pytest.raises(OptionError, match="--rename names streams the store does not have"):
        export_lerobot(str(stores["wds"]), tmp_path / "out", rename={"nope": "x"}, progress=False)
    with pytest.raises(OptionError, match="not LeRobot's own"):
        export_lerobot(str(stores["wds"]), tmp_path / "out", rename={"state": "index"}, progress=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    with pytest.raises(DestinationError, match="not empty"):
        export_lerobot(str(stores["wds"]), tmp_path / "full", progress=False)
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"
    store = shutil.copytree(stores["wds"], tmp_path / "store.wds")
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    for inside in (store / "lerobot", store / "shards" / "lerobot"):
        with pytest.raises(DestinationError, match="lies inside the store"):
            export_lerobot(str(store), inside, progress=False)
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before


@pytest.mark.slow
def test_the_export_command_reports_what_it_wrote(stores, tmp_path):
    done = run_cli("export", str(stores["zarr"]), str(tmp_path / "out"), "--episodes", "0,2", "--quiet",
                   "--rename", "state=observation.state")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exported 2 episodes" in done.stdout and "left out (LeRobot datasets hold no audio): audio" in done.stdout
    refused = run_cli("export", str(stores["zarr"]), str(tmp_path / "bad"), "--episodes", "2-x")
    assert refused.returncode == 2 and "'2-x' is not an episode number" in refused.stderr
