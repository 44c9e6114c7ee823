"""MCAP robot logs written with the real writers (`mcap` + `mcap-ros2-support`), with their ground truth.

Each log is one episode: a JPEG `sensor_msgs/CompressedImage` camera at ~30 Hz with jitter and two
dropped frames (each picture shows its frame number as a stripe), a `sensor_msgs/JointState` at
~200 Hz with jitter (some messages list the joints in another order), and a `std_msgs/String`
command. Header stamps are the capture times; messages are logged a few milliseconds later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np

from mmdata.synthetic import synthetic_frame

HEADER = """================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec
"""
COMPRESSED_IMAGE = "std_msgs/Header header\nstring format\nuint8[] data\n" + HEADER
JOINT_STATE = (
    "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort\n" + HEADER
)
STRING = "string data\n"
JOINTS = ["shoulder", "elbow", "wrist", "gripper"]
WIDTH, HEIGHT = 128, 96
CAMERA, JOINT_TOPIC, COMMAND = "/camera/front/compressed", "/joint_states", "/command"
TOPIC_MAP = {
    "cameras": {"front": CAMERA},
    "lowdim": {
        "observation.state": {"topic": JOINT_TOPIC, "field": "position"},
        "observation.velocity": {"topic": JOINT_TOPIC, "field": "velocity"},
    },
    "task": {"topic": COMMAND, "field": "data"},
}


@dataclass
class LogTruth:
    """What one logged episode holds, in nanoseconds since the clock's epoch."""

    task: str
    frame_stamps: list[int] = field(default_factory=list)  # of the frames kept
    frame_numbers: list[int] = field(default_factory=list)  # drawn in each kept picture
    joint_stamps: list[int] = field(default_factory=list)
    position: list[list[float]] = field(default_factory=list)  # in JOINTS order
    velocity: list[list[float]] = field(default_factory=list)

    @property
    def origin(self) -> int:
        return min(self.frame_stamps[0], self.joint_stamps[0])

    def seconds(self, stamps: list[int]) -> np.ndarray:
        return (np.asarray(stamps, dtype=np.int64) - self.origin) / 1e9


def jpeg(picture: np.ndarray) -> bytes:
    """One JPEG image of an RGB array, as `compressed_image_transport` would publish."""
    context = av.CodecContext.create("mjpeg", "w")
    context.width, context.height, context.pix_fmt = picture.shape[1], picture.shape[0], "yuvj444p"
    context.options = {"qscale": "2"}
    frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format="yuvj444p")
    return b"".join(bytes(p) for p in [*context.encode(frame), *context.encode(None)])


