"""Hostile or malformed recordings: each is a SourceError naming the episode and file (skippable
with --skip-bad when it concerns one episode), never a raw traceback, and no importer reads a
file outside its source."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import SourceError
from mmdata.importers import discover_episodes
from tests.conftest import run_cli
from tests.test_importers import LEROBOT_V3, write_aloha, write_lerobot_v21


def converted(source, destination, source_format="auto", fps=None, skip_bad=True, layout="wds"):
    options = ConvertOptions(layout=layout, workers=1, progress=False, skip_bad=skip_bad)
    return convert(discover_episodes(source, source_format, fps), destination, options, source_root=source)


def skipped_errors(report) -> dict[str, str]:
    return {entry["episode"]: entry["error"] for entry in report.skipped}


# raw folders


def write_meta(raw, episode: str, text: str) -> None:
    (raw / episode / "meta.json").write_text(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 50_000 + "]" * 50_000, "nests deeper than 64 levels"),
        ('{"task": "pick \\ud800 up", "rates": {"state": 50, "action": 50}}', "unpaired surrogate"),
        ('{"task": "t", "rates": {"state": "50", "action": 50}}', "rate of 'state' is '50', not a number"),
        ('{"task": "t", "rates": {"state": [50], "action": 50}}', "rate of 'state' is [50], not a number"),
        ('{"task": "t", "rates": {"state": -50, "action": 50}}', "must be above 0"),
        ('{"task": "t", "rates": {"state": NaN, "action": 50}}', "not a JSON number"),
        ('{"task": 7, "rates": {"state": 50, "action": 50}}', "'task' is 7, not text"),
        ('{"task": "t", "rates": [50], "metadata": {}}', "'rates' is list"),
        ('{"task": "t", "rates": {"state": 50, "action": 50}, "metadata": [1]}', "'metadata' is list"),
        ("{not json", "is not valid JSON"),
        ("\xff\xfe", "is not"),
    ],
    ids=[
        "deep-nesting",
        "lone-surrogate-task",
        "rate-as-string",
        "rate-as-list",
        "negative-rate",
        "nan-rate",
        "task-not-text",
        "rates-not-object",
        "metadata-not-object",
        "not-json",
        "not-utf8",
    ],
)
@pytest.mark.slow
def test_hostile_meta_json_is_an_episode_error_that_skip_bad_skips(raw_copy, tmp_path, text, message):
    meta = raw_copy / "episode_0001" / "meta.json"
    if text == "\xff\xfe":
        meta.write_bytes(b"\xff\xfe\x00")
    else:
        meta.write_text(text, errors="surrogatepass")
    with pytest.raises(SourceError, match=r"episode 'episode_0001', file '.*meta\.json'"):
        converted(raw_copy, tmp_path / "strict", skip_bad=False)
    report = converted(raw_copy, tmp_path / "out")
    errors = skipped_errors(report)
    assert list(errors) == ["episode_0001"] and message in errors["episode_0001"]
    assert len(mmdata.open_dataset(tmp_path / "out")) == 2


@pytest.mark.parametrize("column", ["../../escape", "joint/angle", "task"], ids=["dot-dot-slash", "slash", "reserved"])
def test_stream_names_that_could_escape_or_collide_are_refused(raw_copy, tmp_path, column):
    folder = raw_copy / "episode_0000"
    rows = 100
    table = pa.table({"timestamp": np.arange(rows) / 50.0, column: np.zeros(rows, np.float32)})
    pq.write_table(table, folder / "lowdim.parquet")
    with pytest.raises(SourceError, match=r"episode 'episode_0000'.*stream name"):
        converted(raw_copy, tmp_path / "out", skip_bad=False)
    assert not any(tmp_path.rglob("escape*")), "nothing was written under the name"


@pytest.mark.slow
def test_a_raw_file_linking_outside_the_source_is_refused(raw_copy, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = raw_copy / "episode_0002" / "state.npy"
    shutil.move(target, outside / "state.npy")
    target.symlink_to(outside / "state.npy")
    report = converted(raw_copy, tmp_path / "out")
    assert "outside the source" in skipped_errors(report)["episode_0002"]


@pytest.mark.slow
def test_low_dim_values_of_a_type_a_store_cannot_hold_are_refused(raw_copy, tmp_path):
    np.save(raw_copy / "episode_0000" / "state.npy", np.zeros((10, 14), np.complex64))
    report = converted(raw_copy, tmp_path / "out")
    assert "complex64" in skipped_errors(report)["episode_0000"]


# LeRobot


def lerobot_copy(tmp_path):
    return shutil.copytree(LEROBOT_V3, tmp_path / "lerobot")


def edit_info(root, change) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def edit_episodes_table(root, change) -> None:
    (path,) = (root / "meta" / "episodes").glob("chunk-*/file-*.parquet")
    table = pq.read_table(path)
    pq.write_table(change(table), path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda info: info.update(fps="thirty"), "'fps' is 'thirty', not a number"),
        (lambda info: info.update(fps=0), "must be above 0"),
        (lambda info: info.update(features=[]), "'features' is not an object"),
        (lambda info: info.update(chunks_size="1000"), "'chunks_size' is '1000'"),
    ],
    ids=["fps-text", "fps-zero", "features-list", "chunks-size-text"],
)
def test_unusable_lerobot_info_is_a_source_error(tmp_path, change, message):
    root = lerobot_copy(tmp_path)
    edit_info(root, change)
    with pytest.raises(SourceError, match=message):
        discover_episodes(root, "lerobot")
    result = run_cli("convert", str(root), str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr and message.split(",")[0] in result.stderr


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("data/chunk-{chunk_index.__class__}/file-{file_index:03d}.parquet", "is not one LeRobot fills in"),
        ("data/{chunk_index[0]}/file-{file_index:03d}.parquet", "is not one LeRobot fills in"),
        ("../../outside/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "outside the dataset"),
        ("/etc/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "outside the dataset"),
        ("data/{secret}/file-{file_index:03d}.parquet", "is not one LeRobot fills in"),
    ],
    ids=["attribute-access", "index-access", "dot-dot", "absolute", "unknown-field"],
)
def test_hostile_lerobot_data_path_templates_are_refused(tmp_path, template, message):
    root = lerobot_copy(tmp_path)
    edit_info(root, lambda info: info.update(data_path=template))
    sources = discover_episodes(root, "lerobot")
    assert all(s.problem is not None and message in str(s.problem) for s in sources)


def test_an_absolute_video_path_is_refused(tmp_path):
    root = lerobot_copy(tmp_path)
    edit_info(root, lambda info: info.update(video_path="/tmp/{video_key}/file-{file_index:03d}.mp4"))
    assert all("outside the dataset" in str(s.problem) for s in discover_episodes(root, "lerobot"))


def test_lerobot_episode_rows_with_missing_or_mistyped_fields_are_skipped_episodes(tmp_path):
    root = lerobot_copy(tmp_path)

    def damage(table):
        lengths = table.column("length").to_pylist()
        lengths[1] = None
        chunks = [str(c) for c in table.column("data/chunk_index").to_pylist()]
        table = table.set_column(table.schema.get_field_index("length"), "length", pa.array(lengths, pa.int64()))
        return table.set_column(table.schema.get_field_index("data/chunk_index"), "data/chunk_index", pa.array(chunks))

    edit_episodes_table(root, damage)
    sources = discover_episodes(root, "lerobot")
    problems = {s.name: str(s.problem) for s in sources if s.problem is not None}
    assert "'length' is None, not an integer" in problems["episode_000001"]
    others = [problems[s.name] for s in sources if s.name != "episode_000001"]
    assert others and all("'chunk_index' of the episode's row is '0'" in problem for problem in others)


def test_a_lerobot_feature_key_with_a_slash_is_refused_by_name(tmp_path):
    root = lerobot_copy(tmp_path)
    edit_info(root, lambda info: info["features"].update({"joint/velocity": {"dtype": "float32", "shape": [1]}}))
    with pytest.raises(SourceError, match=r"no episode could be converted .*stream name 'joint/velocity' holds '/'"):
        converted(root, tmp_path / "out", "lerobot")


@pytest.mark.slow
def test_lerobot_float32_times_land_on_the_frame_grid(tmp_path):
    truth = json.loads((LEROBOT_V3 / "fixture_truth.json").read_text())
    report = converted(LEROBOT_V3, tmp_path / "out", "lerobot", skip_bad=False)
    assert report.converted == truth["num_episodes"]
    dataset = mmdata.open_dataset(tmp_path / "out")
    for index, length in enumerate(truth["episode_lengths"]):
        row = dataset.manifest.row(index)
        assert row["duration"] == pytest.approx(length / 30, abs=1e-12), "durations are whole frame periods"
        times = dataset.read_episode(index, streams=["observation.state"])["observation.state"].timestamps
        assert np.array_equal(times, np.arange(length) / 30)
        last = dataset.values_at(index, "observation.state", [(length - 1) / 30])
        assert not last.is_pad.any(), "the last real row is not padding"
    spec = mmdata.Windows(anchor_fps=30, streams={"observation.state": mmdata.Values()})
    loader = mmdata.DataLoader(tmp_path / "out", spec, batch_size=8, num_workers=0)
    assert len(loader.samples) == sum(truth["episode_lengths"]), "one window per recorded row, none past the end"
    whole = mmdata.Sequences(fps=30, streams={"observation.state": mmdata.Values()})
    for batch in mmdata.DataLoader(tmp_path / "out", whole, batch_size=1, num_workers=0):
        assert not batch["observation.state_is_pad"].any()


def test_lerobot_v21_rows_without_length_are_skipped(tmp_path):
    source = write_lerobot_v21(tmp_path / "v21")
    path = source / "meta" / "episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    del rows[2]["length"]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    report = converted(source, tmp_path / "out", "lerobot")
    assert "'length' is None" in skipped_errors(report)["episode_000002"] and report.converted == 2


# HDF5


def test_hdf5_external_raw_storage_is_refused(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 10))
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 20)
    with h5py.File(source / "episode_1.hdf5", "a") as handle:
        del handle["observations/qvel"]
        handle.create_dataset("observations/qvel", shape=(10, 14), dtype="float32", external=[(str(secret), 0, 560)])
    report = converted(source, tmp_path / "out", fps=50)
    assert "keeps its data in other files" in skipped_errors(report)["episode_1"]
    assert b"root:x" not in b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())


def test_hdf5_external_links_are_refused(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 10))
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle["data"] = np.ones((10, 14))
    with h5py.File(source / "episode_0.hdf5", "a") as handle:
        del handle["observations/qvel"]
        handle["observations/qvel"] = h5py.ExternalLink(str(other), "/data")
    report = converted(source, tmp_path / "out", fps=50)
    assert "links to another file" in skipped_errors(report)["episode_0"]


def test_hdf5_virtual_datasets_are_refused(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 10))
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle["data"] = np.ones((10, 14))
    layout = h5py.VirtualLayout(shape=(10, 14), dtype="float64")
    layout[:] = h5py.VirtualSource(str(other), "data", shape=(10, 14))
    with h5py.File(source / "episode_0.hdf5", "a") as handle:
        del handle["observations/qvel"]
        handle["observations"].create_virtual_dataset("qvel", layout)
    report = converted(source, tmp_path / "out", fps=50)
    assert "keeps its data in other files" in skipped_errors(report)["episode_0"]


def test_an_hdf5_file_linking_outside_the_source_is_refused(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 10))
    outside = tmp_path / "outside.hdf5"
    shutil.move(source / "episode_1.hdf5", outside)
    (source / "episode_1.hdf5").symlink_to(outside)
    report = converted(source, tmp_path / "out", fps=50)
    assert "outside the source" in skipped_errors(report)["episode_1"]


def test_hdf5_attributes_json_cannot_hold_are_kept_as_text(tmp_path):
    source = write_aloha(tmp_path / "aloha", lengths=(10, 10))
    with h5py.File(source / "episode_0.hdf5", "a") as handle:
        handle.attrs["gain"] = np.nan
    converted(source, tmp_path / "out", fps=50, skip_bad=False)
    metadata = mmdata.open_dataset(tmp_path / "out").read_episode(0, streams=[]).metadata
    assert metadata["gain"] == "nan"


# anything unexpected inside one episode


@pytest.mark.slow
def test_an_unexpected_error_in_one_episode_is_its_error_and_skip_bad_goes_on(raw_copy, tmp_path, monkeypatch):
    import mmdata.conversion.encode as encode

    original = encode._encode_audio

    def failing(episode, audio, seconds):
        if episode == "episode_0001":
            raise KeyError("a case nobody foresaw")
        return original(episode, audio, seconds)

    monkeypatch.setattr(encode, "_encode_audio", failing)
    report = converted(raw_copy, tmp_path / "out")
    assert "KeyError" in skipped_errors(report)["episode_0001"] and report.converted == 2


def test_an_image_whose_header_declares_a_huge_picture_is_refused_before_decoding():
    import io
    import struct

    import av

    from mmdata.importers.arrays import declared_image_size, decode_image

    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 48, 32, "yuvj420p"
    frame = av.VideoFrame.from_ndarray(np.zeros((32, 48, 3), np.uint8), format="rgb24").reformat(format="yuvj420p")
    jpeg = bytearray(b"".join(bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)]))
    assert declared_image_size(bytes(jpeg)) == (48, 32)
    struct.pack_into(">HH", jpeg, jpeg.find(b"\xff\xc0") + 5, 16000, 20000)  # height, width of the SOF0 header
    with pytest.raises(SourceError, match="an image's header declares frames of 20000x16000"):
        decode_image(bytes(jpeg), "episode_0", "camera.h5:/images")
    png = io.BytesIO()
    with av.open(png, "w", format="image2pipe") as container:
        stream = container.add_stream("png")
        stream.width, stream.height, stream.pix_fmt = 40, 30, "rgb24"
        for packet in [*stream.encode(av.VideoFrame.from_ndarray(np.zeros((30, 40, 3), np.uint8))), *stream.encode()]:
            container.mux(packet)
    assert declared_image_size(png.getvalue()) == (40, 30)
