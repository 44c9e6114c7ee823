"""ROS 1 `.bag` files and ROS 2 SQLite bags (a folder of `metadata.yaml` and `.db3` files), read with the
`rosbags` package (pure Python, no ROS), offered through the interface of the MCAP reader the log importer
uses (`mcap_log.py`): so a bag goes through the same topic map, time rules, message readers and refusals as
an MCAP log, and a topic map written for one works for the other.

Messages are decoded with the type definitions the bag carries (a ROS 1 bag always does; a ROS 2 bag from
Iron on), else with ROS 2 Humble's standard types. Before anything is decompressed, every chunk of a ROS 1
bag is checked to declare no more bytes than one chunk may hold and to lie inside the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmdata.errors import MessageError, SourceError
from mmdata.importers.limits import MAX_ARRAY_CHUNK_BYTES

INSTALL = "pip install 'mmdata[rosbag]'"
ROS2_METADATA = "metadata.yaml"
MESSAGE_ENCODING = "rosbags"


def is_bag(path: str | Path) -> bool:
    """Whether `path` is a ROS 1 bag file or a ROS 2 SQLite bag folder."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".bag"
    return path.is_dir() and (path / ROS2_METADATA).is_file() and any(path.glob("*.db3"))


def holds_bags(path: str | Path) -> bool:
    """Whether `path` is a bag or a folder holding some (for `--from auto`)."""
    path = Path(path)
    return is_bag(path) or (path.is_dir() and bool(bags_below(path)))


def bags_below(root: Path) -> list[Path]:
    """The bags of `root` (itself, or found below it), in path order; a ROS 2 bag folder is one bag."""
    if is_bag(root):
        return [root]
    found = [p for p in root.rglob("*.bag") if p.is_file()]
    found += [p.parent for p in root.rglob(ROS2_METADATA) if is_bag(p.parent)]
    return sorted(found)


@dataclass(frozen=True)
class BagSchema:
    id: int
    name: str
    encoding: str = "ros-msg"
    data: bytes = b""


@dataclass(frozen=True)
class BagChannel:
    id: int
    topic: str
    schema_id: int
    message_encoding: str = MESSAGE_ENCODING


@dataclass(frozen=True)
class BagRecord:
    """A message as the MCAP reader gives one: its log time (ns) and its bytes."""

    log_time: int
    data: bytes


@dataclass(frozen=True)
class BagSummary:
    channels: dict[int, BagChannel]
    schemas: dict[int, BagSchema]
    chunk_indexes: list = field(default_factory=list)  # (a bag's chunks are checked when it is opened)


@dataclass(frozen=True)
class DecodedMessage:
    schema: BagSchema
    channel: BagChannel
    message: BagRecord
    decoded_message: Any


