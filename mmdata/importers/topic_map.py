"""The topic map: which topics of a robot log (MCAP) become which streams of the store.

Written by the user as YAML or JSON (`mmdata convert --from mcap --topics map.yaml`):

    time: header              # message times: header stamps (default) or log times ("log")
    resample: 50              # optional: low-dim topics resampled to this rate (Hz)
    split: {gap: 2.0}         # optional: one file holds several episodes ({gap: s} or {topic: /name})
    cameras:
      front: /camera/front/compressed          # a topic, or {topic: ..., fps: 30}
    lowdim:
      observation.state: {topic: /joint_states, field: position}
      action: {topic: /cmd_vel, fields: [linear.x, linear.y, angular.z]}
    task: {topic: /command, field: data}       # a string topic; or just "/command"

Without `cameras:` and `lowdim:` (or without a map), `mcap_log.default_topic_map` picks the streams
from what each file holds, with the map's other settings (see docs/importers.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mmdata.checks import parse_json, shown, stream_name_problem
from mmdata.errors import OptionError, SourceError
from mmdata.importers.limits import MAX_METADATA_BYTES

TimeSource = Literal["header", "log"]
TIME_SOURCES = ("header", "log")
MAX_YAML_EVENTS = 100_000
MAX_RESAMPLE_HZ = 10_000.0  # low-dim topics resampled at most this often (control loops run at up to ~1 kHz)
CAMERA_FPS = (0.01, 1000.0)


@dataclass(frozen=True)
class CameraTopic:
    """A topic of images (compressed, raw) or video packets, stored as one camera."""

    topic: str
    fps: float | None = None


@dataclass(frozen=True)
class LowdimTopic:
    """Numeric fields of a topic's messages, concatenated into one low-dim row per message."""

    topic: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class TaskTopic:
    """A topic of text messages whose first message in an episode is its task."""

    topic: str
    field: str = "data"


@dataclass(frozen=True)
class EpisodeSplit:
    """How one file holds several episodes: a new one after `gap` seconds without a message on a
    mapped topic, or at every message of `topic`."""

    gap: float | None = None
    topic: str | None = None

    def __post_init__(self):
        if (self.gap is None) == (self.topic is None):
            raise OptionError("an episode split names one of gap= (seconds without a message) or topic=, not both")


@dataclass(frozen=True)
class TopicMap:
    cameras: dict[str, CameraTopic] = field(default_factory=dict)
    lowdim: dict[str, LowdimTopic] = field(default_factory=dict)
    task: TaskTopic | None = None
    time: TimeSource = "header"
    resample: float | None = None
    split: EpisodeSplit | None = None

    @property
    def maps_streams(self) -> bool:
        """Whether the map names streams; one that does not sets only options (time, resample, split,
        task) for the default streams of each file."""
        return bool(self.cameras or self.lowdim)

    @property
    def stream_topics(self) -> list[str]:
        """The topics of cameras and low-dim streams, in map order, each once."""
        return list(dict.fromkeys([c.topic for c in self.cameras.values()] + [d.topic for d in self.lowdim.values()]))

    @property
    def topics(self) -> dict[str, str]:
        """Every topic the map reads, with what it is read for (for messages)."""
        used = {c.topic: f"camera '{n}'" for n, c in self.cameras.items()}
        for name, lowdim in self.lowdim.items():
            used.setdefault(lowdim.topic, f"low-dim stream '{name}'")
        if self.task is not None:
            used.setdefault(self.task.topic, "the task")
        return used

    def with_resample(self, rate: float | None) -> TopicMap:
        return (
            self if rate is None else replace(self, resample=_positive(rate, "resample", "--resample", MAX_RESAMPLE_HZ))
        )


