"""The episode schema: which streams a dataset holds and how each is stored (`dataset.json`).

Every stream lives on one clock, in seconds from the start of its episode.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

from mmdata.checks import as_int, as_number, parse_json, stream_name_problem
from mmdata.errors import StoreError

FORMAT_NAME = "mmdata"
FORMAT_VERSION = 1
Layout = Literal["wds", "zarr"]
LAYOUTS = ("wds", "zarr")

# What a store may declare; anything outside is refused when the store is opened, so that no
# declared size can make a reader allocate more than the data it holds could justify.
VIDEO_CODEC_NAMES = frozenset({"h264", "hevc", "vp9", "vp8", "av1", "mjpeg", "mpeg4"})
PIXEL_FORMATS = ("yuv420p",)
AUDIO_CODEC_NAMES = ("flac", "opus")
AUDIO_SAMPLE_DTYPES = ("int16", "int32", "float32")
LOWDIM_DTYPES: tuple[str, ...] = ("bool", "float16", "float32", "float64")
LOWDIM_DTYPES += tuple(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64))
MAX_FRAME_SIDE = 8192
MAX_SEGMENT_FRAMES = 4096
MAX_RATE = 1_000_000.0
MAX_AUDIO_RATE = 768_000
MAX_AUDIO_CHANNELS = 64
MAX_LOWDIM_RANK = 8
MAX_LOWDIM_ELEMENTS = 1 << 20
# Streams per store: far above any robot's sensors, low enough that every per-stream pass over a store's
# metadata (and the manifest's columns, three or more per stream) stays quick.
MAX_STREAMS = 4096
DEFAULT_MANIFEST_FILE = "episodes.parquet"
DEFAULT_STATS_FILE = "stats.json"
# A version's files: the defaults, or the names an append gives them (no folders: a name cannot point outside)
# A version's manifest and statistics: version 0's plain names, a later version's numbered, with its writer's tag
# (`store.versions`: concurrent writers of one version never write the same file).
_VERSION_FILE = re.compile(r"(episodes|stats)(?:-(\d{6,})(?:-([0-9a-f]{8}))?)?\.(parquet|json)")
MAX_HISTORY = 100_000
# The stores whose media a split or merged store's rows name: paths relative to the store, of plain folder names
MAX_ORIGINS = 1024
_ORIGIN = re.compile(r"(\.\./)+([A-Za-z0-9_][A-Za-z0-9_ .=+,@~-]*/)*[A-Za-z0-9_][A-Za-z0-9_ .=+,@~-]*")
EDITS = ("delete", "keep", "remove-stream", "add-stream", "split", "merge")
DERIVING = ("split", "merge")  # edits that make a new store rather than a store's next version
_DOCUMENT_FIELDS = {
    "format",
    "format_version",
    "layout",
    "num_episodes",
    "streams",
    "created",
    "manifest",
    "stats",
    "history",
    "origins",
    "stream_origins",
}


@dataclass(frozen=True)
class VideoStream:
    """One camera, stored as closed-GOP segments of `segment_frames` frames.

    `width` x `height` is the camera's own size, which readers deliver. 4:2:0 video needs even sides, so a
    camera with an odd side is stored one pixel wider or taller (its last column or row repeated):
    `coded_size`, which decoders check and cut back.
    """

    name: str
    fps: float
    width: int
    height: int
    codec: str
    segment_frames: int
    gop: int
    pix_fmt: str = "yuv420p"
    crf: float | None = None
    kind: Literal["video"] = "video"

    @property
    def coded_size(self) -> tuple[int, int]:
        """(width, height) of the stored frames: the camera's, each side rounded up to even."""
        return self.width + self.width % 2, self.height + self.height % 2


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
_Kind = TypeVar("_Kind", VideoStream, AudioStream, LowdimStream, TextStream)
_KINDS = {"video": VideoStream, "audio": AudioStream, "lowdim": LowdimStream, "text": TextStream}


