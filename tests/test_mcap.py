"""MCAP robot logs (ROS 2), written by the real `mcap` + `mcap-ros2-support` writers in the test, converted
and read back against their ground truth: every frame by the number drawn in it, every joint value and its
timestamp, tasks and episode boundaries."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import AlignmentError, SourceError
from mmdata.importers import discover_episodes, load_topic_map
from mmdata.importers.topic_map import topic_map_from_dict
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import read_index_stripe, synthetic_frame
from tests import mcap_logs
from tests.mcap_logs import JOINTS, TOPIC_MAP, LogTruth

pytest.importorskip("mcap_ros2", reason="the MCAP importer needs `pip install 'mmdata[mcap]'`")

OPTIONS = ConvertOptions(workers=1, progress=False)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> tuple[Path, list[LogTruth]]:
    folder = tmp_path_factory.mktemp("mcap") / "logs"
    return folder, mcap_logs.write_logs(folder)


def _map_file(tmp_path: Path, mapping: dict) -> Path:
    import yaml

    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def check_episode(dataset, index: int, truth: LogTruth) -> None:
    row = dataset.manifest.row(index)
    assert row["task"] == truth.task
    frame_times = dataset.timestamps_of(row, "front")
    assert np.allclose(frame_times, truth.seconds(truth.frame_stamps), rtol=0, atol=1e-9), "each frame at its stamp"
    frames = dataset.frames_at(index, "front", frame_times)
    assert [read_index_stripe(f) for f in np.asarray(frames.values)] == truth.frame_numbers
    state_times = dataset.timestamps_of(row, "observation.state")
    assert np.allclose(state_times, truth.seconds(truth.joint_stamps), rtol=0, atol=1e-9)
    assert np.array_equal(dataset.values_at(index, "observation.state", state_times).values, truth.position)
    assert np.array_equal(dataset.values_at(index, "observation.velocity", state_times).values, truth.velocity)
    metadata = dataset.metadata_of(row)
    assert metadata["observation.state.names"] == JOINTS and metadata["mcap_start_ns"] == truth.origin


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_mcap_logs_convert_and_read_back_as_their_ground_truth(tmp_path, logs, layout):
    folder, truths = logs
    topic_map = load_topic_map(_map_file(tmp_path, TOPIC_MAP))
    options = ConvertOptions(layout=layout, workers=1, progress=False)
    report = convert(discover_episodes(folder, "auto", topic_map=topic_map), tmp_path / "out", options)
    assert report.converted == 3 and verify_dataset(str(tmp_path / "out"), progress=False).ok
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    schema = {s.name: s for s in dataset.schema.streams}
    assert schema["observation.state"].rate is None, "irregular times are kept, not resampled"
    assert schema["front"].fps == 30
    for index, truth in enumerate(truths):
        check_episode(dataset, index, truth)


@pytest.mark.slow
def test_ros1_logs_convert_and_read_back_as_their_ground_truth_with_the_default_map(tmp_path):
    pytest.importorskip("mcap_ros1", reason="ROS 1 logs need mcap-ros1-support (`pip install 'mmdata[mcap]'`)")
    truths = mcap_logs.write_logs(tmp_path / "ros1", ros=1)
    sources = discover_episodes(tmp_path / "ros1", "auto")
    cameras, lowdim = sources[0].cameras, sources[0].lowdim
    assert [c.name for c in cameras] == ["camera.front.compressed"]
    assert [s.name for s in lowdim] == ["joint_states.position", "joint_states.velocity"], "effort is empty"
    report = convert(sources, tmp_path / "out", OPTIONS)
    assert report.converted == 3 and verify_dataset(str(tmp_path / "out"), progress=False).ok
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    for index, truth in enumerate(truths):
        row = dataset.manifest.row(index)
        assert row["task"] == truth.task
        times = dataset.timestamps_of(row, "camera.front.compressed")
        assert np.allclose(times, truth.seconds(truth.frame_stamps), rtol=0, atol=1e-9), "frames at their ROS 1 stamps"
        frames = np.asarray(dataset.frames_at(index, "camera.front.compressed", times).values)
        assert [read_index_stripe(f) for f in frames] == truth.frame_numbers
        state_times = dataset.timestamps_of(row, "joint_states.position")
        assert np.allclose(state_times, truth.seconds(truth.joint_stamps), rtol=0, atol=1e-9)
        assert np.array_equal(dataset.values_at(index, "joint_states.position", state_times).values, truth.position)


def test_a_ros1_schema_that_could_escape_its_generated_code_is_refused(tmp_path):
    pytest.importorskip("mcap_ros1", reason="ROS 1 logs need mcap-ros1-support (`pip install 'mmdata[mcap]'`)")
    from mcap.writer import Writer

    hostile = 'string data\n"""\nimport os; os.environ["MMDATA_PWNED"] = "1"\n"""\n'
    with open(tmp_path / "hostile.mcap", "wb") as handle:
        writer = Writer(handle)
        writer.start(profile="ros1")
        schema = writer.register_schema("std_msgs/String", "ros1msg", hostile.encode())
        channel = writer.register_channel("/command", "ros1", schema)
        image_schema = writer.register_schema("sensor_msgs/CompressedImage", "ros1msg", b"string format\nuint8[] data")
        camera = writer.register_channel("/camera", "ros1", image_schema)
        writer.add_message(channel, log_time=1, data=b"\x01\x00\x00\x00a", publish_time=1)
        writer.add_message(camera, log_time=2, data=b"\x00\x00\x00\x00\x00\x00\x00\x00", publish_time=2)
        writer.finish()
    with pytest.raises(SourceError, match=r"hostile\.mcap.*ROS 1 schema 'std_msgs/String' is not a message definition"):
        convert(discover_episodes(tmp_path / "hostile.mcap", "mcap"), tmp_path / "out", OPTIONS)
    assert "MMDATA_PWNED" not in __import__("os").environ


@pytest.mark.slow
def test_one_log_split_at_its_gaps_gives_the_episodes_of_separate_logs(tmp_path):
    truths = mcap_logs.write_one_log(tmp_path / "session.mcap", gap_seconds=3.0)
    topic_map = topic_map_from_dict({**TOPIC_MAP, "split": {"gap": 1.0}})
    sources = discover_episodes(tmp_path / "session.mcap", "mcap", topic_map=topic_map)
    assert [s.name for s in sources] == ["session.mcap#0", "session.mcap#1", "session.mcap#2"]
    assert [s.task for s in sources] == [t.task for t in truths], "a command logged in a gap opens the next episode"
    _convert_and_check(sources, truths, tmp_path)


@pytest.mark.slow
def test_one_log_split_at_a_marker_topic_starts_an_episode_at_each_marker(tmp_path):
    truths = mcap_logs.write_one_log(tmp_path / "marked.mcap", gap_seconds=0.5, marker="/episode_start")
    topic_map = topic_map_from_dict({**TOPIC_MAP, "split": {"topic": "/episode_start"}})
    sources = discover_episodes(tmp_path / "marked.mcap", "mcap", topic_map=topic_map)
    assert [s.task for s in sources] == [t.task for t in truths], "gaps of 0.5 s, too short for a gap rule"
    _convert_and_check(sources, truths, tmp_path)


def _convert_and_check(sources, truths: list[LogTruth], tmp_path: Path) -> None:
    convert(sources, tmp_path / "out", OPTIONS)
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    for index, truth in enumerate(truths):
        check_episode(dataset, index, truth)


@pytest.mark.slow
def test_the_dataloader_delivers_the_nearest_frame_and_the_last_state_at_each_anchor(tmp_path, logs):
    folder, truths = logs
    convert(discover_episodes(folder, "mcap", topic_map=topic_map_from_dict(TOPIC_MAP)), tmp_path / "out", OPTIONS)
    spec = mmdata.Windows(
        anchor_fps=20,
        streams={
            "front": mmdata.Frames(tolerance=0.05),
            "observation.state": mmdata.Values(interpolation="previous"),
        },
    )
    seen = 0
    for batch in mmdata.DataLoader(str(tmp_path / "out"), spec, batch_size=8, num_workers=2, seed=3):
        for row, (episode, time) in enumerate(zip(batch["episode_index"].tolist(), batch["time"].tolist())):
            truth = truths[episode]
            frame_times = truth.seconds(truth.frame_stamps)
            nearest = int(np.argmin(np.abs(frame_times - time)))
            assert read_index_stripe(batch["front"][row, 0].numpy()) == truth.frame_numbers[nearest]
            joint_times = truth.seconds(truth.joint_stamps)
            last = max(int(np.searchsorted(joint_times, time + 1e-9, side="right")) - 1, 0)
            assert batch["observation.state"][row, 0].tolist() == truth.position[last]
            assert batch["task"][row] == truth.task
            seen += 1
    durations = [max(t.seconds(t.frame_stamps)[-1] + 1 / 30, t.seconds(t.joint_stamps)[-1] + 1 / 200) for t in truths]
    assert seen == sum(int(np.ceil(d * 20 - 1e-9)) for d in durations)


@pytest.mark.slow
def test_a_dropped_camera_frame_is_a_gap_the_default_tolerance_reports(tmp_path, logs):
    folder, truths = logs
    convert(discover_episodes(folder, "mcap", topic_map=topic_map_from_dict(TOPIC_MAP)), tmp_path / "out", OPTIONS)
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    times = truths[0].seconds(truths[0].frame_stamps)
    gap = int(np.argmax(np.diff(times)))  # frame 17 was dropped after this one
    assert truths[0].frame_numbers[gap + 1] - truths[0].frame_numbers[gap] == 2
    middle = (times[gap] + times[gap + 1]) / 2
    with pytest.raises(AlignmentError, match="no frame within"):
        dataset.frames_at(0, "front", [middle])


def test_without_a_topic_map_pictures_joint_states_and_the_lone_string_topic_are_taken(tmp_path, logs):
    folder, truths = logs
    sources = discover_episodes(folder, "auto")
    assert [c.name for c in sources[0].cameras] == ["camera.front.compressed"]
    assert [s.name for s in sources[0].lowdim] == ["joint_states.position", "joint_states.velocity"]
    assert [s.task for s in sources] == [t.task for t in truths]


def test_the_default_map_leaves_depth_pictures_out_and_lists_them(tmp_path):
    raw_image = (
        "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\n"
        "uint8[] data\n" + mcap_logs.HEADER
    )
    with open(tmp_path / "depth.mcap", "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        depth = writer.register_msgdef("sensor_msgs/msg/Image", raw_image)
        truth = mcap_logs.write_episode(writer, schemas, 1_700_000_000_000_000_000, 1.0, 0, "stack the cups")
        for number, stamp in enumerate(truth.frame_stamps[:5]):
            header = {"stamp": {"sec": stamp // 10**9, "nanosec": stamp % 10**9}, "frame_id": "depth"}
            image = {"header": header, "height": 2, "width": 2, "encoding": "16UC1", "is_bigendian": 0, "step": 4}
            writer.write_message("/depth/image_raw", depth, {**image, "data": bytes(8)}, log_time=stamp + number)
            packed = {"header": header, "format": "16UC1; compressedDepth png", "data": bytes(12) + b"\x89PNG"}
            writer.write_message("/depth/compressedDepth", schemas["image"], packed, log_time=stamp + number)
        writer.finish()
    (source,) = discover_episodes(tmp_path / "depth.mcap", "auto")
    assert [c.name for c in source.cameras] == ["camera.front.compressed"], "depth topics are not cameras"
    assert source.metadata["mcap_unmapped_topics"] == ["/depth/compressedDepth", "/depth/image_raw"]
    assert convert([source], tmp_path / "out", OPTIONS).converted == 1


@pytest.mark.slow
def test_resample_stores_low_dim_topics_on_a_fixed_grid_by_linear_interpolation(tmp_path, logs):
    folder, truths = logs
    topic_map = topic_map_from_dict(TOPIC_MAP).with_resample(50)
    convert(discover_episodes(folder, "mcap", topic_map=topic_map), tmp_path / "out", OPTIONS)
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    assert {s.name: s for s in dataset.schema.streams}["observation.state"].rate == 50
    truth = truths[1]
    times = dataset.timestamps_of(dataset.manifest.row(1), "observation.state")
    joint_times = truth.seconds(truth.joint_stamps)
    assert np.allclose(np.diff(times), 1 / 50) and times[0] == pytest.approx(joint_times[0], abs=1e-12)
    stored = dataset.values_at(1, "observation.state", times).values
    expected = np.stack([np.interp(times, joint_times, np.asarray(truth.position)[:, j]) for j in range(4)], axis=1)
    assert np.allclose(stored, expected, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_the_cli_converts_logs_with_a_yaml_topic_map(tmp_path, logs, capsys):
    from mmdata.tools.cli import main

    folder, _ = logs
    topics = _map_file(tmp_path, TOPIC_MAP)
    assert main(["convert", str(folder), str(tmp_path / "out"), "--topics", str(topics), "--quiet"]) == 0
    assert "converted 3 episodes" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0


# ---- bad input: one clear error naming the file (and topic, message), or a skip with --skip-bad


def _copy_logs(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "logs"
    copy.mkdir()
    for path in folder.glob("*.mcap"):
        (copy / path.name).write_bytes(path.read_bytes())
    return copy


def test_a_topic_in_the_map_that_is_not_in_the_file_is_named_with_the_topics_it_holds(tmp_path, logs):
    folder, _ = logs
    mapping = {**TOPIC_MAP, "cameras": {"front": "/camera/rear/compressed"}}
    sources = discover_episodes(folder, "mcap", topic_map=topic_map_from_dict(mapping))
    with pytest.raises(SourceError) as caught:
        convert(sources, tmp_path / "out", OPTIONS)
    message = str(caught.value)
    assert (
        "episode_0.mcap" in message and "topic '/camera/rear/compressed' (camera 'front' in the topic map)" in message
    )
    assert "'/joint_states'" in message, "the topics the file does hold are listed"


@pytest.mark.slow
def test_a_truncated_log_is_an_error_naming_it_and_skip_bad_converts_the_others(tmp_path, logs):
    folder, _ = logs
    copy = _copy_logs(folder, tmp_path)
    cut = copy / "episode_1.mcap"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    topic_map = topic_map_from_dict(TOPIC_MAP)
    with pytest.raises(SourceError, match=r"episode_1.mcap.*not a readable MCAP log.*mcap recover"):
        convert(discover_episodes(copy, "mcap", topic_map=topic_map), tmp_path / "stopped", OPTIONS)
    skipping = ConvertOptions(workers=1, progress=False, skip_bad=True)
    report = convert(discover_episodes(copy, "mcap", topic_map=topic_map), tmp_path / "out", skipping)
    assert report.converted == 2 and [s["episode"] for s in report.skipped] == ["episode_1.mcap"]


def test_a_channel_whose_schema_is_missing_is_named(tmp_path):
    from mcap.writer import Writer

    path = tmp_path / "no_schema.mcap"
    with open(path, "wb") as handle:
        writer = Writer(handle)
        writer.start(profile="ros2", library="test")
        image = writer.register_schema(
            "sensor_msgs/msg/CompressedImage", "ros2msg", mcap_logs.COMPRESSED_IMAGE.encode()
        )
        writer.register_channel("/camera", "cdr", image)
        joints = writer.register_channel("/joint_states", "cdr", schema_id=image + 7)
        writer.add_message(joints, log_time=1, data=b"\x00\x01\x00\x00", publish_time=1)
        writer.finish()
    mapping = {"cameras": {"front": "/camera"}, "lowdim": {"state": {"topic": "/joint_states", "field": "position"}}}
    (source,) = discover_episodes(path, "mcap", topic_map=topic_map_from_dict(mapping))
    assert source.problem is not None
    assert "topic '/joint_states' (cdr) has schema id 8, which the file does not hold" in str(source.problem)
    assert "no_schema.mcap" in str(source.problem)


def _joint_states_source(path: Path, names_per_message: list[list[str]], positions: list[float]):
    """The episode of a log of JointState messages naming `names_per_message` over `positions`, their
    positions mapped as stream 'state'."""
    with open(path, "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        for number, names in enumerate(names_per_message):
            body = {"header": {"stamp": {"sec": 1, "nanosec": number * 1000}, "frame_id": ""}, "name": names,
                    "position": positions, "velocity": [], "effort": []}  # fmt: skip
            writer.write_message("/joint_states", schemas["joints"], body, log_time=10 + number)
        writer.finish()
    mapping = {"lowdim": {"state": {"topic": "/joint_states", "field": "position"}}}
    (source,) = discover_episodes(path, "mcap", topic_map=topic_map_from_dict(mapping))
    return source


def test_a_joint_message_with_other_joints_is_an_error_naming_the_message(tmp_path):
    source = _joint_states_source(tmp_path / "odd.mcap", [["a", "b"], ["a", "b"], ["a", "c"]], [0.0, 1.0])
    with pytest.raises(SourceError, match=r"odd.mcap.*topic '/joint_states', message 2: names the values \['a', 'c'\]"):
        source.lowdim[0].load(source.name)


@pytest.mark.parametrize(
    ("names", "complaint"),
    [
        (["a", "b", "c", "d"], r"message 1: names 4 values \['a', 'b', 'c', 'd'\] but holds 3"),
        (["a", "a", "b"], r"message 1: names the values \['a', 'a', 'b'\], \['a'\] more than once"),
    ],
    ids=["four-names-three-values", "repeated-name"],
)
def test_joint_names_that_do_not_match_their_values_are_the_messages_error(tmp_path, names, complaint):
    source = _joint_states_source(tmp_path / "odd.mcap", [["a", "b", "c"], names, ["a", "b", "c"]], [0.0, 1.0, 2.0])
    with pytest.raises(SourceError, match=f"topic '/joint_states', {complaint}"):
        source.lowdim[0].load(source.name)


def test_two_topics_the_default_map_would_give_one_name_are_named_both(tmp_path):
    with open(tmp_path / "clash.mcap", "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        truth = mcap_logs.write_episode(writer, schemas, 1_700_000_000_000_000_000, 1.0, 0, "stack the cups")
        for number, stamp in enumerate(truth.frame_stamps[:10]):
            header = {"stamp": {"sec": stamp // 10**9, "nanosec": stamp % 10**9}, "frame_id": "arm"}
            picture = {"header": header, "format": "jpeg", "data": mcap_logs.jpeg(synthetic_frame(number, 0, 32, 48))}
            writer.write_message("/arm/position", schemas["image"], picture, log_time=stamp + 1)
            joints = {"header": header, "name": ["elbow"], "position": [0.1 * number], "velocity": [], "effort": []}
            writer.write_message("/arm", schemas["joints"], joints, log_time=stamp + 2)
        writer.finish()
    (source,) = discover_episodes(tmp_path / "clash.mcap", "auto")
    assert source.problem is not None
    assert "topics '/arm' and '/arm/position' would both become stream 'arm.position'" in str(source.problem)
    assert "--topics" in str(source.problem)


@pytest.mark.parametrize(
    ("mapping", "complaint"),
    [
        ({"cameras": {"front": "/c"}, "lowdims": {}}, r"unknown key \['lowdims'\]"),
        ({"lowdim": {"state": {"topic": "/j"}}}, "lowdim.state needs one of field:"),
        ({"cameras": {"front": "/c"}, "time": "wall"}, "time is 'wall'"),
        ({"cameras": {"front": "/c"}, "split": {"gap": -1}}, "split.gap is a positive number"),
        ({"cameras": {"a/b": "/c"}}, "holds '/'"),
        ({"cameras": {"front": "/c"}, "resample": 0}, r"resample is a number in \(0, 10000\], not 0"),
    ],
)
def test_a_topic_map_mistake_is_named(mapping, complaint):
    with pytest.raises(SourceError, match=complaint):
        topic_map_from_dict(mapping, "topics.yaml")


def test_a_camera_mapped_to_a_topic_without_pictures_is_refused(tmp_path, logs):
    folder, _ = logs
    mapping = {"cameras": {"front": "/joint_states"}}
    sources = discover_episodes(folder, "mcap", topic_map=topic_map_from_dict(mapping))
    assert "carries sensor_msgs/msg/JointState, not pictures" in str(sources[0].problem)


def test_foxglove_compressed_video_packets_decode_to_their_frames_at_their_times(tmp_path):
    """H.264 packets in `foxglove.CompressedVideo` protobuf messages (one frame each), schema built from
    its .proto definition, written with `mcap-protobuf-support`."""
    pytest.importorskip("mcap_protobuf")
    stamps = [5_000_000_000 + int(n / 15 * 1e9) + (n % 3) * 1_000_000 for n in range(24)]
    log = mcap_logs.write_video_log(
        tmp_path / "video.mcap", "h264", mcap_logs.video_packets("h264", 24, 8), stamps, "/camera/h264"
    )
    (source,) = discover_episodes(log, "mcap")
    camera = source.cameras[0]
    assert camera.name == "camera.h264" and float(camera.info(source.name).fps) == 15
    decoded = list(camera.frames(source.name, camera.info(source.name).fps))
    assert [read_index_stripe(f.to_ndarray(format="rgb24")) for f, _ in decoded] == list(range(24))
    assert np.allclose([t for _, t in decoded], (np.asarray(stamps) - stamps[0]) / 1e9, rtol=0, atol=1e-9)


def test_metadata_lists_topics_the_map_left_out(tmp_path, logs):
    folder, _ = logs
    mapping = {"cameras": {"front": mcap_logs.CAMERA}}
    sources = discover_episodes(folder, "mcap", topic_map=topic_map_from_dict(mapping))
    assert sources[0].metadata["mcap_unmapped_topics"] == ["/command", "/joint_states"]
    assert json.dumps(sources[0].metadata)


def test_a_chunk_declaring_gigabytes_decompressed_is_refused_before_it_is_read(tmp_path, logs):
    import struct

    from mcap.reader import make_reader

    folder, _ = logs
    path = tmp_path / "bomb.mcap"
    data = bytearray((folder / "episode_0.mcap").read_bytes())
    with open(folder / "episode_0.mcap", "rb") as handle:
        chunk = make_reader(handle).get_summary().chunk_indexes[0]
    struct.pack_into("<Q", data, chunk.chunk_start_offset + 1 + 8 + 16, 40 << 30)
    path.write_bytes(bytes(data))
    (source,) = discover_episodes(path, "mcap", topic_map=topic_map_from_dict(TOPIC_MAP))
    assert f"the chunk at byte {chunk.chunk_start_offset} declares {40 << 30} bytes decompressed" in str(source.problem)


def test_time_log_keeps_each_message_at_its_log_time(tmp_path, logs):
    from mcap.reader import make_reader

    folder, _ = logs
    topic_map = topic_map_from_dict({**TOPIC_MAP, "time": "log"})
    (source, *_) = discover_episodes(folder, "mcap", topic_map=topic_map)
    with open(folder / "episode_0.mcap", "rb") as handle:
        logged = [m.log_time for _, _, m in make_reader(handle).iter_messages(topics=[mcap_logs.JOINT_TOPIC])]
    _, times = source.lowdim[0].load(source.name)
    origin = source.metadata["mcap_start_ns"]
    assert np.allclose(times, (np.asarray(logged) - origin) / 1e9, rtol=0, atol=1e-9)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8", "mono8"])
def test_raw_image_messages_become_rgb_frames(encoding):
    from types import SimpleNamespace

    from mmdata.importers.log_messages import picture

    rgb = synthetic_frame(3, 0, 32, 48)
    channels = {"rgb8": rgb, "bgr8": rgb[:, :, ::-1], "mono8": rgb[:, :, :1]}
    alpha = np.full((32, 48, 1), 255, np.uint8)
    channels["rgba8"] = np.concatenate([rgb, alpha], axis=2)
    channels["bgra8"] = np.concatenate([rgb[:, :, ::-1], alpha], axis=2)
    layout = channels[encoding]
    padded = np.zeros((32, 48 * layout.shape[2] + 16), np.uint8)  # rows with a step wider than the pixels
    padded[:, : 48 * layout.shape[2]] = layout.reshape(32, -1)
    message = SimpleNamespace(encoding=encoding, height=32, width=48, step=padded.shape[1], data=padded.tobytes())
    expected = np.repeat(rgb[:, :, :1], 3, axis=2) if encoding == "mono8" else rgb
    assert np.array_equal(picture(message, "raw", "raw.mcap", "e"), expected)


def test_a_damaged_video_packet_is_named_not_taken_for_an_encoder_failure():
    from mmdata.importers.log_messages import MessageError, PacketDecoder

    decoder = PacketDecoder("h264")
    with pytest.raises(MessageError, match="h264 packet 0 does not decode"):
        list(decoder.decode(b"\x00\x00\x00\x01\x65" + bytes(range(256)) * 4, 0.0))


def test_a_log_of_random_bytes_after_a_valid_header_is_that_files_error_not_a_crash(tmp_path, logs):
    folder, _ = logs
    copy = _copy_logs(folder, tmp_path)
    data = bytearray((copy / "episode_2.mcap").read_bytes())
    rng = np.random.default_rng(0)
    middle = slice(200, len(data) - 200)
    data[middle] = rng.integers(0, 256, len(data) - 400, dtype=np.uint8).tobytes()
    (copy / "episode_2.mcap").write_bytes(bytes(data))
    sources = discover_episodes(copy, "mcap", topic_map=topic_map_from_dict(TOPIC_MAP))
    assert [s.problem is None for s in sources] == [True, True, False]
    assert "episode_2.mcap" in str(sources[2].problem)


def test_camera_stamps_that_go_back_are_named_with_the_fix(tmp_path):
    with open(tmp_path / "back.mcap", "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        picture = mcap_logs.jpeg(synthetic_frame(0, 0, 32, 48))
        for number, stamp in enumerate([1_000_000_000, 1_033_000_000, 1_020_000_000]):
            header = {"stamp": {"sec": 1, "nanosec": stamp - 1_000_000_000}, "frame_id": ""}
            body = {"header": header, "format": "jpeg", "data": picture}
            writer.write_message("/cam", schemas["image"], body, log_time=2_000_000_000 + number)
        writer.finish()
    (source,) = discover_episodes(
        tmp_path / "back.mcap", "mcap", topic_map=topic_map_from_dict({"cameras": {"c": "/cam"}})
    )
    with pytest.raises(
        SourceError, match=r"topic '/cam', message 2: is timed .* not after the frame before it.*time: log"
    ):
        list(source.cameras[0].frames(source.name, Fraction(30)))


def test_a_map_of_options_only_takes_the_default_streams_with_those_options(tmp_path, logs):
    folder, truths = logs
    sources = discover_episodes(folder, "mcap", topic_map=topic_map_from_dict({"time": "log", "resample": 50}))
    assert [c.name for c in sources[0].cameras] == ["camera.front.compressed"]
    state = next(s for s in sources[0].lowdim if s.name == "joint_states.position")
    values, times = state.load(sources[0].name)
    assert state.rate == 50 and np.allclose(np.diff(times), 1 / 50) and values.shape[1] == len(JOINTS)
    assert [s.task for s in sources] == [t.task for t in truths]


def test_a_camera_stamp_that_jumps_30_days_is_refused_at_conversion_not_stored_damaged(tmp_path):
    with open(tmp_path / "jump.mcap", "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        stamps = [1_000_000_000 + n * 33_333_333 for n in range(20)] + [30 * 86_400 * 10**9 + 1_700_000_000]
        for number, stamp in enumerate(stamps):
            header = {"stamp": {"sec": stamp // 10**9, "nanosec": stamp % 10**9}, "frame_id": ""}
            body = {"header": header, "format": "jpeg", "data": mcap_logs.jpeg(synthetic_frame(number, 0, 32, 48))}
            writer.write_message("/cam", schemas["image"], body, log_time=stamp + 1_000_000)
        writer.finish()
    (source,) = discover_episodes(
        tmp_path / "jump.mcap", "mcap", topic_map=topic_map_from_dict({"cameras": {"c": "/cam"}})
    )
    with pytest.raises(SourceError, match=r"jump.mcap.*duration 2.592e\+06 s is not within \[0, 604800\]"):
        convert([source], tmp_path / "out", OPTIONS)
    assert not (tmp_path / "out" / "dataset.json").exists()


@pytest.mark.slow
def test_a_log_split_at_1500_markers_is_read_in_a_few_passes_not_one_per_episode(tmp_path, monkeypatch):
    from mmdata.importers import mcap_log

    path = tmp_path / "marks.mcap"
    picture = mcap_logs.jpeg(synthetic_frame(0, 0, 16, 16))
    with open(path, "wb") as handle:
        writer, schemas = mcap_logs.open_writer(handle)
        start = 1_700_000_000_000_000_000
        for number in range(1500):
            writer.write_message("/mark", schemas["string"], {"data": f"task {number}"}, log_time=start)
            for frame in range(3):
                stamp = start + 1_000_000 + frame * 33_000_000
                header = {"stamp": {"sec": stamp // 10**9, "nanosec": stamp % 10**9}, "frame_id": ""}
                image = {"header": header, "format": "jpeg", "data": picture}
                joints = {"header": header, "name": ["a"], "position": [float(number)], "velocity": [], "effort": []}
                writer.write_message("/cam", schemas["image"], image, log_time=stamp)
                writer.write_message("/j", schemas["joints"], joints, log_time=stamp + 1)
            start += 200_000_000
        writer.finish()
    passes = []
    for name in ("_raw_messages", "_decoded_topics"):
        original = getattr(mcap_log, name)
        monkeypatch.setattr(mcap_log, name, lambda *a, _f=original, _n=name: passes.append(_n) or _f(*a))
    mapping = {
        "cameras": {"c": "/cam"},
        "lowdim": {"s": {"topic": "/j", "field": "position"}},
        "task": "/mark",
        "split": {"topic": "/mark"},
    }
    sources = discover_episodes(path, "mcap", topic_map=topic_map_from_dict(mapping))
    assert len(sources) == 1500 and [s.task for s in sources[::500]] == ["task 0", "task 500", "task 1000"]
    assert len(passes) <= 4, f"{len(passes)} passes over the log"


ALIAS_BOMB = (
    "".join(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}' if level else 'x'] * 9)}]\n" for level in range(6))
    + "lowdim: {s: {topic: /j, fields: *l5}}\n"
)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("cameras: [unclosed", "is not valid YAML"),
        ("? [a, b]\n: x\n", "is not valid YAML"),
        (ALIAS_BOMB, "anchors or aliases"),
        ("resample: 1e9\n", r"resample is a number in \(0, 10000\]"),
        ("cameras: {front: {topic: /c, fps: 1e-300}}\n", r"cameras.front.fps is a number in \(0.01, 1000\]"),
        ("cameras: {front: {topic: /c, fps: 1e300}}\n", r"cameras.front.fps is a number in \(0.01, 1000\]"),
        ("[1, 2]\n", "is not a mapping"),
    ],
    ids=["unparsable", "list-as-key", "alias-bomb", "huge-resample", "tiny-fps", "huge-fps", "a-list"],
)
def test_a_hostile_topic_map_file_is_refused_quickly_in_one_bounded_message(tmp_path, text, complaint):
    """(A few hundred bytes of nested aliases name 9^6 values as the fields of a stream: their text ran to
    megabytes in the message; nine levels took a minute and 2 GB.)"""
    import time

    from mmdata.importers import load_topic_map

    path = tmp_path / "map.yaml"
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(SourceError, match=complaint) as raised:
        load_topic_map(path)
    assert len(str(raised.value)) < 2000 and time.perf_counter() - started < 5
