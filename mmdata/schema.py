"""The episode schema: which streams a dataset holds and how each is stored (`dataset.json`).

Every stream lives on one clock, in seconds from the start of its episode.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mmdata.errors import StoreError

FORMAT_NAME = "mmdata"
FORMAT_VERSION = 1
Layout = Literal["wds", "zarr"]


@dataclass(frozen=True)
class VideoStream:
    """One camera, stored as closed-GOP segments of `segment_frames` frames."""

    name: str
    fps: float
    width: int
    height: int
    codec: str
    segment_frames: int
    gop: int
    pix_fmt: str = "yuv420p"
    crf: int | None = None
    kind: Literal["video"] = "video"


@dataclass(frozen=True)
class AudioStream:
    """One audio track: FLAC (lossless, integer samples) or Opus (kept as recorded)."""

    name: str
    sample_rate: int
    channels: int
    codec: str
    sample_dtype: str
    kind: Literal["audio"] = "audio"


@dataclass(frozen=True)
class LowdimStream:
    """A numeric stream `[T, *shape]` (proprioception, actions, ...).

    `rate` is set when every episode samples the stream at that fixed rate; `None` means the
    stream has explicit, possibly irregular timestamps. Timestamps are stored in either case.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    rate: float | None
    kind: Literal["lowdim"] = "lowdim"


@dataclass(frozen=True)
class TextStream:
    """The task description of each episode."""

    name: str = "task"
    kind: Literal["text"] = "text"


Stream = VideoStream | AudioStream | LowdimStream | TextStream
_KINDS = {"video": VideoStream, "audio": AudioStream, "lowdim": LowdimStream, "text": TextStream}


@dataclass
class DatasetSchema:
    """What `dataset.json` holds: the layout, the streams and how the store was made."""

    layout: Layout
    streams: list[Stream]
    num_episodes: int = 0
    created: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def stream(self, name: str) -> Stream:
        for stream in self.streams:
            if stream.name == name:
                return stream
        known = ", ".join(s.name for s in self.streams)
        raise KeyError(f"no stream named '{name}' in this dataset (streams: {known})")

    def of_kind(self, kind: str) -> list[Stream]:
        return [s for s in self.streams if s.kind == kind]

    def to_json(self) -> str:
        document = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "layout": self.layout,
            "num_episodes": self.num_episodes,
            "streams": [stream_to_dict(s) for s in self.streams],
            "created": self.created,
        }
        return json.dumps(document, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "dataset.json") -> DatasetSchema:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StoreError(f"{where} is not valid JSON: {exc}") from exc
        if document.get("format") != FORMAT_NAME:
            raise StoreError(f'{where} does not describe an mmdata store (no "format": "mmdata")')
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreError(
                f"{where} has format version {version}; this mmdata reads version {FORMAT_VERSION}"
                " (upgrade mmdata, or re-run `mmdata convert` with this version)"
            )
        streams = [stream_from_dict(entry) for entry in document["streams"]]
        return cls(
            layout=document["layout"],
            streams=streams,
            num_episodes=document.get("num_episodes", 0),
            created=document.get("created", {}),
            format_version=version,
        )


def stream_to_dict(stream: Stream) -> dict[str, Any]:
    return asdict(stream)


def stream_from_dict(entry: dict[str, Any]) -> Stream:
    entry = dict(entry)
    kind_type = _KINDS[entry["kind"]]
    if kind_type is LowdimStream:
        entry["shape"] = tuple(entry["shape"])
    return kind_type(**entry)
