"""Importers: LeRobot v3.0 (the shared fixture written by lerobot itself) and v2.1, HDF5 (ALOHA and
robomimic) and replay-buffer Zarr (v2, v3, zip), checked against ground truth after conversion,
and bad input named by file and episode."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import av
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import SourceError
from mmdata.importers import detect_format, discover_episodes
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import read_index_stripe, synthetic_frame
from tests.conftest import run_cli

LEROBOT_V3 = Path(__file__).parent / "fixtures" / "lerobot_small"
H, W = 96, 128


def convert_to(path, destination, source_format="auto", fps=None, layout="wds", skip_bad=False):
    sources = discover_episodes(path, source_format, fps)
    options = ConvertOptions(layout=layout, workers=1, progress=False, skip_bad=skip_bad)
    report = convert(sources, destination, options)
    return mmdata.open_dataset(destination), report


def assert_stripes(frames: np.ndarray, first_index: int = 0) -> None:
    assert [read_index_stripe(f) for f in frames] == list(range(first_index, first_index + len(frames)))


# LeRobot v3.0: the fixture written by lerobot 0.4.4's own writer


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_lerobot_v3_fixture_converts_to_the_frames_values_and_tasks_its_truth_file_states(tmp_path, layout):
    truth = json.loads((LEROBOT_V3 / "fixture_truth.json").read_text())
    assert detect_format(LEROBOT_V3) == "lerobot"
    dataset, report = convert_to(LEROBOT_V3, tmp_path / "out", layout=layout)
    assert report.converted == truth["num_episodes"] == len(dataset)
    cameras = list(truth["image_shapes_hwc"])
    stripe = truth["stripe_height_px"]
    for index in range(len(dataset)):
        row = dataset.manifest.row(index)
        episode = dataset.read_episode(index)
        length = truth["episode_lengths"][index]
        assert row["task"] == truth["TASKS"][index % 2]
        frame_index = np.arange(length)
        for camera in cameras:
            frames = episode[camera].values
            assert frames.shape == (length, *truth["image_shapes_hwc"][camera])
            np.testing.assert_allclose(episode[camera].timestamps, frame_index / truth["fps"], atol=1e-6)
            top = frames[:, 2 : stripe - 2].reshape(length, -1).mean(axis=1)
            bottom = frames[:, -stripe + 2 : -2].reshape(length, -1).mean(axis=1)
            assert np.abs(top - (frame_index * 7) % 256).max() <= 6
            assert np.abs(bottom - (40 + 9 * index) % 256).max() <= 6
        expected = (index + 0.01 * frame_index[:, None] + np.arange(14)[None, :]).astype(np.float32)
        np.testing.assert_array_equal(episode["observation.state"].values, expected)
        action = (index + 0.01 * frame_index[:, None] + np.arange(14) + 0.5).astype(np.float32)
        np.testing.assert_array_equal(episode["action"].values, action)
        np.testing.assert_allclose(episode["action"].timestamps, frame_index / truth["fps"], atol=1e-6)
    assert dataset.schema.stream(cameras[0]).fps == truth["fps"]
    assert dataset.schema.stream("observation.state").rate == truth["fps"]


# LeRobot v2.1, written here with its conventions


def write_lerobot_v21(root: Path, lengths=(20, 31, 12), short_video: int | None = None) -> Path:
    (root / "meta").mkdir(parents=True)
    tasks = ["open the drawer", "close the drawer"]
    features = {
        "observation.images.top": {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [6], "names": None},
        "action": {"dtype": "float32", "shape": [6], "names": None},
        **{
            k: {"dtype": d, "shape": [1], "names": None}
            for k, d in (
                ("timestamp", "float32"),
                ("frame_index", "int64"),
                ("episode_index", "int64"),
                ("index", "int64"),
                ("task_index", "int64"),
            )
        },
    }
    info = {
        "codebase_version": "v2.1",
        "robot_type": "koch",
        "fps": 30,
        "chunks_size": 1000,
        "total_episodes": len(lengths),
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info))
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(tasks))
    )
    episodes, start = [], 0
    for index, length in enumerate(lengths):
        episodes.append(json.dumps({"episode_index": index, "tasks": [tasks[index % 2]], "length": length}))
        frame_index = np.arange(length)
        state = (index + 0.01 * frame_index[:, None] + np.arange(6)).astype(np.float32)
        table = pa.table(
            {
                "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 6),
                "action": pa.FixedSizeListArray.from_arrays(pa.array((state + 0.5).ravel()), 6),
                "timestamp": pa.array((frame_index / 30).astype(np.float32)),
                "frame_index": pa.array(frame_index),
                "episode_index": pa.array(np.full(length, index)),
                "index": pa.array(start + frame_index),
                "task_index": pa.array(np.full(length, index % 2)),
            }
        )
        (root / "data" / "chunk-000").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / "data" / "chunk-000" / f"episode_{index:06d}.parquet")
        video = root / "videos" / "chunk-000" / "observation.images.top" / f"episode_{index:06d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        frames = length - 5 if short_video == index else length
        write_video(video, [synthetic_frame(i, 0, H, W) for i in range(frames)], 30)
        start += length
    (root / "meta" / "episodes.jsonl").write_text("\n".join(episodes) + "\n")
    return root


def write_video(path: Path, frames, fps: int) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        stream.options = {"crf": "10", "g": "2"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))


def test_lerobot_v21_converts_with_every_frame_and_value(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    assert detect_format(source) == "lerobot"
    dataset, _ = convert_to(source, tmp_path / "out")
    assert len(dataset) == 3
    for index, length in enumerate((20, 31, 12)):
        episode = dataset.read_episode(index)
        assert dataset.manifest.row(index)["task"] == ["open the drawer", "close the drawer"][index % 2]
        assert_stripes(episode["observation.images.top"].values)
        state = (index + 0.01 * np.arange(length)[:, None] + np.arange(6)).astype(np.float32)
        np.testing.assert_array_equal(episode["observation.state"].values, state)
        np.testing.assert_array_equal(episode["action"].values, state + np.float32(0.5))


def test_a_lerobot_v21_episode_whose_task_changes_keeps_each_frames_task(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    path = source / "data" / "chunk-000" / "episode_000001.parquet"
    table = pq.read_table(path)
    table = table.set_column(
        table.schema.get_field_index("task_index"), "task_index", pa.array(np.repeat([1, 0, 1], [10, 11, 10]))
    )
    pq.write_table(table, path)
    rows = (source / "meta" / "episodes.jsonl").read_text().splitlines()
    rows[1] = json.dumps({"episode_index": 1, "tasks": ["open the drawer", "close the drawer"], "length": 31})
    (source / "meta" / "episodes.jsonl").write_text("\n".join(rows) + "\n")
    dataset, _ = convert_to(source, tmp_path / "out")
    row = dataset.manifest.row(1)
    assert row["task"] == "close the drawer; open the drawer", "the tasks in the order the frames come"
    metadata = dataset.metadata_of(row)
    assert metadata["lerobot_task_runs"] == [[0, 1], [10, 0], [21, 1]]
    assert metadata["lerobot_tasks"] == {"0": "open the drawer", "1": "close the drawer"}


@pytest.mark.parametrize(
    "values", [np.full(31, -5), np.full(31, 2**40), np.full(31, 0.5)], ids=["neg", "huge", "float"]
)
@pytest.mark.slow
def test_a_task_index_column_out_of_range_is_named_and_can_be_skipped(tmp_path, values):
    source = write_lerobot_v21(tmp_path / "v21")
    path = source / "data" / "chunk-000" / "episode_000001.parquet"
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("task_index"), "task_index", pa.array(values)), path)
    with pytest.raises(SourceError, match=r"episode 'episode_000001'.*task_index column holds"):
        convert_to(source, tmp_path / "out")
    dataset, report = convert_to(source, tmp_path / "skipped", skip_bad=True)
    assert len(dataset) == 2 and [s["episode"] for s in report.skipped] == ["episode_000001"]


def test_lerobot_image_features_without_embedded_bytes_are_named_and_can_be_skipped(tmp_path):
    source = shutil.copytree(Path(__file__).parent / "fixtures" / "lerobot_images", tmp_path / "images")
    assert discover_episodes(source)[0].cameras[0].name == "observation.image"
    path = source / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    images = table.column("observation.image").combine_chunks()
    kept = [None if row >= 27 else value for row, value in enumerate(images.field("bytes").to_pylist())]
    emptied = pa.StructArray.from_arrays([pa.array(kept, pa.binary()), images.field("path")], ["bytes", "path"])
    table = table.set_column(table.schema.get_field_index("observation.image"), "observation.image", emptied)
    pq.write_table(table, path, row_group_size=16)
    with pytest.raises(SourceError, match=r"episode 'episode_000002'.*file-000\.parquet:observation\.image.*no bytes"):
        convert_to(source, tmp_path / "out")
    dataset, report = convert_to(source, tmp_path / "skipped", skip_bad=True)
    assert [s["episode"] for s in report.skipped] == ["episode_000002"]
    assert len(dataset) == 2 and len(dataset.read_episode(1)["observation.image"].values) == 15


def test_a_picture_of_another_size_is_named_by_its_frame(tmp_path):
    source = shutil.copytree(Path(__file__).parent / "fixtures" / "lerobot_images", tmp_path / "images")
    path = source / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    images = table.column("observation.image").to_pylist()
    small = av.VideoFrame.from_ndarray(np.zeros((20, 30, 3), np.uint8), format="rgb24")
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height, codec.pix_fmt = 30, 20, "rgb24"
    images[15]["bytes"] = b"".join(bytes(packet) for packet in codec.encode(small))
    column = table.schema.get_field_index("observation.image")
    pq.write_table(table.set_column(column, "observation.image", pa.array(images)), path)
    with pytest.raises(SourceError, match=r"episode 'episode_000001'.*frame 3 is 30x20, the camera's first 64x48"):
        convert_to(source, tmp_path / "out")


def test_lerobot_string_features_are_kept_as_runs_and_features_mmdata_does_not_read_are_listed(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    info = json.loads((source / "meta" / "info.json").read_text())
    info["features"]["language_instruction"] = {"dtype": "string", "shape": [1], "names": None}
    info["features"]["caption"] = {"dtype": "string", "shape": [1], "names": None}
    info["features"]["point_cloud"] = {"dtype": "pointcloud", "shape": [1], "names": None}
    (source / "meta" / "info.json").write_text(json.dumps(info))
    for index, length in enumerate((20, 31, 12)):
        path = source / "data" / "chunk-000" / f"episode_{index:06d}.parquet"
        table = pq.read_table(path)
        instruction = [f"step {frame // 8}" for frame in range(length)]
        caption = [f"frame {frame}" * 20_000 for frame in range(length)]  # too much text to keep as runs
        table = table.append_column("language_instruction", pa.array(instruction))
        pq.write_table(table.append_column("caption", pa.array(caption)), path)
    episode = discover_episodes(source)[1]
    assert [s.name for s in episode.lowdim] == ["observation.state", "action"]
    dataset, _ = convert_to(source, tmp_path / "out")
    metadata = dataset.metadata_of(dataset.manifest.row(1))
    assert metadata["lerobot_text_runs"] == {
        "language_instruction": [[0, "step 0"], [8, "step 1"], [16, "step 2"], [24, "step 3"]]
    }
    assert metadata["lerobot_unread_features"] == ["caption", "point_cloud"]


def test_a_lerobot_folder_without_info_json_is_named_with_the_fix(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    (source / "meta" / "info.json").unlink()
    with pytest.raises(SourceError, match=r"meta/info\.json'?: missing meta/info\.json.*LeRobot dataset"):
        discover_episodes(source, "lerobot")


def test_a_data_file_that_disagrees_with_the_episodes_table_is_named_and_can_be_skipped(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    path = source / "data" / "chunk-000" / "episode_000001.parquet"
    table = pq.read_table(path)
    table = table.set_column(
        table.schema.get_field_index("episode_index"), "episode_index", pa.array(np.full(table.num_rows, 7))
    )
    pq.write_table(table, path)
    with pytest.raises(SourceError, match=r"episode 'episode_000001', file '.*episode_000001\.parquet'.*episode_index"):
        convert_to(source, tmp_path / "out")
    dataset, report = convert_to(source, tmp_path / "skipped", skip_bad=True)
    assert len(dataset) == 2 and [s["episode"] for s in report.skipped] == ["episode_000001"]


def test_a_video_shorter_than_its_episode_is_named(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21", short_video=2)
    with pytest.raises(SourceError, match=r"episode 'episode_000002'.*episode_000002\.mp4.*7 frames.*has 12"):
        convert_to(source, tmp_path / "out")


@pytest.mark.slow
def test_convert_cli_reads_a_lerobot_dataset_and_reports_skipped_episodes(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21", short_video=0)
    finished = run_cli("convert", str(source), str(tmp_path / "out"), "--from", "lerobot", "--skip-bad")
    assert finished.returncode == 0, finished.stderr
    assert "episode_000000" in finished.stdout + finished.stderr
    assert len(mmdata.open_dataset(tmp_path / "out")) == 2


# HDF5: ALOHA / ACT and robomimic


def jpeg(frame: np.ndarray) -> bytes:
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height, codec.pix_fmt = frame.shape[1], frame.shape[0], "yuvj420p"
    codec.options = {"qscale": "2"}
    codec.qscale = 2
    packets = codec.encode(av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format="yuvj420p"))
    packets += codec.encode(None)
    return b"".join(bytes(p) for p in packets)


def write_aloha(folder: Path, lengths=(25, 18), compressed: int | None = None, drop_action: int | None = None) -> Path:
    folder.mkdir(parents=True)
    for index, length in enumerate(lengths):
        with h5py.File(folder / f"episode_{index}.hdf5", "w") as handle:
            handle.attrs["sim"] = True
            frames = np.stack([synthetic_frame(i, 0, H, W) for i in range(length)])
            images = handle.create_group("observations/images")
            if compressed == index:
                encoded = [jpeg(f) for f in frames]
                padded = np.zeros((length, max(map(len, encoded))), np.uint8)
                for row, data in enumerate(encoded):
                    padded[row, : len(data)] = np.frombuffer(data, np.uint8)
                images.create_dataset("cam_high", data=padded)
            else:
                images.create_dataset("cam_high", data=frames, chunks=(1, H, W, 3))
            qpos = (index + 0.02 * np.arange(length)[:, None] + np.arange(14)).astype(np.float64)
            handle.create_dataset("observations/qpos", data=qpos)
            handle.create_dataset("observations/qvel", data=-qpos)
            if drop_action != index:
                handle.create_dataset("action", data=qpos + 0.25)
    return folder


def test_aloha_hdf5_files_convert_with_frames_values_and_rate(tmp_path):
    source = write_aloha(tmp_path / "aloha", compressed=1)
    assert detect_format(source) == "hdf5"
    dataset, _ = convert_to(source, tmp_path / "out", fps=50)
    assert len(dataset) == 2
    assert dataset.schema.stream("cam_high").fps == 50 and dataset.schema.stream("qpos").rate == 50
    for index, length in enumerate((25, 18)):
        episode = dataset.read_episode(index)
        assert_stripes(episode["cam_high"].values)
        qpos = index + 0.02 * np.arange(length)[:, None] + np.arange(14)
        np.testing.assert_array_equal(episode["qpos"].values, qpos)
        np.testing.assert_array_equal(episode["qvel"].values, -qpos)
        np.testing.assert_array_equal(episode["action"].values, qpos + 0.25)
        np.testing.assert_allclose(episode["qpos"].timestamps, np.arange(length) / 50)
        assert json.loads(dataset.manifest.row(index)["metadata"])["sim"] is True


def test_an_hdf5_file_with_a_missing_key_is_named_and_can_be_skipped(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 12, 14), drop_action=1)
    with pytest.raises(SourceError, match=r"episode 'episode_1', file '.*episode_1\.hdf5:/action'.*'action'"):
        convert_to(source, tmp_path / "out", fps=50)
    dataset, report = convert_to(source, tmp_path / "skipped", fps=50, skip_bad=True)
    assert len(dataset) == 2 and [s["episode"] for s in report.skipped] == ["episode_1"]


def test_hdf5_without_a_rate_asks_for_fps(tmp_path):
    source = write_aloha(tmp_path / "aloha")
    with pytest.raises(SourceError, match="--fps"):
        discover_episodes(source, "hdf5")


def test_robomimic_demos_convert_with_cameras_low_dim_and_the_env_as_task(tmp_path):
    path = tmp_path / "low_dim.hdf5"
    lengths = (15, 22)
    with h5py.File(path, "w") as handle:
        data = handle.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1})
        for index, length in enumerate(lengths):
            demo = data.create_group(f"demo_{index}")
            demo.attrs["num_samples"] = length
            demo.create_dataset(
                "obs/agentview_image", data=np.stack([synthetic_frame(i, 0, 84, 84) for i in range(length)])
            )
            demo.create_dataset(
                "obs/robot0_eef_pos", data=np.arange(length * 3, dtype=np.float64).reshape(length, 3) + index
            )
            demo.create_dataset("actions", data=np.full((length, 7), index, np.float32))
            demo.create_dataset("rewards", data=np.arange(length, dtype=np.float64))
            demo.create_dataset("dones", data=(np.arange(length) == length - 1).astype(np.int64))
    dataset, _ = convert_to(path, tmp_path / "out", fps=20)
    assert len(dataset) == 2
    for index, length in enumerate(lengths):
        episode = dataset.read_episode(index)
        assert dataset.manifest.row(index)["task"] == "Lift"
        assert_stripes(episode["agentview_image"].values)
        np.testing.assert_array_equal(
            episode["robot0_eef_pos"].values, np.arange(length * 3, dtype=np.float64).reshape(length, 3) + index
        )
        np.testing.assert_array_equal(episode["action"].values, np.full((length, 7), index, np.float32))
        np.testing.assert_array_equal(episode["reward"].values[:, 0], np.arange(length))
        assert episode["done"].values[-1, 0] == 1


# Replay-buffer Zarr (Diffusion Policy / UMI)


def write_replay(path: Path, zarr_format: int, lengths=(12, 20, 9)) -> Path:
    total = sum(lengths)
    ends = np.cumsum(lengths)
    frames = np.concatenate([np.stack([synthetic_frame(i, 1, H, W) for i in range(n)]) for n in lengths])
    state = np.arange(total * 2, dtype=np.float32).reshape(total, 2)
    if path.suffix == ".zip":
        store = zarr.storage.ZipStore(path, mode="w")
        root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
    else:
        store = None
        root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    root.create_array("data/img", data=frames, chunks=(4, H, W, 3))
    root.create_array("data/state", data=state, chunks=(16, 2))
    root.create_array("data/action", data=state * 2, chunks=(16, 2))
    root.create_array("meta/episode_ends", data=ends.astype(np.int64))
    if store is not None:
        store.close()
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("name", "zarr_format"), [("replay.zarr", 2), ("replay.zarr", 3), ("replay.zarr.zip", 2)])
def test_replay_buffers_convert_episode_by_episode_in_v2_v3_and_zip(tmp_path, name, zarr_format):
    source = write_replay(tmp_path / name, zarr_format)
    assert detect_format(source) == "zarr-replay"
    dataset, _ = convert_to(source, tmp_path / "out", fps=10)
    assert len(dataset) == 3
    start = 0
    for index, length in enumerate((12, 20, 9)):
        episode = dataset.read_episode(index)
        assert_stripes(episode["img"].values)
        rows = np.arange(start, start + length)
        np.testing.assert_array_equal(episode["state"].values, np.stack([2 * rows, 2 * rows + 1], 1).astype(np.float32))
        np.testing.assert_array_equal(episode["action"].values, 2 * episode["state"].values)
        np.testing.assert_allclose(episode["state"].timestamps, np.arange(length) / 10)
        start += length


def test_a_replay_buffer_whose_arrays_disagree_with_episode_ends_is_named(tmp_path):
    source = write_replay(tmp_path / "replay.zarr", 3)
    zarr.open_group(source, mode="a")["meta/episode_ends"][-1] = 99
    with pytest.raises(SourceError, match=r"replay.zarr/data/action.: has 41 rows but meta/episode_ends ends at 99"):
        discover_episodes(source, "zarr-replay", fps=10)


def test_an_ambiguous_or_unknown_source_asks_for_from(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="matches no input format.*--from"):
        detect_format(tmp_path / "empty")
    both = write_aloha(tmp_path / "both")
    shutil.copytree(LEROBOT_V3 / "meta", both / "meta")
    with pytest.raises(SourceError, match="could be lerobot or hdf5.*--from"):
        detect_format(both)


def test_a_replay_buffer_compressed_with_a_missing_imagecodecs_codec_says_which_and_how_to_get_it(tmp_path):
    source = write_replay(tmp_path / "replay.zarr", 2)
    metadata_path = source / "data" / "img" / ".zarray"
    metadata = json.loads(metadata_path.read_text())
    metadata["compressor"] = {"id": "imagecodecs_jpegxl", "level": 90}
    metadata_path.write_text(json.dumps(metadata))
    with pytest.raises(SourceError, match=r"imagecodecs_jpegxl.*'imagecodecs' package \(pip install imagecodecs\)"):
        discover_episodes(source, "zarr-replay", fps=10)


def test_a_lerobot_v3_data_file_that_disagrees_with_the_episodes_table_is_named(tmp_path):
    source = tmp_path / "v3"
    shutil.copytree(LEROBOT_V3, source)
    path = source / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    owners = table.column("episode_index").to_numpy().copy()
    owners[owners == 1] = 2
    table = table.set_column(table.schema.get_field_index("episode_index"), "episode_index", pa.array(owners))
    pq.write_table(table, path)
    with pytest.raises(SourceError, match=r"episode 'episode_000001', file '.*file-000\.parquet'.*episode_index \[2\]"):
        convert_to(source, tmp_path / "out")
    dataset, report = convert_to(source, tmp_path / "skipped", skip_bad=True)
    assert len(dataset) == 2 and [s["episode"] for s in report.skipped] == ["episode_000001"]


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_a_camera_of_odd_sides_converts_and_reads_back_at_its_own_size(tmp_path, layout):
    height, width, length = 161, 223, 20
    folder = tmp_path / "aloha"
    folder.mkdir()
    frames = np.stack([synthetic_frame(i, 0, height, width) for i in range(length)])
    with h5py.File(folder / "episode_0.hdf5", "w") as handle:
        handle.create_dataset("observations/images/cam_high", data=frames)
        handle.create_dataset("observations/qpos", data=np.zeros((length, 14), np.float32))
    dataset, _ = convert_to(folder, tmp_path / "out", fps=10, layout=layout)
    camera = dataset.schema.stream("cam_high")
    assert (camera.width, camera.height, camera.coded_size) == (width, height, (224, 162))
    read = dataset.read_episode(0)["cam_high"].values
    assert read.shape == (length, height, width, 3)
    assert_stripes(read)
    assert np.abs(read.astype(int) - frames).mean() < 3, "the camera's own pixels, not shifted by the padding"
    assert verify_dataset(str(tmp_path / "out"), progress=False).ok
    spec = mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[0.0])})
    (batch, *_) = list(mmdata.DataLoader(dataset, spec, batch_size=4, shuffle="none", num_workers=0))
    assert tuple(batch["cam_high"].shape) == (4, 1, height, width, 3)
    assert [read_index_stripe(f) for f in batch["cam_high"][:, 0].numpy()] == [0, 1, 2, 3]
    resized = mmdata.Frames(offsets=[0.0], resize=mmdata.Resize(size=(64, 96)))
    (batch, *_) = list(
        mmdata.DataLoader(dataset, mmdata.Windows(10, {"cam_high": resized}), batch_size=4, num_workers=0)
    )
    assert tuple(batch["cam_high"].shape) == (4, 1, 64, 96, 3)