class BagReader:
    """An open bag with the MCAP reader's methods that `mcap_log` calls (`get_summary`, `iter_messages`,
    `iter_decoded_messages`) and `decode` for single messages."""

    def __init__(self, path: str | Path):
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore

        self.path = Path(path)
        if self.path.is_file():
            _check_ros1_chunks(self.path)
        self._reader = AnyReader([self.path], default_typestore=get_typestore(Stores.ROS2_HUMBLE))
        self._reader.open()
        connections = self._reader.connections
        self._connections = {c.id: c for c in connections}
        names = sorted({c.msgtype for c in connections})
        self._schemas = {number + 1: BagSchema(number + 1, name) for number, name in enumerate(names)}
        schema_of = {schema.name: schema.id for schema in self._schemas.values()}
        self._channels = {c.id: BagChannel(c.id, c.topic, schema_of[c.msgtype]) for c in connections}

    def close(self) -> None:
        self._reader.close()

    def get_summary(self) -> BagSummary:
        return BagSummary(dict(self._channels), dict(self._schemas))

    def iter_messages(
        self,
        topics: str | list[str] | None = None,
        starting_at: int | None = None,
        ending_before: int | None = None,
        log_time_order: bool = True,
    ) -> Iterator[tuple[BagSchema, BagChannel, BagRecord]]:
        """(schema, channel, record) of the messages of `topics` logged in [starting_at, ending_before), in
        log-time order."""
        wanted = {topics} if isinstance(topics, str) else set(topics or [])
        chosen = [c for c in self._connections.values() if not wanted or c.topic in wanted]
        if not chosen:
            return
        for connection, time, data in self._reader.messages(chosen, start=starting_at, stop=ending_before):
            channel = self._channels[connection.id]
            yield self._schemas[channel.schema_id], channel, BagRecord(int(time), bytes(data))

    def iter_decoded_messages(
        self,
        topics: str | list[str] | None = None,
        starting_at: int | None = None,
        ending_before: int | None = None,
        log_time_order: bool = True,
    ) -> Iterator[DecodedMessage]:
        for schema, channel, record in self.iter_messages(topics, starting_at, ending_before, log_time_order):
            yield DecodedMessage(schema, channel, record, self.decode(schema, channel, record))

    def decode(self, schema: BagSchema, channel: BagChannel, record: BagRecord) -> Any:
        """The message of `record`, decoded by the type the bag defines for it; MessageError when it does not."""
        from rosbags.highlevel import AnyReaderError

        try:
            return self._reader.deserialize(record.data, schema.name)
        except (AnyReaderError, KeyError, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            defined = schema.name in self._reader.typestore.types
            why = "does not decode" if defined else "has a type the bag does not define"
            raise MessageError(
                f"a '{schema.name}' message on topic '{channel.topic}' {why} ({type(exc).__name__}: {exc})"
            ) from exc


def open_bag(path: str | Path, episode: str) -> BagReader:
    """A `BagReader` of `path`; a damaged or unreadable bag is a SourceError naming it."""
    try:
        from rosbags.highlevel import AnyReaderError
    except ImportError as exc:
        raise SourceError(episode, str(path), f"reading ROS bags needs the rosbags package ({exc})", INSTALL) from exc
    try:
        return BagReader(path)
    except SourceError:
        raise
    except (AnyReaderError, OSError, KeyError, ValueError, IndexError, AssertionError, EOFError) as exc:
        raise SourceError(
            episode, str(path), f"not a readable ROS bag ({type(exc).__name__}: {exc})", _fix(exc)
        ) from exc
    except Exception as exc:  # sqlite3 and the decompressors raise their own types on damaged bytes
        raise SourceError(episode, str(path), f"not a readable ROS bag ({type(exc).__name__}: {exc})") from exc


def _fix(error: Exception) -> str:
    """What to do about a bag rosbags refuses: its message definitions, or its index and records."""
    text = str(error)
    if "unknown" in text or "hash mismatch" in text or "definition" in text:
        return "record the bag with complete message definitions (or leave that topic out of it), or pass --skip-bad"
    return "re-index it (`rosbag reindex` for ROS 1, `ros2 bag reindex` for ROS 2), or pass --skip-bad"


def _check_ros1_chunks(path: Path) -> None:
    """Refuse a ROS 1 bag whose chunk records declare more bytes (compressed in the file, or decompressed)
    than one chunk may hold, or more than the file holds: a reader would allocate that much first."""
    from rosbags.rosbag1.reader import Header, Reader, RecordType

    size = os.path.getsize(path)
    with Reader(path) as reader:
        positions = [info.pos for info in reader.chunk_infos]
        with path.open("rb") as handle:
            for position in positions:
                handle.seek(position)
                header = Header.read(handle, RecordType.CHUNK)
                declared = header.get_uint32("size")
                stored = int.from_bytes(handle.read(4), "little")
                if declared > MAX_ARRAY_CHUNK_BYTES or handle.tell() + stored > size:
                    raise ValueError(
                        f"the chunk at byte {position} declares {declared} bytes decompressed and {stored} stored"
                        f" ({size - handle.tell()} left in the file; at most {MAX_ARRAY_CHUNK_BYTES} decompressed)"
                    )
