"""What goes in comes back: low-dim bit-exact, video within CRF tolerance, audio sample-exact."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

import mmdata
from mmdata.codecs.audio import decode_audio
from mmdata.store.manifest import Piece
from mmdata.synthetic import read_index_stripe


def source_frames(path) -> tuple[np.ndarray, np.ndarray]:
    import av

    with av.open(str(path)) as container:
        decoded = [(f.to_ndarray(format="rgb24"), f.time) for f in container.decode(video=0)]
    return np.stack([f for f, _ in decoded]), np.array([t for _, t in decoded])


def test_lowdim_streams_read_back_bit_exact(store, raw_dataset):
    dataset = mmdata.open_dataset(str(store))
    for index in range(len(dataset)):
        folder = raw_dataset / dataset.manifest.row(index)["source"]
        episode = dataset.read_episode(index, streams=["state", "action"])
        for name in ("state", "action"):
            expected = np.load(folder / f"{name}.npy")
            assert episode[name].values.dtype == expected.dtype
            assert np.array_equal(episode[name].values, expected)
            assert np.array_equal(episode[name].timestamps, np.arange(len(expected)) / 50)


@pytest.mark.slow
def test_every_video_frame_matches_its_source_frame(store, raw_dataset):
    dataset = mmdata.open_dataset(str(store))
    for index in range(len(dataset)):
        folder = raw_dataset / dataset.manifest.row(index)["source"]
        episode = dataset.read_episode(index, streams=["cam_high", "cam_wrist"])
        for camera in ("cam_high", "cam_wrist"):
            expected, expected_times = source_frames(folder / f"{camera}.mp4")
            stored = episode[camera]
            assert stored.values.shape == expected.shape
            error = np.abs(stored.values.astype(np.int16) - expected.astype(np.int16)).mean()
            assert error < 3, f"episode {index} {camera}: mean absolute error {error:.2f}"
            assert [read_index_stripe(f) for f in stored.values] == list(range(len(expected)))
            assert np.allclose(stored.timestamps, expected_times)


def test_audio_reads_back_sample_exact(store, raw_dataset):
    dataset = mmdata.open_dataset(str(store))
    for index in range(len(dataset)):
        folder = raw_dataset / dataset.manifest.row(index)["source"]
        expected, _ = decode_audio(str(folder / "audio.wav"))
        audio = dataset.read_episode(index, streams=["audio"])["audio"]
        assert audio.values.dtype == np.int16
        assert np.array_equal(audio.values, expected.samples)
        assert np.allclose(audio.timestamps[:3], np.arange(3) / 16000)


def test_time_range_returns_only_values_inside_it(store):
    dataset = mmdata.open_dataset(str(store))
    episode = dataset.read_episode(1, t0=0.5, t1=1.0)
    frames = episode["cam_high"]
    assert len(frames.values) == 15
    assert [read_index_stripe(f) for f in frames.values] == list(range(15, 30))
    assert len(episode["state"].values) == 25
    assert episode["state"].timestamps[0] == pytest.approx(0.5)
    assert len(episode["audio"].values) == 8000
    assert episode["audio"].timestamps[0] == pytest.approx(0.5)


def test_manifest_and_schema_describe_the_episodes(store):
    dataset = mmdata.open_dataset(str(store))
    assert len(dataset) == 3
    names = [s.name for s in dataset.schema.streams]
    assert names == ["task", "cam_high", "cam_wrist", "audio", "action", "state"]
    camera = dataset.schema.stream("cam_wrist")
    assert (camera.width, camera.height, camera.fps, camera.codec) == (208, 160, 30.0, "h264")
    assert dataset.schema.stream("state").shape == (14,)
    table = dataset.table
    assert table.column("task").to_pylist()[1] == "open the drawer"
    assert table.column("cam_high/count").to_pylist() == [45, round(table.column("duration")[1].as_py() * 30), 90]


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_fsspec_urls_read_the_same_episode(store, scheme):
    if scheme == "file":
        url = f"file://{store}"
    else:
        fs = fsspec.filesystem("memory")
        target = f"/stores/{store.name}"
        fs.put(str(store), target, recursive=True)
        url = f"memory://{target}"
    remote = mmdata.open_dataset(url).read_episode(2, t0=1.0, t1=1.5)
    local = mmdata.open_dataset(str(store)).read_episode(2, t0=1.0, t1=1.5)
    for name in ("cam_wrist", "state", "audio"):
        assert np.array_equal(remote[name].values, local[name].values)


@pytest.mark.slow
def test_opus_audio_is_stored_as_recorded(raw_copy, tmp_path):
    import av

    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes

    for folder in sorted(raw_copy.iterdir()):
        clip, _ = decode_audio(str(folder / "audio.wav"))
        (folder / "audio.wav").unlink()
        with av.open(str(folder / "audio.opus"), "w") as container:
            stream = container.add_stream("libopus", rate=48000, layout="mono")
            resampled = np.repeat(clip.samples[:, 0], 3)
            frame = av.AudioFrame.from_ndarray(resampled.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = 48000
            container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    convert(discover_raw_episodes(raw_copy), tmp_path / "out", ConvertOptions(workers=1, progress=False))
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    audio_spec = dataset.schema.stream("audio")
    assert (audio_spec.codec, audio_spec.sample_rate, audio_spec.sample_dtype) == ("opus", 48000, "float32")
    row = dataset.manifest.row(0)
    stored = dataset.pieces.read_bytes(Piece.from_dict(row["audio/data"]))
    assert stored == (raw_copy / "episode_0000" / "audio.opus").read_bytes()
    audio = dataset.read_episode(0, streams=["audio"])["audio"]
    assert audio.values.dtype == np.float32 and len(audio.values) == row["audio/count"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_streams_with_long_or_non_ascii_names_convert_and_read_back(raw_copy, stores, tmp_path, layout):
    import json
    import tarfile

    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes

    camera, values = "caméra poignet " + "x" * 120, "état " + "é" * 95  # 137 and 196 bytes
    for folder in sorted(raw_copy.iterdir()):
        (folder / "cam_wrist.mp4").rename(folder / f"{camera}.mp4")
        (folder / "state.npy").rename(folder / f"{values}.npy")
        meta = json.loads((folder / "meta.json").read_text())
        meta["rates"][values] = meta["rates"].pop("state")
        (folder / "meta.json").write_text(json.dumps(meta))
    options = ConvertOptions(layout=layout, shard_bytes=150_000, progress=False)
    convert(discover_raw_episodes(raw_copy), tmp_path / "out", options)
    renamed, plain = mmdata.open_dataset(str(tmp_path / "out")), mmdata.open_dataset(str(stores[layout]))
    for index in range(len(plain)):
        got = renamed.read_episode(index, streams=[camera, values])
        expected = plain.read_episode(index, streams=["cam_wrist", "state"])
        assert np.array_equal(got[camera].values, expected["cam_wrist"].values)
        assert np.array_equal(got[values].values, expected["state"].values)
        assert np.array_equal(got[values].timestamps, expected["state"].timestamps)
    if layout == "zarr":
        return
    shards = sorted((tmp_path / "out" / "shards").glob("*.tar"))
    assert len(shards) > 1
    names = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    assert f"episode_000000.{values}.timestamps.npy" in names
    assert sum(name.startswith(f"episode_000002.{camera}.") for name in names) >= 1


def test_a_stream_name_longer_than_a_file_name_holds_is_refused_by_its_bytes_not_its_characters():
    from mmdata.checks import stream_name_problem

    assert stream_name_problem("é" * 100) is None
    assert "201 bytes in UTF-8 is longer than 200" in stream_name_problem("é" * 100 + "x")