@dataclass
class DatasetSchema:
    """What `dataset.json` holds: the layout, the streams, how the store was made, and which manifest and
    statistics files are this version's (an append writes new ones under new names, then replaces
    `dataset.json`, so a reader sees one version whole; `history` lists the appends)."""

    layout: Layout
    streams: list[Stream]
    num_episodes: int = 0
    created: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    manifest_file: str = DEFAULT_MANIFEST_FILE
    stats_file: str = DEFAULT_STATS_FILE
    history: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    # Streams added from another store (`mmdata edit add-stream`): each one's pieces lie in that store, named as
    # `origins` are (relative to this store), in every row, whatever the row's own origin.
    stream_origins: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> int:
        """How many appends and edits made this version of the store (0: as converted)."""
        return len(self.history)

    def stream(self, name: str) -> Stream:
        for stream in self.streams:
            if stream.name == name:
                return stream
        known = ", ".join(s.name for s in self.streams)
        raise KeyError(f"no stream named '{name}' in this dataset (streams: {known})")

    def video(self, name: str) -> VideoStream:
        """The video stream `name` (KeyError when there is none, or it is of another kind)."""
        return self._stream_of(name, VideoStream)

    def audio(self, name: str) -> AudioStream:
        """The audio stream `name` (KeyError when there is none, or it is of another kind)."""
        return self._stream_of(name, AudioStream)

    def lowdim(self, name: str) -> LowdimStream:
        """The low-dim stream `name` (KeyError when there is none, or it is of another kind)."""
        return self._stream_of(name, LowdimStream)

    def _stream_of(self, name: str, kind: type[_Kind]) -> _Kind:
        stream = self.stream(name)
        if not isinstance(stream, kind):
            raise KeyError(f"stream '{name}' of this dataset is a {stream.kind} stream, not a {kind.kind} stream")
        return stream

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
        if self.history:  # (a store never appended to keeps the dataset.json it always had)
            document.update(manifest=self.manifest_file, stats=self.stats_file, history=self.history)
        if self.origins:
            document["origins"] = self.origins
        if self.stream_origins:
            document["stream_origins"] = self.stream_origins
        return json.dumps(document, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "dataset.json") -> DatasetSchema:
        """Parse and check a `dataset.json` document; anything malformed is a StoreError naming `where`."""
        try:
            document = parse_json(text)
        except ValueError as exc:
            raise StoreError(f"{where} {exc}; restore it or convert the store again") from exc
        if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
            raise StoreError(f'{where} does not describe an mmdata store (no "format": "mmdata")')
        version = document.get("format_version")
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise StoreError(
                f"{where} has format version {version!r}; this mmdata reads version {FORMAT_VERSION}"
                " (upgrade mmdata, or re-run `mmdata convert` with this version)"
            )
        try:
            unknown = sorted(set(document) - _DOCUMENT_FIELDS)
            if unknown:
                raise ValueError(f"it has fields {unknown} that no mmdata store writes")
            layout = document.get("layout")
            if layout not in LAYOUTS:
                raise ValueError(f"layout is {layout!r}, not one of {', '.join(LAYOUTS)}")
            entries = document.get("streams")
            if not isinstance(entries, list) or not entries:
                raise ValueError("'streams' is not a non-empty list")
            if len(entries) > MAX_STREAMS:
                raise ValueError(f"it lists {len(entries)} streams; a store holds at most {MAX_STREAMS}")
            streams = [stream_from_dict(entry) for entry in entries]
            counts = Counter(stream.name for stream in streams)
            repeated = sorted(name for name, count in counts.items() if count > 1)
            if repeated:
                raise ValueError(f"stream names {repeated} appear more than once")
            created = document.get("created", {})
            if not isinstance(created, dict):
                raise ValueError("'created' is not an object")
            num_episodes = as_int(document.get("num_episodes"), "num_episodes", 0)
            manifest_file = _version_file(document.get("manifest", DEFAULT_MANIFEST_FILE), "manifest", ".parquet")
            stats_file = _version_file(document.get("stats", DEFAULT_STATS_FILE), "stats", ".json")
            history = _checked_history(document.get("history", []))
            origins = _checked_origins(document.get("origins", []))
            stream_origins = _checked_stream_origins(document.get("stream_origins", {}), streams)
        except ValueError as exc:
            raise StoreError(f"{where}: {exc}; restore it or convert the store again") from exc
        return cls(
            layout=layout,
            streams=streams,
            num_episodes=num_episodes,
            created=created,
            format_version=version,
            manifest_file=manifest_file,
            stats_file=stats_file,
            history=history,
            origins=origins,
            stream_origins=stream_origins,
        )

    def media_stores(self) -> list[str]:
        """Every store this one reads media from besides itself: its rows' origins and its streams'."""
        return sorted({*self.origins, *self.stream_origins.values()})


