"""Robot logs -> `EpisodeSource`s, read without ROS: MCAP files (ROS 2 bags, Foxglove recordings), and ROS 1
`.bag` files and ROS 2 SQLite bags through the same code (`rosbag_log.py` offers a bag as an MCAP reader).

A log holds topics at their own, irregular rates. A `TopicMap` (see `topic_map.py`) says which
topics become which streams; without one, `default_topic_map` takes every picture topic as a
camera, every `JointState` field that holds values as a low-dim stream and a lone `String` topic
as the task. Each stream keeps its messages' own times (header stamps, or log times), counted
from the episode's earliest mapped message; low-dim topics are resampled only when asked.

A file is one episode, or several when the map says how to split it (`split: {gap: s}` or
`split: {topic: /name}`). Files are found recursively and taken in the order of their paths.
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.codecs.video_copy import CopiedVideo, copy_packets
from mmdata.codecs.video_source import VideoInfo
from mmdata.errors import CopyError, SourceError
from mmdata.importers import log_messages
from mmdata.importers.episode import EpisodeSource, require_common_streams
from mmdata.importers.files import file_problem, listed_below
from mmdata.importers.limits import MAX_ARRAY_CHUNK_BYTES, MAX_LOWDIM_BYTES, frame_size_problem
from mmdata.importers.log_messages import MessageError
from mmdata.importers.rosbag_log import BagReader, bags_below, is_bag, open_bag
from mmdata.importers.topic_map import (
    CameraTopic,
    EpisodeSplit,
    LowdimTopic,
    TaskTopic,
    TimeSource,
    TopicMap,
)

INSTALL = "pip install 'mmdata[mcap]'"
RECOVER = "rebuild its index with `mcap recover FILE -o FIXED.mcap` (the mcap CLI), or pass --skip-bad"
JOINT_STATES = ("sensor_msgs/msg/JointState", "sensor_msgs/JointState")
JOINT_FIELDS = ("position", "velocity", "effort")
STRINGS = ("std_msgs/msg/String", "std_msgs/String")
MAX_ROS1_SCHEMA_CHARS = 1 << 20
MAX_COMMANDS_KEPT = 100


@dataclass(frozen=True)
class LogSpan:
    """The messages of one episode: log times [start, end) of file `path` (None: to the file's edge),
    timed by `time`, in seconds from `origin` (nanoseconds)."""

    path: str
    start: int | None
    end: int | None
    origin: int
    time: TimeSource


@dataclass(frozen=True)
class McapCameraSource:
    """A camera from a topic of images or video packets; frames keep their messages' times."""

    name: str
    span: LogSpan
    topic: str
    fps: float | None = None

    @property
    def path(self) -> str:
        return self.span.path

    def info(self, episode: str) -> VideoInfo:
        with _reading(self.span.path, episode, self.topic) as reader:
            times = [m.log_time for _, _, m in _raw_messages(reader, self.topic, self.span)]
        if not times:
            raise SourceError(episode, self.span.path, f"topic '{self.topic}' has no message in the episode")
        pictures = self.frames(episode, Fraction(1))
        try:
            width, height = _size(next(pictures)[0])
        finally:
            pictures.close()
        self._check_size(episode, width, height)
        return VideoInfo(width, height, self._rate(times), f"mcap:{self.topic}")

    def _check_size(self, episode: str, width: int, height: int) -> None:
        problem = frame_size_problem(width, height)
        if problem is not None:
            raise SourceError(episode, self.span.path, f"topic '{self.topic}': {problem}", "store smaller images")

    def _rate(self, log_times: list[int]) -> Fraction:
        """The rate the topic map states, else the one its messages' log times (ns) give."""
        return Fraction(self.fps).limit_denominator(1001) if self.fps else nominal_rate(np.asarray(log_times))

    def frames(self, episode: str, fps: Fraction) -> Generator[tuple[Any, float], None, None]:
        size, previous = None, None
        with _reading(self.span.path, episode, self.topic) as reader:
            decoder = None
            for index, (schema, record, message) in enumerate(_decoded(reader, self.topic, self.span)):
                where = f"{self.span.path}: topic '{self.topic}', message {index}"
                try:
                    time = _seconds(message_time(record, message, self.span.time), self.span.origin)
                    kind = log_messages.schema_kind(schema.name if schema else "")
                    if kind == "video":
                        decoder = decoder or log_messages.PacketDecoder(str(message.format))
                        pictures: Iterator[tuple[Any, float]] = decoder.decode(bytes(message.data), time)
                    elif kind == "other":
                        raise MessageError(f"is a {schema.name if schema else 'schemaless'} message, not a picture")
                    else:
                        pictures = iter([(log_messages.picture(message, kind, where, episode), time)])
                    for picture, at in pictures:
                        size = _same_size(picture, size)
                        _require_after(at, previous, decoder is not None and decoder.reordered)
                        previous = at
                        yield picture, at
                except MessageError as exc:
                    raise SourceError(episode, self.span.path, f"topic '{self.topic}', message {index}: {exc}") from exc
            if decoder is not None:
                try:
                    for picture, at in decoder.flush():
                        size = _same_size(picture, size)
                        _require_after(at, previous, decoder.reordered)
                        previous = at
                        yield picture, at
                except MessageError as exc:
                    raise SourceError(episode, self.span.path, f"topic '{self.topic}': {exc}") from exc

    def copied(self, episode: str, segment_frames: int) -> CopiedVideo:
        """The topic's video packets (`foxglove.CompressedVideo`) cut into segments of at most `segment_frames`
        frames at key frames, not decoded (`--video-codec copy`), each frame at its message's time as `frames`
        gives it; a topic of images is refused."""
        payloads: list[bytes] = []
        times: list[float] = []
        log_times: list[int] = []
        video_format: str | None = None
        with _reading(self.span.path, episode, self.topic) as reader:
            for index, (schema, record, message) in enumerate(_decoded(reader, self.topic, self.span)):
                try:
                    kind = log_messages.schema_kind(schema.name if schema else "")
                    if kind != "video":
                        raise SourceError(
                            episode,
                            self.span.path,
                            f"topic '{self.topic}' carries {schema.name if schema else 'schemaless'} pictures, not"
                            " video packets; --video-codec copy keeps foxglove.CompressedVideo packets and video"
                            " files as they are",
                            "convert with --video-codec h264 (or another codec) to encode its pictures",
                        )
                    if video_format is None:
                        video_format = str(message.format)
                    if str(message.format) != video_format:
                        raise MessageError(f"is {message.format} video, after messages of {video_format}")
                    time = _seconds(message_time(record, message, self.span.time), self.span.origin)
                except MessageError as exc:
                    raise SourceError(episode, self.span.path, f"topic '{self.topic}', message {index}: {exc}") from exc
                payloads.append(bytes(message.data))
                times.append(time)
                log_times.append(record.log_time)
        if not payloads or video_format is None:
            raise SourceError(episode, self.span.path, f"topic '{self.topic}' has no message in the episode")
        try:
            codec = log_messages.stored_codec(video_format)
            copied = copy_packets(codec, payloads, self._rate(log_times), segment_frames)
        except (CopyError, MessageError) as exc:
            raise SourceError(episode, self.span.path, f"topic '{self.topic}': {exc}") from exc
        self._check_size(episode, copied.width, copied.height)  # (as the codec's parser found it)
        shown_times = np.asarray(times, np.float64)[copied.shown]  # each frame at its message's time
        reordered = not np.array_equal(copied.shown, np.arange(len(copied.shown)))
        for frame in range(1, len(shown_times)):
            try:
                _require_after(shown_times[frame], shown_times[frame - 1], reordered)
            except MessageError as exc:
                message = int(copied.shown[frame])
                raise SourceError(episode, self.span.path, f"topic '{self.topic}', message {message}: {exc}") from exc
        copied.timestamps = shown_times
        return copied


def _require_after(time: float, previous: float | None, reordered: bool = False) -> None:
    """MessageError unless a camera's frame at `time` comes after the frame shown before it, at `previous`.
    `reordered`: the video shows its frames in another order than its messages carry them (B-frames), so only
    stamps at the frames' presentation times place them; log times, in the order messages were sent, cannot."""
    if previous is None or time > previous:
        return
    if reordered:
        raise MessageError(
            f"its frame is timed {time:.6f} s, not after the frame shown before it ({previous:.6f} s): the video has"
            " B-frames (frames are shown in another order than their messages come), and the messages' times are"
            " not the times the frames are shown; stamp each message with its frame's presentation time and read"
            " those stamps (`time: header` in the topic map), or record the video without B-frames"
        )
    raise MessageError(
        f"is timed {time:.6f} s, not after the frame before it ({previous:.6f} s);"
        " read log times with `time: log` in the topic map"
    )


@dataclass(frozen=True)
class McapLowdimSource:
    """Numeric fields of a topic's messages, one row per message at its own time; at `resample` Hz
    (linear for floats, the previous value for integers) when set. Rows of messages that name their
    values (`JointState.name`) are put in the order of the episode's first message.

    `topic_fields` lists the field groups of every stream the episode reads from this topic, so the
    topic is decoded once for all of them (JointState position, velocity and effort)."""

    name: str
    span: LogSpan
    topic: str
    fields: tuple[str, ...]
    resample: float | None = None
    topic_fields: tuple[tuple[str, ...], ...] = ()

    @property
    def path(self) -> str:
        return self.span.path

    @property
    def rate(self) -> float | None:
        return self.resample

    def load(self, episode: str) -> tuple[np.ndarray, np.ndarray]:
        groups = self.topic_fields if self.fields in self.topic_fields else (self.fields,)
        times, tables = _topic_rows(self.span, self.topic, groups, episode)
        values = tables[groups.index(self.fields)]
        if values.shape[1] == 0:
            raise SourceError(
                episode, self.path, f"topic '{self.topic}': fields {list(self.fields)} hold no values", "map others"
            )
        seconds = (times - self.span.origin) / 1e9
        if self.resample:
            rows = (seconds[-1] - seconds[0]) * self.resample + 1 if len(seconds) else 0
            if rows * values[0].nbytes > MAX_LOWDIM_BYTES:
                raise SourceError(
                    episode,
                    self.path,
                    f"topic '{self.topic}' resampled at {self.resample:g} Hz over {seconds[-1] - seconds[0]:.1f} s"
                    f" would hold {rows:.0f} rows, more than one episode's stream may ({MAX_LOWDIM_BYTES} bytes)",
                    "resample at a lower rate",
                )
            return resample_rows(values, seconds, self.resample)
        return values, seconds


@lru_cache(maxsize=2)
def _topic_rows(
    span: LogSpan, topic: str, groups: tuple[tuple[str, ...], ...], episode: str
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Message times (ns) and one array of rows per field group, from one pass over the topic (kept for the
    episode's other streams of the same topic)."""
    rows: list[list[np.ndarray]] = [[] for _ in groups]
    orders = [_NameOrder() for _ in groups]
    times: list[int] = []
    held = 0
    with _reading(span.path, episode, topic) as reader:
        for index, (_, record, message) in enumerate(_decoded(reader, topic, span)):
            try:
                time = message_time(record, message, span.time)
                if times and time <= times[-1]:
                    raise MessageError(
                        f"is timed {_seconds(time, span.origin):.6f} s, not after the message before it"
                        f" ({_seconds(times[-1], span.origin):.6f} s); read log times with `time: log`"
                    )
                for fields, order, kept in zip(groups, orders, rows):
                    row = order.arrange(message, log_messages.numbers(message, fields), len(fields))
                    if kept and row.shape != kept[0].shape:
                        raise MessageError(
                            f"fields {list(fields)} hold {row.size} values, in the first message {kept[0].size}"
                        )
                    kept.append(row)
                    held += row.nbytes
            except MessageError as exc:
                raise SourceError(episode, span.path, f"topic '{topic}', message {index}: {exc}") from exc
            if held > MAX_LOWDIM_BYTES:
                raise SourceError(episode, span.path, f"topic '{topic}' holds more than {MAX_LOWDIM_BYTES} bytes")
            times.append(time)
    if not times:
        raise SourceError(episode, span.path, f"topic '{topic}' has no message in the episode")
    return np.asarray(times, dtype=np.int64), tuple(np.stack(kept) for kept in rows)


class _NameOrder:
    """Keeps rows of named values (`JointState.name` beside `position`) in the first message's order."""

    def __init__(self):
        self.names: list[str] | None = None

    def arrange(self, message: Any, row: np.ndarray, field_count: int) -> np.ndarray:
        names = getattr(message, "name", None)
        if field_count != 1 or not isinstance(names, list) or not names:
            return row
        if len(names) != row.size:
            raise MessageError(f"names {len(names)} values {names} but holds {row.size}")
        if len(set(names)) != len(names):
            repeated = sorted({name for name in names if names.count(name) > 1})
            raise MessageError(f"names the values {names}, {repeated} more than once")
        if self.names is None:
            self.names = list(names)
        if names == self.names:
            return row
        if sorted(names) != sorted(self.names):
            raise MessageError(f"names the values {names}, where the first message names {self.names}")
        position = {name: i for i, name in enumerate(names)}
        return row[[position[name] for name in self.names]]


def resample_rows(values: np.ndarray, times: np.ndarray, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows at `times` resampled to `times[0] + k / rate` up to the last time: linear between the two
    neighbours for floats, the last value at or before for integers."""
    grid = times[0] + np.arange(int(math.floor((times[-1] - times[0]) * rate + 1e-9)) + 1) / rate
    if values.dtype.kind == "f":
        columns = values.reshape(len(values), -1)
        out = np.stack([np.interp(grid, times, columns[:, c]) for c in range(columns.shape[1])], axis=1)
        return out.reshape((len(grid), *values.shape[1:])).astype(values.dtype), grid
    before = np.clip(np.searchsorted(times, grid + 1e-9, side="right") - 1, 0, len(times) - 1)
    return values[before], grid


def nominal_rate(times_ns: np.ndarray) -> Fraction:
    """A camera's nominal rate from its message times: the mean period between messages (gaps of dropped
    frames left out), as a whole number of Hz when within 5% of one (cameras run at 15, 30, 60 Hz; jitter
    moves the estimate from episode to episode, and every episode of a store must state the same rate),
    else to a tenth of a Hz. `fps:` in the topic map states it instead."""
    periods = np.diff(times_ns.astype(np.int64)) / 1e9
    if len(periods) == 0 or not np.median(periods) > 0:
        return Fraction(30)
    rate = 1.0 / float(periods[periods < 1.5 * np.median(periods)].mean())
    if round(rate) > 0 and abs(round(rate) - rate) <= 0.05 * rate:
        return Fraction(round(rate))
    return Fraction(round(rate * 10), 10)


def message_time(record: Any, message: Any, time: TimeSource) -> int:
    """A message's time in nanoseconds: its header stamp (when it has one and `time` is "header"), else
    its log time."""
    if time == "header":
        stamp = log_messages.stamp_ns(message)
        if stamp is not None:
            if stamp <= 0:
                raise MessageError("has a header stamp of 0; read log times with `time: log` in the topic map")
            return stamp
    return int(record.log_time)


def discover_mcap_episodes(root: str | Path, topic_map: TopicMap | None = None, task: str = "") -> list[EpisodeSource]:
    """One EpisodeSource per file of `root` (a .mcap file or a folder of them), or per part of a file
    the map's `split` rule makes."""
    _require_mcap(root)
    return _log_episodes(Path(root), log_files(Path(root)), topic_map, task)


def discover_rosbag_episodes(
    root: str | Path, topic_map: TopicMap | None = None, task: str = ""
) -> list[EpisodeSource]:
    """One EpisodeSource per bag of `root` (a ROS 1 `.bag` file, a ROS 2 SQLite bag folder, or a folder holding
    bags), or per part of a bag the map's `split` rule makes: as MCAP logs are read (see `rosbag_log.py`)."""
    root = Path(root)
    if not root.exists():
        raise SourceError.for_source(str(root), None, "the source does not exist", "give a bag or a folder of bags")
    bags = bags_below(root)
    if not bags:
        logs = [root] if root.suffix == ".mcap" else []
        if root.is_dir():
            logs = listed_below(root, lambda name: name.endswith(".mcap"))
        raise SourceError.for_source(
            str(root),
            None,
            "holds no ROS bag that --from rosbag reads (.bag files, or folders of metadata.yaml and .db3 files)"
            + (f"; it holds {len(logs)} MCAP file(s) (ROS 2 bags stored as MCAP)" if logs else ""),
            "convert it with --from mcap" if logs else "give a bag or a folder of bags",
        )
    return _log_episodes(root, bags, topic_map, task)


def _log_episodes(root: Path, files: list[Path], topic_map: TopicMap | None, task: str) -> list[EpisodeSource]:
    episodes: list[EpisodeSource] = []
    for path in files:
        name = path.relative_to(root).as_posix() if root.is_dir() and path != root else path.name
        why = _log_problem(path, root if root.is_dir() else root.parent)
        if why is not None:
            problem = SourceError(name, str(path), why, "replace it with the log, or remove it")
            episodes.append(EpisodeSource(name, problem=problem))
            continue
        try:
            episodes += _file_episodes(path, name, topic_map, task)
        except SourceError as failure:
            episodes.append(EpisodeSource(name, problem=failure))
        except Exception as exc:  # a per-file boundary: a log the decoders choke on must not stop the others
            problem = SourceError(name, str(path), f"could not be read: {type(exc).__name__}: {exc}", RECOVER)
            episodes.append(EpisodeSource(name, problem=problem))
    return require_common_streams(episodes)


def _log_problem(path: Path, root: Path) -> str | None:
    """Why a log file (or each file of a ROS 2 bag folder) may not be read, or None."""
    if path.is_dir():
        for part in sorted(path.iterdir()):
            why = file_problem(part, root)
            if why is not None:
                return f"holds '{part.name}', which {why}"
        return None
    return file_problem(path, root)


def log_files(root: Path) -> list[Path]:
    """The .mcap files of `root`, in path order; a ROS 2 bag split into several files is refused."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError.for_source(str(root), None, "the source does not exist", "give a .mcap file or a folder")
    files = listed_below(root, lambda name: name.endswith(".mcap"))
    if not files:
        raise SourceError.for_source(str(root), None, "holds no .mcap file", "give a folder of MCAP logs")
    for bag in sorted(root.rglob("metadata.yaml")):
        parts = [p for p in files if p.parent == bag.parent]
        if len(parts) > 1:
            raise SourceError.for_source(
                str(bag.parent),
                None,
                f"a ROS 2 bag split into {len(parts)} files; an episode is one file",
                "join them with `mcap merge` (the mcap CLI) and convert the merged file",
            )
    return files


def holds_mcap_logs(path: Path) -> bool:
    """Whether `path` is a .mcap file or a folder holding some (for `--from auto`)."""
    if path.is_file():
        return path.suffix == ".mcap"
    return path.is_dir() and next((p for p in path.rglob("*.mcap") if p.is_file()), None) is not None


def _file_episodes(path: Path, name: str, topic_map: TopicMap | None, task: str) -> list[EpisodeSource]:
    with _reading(str(path), name) as reader:
        summary = _summary(reader, str(path), name)
        channels = _channels(summary, str(path), name)
        if topic_map is not None and topic_map.maps_streams:
            mapping = topic_map
        else:
            mapping = default_topic_map(reader, channels, str(path), name, topic_map or TopicMap())
        _require_topics(mapping, channels, str(path), name)
        spans = _spans(reader, mapping, str(path), name)
        if len(spans) == 1:
            ((start, end),) = spans
            contents: list[tuple[dict[str, tuple[int, Any]], list[tuple[int, str]] | None]]
            contents = [(_first_messages(reader, mapping, str(path), name, start, end), None)]
        else:
            contents = [(first, found) for first, found in _span_contents(reader, mapping, spans, str(path), name)]
        episodes = []
        for number, ((start, end), (first, commands)) in enumerate(zip(spans, contents)):
            episode = f"{name}#{number}" if len(spans) > 1 else name
            episodes.append(_episode(reader, mapping, channels, str(path), episode, start, end, task, first, commands))
        return episodes


def _episode(
    reader,
    mapping: TopicMap,
    channels: dict,
    path: str,
    episode: str,
    start: int | None,
    end: int | None,
    task: str,
    first: dict[str, tuple[int, Any]],
    commands: list[tuple[int, str]] | None,
) -> EpisodeSource:
    """The episode of the messages logged in [start, end), from each stream topic's `first` message there and
    its task topic's `commands` (read here when None)."""
    missing = [t for t in mapping.stream_topics if t not in first]
    if missing:
        raise SourceError(episode, path, f"topics {missing} have no message in the episode", "check the split rule")
    origin = min(time for time, _ in first.values())
    span = LogSpan(path, start, end, origin, mapping.time)
    timed = _commands(reader, mapping.task, span, episode) if commands is None else _timed(commands, origin)
    metadata: dict[str, Any] = {"mcap_file": Path(path).name, "mcap_start_ns": origin}
    if start is not None:
        metadata["mcap_span_ns"] = [start, end]
    if len({text for _, text in timed}) > 1:
        metadata["commands"] = [{"t": round(t, 6), "text": text} for t, text in timed[:MAX_COMMANDS_KEPT]]
    for stream, lowdim in mapping.lowdim.items():
        names = getattr(first[lowdim.topic][1], "name", None)
        if len(lowdim.fields) == 1 and isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            metadata[f"{stream}.names"] = list(names)
    unmapped = sorted(set(channels) - set(mapping.topics))
    if unmapped:
        metadata["mcap_unmapped_topics"] = unmapped
    return EpisodeSource(
        episode,
        task=timed[0][1] if timed else task,
        metadata=metadata,
        cameras=tuple(McapCameraSource(n, span, c.topic, c.fps) for n, c in mapping.cameras.items()),
        lowdim=tuple(
            McapLowdimSource(n, span, d.topic, d.fields, mapping.resample, _field_groups(mapping, d.topic))
            for n, d in mapping.lowdim.items()
        ),
    )


def _field_groups(mapping: TopicMap, topic: str) -> tuple[tuple[str, ...], ...]:
    return tuple(dict.fromkeys(d.fields for d in mapping.lowdim.values() if d.topic == topic))


def _first_messages(reader, mapping: TopicMap, path: str, episode: str, start, end) -> dict[str, tuple[int, Any]]:
    """The time and decoded message of each camera and low-dim topic's first message in [start, end)."""
    wanted = set(mapping.stream_topics)
    found: dict[str, tuple[int, Any]] = {}
    span = LogSpan(path, start, end, 0, mapping.time)
    try:
        for _schema, record, message, topic in _decoded_topics(reader, sorted(wanted), span):
            if topic in found:
                continue
            found[topic] = (message_time(record, message, mapping.time), message)
            if len(found) == len(wanted):
                break
    except MessageError as exc:  # (raised inside the reader's iteration: which topic's message is in `exc`)
        raise SourceError(episode, path, f"reading the first messages of topics {sorted(wanted)}: {exc}") from exc
    return found


def _span_contents(
    reader, mapping: TopicMap, spans: list[tuple[int | None, int | None]], path: str, name: str
) -> list[tuple[dict[str, tuple[int, Any]], list[tuple[int, str]]]]:
    """For every span of a split log, in one pass over it (a pass per span was quadratic in the markers): the
    first message of each stream topic (its time and decoded message) and the task topic's commands (time in
    ns, text). Only those messages are decoded; the others are only located."""
    starts = [-1 if start is None else start for start, _ in spans]
    wanted = set(mapping.stream_topics)
    task = mapping.task
    task_topic = task.topic if task is not None else None
    contents: list[tuple[dict, list]] = [({}, []) for _ in spans]
    decode = _MessageDecoder(reader)
    for schema, channel, record in _raw_messages(
        reader, sorted(wanted | {task_topic} - {None}), LogSpan(path, None, None, 0, "log")
    ):
        number = bisect.bisect_right(starts, record.log_time) - 1
        end = spans[number][1] if number >= 0 else None
        if number < 0 or (end is not None and record.log_time >= end):
            continue
        first, commands = contents[number]
        topic = channel.topic
        episode = f"{name}#{number}"
        try:
            if topic in wanted and topic not in first:
                message = decode(schema, channel, record)
                first[topic] = (message_time(record, message, mapping.time), message)
            if task is not None and topic == task_topic:
                message = decode(schema, channel, record)
                commands.append((message_time(record, message, mapping.time), log_messages.text(message, task.field)))
        except MessageError as exc:
            raise SourceError(episode, path, f"topic '{topic}': {exc}") from exc
    return contents


class _MessageDecoder:
    """Decodes single messages with the decoder of their channel (made once per channel); a bag's reader
    decodes its own."""

    def __init__(self, reader):
        self._factories = _decoder_factories() if not isinstance(reader, BagReader) else []
        self._decoders: dict[int, Callable[[bytes], Any]] = {}
        self._reader = reader

    def __call__(self, schema, channel, record) -> Any:
        if isinstance(self._reader, BagReader):
            return self._reader.decode(schema, channel, record)
        decoder = self._decoders.get(channel.id)
        if decoder is None:
            decoder = next(
                (d for f in self._factories if (d := f.decoder_for(channel.message_encoding, schema)) is not None), None
            )
            if decoder is None:
                raise MessageError(f"no decoder reads its {channel.message_encoding} messages")
            self._decoders[channel.id] = decoder
        return decoder(record.data)


def _timed(commands: list[tuple[int, str]], origin: int) -> list[tuple[float, str]]:
    return [(_seconds(time, origin), text) for time, text in commands]


def _commands(reader, task: TaskTopic | None, span: LogSpan, episode: str) -> list[tuple[float, str]]:
    if task is None:
        return []
    found = []
    for index, (_, record, message) in enumerate(_decoded(reader, task.topic, span)):
        try:
            found.append(
                (
                    _seconds(message_time(record, message, span.time), span.origin),
                    log_messages.text(message, task.field),
                )
            )
        except MessageError as exc:
            raise SourceError(episode, span.path, f"topic '{task.topic}', message {index}: {exc}") from exc
    return found


def default_topic_map(reader, channels: dict[str, Any], path: str, episode: str, options: TopicMap) -> TopicMap:
    """Every picture topic of 8-bit colour or grey pictures as a camera (named by its topic, `/` as `.`; depth
    and 16-bit topics are left out), the position / velocity / effort of every JointState topic that hold
    values, and a lone String topic as the task (unless `options` names one), with the other settings of
    `options` (time, resample, split)."""
    cameras, lowdim = {}, {}
    strings = []
    claimed: dict[str, str] = {}  # stream name -> the topic that gave it

    def claim(stream: str, topic: str) -> str:
        if stream in claimed:
            raise SourceError(
                episode,
                path,
                f"topics '{claimed[stream]}' and '{topic}' would both become stream '{stream}'",
                "write a topic map that names their streams and pass it with --topics (see docs/importers.md)",
            )
        claimed[stream] = topic
        return stream

    for topic, schema in sorted(channels.items()):
        if isinstance(schema, SourceError):
            continue  # a channel without its schema cannot be decoded; left out (and listed as unmapped)
        name = _stream_name(topic)
        kind = log_messages.schema_kind(schema)
        if kind != "other":
            first = next(_decoded(reader, topic, LogSpan(path, None, None, 0, "log")), None)
            if first is not None and log_messages.picture_problem(first[2], kind) is None:
                # depth and 16-bit pictures are left out (listed as unmapped)
                cameras[claim(name, topic)] = CameraTopic(topic)
        elif schema in JOINT_STATES:
            first = next(_decoded(reader, topic, LogSpan(path, None, None, 0, "log")), None)
            for field in JOINT_FIELDS:
                values = getattr(first[2], field, None) if first is not None else None
                if values is not None and len(values):  # (a list, or a numpy array from a bag)
                    lowdim[claim(f"{name}.{field}", topic)] = LowdimTopic(topic, (field,))
        elif schema in STRINGS:
            strings.append(topic)
    if not cameras and not lowdim:
        raise SourceError(
            episode,
            path,
            f"no topic of a kind mmdata maps by itself (pictures, JointState); it holds {sorted(channels.items())}",
            "write a topic map and pass it with --topics (see docs/importers.md)",
        )
    task = options.task or (TaskTopic(strings[0]) if len(strings) == 1 else None)
    return replace(options, cameras=cameras, lowdim=lowdim, task=task)


def _stream_name(topic: str) -> str:
    return ".".join(part for part in topic.split("/") if part) or "topic"


def _summary(reader, path: str, episode: str):
    summary = reader.get_summary()
    if summary is None:
        raise SourceError(episode, path, "the file has no summary section (no index of its messages)", RECOVER)
    if summary.chunk_indexes:
        _require_chunk_sizes(summary.chunk_indexes, path, episode)
    return summary


def _require_chunk_sizes(chunk_indexes, path: str, episode: str) -> None:
    """Refuse a chunk that declares, in its index or in its own header, more bytes decompressed than
    one chunk may hold: the reader would allocate that much before decompressing a byte."""
    with open(path, "rb") as handle:
        for chunk in chunk_indexes:
            handle.seek(chunk.chunk_start_offset + 1 + 8 + 16)
            header = handle.read(8)
            declared = struct.unpack("<Q", header)[0] if len(header) == 8 else -1
            if declared != chunk.uncompressed_size:
                raise SourceError(
                    episode,
                    path,
                    f"the chunk at byte {chunk.chunk_start_offset} declares {declared} bytes decompressed, its index"
                    f" {chunk.uncompressed_size}",
                    RECOVER,
                )
            if declared > MAX_ARRAY_CHUNK_BYTES:
                raise SourceError(
                    episode,
                    path,
                    f"the chunk at byte {chunk.chunk_start_offset} declares {declared} bytes decompressed, more than"
                    f" the {MAX_ARRAY_CHUNK_BYTES} allowed",
                    "check the file; it may be damaged",
                )


def _channels(summary, path: str, episode: str) -> dict[str, str | SourceError]:
    """Topic -> schema name, or why the channel's messages cannot be decoded (its schema is not in the file)."""
    found: dict[str, str | SourceError] = {}
    for channel in summary.channels.values():
        if channel.schema_id == 0 or channel.schema_id not in summary.schemas:
            what = (
                "no schema"
                if channel.schema_id == 0
                else f"schema id {channel.schema_id}, which the file does not hold"
            )
            found[channel.topic] = SourceError(
                episode,
                path,
                f"topic '{channel.topic}' ({channel.message_encoding}) has {what}; its messages cannot be decoded",
                "record it with its schema, or leave the topic out of the topic map",
            )
        else:
            found.setdefault(channel.topic, summary.schemas[channel.schema_id].name)
    return found


def _require_topics(mapping: TopicMap, channels: dict[str, Any], path: str, episode: str) -> None:
    topics = dict(mapping.topics)
    if mapping.split is not None and mapping.split.topic is not None:
        topics.setdefault(mapping.split.topic, "the episode split")
    for topic, use in topics.items():
        if topic not in channels:
            held = sorted(t for t in channels)
            raise SourceError(
                episode,
                path,
                f"topic '{topic}' ({use} in the topic map) is not in the file; it holds {held}",
                "fix the topic map, or pass --skip-bad to leave this file out",
            )
        if isinstance(channels[topic], SourceError):
            raise channels[topic]
    for name, camera in mapping.cameras.items():
        if log_messages.schema_kind(channels[camera.topic]) == "other":
            raise SourceError(
                episode,
                path,
                f"camera '{name}': topic '{camera.topic}' carries {channels[camera.topic]}, not pictures",
                f"cameras read {', '.join(log_messages.PICTURE_SCHEMAS)}",
            )
    for channel_topic, found in channels.items():
        if isinstance(found, SourceError) and channel_topic in topics:
            raise found


def _spans(reader, mapping: TopicMap, path: str, episode: str) -> list[tuple[int | None, int | None]]:
    split: EpisodeSplit | None = mapping.split
    if split is None:
        return [(None, None)]
    whole = LogSpan(path, None, None, 0, "log")
    if split.topic is not None:
        marks = [m.log_time for _, _, m in _raw_messages(reader, split.topic, whole)]
        if not marks:
            raise SourceError(episode, path, f"the split topic '{split.topic}' has no message")
        return [(a, b) for a, b in zip(marks, [*marks[1:], None])]
    times = np.asarray([m.log_time for _, _, m in _raw_messages(reader, mapping.stream_topics, whole)], dtype=np.int64)
    if len(times) == 0:
        raise SourceError(episode, path, "the mapped topics have no message")
    # spans meet right after each gap's first side, so what is logged in a gap (a command) opens the next episode
    gap = split.gap
    assert gap is not None, "a split names its topic or its gap"
    breaks = [int(times[b]) + 1 for b in np.flatnonzero(np.diff(times) > gap * 1e9)]
    return list(zip([None, *breaks], [*breaks, None]))


def _raw_messages(reader, topics, span: LogSpan) -> Iterator:
    return reader.iter_messages(topics=topics, starting_at=span.start, ending_before=span.end, log_time_order=True)


def _decoded(reader, topic: str, span: LogSpan) -> Iterator[tuple[Any, Any, Any]]:
    """(schema, message record, decoded message) of `topic` in the span, in log-time order."""
    for schema, record, message, _ in _decoded_topics(reader, [topic], span):
        yield schema, record, message


def _decoded_topics(reader, topics: list[str], span: LogSpan) -> Iterator[tuple[Any, Any, Any, str]]:
    for item in reader.iter_decoded_messages(
        topics=topics, starting_at=span.start, ending_before=span.end, log_time_order=True
    ):
        yield item.schema, item.message, item.decoded_message, item.channel.topic


@contextmanager
def _reading(path: str, episode: str, topic: str | None = None):
    """An MCAP reader of `path` with the ROS 2 and protobuf decoders; what the file's damage makes the
    library raise becomes a SourceError naming the file (and the topic being read)."""
    from mcap.exceptions import McapError
    from mcap.reader import make_reader

    where = f" while reading topic '{topic}'" if topic else ""
    if is_bag(path):
        with _reading_bag(path, episode, where) as reader:
            yield reader
        return
    try:
        with open(path, "rb") as handle:
            yield make_reader(handle, validate_crcs=True, decoder_factories=_decoder_factories())
    except SourceError:
        raise
    except MessageError as exc:
        raise SourceError(episode, path, f"a message{where}: {exc}") from exc
    except OSError as exc:
        raise SourceError(episode, path, f"cannot be read: {exc}") from exc
    except (McapError, struct.error, EOFError, KeyError, IndexError, ValueError, RuntimeError) as exc:
        raise SourceError(
            episode, path, f"not a readable MCAP log{where} ({type(exc).__name__}: {exc})", RECOVER
        ) from exc


@contextmanager
def _reading_bag(path: str, episode: str, where: str):
    """A bag's reader (`rosbag_log.BagReader`), with what its damage makes rosbags or SQLite raise while
    reading as a SourceError naming the bag."""
    reader = open_bag(path, episode)
    try:
        yield reader
    except (SourceError, GeneratorExit):
        raise
    except MessageError as exc:
        raise SourceError(episode, path, f"a message{where}: {exc}") from exc
    except Exception as exc:  # rosbags' ReaderError, sqlite3's DatabaseError, the decompressors' own errors
        raise SourceError(
            episode,
            path,
            f"not a readable ROS bag{where} ({type(exc).__name__}: {exc})",
            "re-index it (`rosbag reindex` for ROS 1, `ros2 bag reindex` for ROS 2), or pass --skip-bad",
        ) from exc
    finally:
        reader.close()


def _decoder_factories() -> list:
    from mcap_ros2.decoder import DecoderFactory as Ros2Decoders

    factories: list[Any] = [Ros2Decoders()]
    with suppress(ImportError):
        from mcap_protobuf.decoder import DecoderFactory as ProtobufDecoders

        factories.append(ProtobufDecoders())
    with suppress(ImportError):
        factories.append(Ros1Decoders())
    return factories


class Ros1Decoders:
    """ROS 1 messages (`ros1msg` schemas), decoded by mcap-ros1-support. Its genpy generates Python source from
    each schema's text and imports it, so a schema is first checked to hold only what a ROS 1 message
    definition holds: no backslash and no triple quote, which could end the generated string literal."""

    def __init__(self) -> None:
        from mcap_ros1.decoder import DecoderFactory

        self._factory = DecoderFactory()

    def decoder_for(self, message_encoding: str, schema: Any):
        if message_encoding != "ros1" or schema is None or schema.encoding != "ros1msg":
            return None
        text = bytes(schema.data).decode("utf-8", errors="replace")
        unsafe = next((mark for mark in ("\\", '"""', "\x00") if mark in text), None)
        if unsafe is not None or len(text) > MAX_ROS1_SCHEMA_CHARS:
            raise MessageError(
                f"ROS 1 schema '{schema.name}' is not a message definition mmdata reads"
                f" ({'it holds ' + repr(unsafe) if unsafe else f'over {MAX_ROS1_SCHEMA_CHARS} characters'})"
            )
        try:
            decode = self._factory.decoder_for(message_encoding, schema)
        except Exception as exc:  # genpy raises anything, SyntaxError included, on a definition it cannot parse
            raise MessageError(f"ROS 1 schema '{schema.name}' does not parse: {type(exc).__name__}: {exc}") from exc
        if decode is None:
            return None

        def decoded(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as exc:  # genpy's deserialisers raise struct, genpy and Unicode errors
                raise MessageError(f"a ROS 1 '{schema.name}' message does not decode: {exc}") from exc

        return decoded


def _require_mcap(root) -> None:
    try:
        import mcap.reader  # noqa: F401
        import mcap_ros2.decoder  # noqa: F401
    except ImportError as exc:
        raise SourceError.for_source(
            str(root), None, f"reading MCAP logs needs the mcap packages ({exc})", INSTALL
        ) from exc


def _seconds(time_ns: int, origin_ns: int) -> float:
    return (time_ns - origin_ns) / 1e9


def _size(picture) -> tuple[int, int]:
    """(width, height) of a decoded frame or an RGB array."""
    return (picture.width, picture.height) if hasattr(picture, "width") else (picture.shape[1], picture.shape[0])


def _same_size(picture, size: tuple[int, int] | None) -> tuple[int, int]:
    found = _size(picture)
    if size is not None and found != size:
        raise MessageError(f"a {found[0]}x{found[1]} picture where the topic's first is {size[0]}x{size[1]}")
    return found