def load_topic_map(path: str | Path) -> TopicMap:
    """The topic map in the YAML or JSON file `path`; a mistake is an error naming the key."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _problem(where, f"cannot be read: {exc}") from exc
    if len(data) > MAX_METADATA_BYTES:
        raise _problem(where, f"is {len(data)} bytes, more than a topic map may be")
    try:
        document = parse_json(data) if where.endswith(".json") else _plain_yaml(data.decode("utf-8"), where)
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if where.endswith(".json") else "YAML"
        raise _problem(where, f"is not valid {kind}: {str(exc)[:300]}") from exc
    except ImportError as exc:
        raise _problem(
            where, "reading YAML needs PyYAML", "pip install 'mmdata[mcap]', or write the map as .json"
        ) from exc
    return topic_map_from_dict(document, where)


def _plain_yaml(text: str, where: str) -> Any:
    """A YAML document of plain mappings, lists and scalars. Anchors and aliases are refused (a kilobyte of
    nested aliases expands to gigabytes), and so are documents of more than MAX_YAML_EVENTS parts."""
    import yaml

    try:
        for count, event in enumerate(yaml.parse(text, Loader=yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ValueError("it uses anchors or aliases (&name, *name), which a topic map may not")
            if count > MAX_YAML_EVENTS:
                raise ValueError(f"it holds more than {MAX_YAML_EVENTS} keys and values")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def topic_map_from_dict(document: Any, where: str = "topic map") -> TopicMap:
    """A `TopicMap` from its plain form (what `load_topic_map` reads), checked key by key."""
    if not isinstance(document, dict):
        raise _problem(where, "is not a mapping of cameras, lowdim, task, time, resample, split")
    _known(document, {"cameras", "lowdim", "task", "time", "resample", "split"}, where, "")
    cameras = {
        _stream_name(name, where): _camera(entry, where, f"cameras.{name}")
        for name, entry in _mapping(document.get("cameras", {}), where, "cameras").items()
    }
    lowdim = {
        _stream_name(name, where): _lowdim(entry, where, f"lowdim.{name}")
        for name, entry in _mapping(document.get("lowdim", {}), where, "lowdim").items()
    }
    clash = sorted(set(cameras) & set(lowdim))
    if clash:
        raise _problem(where, f"names {clash} are both a camera and a low-dim stream")
    time = document.get("time", "header")
    if time not in TIME_SOURCES:
        raise _problem(where, f"time is '{time}', not one of {TIME_SOURCES}")
    resample = document.get("resample")
    return TopicMap(
        cameras=cameras,
        lowdim=lowdim,
        task=_task(document["task"], where) if document.get("task") is not None else None,
        time=time,
        resample=_positive(resample, "resample", where, MAX_RESAMPLE_HZ) if resample is not None else None,
        split=_split(document["split"], where) if document.get("split") is not None else None,
    )


def _camera(entry: Any, where: str, key: str) -> CameraTopic:
    if isinstance(entry, str):
        return CameraTopic(_topic(entry, where, key))
    entry = _mapping(entry, where, key)
    _known(entry, {"topic", "fps"}, where, key)
    fps = entry.get("fps")
    fps = _positive(fps, f"{key}.fps", where, CAMERA_FPS[1], CAMERA_FPS[0]) if fps is not None else None
    return CameraTopic(_topic(entry.get("topic"), where, key), fps)


def _lowdim(entry: Any, where: str, key: str) -> LowdimTopic:
    entry = _mapping(entry, where, key)
    _known(entry, {"topic", "field", "fields"}, where, key)
    if ("field" in entry) == ("fields" in entry):
        raise _problem(where, f"{key} needs one of field: (a message field) or fields: (a list of them)")
    fields = [entry["field"]] if "field" in entry else entry["fields"]
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields):
        raise _problem(
            where, f"{key}: fields are message field paths such as position or linear.x, not {shown(fields)}"
        )
    return LowdimTopic(_topic(entry.get("topic"), where, key), tuple(fields))


def _task(entry: Any, where: str) -> TaskTopic:
    if isinstance(entry, str):
        return TaskTopic(_topic(entry, where, "task"))
    entry = _mapping(entry, where, "task")
    _known(entry, {"topic", "field"}, where, "task")
    return TaskTopic(_topic(entry.get("topic"), where, "task"), str(entry.get("field", "data")))


def _split(entry: Any, where: str) -> EpisodeSplit:
    entry = _mapping(entry, where, "split")
    _known(entry, {"gap", "topic"}, where, "split")
    if ("gap" in entry) == ("topic" in entry):
        raise _problem(where, "split needs one of gap: (seconds) or topic: (a topic marking each episode's start)")
    if "gap" in entry:
        return EpisodeSplit(gap=_positive(entry["gap"], "split.gap", where))
    return EpisodeSplit(topic=_topic(entry["topic"], where, "split"))


def _mapping(value: Any, where: str, key: str) -> dict:
    if not isinstance(value, dict):
        raise _problem(where, f"{key} is a {type(value).__name__}, not a mapping")
    return value


def _known(entry: dict, allowed: set[str], where: str, key: str) -> None:
    unknown = sorted(k[:60] if isinstance(k, str) else shown(k) for k in entry if k not in allowed)
    if unknown:
        inside = f" in {key}" if key else ""
        raise _problem(where, f"unknown key {unknown[:5]}{inside}", f"the keys are {sorted(allowed)}")


def _topic(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise _problem(where, f"{key} needs a topic name, not {shown(value)}")
    return value


def _stream_name(name: Any, where: str) -> str:
    problem = stream_name_problem(name) if isinstance(name, str) else f"stream name {shown(name)} is not text"
    if problem is not None or name == "task":
        raise _problem(where, problem or "'task' is the task text's name, not a stream's")
    return name


def _positive(value: Any, key: str, where: str, high: float = math.inf, low: float = 0.0) -> float:
    """A number above `low` (0: positive) and at most `high`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        what = "a positive number" if low == 0 and high == math.inf else f"a number in ({low:g}, {high:g}]"
        raise _problem(where, f"{key} is {what}, not {shown(value)}")
    return float(value)


def _problem(where: str, problem: str, fix: str | None = None) -> SourceError:
    return SourceError.for_source(where, where, problem, fix or "see the topic map in docs/importers.md")
