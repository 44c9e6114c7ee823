"""ROS 1 `.bag` files and ROS 2 SQLite bags, written by rosbags' own writers, read through the MCAP importer's
topic map, time rules, message readers and refusals: every frame, value and time checked against the ground
truth, and damaged bags named (or skipped with --skip-bad)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import mmdata
from mmdata.codecs.colour import to_rgb
from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.errors import SourceError
from mmdata.importers import detect_format, discover_episodes, load_topic_map
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import read_index_stripe
from tests import mcap_logs, rosbag_logs
from tests.conftest import run_cli
from tests.test_mcap import check_episode

pytest.importorskip("rosbags", reason="ROS bags need rosbags (`pip install 'mmdata[rosbag]'`)")

OPTIONS = ConvertOptions(workers=1, progress=False)
TOPIC_MAP = {
    **mcap_logs.TOPIC_MAP,
    "cameras": {**mcap_logs.TOPIC_MAP["cameras"], "wrist": {"topic": rosbag_logs.RAW_TOPIC, "fps": 10}},
}


@pytest.fixture(scope="module", params=[1, 2], ids=["ros1", "ros2"])
def bags(request, tmp_path_factory) -> tuple[Path, list[rosbag_logs.BagTruth], int]:
    folder = tmp_path_factory.mktemp(f"ros{request.param}")
    return folder, rosbag_logs.write_bags(folder, request.param), request.param


def map_file(folder: Path, mapping: dict) -> Path:
    path = folder / "topics.json"
    path.write_text(json.dumps(mapping))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_bags_convert_and_read_back_as_their_ground_truth(bags, tmp_path, layout):
    folder, truths, _ = bags
    assert detect_format(folder) == "rosbag"
    topic_map = load_topic_map(map_file(tmp_path, TOPIC_MAP))  # the topic map the MCAP tests use, and a raw camera
    sources = discover_episodes(folder, "auto", topic_map=topic_map)
    report = convert(sources, tmp_path / "out", ConvertOptions(layout=layout, workers=1, progress=False))
    assert report.converted == 3 and verify_dataset(str(tmp_path / "out"), progress=False).ok
    dataset = mmdata.open_dataset(str(tmp_path / "out"))
    for index, truth in enumerate(truths):
        check_episode(dataset, index, truth.log)  # what the MCAP tests check: frames, values, times, metadata
        row = dataset.manifest.row(index)
        wrist_times = dataset.timestamps_of(row, "wrist")
        assert np.allclose(wrist_times, truth.log.seconds(truth.raw_stamps), rtol=0, atol=1e-9)
        wrist = np.asarray(dataset.frames_at(index, "wrist", wrist_times).values)
        assert [read_index_stripe(f) for f in wrist] == truth.raw_numbers


def test_without_a_topic_map_a_bag_gives_the_streams_an_mcap_log_gives(bags):
    folder, truths, _ = bags
    source = discover_episodes(folder, "rosbag")[0]
    assert sorted(c.name for c in source.cameras) == ["camera.front.compressed", "camera.wrist.image_raw"]
    assert [s.name for s in source.lowdim] == ["joint_states.position", "joint_states.velocity"], "effort is empty"
    assert source.task == truths[0].log.task


@pytest.mark.slow
def test_the_command_line_reads_bags_named_with_from_rosbag(bags, tmp_path):
    folder, _, _ = bags
    done = run_cli("convert", str(folder), str(tmp_path / "out"), "--from", "rosbag", "--workers", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "converted 3 episodes" in done.stdout


def truncated(folder: Path, ros: int, destination: Path) -> Path:
    """A copy of the bags with episode 1's cut in half."""
    shutil.copytree(folder, destination)
    damaged = destination / ("episode_1.bag" if ros == 1 else "episode_1/episode_1.db3")
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    return damaged


@pytest.mark.slow
def test_a_truncated_bag_is_its_episodes_error_and_skip_bad_converts_the_others(bags, tmp_path):
    folder, _, ros = bags
    damaged = truncated(folder, ros, tmp_path / "bags")
    with pytest.raises(SourceError, match=r"episode_1.*(not a readable ROS bag|a message)"):
        convert(discover_episodes(tmp_path / "bags", "rosbag"), tmp_path / "out", OPTIONS)
    report = convert(
        discover_episodes(tmp_path / "bags", "rosbag"),
        tmp_path / "skipped",
        ConvertOptions(workers=1, skip_bad=True, progress=False),
    )
    assert report.converted == 2 and len(report.skipped) == 1 and "episode_1" in report.skipped[0]["episode"]
    assert str(damaged) in report.skipped[0]["error"]


def test_a_ros1_chunk_declaring_gigabytes_is_refused_before_it_is_decompressed(tmp_path):
    rosbag_logs.write_bags(tmp_path / "bags", 1)
    path = tmp_path / "bags" / "episode_0.bag"
    data = bytearray(path.read_bytes())
    at = data.index(b"size=") + len(b"size=")  # the first chunk's header: its decompressed size
    data[at : at + 4] = (0xFFFFFFF0).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    sources = discover_episodes(path, "rosbag")
    assert sources[0].problem is not None and "declares 4294967280 bytes decompressed" in str(sources[0].problem)


@pytest.mark.slow
def test_a_ros1_connection_header_without_its_topic_is_named(tmp_path):
    rosbag_logs.write_bags(tmp_path / "bags", 1)
    path = tmp_path / "bags" / "episode_0.bag"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"topic=/joint_states", b"tXpic=/joint_states"))
    sources = discover_episodes(path, "rosbag")
    assert sources[0].problem is not None and "not a readable ROS bag" in str(sources[0].problem)
    assert "episode_0.bag" in str(sources[0].problem)


