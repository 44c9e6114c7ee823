"""RLDS / TFDS input, read without TensorFlow: the TFRecord framing and tf.train.Example records of a
dataset written by TensorFlow Datasets' own writer (tests/fixtures/rlds_small), against its ground truth."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from mmdata.importers.arrays import decode_image
from mmdata.importers.tfrecord import TFRecordError, masked_crc32c, parse_example, read_records

FIXTURE = Path(__file__).parent / "fixtures" / "rlds_small"
TRUTH = json.loads((FIXTURE / "fixture_truth.json").read_text())
RECORDS = sorted((FIXTURE / "tfds" / "robot_small" / "1.0.0").glob("*.tfrecord-*"))


def bars(image: np.ndarray, rows: slice) -> int:
    """The number an image's 8 bars show in `rows` (bit 7 on the left)."""
    width = image.shape[1] // 8
    bits = [image[rows, bit * width + width // 4 : (bit + 1) * width - width // 4].mean() > 127 for bit in range(8)]
    return int("".join("1" if bit else "0" for bit in bits), 2)


def test_every_record_of_the_tfds_fixture_parses_to_its_ground_truth():
    episodes = [parse_example(data, f"record {n}") for path in RECORDS for n, data in enumerate(read_records(path))]
    assert [int(e["episode_metadata/episode_id"].values[0]) for e in episodes] == TRUTH["file_order"]
    for example in episodes:
        number = int(example["episode_metadata/episode_id"].values[0]) - 100
        truth = TRUTH["episodes"][number]
        steps = truth["steps"]
        assert example["episode_metadata/file_path"].values == [truth["metadata"]["file_path"].encode()]
        state = example["steps/observation/state"].values.reshape(steps, 7)
        action = example["steps/action"].values.reshape(steps, 7)
        assert np.array_equal(state, np.array(truth["state"], np.float32))
        assert np.array_equal(action, np.array(truth["action"], np.float32))
        assert np.array_equal(example["steps/reward"].values, np.array(truth["reward"], np.float32))
        assert example["steps/is_first"].values.tolist() == [1] + [0] * (steps - 1)
        assert example["steps/is_last"].values.tolist() == [0] * (steps - 1) + [1]
        assert example["steps/language_instruction"].values == [truth["task"].encode()] * steps
        for key, (height, width, _) in TRUTH["image_keys"].items():
            images = example[f"steps/observation/{key}"].values
            assert len(images) == steps
            for step, encoded in enumerate(images):
                image = decode_image(encoded, f"episode {number}", key)
                assert image.shape == (height, width, 3)
                assert bars(image, slice(height // 2, None)) == step
                assert bars(image, slice(0, height // 8)) == number


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / RECORDS[0].name
    shutil.copyfile(RECORDS[0], copy)
    return copy


def test_a_flipped_byte_in_a_record_is_a_crc_error_naming_the_file_and_record(tmp_path):
    damaged = _copy(tmp_path)
    data = bytearray(damaged.read_bytes())
    (first,) = struct.unpack_from("<Q", data, 0)
    data[12 + first + 16 + 40] ^= 0x01  # inside the second record's data
    damaged.write_bytes(bytes(data))
    second = 12 + first + 4
    with pytest.raises(TFRecordError, match=rf"{damaged.name}: record 1 at byte {second}: .*data fails its CRC32C"):
        list(read_records(damaged))


def test_a_truncated_tfrecord_file_is_named_as_truncated(tmp_path):
    cut = _copy(tmp_path)
    cut.write_bytes(cut.read_bytes()[:-100])
    with pytest.raises(TFRecordError, match=r"record 2 at byte \d+: .*past the end of the file \(truncated\)"):
        list(read_records(cut))
    cut.write_bytes(cut.read_bytes()[:5])
    with pytest.raises(TFRecordError, match=r"record 0 at byte 0: the file ends inside the record's header"):
        list(read_records(cut))


def test_a_damaged_length_is_caught_before_anything_is_allocated(tmp_path):
    damaged = _copy(tmp_path)
    data = bytearray(damaged.read_bytes())
    data[7] = 0x7F  # the length's top byte: 2**62 bytes, with the length's CRC now wrong
    damaged.write_bytes(bytes(data))
    with pytest.raises(TFRecordError, match="record 0 at byte 0: the record's length fails its CRC32C"):
        list(read_records(damaged))


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def test_negative_and_unpacked_values_parse_as_protobuf_encodes_them(tmp_path):
    def field(number: int, wire: int, payload: bytes) -> bytes:
        return bytes([number << 3 | wire]) + payload

    def delimited(number: int, payload: bytes) -> bytes:
        return field(number, 2, bytes([len(payload)]) + payload)

    minus_five = (2**64 - 5).to_bytes(8, "little")
    varint = bytearray()
    value = int.from_bytes(minus_five, "little")
    while value > 0x7F:
        varint.append(value & 0x7F | 0x80)
        value >>= 7
    varint.append(value)
    int64_list = delimited(1, bytes([1 << 3 | 0]) + bytes([7]) + bytes([1 << 3 | 0]) + bytes(varint))
    float_list = delimited(1, field(1, 5, struct.pack("<f", 1.5)) + field(1, 5, struct.pack("<f", -2.0)))
    entries = delimited(1, delimited(1, b"ints") + delimited(2, delimited(3, int64_list[2:])))
    entries += delimited(1, delimited(1, b"floats") + delimited(2, delimited(2, float_list[2:])))
    path = tmp_path / "made.tfrecord"
    path.write_bytes(_record(delimited(1, entries)))
    (example,) = [parse_example(data, "made") for data in read_records(path)]
    assert example["ints"].values.tolist() == [7, -5]
    assert example["floats"].values.tolist() == [1.5, -2.0]


def test_bytes_that_are_not_an_example_are_a_clear_error():
    with pytest.raises(TFRecordError, match="record 3: not a tf.train.Example"):
        parse_example(b"\x0a\xff\xff\xff\xff\x0f", "record 3")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_an_rlds_dataset_converts_and_reads_back_as_its_ground_truth(tmp_path, layout):
    import mmdata
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers import discover_episodes
    from mmdata.store.verification import verify_dataset

    sources = discover_episodes(FIXTURE, "auto", fps=10)
    report = convert(sources, tmp_path / "out", ConvertOptions(layout=layout, workers=1, progress=False))
    assert report.converted == 3 and verify_dataset(str(tmp_path / "out"), progress=False).ok
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    for index, episode_id in enumerate(TRUTH["file_order"]):
        truth = TRUTH["episodes"][episode_id - 100]
        row = dataset.manifest.row(index)
        assert row["task"] == truth["task"]
        metadata = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]
        assert metadata["episode_id"] == episode_id and metadata["file_path"] == truth["metadata"]["file_path"]
        times = np.arange(truth["steps"]) / 10
        state = dataset.values_at(index, "observation.state", times)
        assert np.array_equal(state.values, np.array(truth["state"], np.float32)) and not state.is_pad.any()
        assert np.allclose(dataset.timestamps_of(row, "observation.state"), times), "step i is at i / fps"
        action = dataset.values_at(index, "action", times)
        assert np.array_equal(action.values, np.array(truth["action"], np.float32))
        for camera, (height, _, _) in TRUTH["image_keys"].items():
            frames = dataset.frames_at(index, camera, times)
            assert not frames.is_pad.any() and np.allclose(frames.timestamps, times)
            assert [bars(f, slice(height // 2, None)) for f in np.asarray(frames.values)] == list(range(truth["steps"]))
            assert {bars(f, slice(0, height // 8)) for f in np.asarray(frames.values)} == {episode_id - 100}
        after = dataset.values_at(index, "observation.state", [truth["steps"] / 10 + 0.05])
        assert after.is_pad.all(), "the episode ends after its last step"


def test_rlds_without_fps_or_with_an_unknown_image_key_says_what_to_give():
    from mmdata.errors import SourceError
    from mmdata.importers import discover_episodes

    with pytest.raises(SourceError, match="--fps"):
        discover_episodes(FIXTURE, "rlds")
    with pytest.raises(SourceError, match=r"no image feature \['top'\].*choose from \['image', 'wrist_image'\]"):
        discover_episodes(FIXTURE, "rlds", fps=10, image_keys=["top"])
    picked = discover_episodes(FIXTURE, "rlds", fps=10, image_keys=["wrist_image"])
    assert [camera.name for camera in picked[0].cameras] == ["wrist_image"]


def _fixture_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "rlds"
    shutil.copytree(FIXTURE / "tfds" / "robot_small" / "1.0.0", copy)
    return copy


def test_a_damaged_record_stops_the_conversion_naming_it_or_is_skipped_with_skip_bad(tmp_path):
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.errors import SourceError
    from mmdata.importers import discover_episodes

    builder = _fixture_copy(tmp_path)
    record_file = next(builder.glob("*.tfrecord-*"))
    data = bytearray(record_file.read_bytes())
    (first,) = struct.unpack_from("<Q", data, 0)
    data[12 + first + 16 + 40] ^= 0x01  # inside the second record's data
    record_file.write_bytes(bytes(data))
    options = ConvertOptions(workers=1, progress=False)
    with pytest.raises(SourceError, match=r"#1.*record 1 at byte \d+: .*fails its CRC32C"):
        convert(discover_episodes(builder, "rlds", fps=10), tmp_path / "stopped", options)
    skipping = ConvertOptions(workers=1, progress=False, skip_bad=True)
    report = convert(discover_episodes(builder, "rlds", fps=10), tmp_path / "skipped", skipping)
    assert report.converted == 2 and [s["episode"] for s in report.skipped] == [f"{record_file.name}#1"]


def test_a_feature_class_the_importer_does_not_read_is_named(tmp_path):
    from mmdata.errors import SourceError
    from mmdata.importers import discover_episodes

    builder = _fixture_copy(tmp_path)
    features = json.loads((builder / "features.json").read_text())
    steps = features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["depth"] = {"pythonClassName": "tensorflow_datasets.core.features.video_feature.Video", "video": {}}
    (builder / "features.json").write_text(json.dumps(features))
    with pytest.raises(SourceError, match="feature 'depth' is a .*video_feature.Video, which the RLDS importer"):
        discover_episodes(builder, "rlds", fps=10)


@pytest.mark.slow
def test_the_dataloader_delivers_every_rlds_step_with_its_frame_state_and_task(tmp_path):
    import mmdata
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers import discover_episodes

    convert(discover_episodes(FIXTURE, "rlds", fps=10), tmp_path / "out", ConvertOptions(workers=1, progress=False))
    spec = mmdata.Windows(anchor_fps=10, streams={"image": mmdata.Frames(), "observation.state": mmdata.Values()})
    seen = set()
    for batch in mmdata.DataLoader(str(tmp_path / "out"), spec, batch_size=8, num_workers=2, seed=5):
        for row, (episode, time) in enumerate(zip(batch["episode_index"].tolist(), batch["time"].tolist())):
            truth = TRUTH["episodes"][TRUTH["file_order"][episode] - 100]
            step = round(time * 10)
            image = batch["image"][row, 0].numpy()
            assert bars(image, slice(image.shape[0] // 2, None)) == step
            assert batch["observation.state"][row, 0].tolist() == np.float32(truth["state"][step]).tolist()
            assert batch["task"][row] == truth["task"]
            seen.add((episode, step))
    assert len(seen) == sum(e["steps"] for e in TRUTH["episodes"]), "every step of every episode, once"


def test_discovery_reads_no_record_and_a_file_cut_short_keeps_the_records_before_the_cut(tmp_path):
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers import discover_episodes
    from mmdata.importers.rlds import _record

    builder = _fixture_copy(tmp_path)
    record_file = next(builder.glob("*.tfrecord-*"))
    record_file.write_bytes(record_file.read_bytes()[:-100])
    _record.cache_clear()
    sources = discover_episodes(builder, "rlds", fps=10)
    assert _record.cache_info().misses == 0, "records are parsed where they are converted, not at discovery"
    assert [s.name for s in sources] == [f"{record_file.name}#{n}" for n in range(3)]
    assert "record 2 at byte" in str(sources[2].problem) and "truncated" in str(sources[2].problem)
    report = convert(sources, tmp_path / "out", ConvertOptions(workers=1, progress=False, skip_bad=True))
    assert report.converted == 2 and [s["episode"] for s in report.skipped] == [f"{record_file.name}#2"]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _delimited(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _example_file(path: Path, ints: dict[str, list[int]], floats: dict[str, list[float]]) -> None:
    """One TFRecord holding one tf.train.Example of packed int64 and float lists."""
    entries = b""
    for key, values in ints.items():
        feature = _delimited(3, _delimited(1, b"".join(_varint(v) for v in values)))
        entries += _delimited(1, _delimited(1, key.encode()) + _delimited(2, feature))
    for key, values in floats.items():
        feature = _delimited(2, _delimited(1, struct.pack(f"<{len(values)}f", *values)))
        entries += _delimited(1, _delimited(1, key.encode()) + _delimited(2, feature))
    path.write_bytes(_record(_delimited(1, entries)))


@pytest.mark.parametrize(
    ("values", "dtype", "complaint"),
    [
        ({"ints": [5, 300, -1, 70000]}, "uint8", "step 1 holds 300, which uint8 .* cannot hold \\(3 such"),
        ({"ints": [0, 1, 2]}, "bool", "step 2 holds 2, which bool"),
        ({"ints": [1, -40000]}, "int16", "step 1 holds -40000, which int16"),
        ({"floats": [1.0, 2.5]}, "int32", "step 1 holds 2.5, which int32"),
    ],
    ids=["uint8-overflow", "bool-of-two", "int16-underflow", "fraction-as-int"],
)
def test_step_values_the_declared_dtype_cannot_hold_are_the_episodes_error_not_wrapped(
    tmp_path, values, dtype, complaint
):
    from mmdata.errors import SourceError
    from mmdata.importers.rlds import RecordAddress, StepArray

    ints = {"steps/gripper": values["ints"]} if "ints" in values else {}
    floats = {"steps/gripper": values["floats"]} if "floats" in values else {}
    _example_file(tmp_path / "made.tfrecord-00000-of-00001", ints, floats)
    array = StepArray(RecordAddress(str(tmp_path / "made.tfrecord-00000-of-00001"), 0, 0), "steps/gripper", (), dtype)
    with pytest.raises(SourceError, match=complaint):
        array.read("made#0")


def test_step_values_within_the_declared_dtype_are_kept_exactly(tmp_path):
    from mmdata.importers.rlds import RecordAddress, StepArray

    _example_file(tmp_path / "ok.tfrecord", {"a": [0, 255, 7], "b": [2**64 - 1, 3]}, {})
    address = RecordAddress(str(tmp_path / "ok.tfrecord"), 0, 0)
    assert StepArray(address, "a", (), "uint8").read("ok#0").tolist() == [0, 255, 7]
    assert StepArray(address, "b", (), "uint64").read("ok#0").tolist() == [2**64 - 1, 3]


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (lambda steps: steps["action"].pop("tensor"), "feature 'action' .* is malformed: lacks 'tensor'"),
        (lambda steps: steps["action"]["tensor"].update(dtype=7), "feature 'action' .* its dtype is '7'"),
        (lambda steps: steps["action"]["tensor"].update(shape="seven"), "feature 'action' .* its shape is seven"),
        (lambda steps: steps["action"]["tensor"]["shape"].update(dimensions=["x"]), "feature 'action' .* a size"),
        (lambda steps: steps["action"]["tensor"]["shape"].update(dimensions=[10**9]), "a size is 1000000000"),
        (lambda steps: steps["observation"].update(featuresDict=[]), "feature 'observation' .* malformed"),
        (lambda steps: steps["observation"]["featuresDict"].update(features=3), "featuresDict.features is not"),
        (lambda steps: steps["observation"]["featuresDict"]["features"]["image"].pop("image"), "lacks 'image'"),
    ],
    ids=["no-tensor", "dtype-number", "shape-text", "size-text", "size-huge", "dict-list", "features-int", "no-image"],
)
def test_malformed_feature_descriptions_are_named_source_errors(tmp_path, edit, complaint):
    from mmdata.errors import SourceError
    from mmdata.importers import discover_episodes

    builder = _fixture_copy(tmp_path)
    features = json.loads((builder / "features.json").read_text())
    edit(features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"])
    (builder / "features.json").write_text(json.dumps(features))
    with pytest.raises(SourceError, match=complaint):
        discover_episodes(builder, "rlds", fps=10)
