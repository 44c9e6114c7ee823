"""ROS 1 `.bag` files and ROS 2 SQLite bags written with `rosbags`' own writers, holding the episodes of
`tests/mcap_logs.py` (a JPEG CompressedImage camera with jitter and dropped frames, a JointState at ~200 Hz
listing its joints in another order now and then, a String command) plus a raw `sensor_msgs/Image` camera
(rgb8, 10 Hz, each picture showing its number), with their ground truth."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.synthetic import synthetic_frame
from tests import mcap_logs

RAW_TOPIC = "/camera/wrist/image_raw"
RAW_WIDTH, RAW_HEIGHT = 64, 48
MESSAGE_TYPES = {
    "image": "sensor_msgs/msg/CompressedImage",
    "joints": "sensor_msgs/msg/JointState",
    "string": "std_msgs/msg/String",
    "raw": "sensor_msgs/msg/Image",
}


@dataclass
class BagTruth:
    log: mcap_logs.LogTruth
    raw_stamps: list[int] = field(default_factory=list)
    raw_numbers: list[int] = field(default_factory=list)


class BagWriter:
    """`write_message(topic, kind, body, log_time)` as `mcap_logs.write_episode` calls it, into a rosbags writer
    of a ROS 1 bag (`ros=1`) or a ROS 2 SQLite bag (`ros=2`), with each message built from its plain body."""

    def __init__(self, path: Path, ros: int):
        from rosbags.rosbag1 import Writer as Writer1
        from rosbags.rosbag2 import Writer as Writer2
        from rosbags.typesys import Stores, get_typestore

        self.ros = ros
        self.typestore = get_typestore(Stores.ROS1_NOETIC if ros == 1 else Stores.ROS2_HUMBLE)
        self.writer = Writer1(path) if ros == 1 else Writer2(path, version=9)
        self.writer.open()
        self.connections: dict[str, Any] = {}

    def write_message(self, topic: str, kind: str, body: dict, log_time: int, publish_time: int | None = None) -> None:
        msgtype = MESSAGE_TYPES[kind]
        if topic not in self.connections:
            self.connections[topic] = self.writer.add_connection(topic, msgtype, typestore=self.typestore)
        message = self.build(msgtype, body)
        serialize = self.typestore.serialize_ros1 if self.ros == 1 else self.typestore.serialize_cdr
        self.writer.write(self.connections[topic], log_time, serialize(message, msgtype))

    def build(self, msgtype: str, body: dict) -> Any:
        types = self.typestore.types
        fields = dict(body)
        if "header" in fields:
            stamp = fields["header"]["stamp"]
            header = {"stamp": types["builtin_interfaces/msg/Time"](**stamp), "frame_id": fields["header"]["frame_id"]}
            if self.ros == 1:
                header["seq"] = 0
            fields["header"] = types["std_msgs/msg/Header"](**header)
        for name in ("position", "velocity", "effort"):
            if name in fields:
                fields[name] = np.asarray(fields[name], np.float64)
        if "data" in fields and isinstance(fields["data"], bytes | np.ndarray):
            fields["data"] = np.frombuffer(bytes(fields["data"]), np.uint8)
        return types[msgtype](**fields)

    def finish(self) -> None:
        self.writer.close()


def write_bag(path: Path, ros: int, number: int, seconds: float, task: str) -> BagTruth:
    """One episode (as `mcap_logs`' episode `number`) and a raw rgb8 camera at 10 Hz, into the bag at `path`."""
    writer = BagWriter(path, ros)
    start = 1_700_000_000_000_000_000 + number * 10**11
    schemas = {kind: kind for kind in MESSAGE_TYPES}
    truth = BagTruth(mcap_logs.write_episode(writer, schemas, start, seconds, number, task))
    for frame in range(int(seconds * 10)):
        stamp = start + int(frame / 10 * 1e9) + 1_000_000
        picture = synthetic_frame(frame, number + 7, RAW_HEIGHT, RAW_WIDTH)
        header = {"stamp": {"sec": stamp // 1_000_000_000, "nanosec": stamp % 1_000_000_000}, "frame_id": "wrist"}
        body = {
            "header": header,
            "height": RAW_HEIGHT,
            "width": RAW_WIDTH,
            "encoding": "rgb8",
            "is_bigendian": 0,
            "step": RAW_WIDTH * 3,
            "data": picture.tobytes(),
        }
        writer.write_message(RAW_TOPIC, "raw", body, log_time=stamp + 2_000_000)
        truth.raw_stamps.append(stamp)
        truth.raw_numbers.append(frame)
    writer.finish()
    return truth


def write_bags(folder: Path, ros: int) -> list[BagTruth]:
    """`mcap_logs.EPISODES` as bags in `folder`: `episode_N.bag` (ROS 1) or folders `episode_N/` (ROS 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_bag(folder / (f"episode_{number}.bag" if ros == 1 else f"episode_{number}"), ros, number, seconds, task)
        for number, (seconds, task) in enumerate(mcap_logs.EPISODES)
    ]


VIDEO_TYPE = "foxglove_msgs/msg/CompressedVideo"
VIDEO_DEFINITION = "builtin_interfaces/Time timestamp\nstring frame_id\nuint8[] data\nstring format\n"


def write_video_bag(
    path: Path,
    video_format: str,
    packets: list[tuple[bytes, int]],
    stamps: list[int],
    log_times: list[int] | None = None,
) -> Path:
    """A ROS 2 SQLite bag of one `foxglove_msgs/msg/CompressedVideo` topic (its definition registered and stored
    in the bag), a message per packet stamped `stamps[frame number]` (ns) and logged a microsecond later, or at
    `log_times[message]` (the order a recorder received them: B-frames come before the frames shown first)."""
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    typestore = get_typestore(Stores.ROS2_HUMBLE)
    typestore.register(get_types_from_msg(VIDEO_DEFINITION, VIDEO_TYPE))
    types = typestore.types
    writer = Writer(path, version=9)
    writer.open()
    connection = writer.add_connection("/camera/video", VIDEO_TYPE, typestore=typestore)
    for position, (data, number) in enumerate(packets):
        stamp = types["builtin_interfaces/msg/Time"](sec=stamps[number] // 10**9, nanosec=stamps[number] % 10**9)
        message = types[VIDEO_TYPE](
            timestamp=stamp, frame_id="cam", data=np.frombuffer(data, np.uint8), format=video_format
        )
        logged = log_times[position] if log_times is not None else stamps[number] + 1000
        writer.write(connection, logged, typestore.serialize_cdr(message, VIDEO_TYPE))
    writer.close()
    return path