def one_connection_bag(path: Path, msgdef: str, md5sum: str) -> Path:
    """A ROS 1 bag of one JointState topic and one `my_msgs/msg/Thing` topic defined by `msgdef`."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    typestore = get_typestore(Stores.ROS1_NOETIC)
    types = typestore.types
    with Writer(path) as writer:
        joints = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=typestore)
        odd = writer.add_connection("/odd", "my_msgs/msg/Thing", msgdef=msgdef, md5sum=md5sum)
        for step in range(3):
            stamp = types["builtin_interfaces/msg/Time"](sec=1, nanosec=step)
            state = types["sensor_msgs/msg/JointState"](
                header=types["std_msgs/msg/Header"](seq=0, stamp=stamp, frame_id=""),
                name=["a"],
                position=np.array([float(step)]),
                velocity=np.array([], np.float64),
                effort=np.array([], np.float64),
            )
            writer.write(joints, 1_000_000_000 + step, typestore.serialize_ros1(state, "sensor_msgs/msg/JointState"))
            writer.write(odd, 1_000_000_000 + step, b"\x01\x02")
    return path


def test_a_message_type_the_bag_does_not_define_is_the_bags_named_error(tmp_path):
    path = one_connection_bag(tmp_path / "undefined.bag", "other_msgs/Missing value\n", "*")
    problem = discover_episodes(path, "rosbag")[0].problem
    assert problem is not None and "undefined.bag" in str(problem)
    assert "other_msgs/msg/Missing" in str(problem) and "complete message definitions" in str(problem)


def test_a_connection_header_whose_digest_disagrees_with_its_definition_is_named(tmp_path):
    path = one_connection_bag(tmp_path / "digest.bag", "float64 x\n", "0" * 32)
    problem = discover_episodes(path, "rosbag")[0].problem
    assert problem is not None and "digest.bag" in str(problem) and "my_msgs/msg/Thing" in str(problem)


def test_a_message_shorter_than_its_type_is_named_with_its_topic_and_number(tmp_path):
    path = one_connection_bag(tmp_path / "short.bag", "float64 x\n", "76b81e0561db142e2fc5c30d562dc4be")
    mapping = {
        "lowdim": {"state": {"topic": "/joint_states", "field": "position"}, "odd": {"topic": "/odd", "field": "x"}}
    }
    sources = discover_episodes(path, "rosbag", topic_map=load_topic_map(map_file(tmp_path, mapping)))
    with pytest.raises(SourceError, match=r"short.bag.*'/odd'.*(message|does not decode)"):
        convert(sources, tmp_path / "out", OPTIONS)


@pytest.mark.slow
def test_a_ros2_bag_whose_database_is_garbage_is_named(tmp_path):
    rosbag_logs.write_bags(tmp_path / "bags", 2)
    database = tmp_path / "bags" / "episode_2" / "episode_2.db3"
    with sqlite3.connect(database) as connection:
        connection.execute(
            "UPDATE messages SET data = X'00' WHERE topic_id = (SELECT id FROM topics WHERE name = ?)",
            (mcap_logs.JOINT_TOPIC,),
        )
    sources = discover_episodes(tmp_path / "bags", "rosbag")
    report = convert(sources, tmp_path / "out", ConvertOptions(workers=1, skip_bad=True, progress=False))
    assert report.converted == 2
    assert "episode_2" in report.skipped[0]["episode"] and "joint_states" in report.skipped[0]["error"]


@pytest.mark.parametrize("layout", ["wds", "zarr"])
def test_compressed_video_of_a_ros2_bag_is_copied_as_the_frames_its_messages_decode_to(tmp_path, layout):
    stamps = [2_000_000_000 + int(n / 15 * 1e9) + (n % 3) * 1_000_000 for n in range(24)]
    bag = rosbag_logs.write_video_bag(tmp_path / "bag", "h264", mcap_logs.video_packets("h264", 24, 8), stamps)
    (source,) = discover_episodes(bag, "rosbag")
    camera = source.cameras[0]
    decoded = list(camera.frames(source.name, camera.info(source.name).fps))
    video = VideoEncoding(codec="copy", segment_frames=16, gop=1)
    options = ConvertOptions(layout=layout, encode=EncodeOptions(video=video), workers=1, progress=False)
    convert([source], tmp_path / f"store.{layout}", options)
    store = mmdata.open_dataset(str(tmp_path / f"store.{layout}"))
    assert (store.schema.stream(camera.name).codec, store.schema.stream(camera.name).crf) == ("h264", None)
    episode = store.read_episode(0, [camera.name])[camera.name]
    assert np.array_equal(np.asarray(episode.values), np.stack([to_rgb(frame) for frame, _ in decoded]))
    np.testing.assert_allclose(episode.timestamps, (np.asarray(stamps) - stamps[0]) / 1e9, rtol=0, atol=1e-9)


def test_from_rosbag_on_a_ros2_bag_stored_as_mcap_names_from_mcap(tmp_path):
    pytest.importorskip("mcap_protobuf")
    from tests import mcap_logs

    bag = tmp_path / "bag"
    bag.mkdir()
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information:\n  storage_identifier: mcap\n")
    mcap_logs.write_one_log(bag / "bag_0.mcap")
    for source in (bag, bag / "bag_0.mcap"):
        with pytest.raises(SourceError, match=r"holds no ROS bag .*it holds 1 MCAP file.*convert it with --from mcap"):
            discover_episodes(str(source), "rosbag")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="holds no ROS bag .*give a bag or a folder of bags"):
        discover_episodes(str(tmp_path / "empty"), "rosbag")