def version_file_name(stem: str, version: int, tag: str = "") -> str:
    """The manifest ("episodes") or statistics ("stats") file of store version `version`, written by the writer
    `tag` names (8 hexadecimal digits; none for the names of stores written before writers were tagged)."""
    suffix = ".parquet" if stem == "episodes" else ".json"
    if version == 0:
        return f"{stem}{suffix}"
    return f"{stem}-{version:06d}{f'-{tag}' if tag else ''}{suffix}"


def version_of_file(name: str) -> int | None:
    """The store version whose manifest or statistics file is named `name` (`version_file_name`); None for any
    other name."""
    match = _VERSION_FILE.fullmatch(name)
    if match is None or not name.endswith(".parquet" if match.group(1) == "episodes" else ".json"):
        return None
    return int(match.group(2) or 0)


def _version_file(name: Any, field_name: str, suffix: str) -> str:
    if not isinstance(name, str) or not _VERSION_FILE.fullmatch(name) or not name.endswith(suffix):
        raise ValueError(f"'{field_name}' is {name!r}, not a file name of the form a store version uses")
    return name


def _checked_history(history: Any) -> list[dict[str, Any]]:
    """The appends and edits `dataset.json` lists: each with its time, episode count, first episode and source
    (an edit: also what it did and the episodes before it)."""
    if not isinstance(history, list) or len(history) > MAX_HISTORY:
        raise ValueError(f"'history' is not a list of at most {MAX_HISTORY} entries")
    for entry in history:
        if not isinstance(entry, dict):
            raise ValueError("a 'history' entry is not an object")
        as_int(entry.get("episodes"), "a history entry's episodes", 0)
        as_int(entry.get("first_episode"), "a history entry's first_episode", 0)
        if not isinstance(entry.get("time"), str) or not isinstance(entry.get("source"), str):
            raise ValueError("a 'history' entry lacks its time or source text")
        if "edit" in entry or "episodes_before" in entry:  # an edit's (`mmdata edit`)
            if entry.get("edit") not in EDITS:
                raise ValueError(f"a 'history' entry's edit is {entry.get('edit')!r}, not one of {', '.join(EDITS)}")
            as_int(entry.get("episodes_before"), "a history entry's episodes_before", 0)
    return history


def is_origin(path: Any) -> bool:
    """Whether `path` can name a split or merged store's origin: `../` at least once, then plain folder names."""
    return isinstance(path, str) and _ORIGIN.fullmatch(path) is not None


def _checked_origins(origins: Any) -> list[str]:
    """The stores a split or merged store reads media from: distinct paths relative to the store that climb out
    of it (`../name`), never into it, never absolute or another protocol."""
    if not isinstance(origins, list) or len(origins) > MAX_ORIGINS:
        raise ValueError(f"'origins' is not a list of at most {MAX_ORIGINS} paths")
    for origin in origins:
        if not is_origin(origin):
            raise ValueError(f"an origin is {origin!r:.80}, not a path like ../store relative to this store")
    if len(set(origins)) != len(origins):
        raise ValueError("'origins' names a store twice")
    return origins


def _checked_stream_origins(stream_origins: Any, streams: list[Stream]) -> dict[str, str]:
    """The streams added from other stores, each to the store holding its pieces (a path as `origins` holds)."""
    if not isinstance(stream_origins, dict) or len(stream_origins) > MAX_ORIGINS:
        raise ValueError(f"'stream_origins' is not an object of at most {MAX_ORIGINS} streams")
    media = {stream.name for stream in streams if stream.kind != "text"}
    for name, origin in stream_origins.items():
        if name not in media:
            raise ValueError(f"'stream_origins' names {name!r:.80}, which is not one of its streams with media")
        if not is_origin(origin):
            raise ValueError(f"stream {name!r}'s origin is {origin!r:.80}, not a path like ../store")
    return dict(stream_origins)


def stream_to_dict(stream: Stream) -> dict[str, Any]:
    return asdict(stream)