def write_episode(
    writer,
    schemas: dict,
    start_ns: int,
    seconds: float,
    seed: int,
    task: str,
    dropped: tuple[int, ...] = (17, 40),
) -> LogTruth:
    """Log one episode of `seconds` from `start_ns` into an open `mcap_ros2.writer.Writer`."""
    rng = np.random.default_rng(seed)
    truth = LogTruth(task)
    messages = []
    messages.append((start_ns - 50_000_000, COMMAND, "string", {"data": task}, 0))
    for number in range(int(seconds * 30)):
        stamp = start_ns + int(number / 30 * 1e9) + int(rng.integers(-4_000_000, 4_000_000))
        if number in dropped:
            continue
        picture = synthetic_frame(number, seed, HEIGHT, WIDTH)
        header = {"stamp": {"sec": stamp // 1_000_000_000, "nanosec": stamp % 1_000_000_000}, "frame_id": "front"}
        body = {"header": header, "format": "jpeg", "data": jpeg(picture)}
        messages.append((stamp, CAMERA, "image", body, int(rng.integers(2_000_000, 6_000_000))))
        truth.frame_stamps.append(stamp)
        truth.frame_numbers.append(number)
    for number in range(int(seconds * 200)):
        stamp = start_ns + int(number / 200 * 1e9) + int(rng.integers(-800_000, 800_000))
        t = number / 200
        position = [float(np.sin(1.3 * t + j) + 0.001 * seed) for j in range(len(JOINTS))]
        velocity = [float(1.3 * np.cos(1.3 * t + j)) for j in range(len(JOINTS))]
        order = list(range(len(JOINTS)))
        if number % 50 == 7:
            order = order[::-1]  # some drivers list the joints in another order now and then
        header = {"stamp": {"sec": stamp // 1_000_000_000, "nanosec": stamp % 1_000_000_000}, "frame_id": ""}
        body = {
            "header": header,
            "name": [JOINTS[i] for i in order],
            "position": [position[i] for i in order],
            "velocity": [velocity[i] for i in order],
            "effort": [],
        }
        messages.append((stamp, JOINT_TOPIC, "joints", body, int(rng.integers(500_000, 2_000_000))))
        truth.joint_stamps.append(stamp)
        truth.position.append(position)
        truth.velocity.append(velocity)
    for stamp, topic, kind, body, latency in sorted(messages, key=lambda m: m[0] + m[4]):
        writer.write_message(topic, schemas[kind], body, log_time=stamp + latency, publish_time=stamp + latency)
    return truth


def open_writer(handle):
    from mcap_ros2.writer import Writer

    writer = Writer(handle)
    schemas = {
        "image": writer.register_msgdef("sensor_msgs/msg/CompressedImage", COMPRESSED_IMAGE),
        "joints": writer.register_msgdef("sensor_msgs/msg/JointState", JOINT_STATE),
        "string": writer.register_msgdef("std_msgs/msg/String", STRING),
    }
    return writer, schemas


ROS1_HEADER = """================================================================================
MSG: std_msgs/Header
uint32 seq
time stamp
string frame_id
"""
ROS1_DEFINITIONS = {
    "image": ("sensor_msgs/CompressedImage", "Header header\nstring format\nuint8[] data\n" + ROS1_HEADER),
    "joints": (
        "sensor_msgs/JointState",
        "Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort\n" + ROS1_HEADER,
    ),
    "string": ("std_msgs/String", STRING),
}


class Ros1Writer:
    """`mcap_ros1.writer.Writer` taking the ROS 2 writer's dict messages (as `write_episode` writes them), turned
    into the ROS 1 message classes genpy generates from the definitions: a ROS 1 log of the same episodes."""

    def __init__(self, handle):
        from mcap_ros1._vendor.genpy import Time
        from mcap_ros1._vendor.genpy.dynamic import generate_dynamic
        from mcap_ros1.writer import Writer

        self._writer, self._time = Writer(handle), Time
        self.classes = {kind: generate_dynamic(name, text)[name] for kind, (name, text) in ROS1_DEFINITIONS.items()}

    def write_message(self, topic: str, kind: str, body: dict, log_time: int, publish_time: int | None = None):
        message = self.classes[kind]()
        for field_name, value in body.items():
            if field_name == "header":
                stamp = value["stamp"]
                message.header.stamp = self._time(stamp["sec"], stamp["nanosec"])
                message.header.frame_id = value["frame_id"]
            else:
                setattr(message, field_name, value)
        self._writer.write_message(topic, message, log_time=log_time, publish_time=publish_time or log_time)

    def finish(self) -> None:
        self._writer.finish()


def open_ros1_writer(handle):
    return Ros1Writer(handle), {kind: kind for kind in ROS1_DEFINITIONS}


EPISODES = ((2.0, "pick up the red block"), (1.5, "open the drawer"), (1.8, "pick up the red block"))


def write_logs(folder: Path, ros: int = 2) -> list[LogTruth]:
    """Three logs, one episode each, `episode_0.mcap` ... in `folder`, of ROS 2 (or with `ros=1` ROS 1) messages."""
    folder.mkdir(parents=True, exist_ok=True)
    truths = []
    for number, (seconds, task) in enumerate(EPISODES):
        with open(folder / f"episode_{number}.mcap", "wb") as handle:
            writer, schemas = open_writer(handle) if ros == 2 else open_ros1_writer(handle)
            truths.append(
                write_episode(writer, schemas, 1_700_000_000_000_000_000 + number * 10**11, seconds, number, task)
            )
            writer.finish()
    return truths


def write_one_log(path: Path, gap_seconds: float = 3.0, marker: str | None = None) -> list[LogTruth]:
    """The same three episodes in one file, `gap_seconds` apart; with `marker`, a String message on that
    topic 0.1 s before each episode starts (before its command)."""
    truths = []
    start = 1_700_000_000_000_000_000
    with open(path, "wb") as handle:
        writer, schemas = open_writer(handle)
        for number, (seconds, task) in enumerate(EPISODES):
            if marker is not None:
                writer.write_message(marker, schemas["string"], {"data": str(number)}, log_time=start - 100_000_000)
            truths.append(write_episode(writer, schemas, start, seconds, number, task))
            start += int((seconds + gap_seconds) * 1e9)
        writer.finish()
    return truths


# `foxglove.CompressedVideo` logs: each message one frame of `format` (Foxglove's names), key frames every `gop`
VIDEO_ENCODERS = {"h264": "libx264", "h265": "libx265", "vp9": "libvpx-vp9", "av1": "libsvtav1"}
VIDEO_FPS = 15


def video_packets(
    video_format: str, count: int, gop: int, bframes: int = 0, size: tuple[int, int] = (WIDTH, HEIGHT)
) -> list[tuple[bytes, int]]:
    """`count` synthetic frames of `size` (width, height) encoded as `video_format`, with `bframes` B-frames
    between references (H.264 and H.265): (packet, frame number) in decode order."""
    from fractions import Fraction

    width, height = size
    context = av.CodecContext.create(VIDEO_ENCODERS[video_format], "w")
    context.width, context.height, context.pix_fmt = width, height, "yuv420p"
    context.time_base = Fraction(1, VIDEO_FPS)
    context.gop_size = gop
    context.options = {
        "h264": {"x264-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}:b-adapt=0:scenecut=0"}
        | ({} if bframes else {"tune": "zerolatency"}),
        "h265": {
            "x265-params": f"keyint={gop}:min-keyint={gop}:bframes={bframes}:b-adapt=0:scenecut=0:log-level=none"
            + (":open-gop=0" if bframes else "")
        },
        "vp9": {"lag-in-frames": "0"},
        "av1": {"svtav1-params": f"keyint={gop}:scd=0:pred-struct=1:lookahead=0"},
    }[video_format]
    packets = []
    for number in range(count + 1):
        frame = None
        if number < count:
            picture = synthetic_frame(number, 0, height, width)
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format="yuv420p")
            frame.pts = number
        packets += [(bytes(packet), int(packet.pts)) for packet in context.encode(frame)]
    return packets


def compressed_video_class():
    """`foxglove.CompressedVideo` as Foxglove's schema defines it, built from its descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    pool = descriptor_pool.DescriptorPool()
    timestamp_file = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp_file)
    pool.Add(timestamp_file)
    schema = descriptor_pb2.FileDescriptorProto(
        name="foxglove/CompressedVideo.proto", package="foxglove", syntax="proto3"
    )
    schema.dependency.append("google/protobuf/timestamp.proto")
    message = schema.message_type.add(name="CompressedVideo")
    kinds = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate(
        [("timestamp", kinds.TYPE_MESSAGE), ("frame_id", kinds.TYPE_STRING), ("data", kinds.TYPE_BYTES),
         ("format", kinds.TYPE_STRING)], start=1
    ):  # fmt: skip
        field_ = message.field.add(name=name, number=number, type=kind, label=kinds.LABEL_OPTIONAL)
        if name == "timestamp":
            field_.type_name = ".google.protobuf.Timestamp"
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("foxglove.CompressedVideo"))


def write_video_log(
    path: Path,
    video_format: str,
    packets: list[tuple[bytes, int]],
    stamps: list[int],
    topic: str = "/camera/video",
    log_times: list[int] | None = None,
) -> Path:
    """An MCAP log of `foxglove.CompressedVideo` messages (protobuf, `mcap-protobuf-support`), one per packet,
    stamped with `stamps[frame number]` (nanoseconds) and logged a microsecond later, or at `log_times[message]`
    (the order a recorder received them: B-frames come before the frames shown first)."""
    from mcap_protobuf.writer import Writer

    video = compressed_video_class()
    with open(path, "wb") as handle:
        writer = Writer(handle)
        for position, (data, number) in enumerate(packets):
            message = video(data=data, format=video_format, frame_id="cam")
            message.timestamp.FromNanoseconds(stamps[number])
            logged = log_times[position] if log_times is not None else stamps[number] + 1000
            writer.write_message(topic, message, log_time=logged)
        writer.finish()
    return path