def stream_from_dict(entry: Any) -> Stream:
    """A stream spec from its JSON form, every field checked; raises ValueError saying what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError(f"a stream entry is {type(entry).__name__}, not an object")
    kind = entry.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"stream kind {kind!r} is not one of {', '.join(_KINDS)}")
    kind_type = _KINDS[kind]
    known = {f.name for f in fields(kind_type)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"{kind} stream has unknown fields {unknown}")
    missing = sorted(f.name for f in fields(kind_type) if f.name not in entry and f.default is MISSING)
    if missing:
        raise ValueError(f"{kind} stream lacks fields {missing}")
    problem = stream_name_problem(entry.get("name", "task"))
    if problem is not None:
        raise ValueError(problem)
    return _STREAM_CHECKS[kind](dict(entry))


def _video(entry: dict[str, Any]) -> VideoStream:
    where = f"video stream '{entry['name']}'"
    segment_frames = as_int(entry["segment_frames"], f"{where}: segment_frames", 1, MAX_SEGMENT_FRAMES)
    codec = entry["codec"]
    if codec not in VIDEO_CODEC_NAMES:
        raise ValueError(f"{where}: codec {codec!r} is not one of {', '.join(sorted(VIDEO_CODEC_NAMES))}")
    pix_fmt = entry.get("pix_fmt", "yuv420p")
    if pix_fmt not in PIXEL_FORMATS:
        raise ValueError(f"{where}: pix_fmt {pix_fmt!r} is not one of {', '.join(PIXEL_FORMATS)}")
    crf = entry.get("crf")
    return VideoStream(
        name=entry["name"],
        fps=as_number(entry["fps"], f"{where}: fps", high=MAX_RATE, positive=True),
        width=as_int(entry["width"], f"{where}: width", 1, MAX_FRAME_SIDE),
        height=as_int(entry["height"], f"{where}: height", 1, MAX_FRAME_SIDE),
        codec=codec,
        segment_frames=segment_frames,
        gop=as_int(entry["gop"], f"{where}: gop", 1, segment_frames),
        pix_fmt=pix_fmt,
        crf=None if crf is None else _crf(crf, f"{where}: crf"),
    )


def _crf(value: Any, what: str) -> float:
    """A stored constant rate factor: a whole number (all that stores written before issue 41 hold) or a fraction
    (x264, x265)."""
    number = as_number(value, what, 0, 63)
    return int(number) if number == int(number) else number


def _audio(entry: dict[str, Any]) -> AudioStream:
    where = f"audio stream '{entry['name']}'"
    if entry["codec"] not in AUDIO_CODEC_NAMES:
        raise ValueError(f"{where}: codec {entry['codec']!r} is not one of {', '.join(AUDIO_CODEC_NAMES)}")
    if entry["sample_dtype"] not in AUDIO_SAMPLE_DTYPES:
        raise ValueError(f"{where}: sample_dtype {entry['sample_dtype']!r} is not one of {AUDIO_SAMPLE_DTYPES}")
    return AudioStream(
        name=entry["name"],
        sample_rate=as_int(entry["sample_rate"], f"{where}: sample_rate", 1, MAX_AUDIO_RATE),
        channels=as_int(entry["channels"], f"{where}: channels", 1, MAX_AUDIO_CHANNELS),
        codec=entry["codec"],
        sample_dtype=entry["sample_dtype"],
    )


def _lowdim(entry: dict[str, Any]) -> LowdimStream:
    where = f"low-dim stream '{entry['name']}'"
    shape = entry["shape"]
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_LOWDIM_RANK:
        raise ValueError(f"{where}: shape {shape!r} is not a list of at most {MAX_LOWDIM_RANK} sizes")
    shape = tuple(as_int(size, f"{where}: shape", 0, MAX_LOWDIM_ELEMENTS) for size in shape)
    if math.prod(shape) > MAX_LOWDIM_ELEMENTS:
        raise ValueError(f"{where}: shape {shape} holds more than {MAX_LOWDIM_ELEMENTS} values per row")
    if entry["dtype"] not in LOWDIM_DTYPES:
        raise ValueError(f"{where}: dtype {entry['dtype']!r} is not one of {', '.join(LOWDIM_DTYPES)}")
    rate = entry["rate"]
    return LowdimStream(
        name=entry["name"],
        shape=shape,
        dtype=entry["dtype"],
        rate=None if rate is None else as_number(rate, f"{where}: rate", high=MAX_RATE, positive=True),
    )


def _text(entry: dict[str, Any]) -> TextStream:
    return TextStream(name=entry.get("name", "task"))


_STREAM_CHECKS: dict[str, Callable[[dict[str, Any]], Stream]] = {
    "video": _video,
    "audio": _audio,
    "lowdim": _lowdim,
    "text": _text,
}
