"""What a training sample is: `Windows` around anchor times, or `Sequences` of whole episodes.

A spec names streams of the store and says, per stream, which times to read: `Frames` of a
camera, `Values` of a low-dim stream, an `Audio` range. Specs are plain, frozen, picklable
values; `check_against(schema)` rejects, before anything is read, a stream that does not exist,
a stream of the wrong kind, and offsets denser than the stream was recorded at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mmdata import checks
from mmdata.codecs.align import INTERPOLATIONS, Interpolation
from mmdata.codecs.geometry import INTERPOLATIONS as RESIZE_INTERPOLATIONS
from mmdata.codecs.geometry import RESIZE_MODES, Crop, ResizeMode
from mmdata.codecs.geometry import Interpolation as ResizeInterpolation
from mmdata.errors import SpecError
from mmdata.schema import (
    MAX_AUDIO_RATE,
    MAX_FRAME_SIDE,
    MAX_RATE,
    AudioStream,
    DatasetSchema,
    LowdimStream,
    VideoStream,
)
from mmdata.store.manifest_checks import MAX_EPISODE_SECONDS


@dataclass(frozen=True)
class Resize:
    """Frames delivered at `size` (height, width) instead of as stored, scaled inside the decode.

    `mode`: "stretch" fills `size`, "shorter_side" scales the shorter side to fit and keeps the
    centre (a centre crop), "pad" fits the whole frame and letterboxes it with black.
    `crop="random"` first takes a box as torchvision's RandomResizedCrop does (area share in
    `scale`, aspect ratio in `ratio`), drawn from (seed, epoch, sample, camera), so a resumed run
    and any worker count see the same crops; `mode` then maps that box to `size`.
    `interpolation`: "area" (box filter), "bilinear" or "bicubic", antialiased when scaling down.
    A crop lies on even pixels (4:2:0 chroma), so each edge may be up to one source pixel from an exact centre
    crop's (see docs/training-batches.md, "Accuracy").
    """

    size: tuple[int, int]
    mode: ResizeMode = "shorter_side"
    interpolation: ResizeInterpolation = "area"
    crop: Crop = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self):
        size = option_pair(self.size, "resize size (height, width)")
        height, width = (option_int(x, "resize size (height, width)", 1, MAX_FRAME_SIDE) for x in size)
        object.__setattr__(self, "size", (height, width))
        if self.mode not in RESIZE_MODES:
            raise SpecError(f"resize mode '{self.mode}' is not one of {', '.join(RESIZE_MODES)}")
        if self.interpolation not in RESIZE_INTERPOLATIONS:
            raise SpecError(f"interpolation '{self.interpolation}' is not one of {', '.join(RESIZE_INTERPOLATIONS)}")
        if self.crop not in (None, "random"):
            raise SpecError(f"crop is None or 'random', not '{self.crop}' (a centre crop is mode='shorter_side')")
        scale = tuple(option_number(x, "crop scale", 0.0, 1e4) for x in option_pair(self.scale, "crop scale"))
        ratio = tuple(option_number(x, "crop ratio", 0.0, 1e4) for x in option_pair(self.ratio, "crop ratio"))
        if not 0 < scale[0] <= scale[1] <= 1:
            raise SpecError(f"crop scale is a range inside (0, 1], not {self.scale}")
        if not 0 < ratio[0] <= ratio[1]:
            raise SpecError(f"crop ratio is a positive range (low, high) up to 10000, not {self.ratio}")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)


FrameType = Literal["uint8", "float32"]
FRAME_TYPES = ("uint8", "float32")


@dataclass(frozen=True)
class Frames:
    """Frames of a camera at `offsets` seconds from the anchor (`Windows`), or at the sequence rate.

    Each time takes the frame with the nearest timestamp, within `tolerance` seconds (default:
    half a frame period of the camera). Frames come as uint8 `[.., H, W, 3]`, or `[.., 3, H, W]`
    with `channels_first`; `resize` delivers them at the model's resolution (see `Resize`). `dtype="float32"`
    delivers them in [0, 1], each value divided by 255 in float32 (as LeRobot and torchvision divide them),
    in the same pass that gathers them into the batch (4x the bytes of uint8 cross from the workers: for a
    batch that goes to a GPU, uint8 converted there costs less).
    """

    offsets: Sequence[float] = (0.0,)  # (kept as a tuple)
    tolerance: float | None = None
    resize: Resize | None = None
    channels_first: bool = False
    dtype: FrameType = "uint8"

    def __post_init__(self):
        object.__setattr__(self, "offsets", _offsets(self.offsets))
        if self.tolerance is not None:
            object.__setattr__(self, "tolerance", _seconds(self.tolerance, "tolerance", 0.0))
        if self.resize is not None and not isinstance(self.resize, Resize):
            raise SpecError(f"resize takes mmdata.Resize(size=(H, W), ...), not {type(self.resize).__name__}")
        if self.dtype not in FRAME_TYPES:
            raise SpecError(f"a camera's dtype is 'uint8' or 'float32' (in [0, 1]), not {self.dtype!r:.40}")


Normalization = Literal["mean_std", "min_max", "quantile"]
NORMALIZATIONS = ("mean_std", "min_max", "quantile")


@dataclass(frozen=True)
class Values:
    """A low-dim stream at `offsets` seconds from the anchor, or at `rate` Hz over a sequence.

    `interpolation` is "nearest", "previous" (zero-order hold) or "linear"; only "linear" may ask
    for values denser than the stream was recorded at. `normalize` scales values (as float32) by
    the store's `stats.json` (`mmdata stats`): "mean_std" to (x - mean) / std, "min_max" maps
    [min, max] to [-1, 1], "quantile" maps [q01, q99] to [-1, 1] (LeRobot's conventions).
    `pad_to` pads a one-dimensional stream with zeros up to that width (sources of a mixture with
    other widths), marking the padded dimensions in `<stream>_dim_is_pad` `[B, pad_to]`.
    """

    offsets: Sequence[float] = (0.0,)  # (kept as a tuple)
    interpolation: Interpolation = "nearest"
    rate: float | None = None
    normalize: Normalization | None = None
    pad_to: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "offsets", _offsets(self.offsets))
        if self.rate is not None:
            object.__setattr__(self, "rate", _rate(self.rate, "rate"))
        if self.interpolation not in INTERPOLATIONS:
            raise SpecError(f"interpolation '{self.interpolation}' is not one of {', '.join(INTERPOLATIONS)}")
        if self.normalize is not None and self.normalize not in NORMALIZATIONS:
            raise SpecError(f"normalize '{self.normalize}' is not one of {', '.join(NORMALIZATIONS)}")
        if self.pad_to is not None and not (isinstance(self.pad_to, int) and self.pad_to >= 1):
            raise SpecError(f"pad_to is a width of at least 1, not {self.pad_to!r}")


@dataclass(frozen=True)
class Audio:
    """Audio samples in [anchor + window[0], anchor + window[1]) seconds (or the whole sequence).

    Samples come as float32 in [-1, 1]; `sample_rate` resamples and `mono` downmixes after
    cutting; samples outside the recording are silence, flagged in the `_is_pad` mask.
    """

    window: tuple[float, float] = (-1.0, 0.0)
    sample_rate: int | None = None
    mono: bool = False

    def __post_init__(self):
        low, high = (_seconds(x, "an audio window's end") for x in self.window)
        if not high > low:
            raise SpecError(f"audio window {self.window} must end after it starts")
        object.__setattr__(self, "window", (low, high))
        if self.sample_rate is not None and not (
            isinstance(self.sample_rate, int) and 0 < self.sample_rate <= MAX_AUDIO_RATE
        ):
            raise SpecError(f"sample_rate is a whole number of Hz up to {MAX_AUDIO_RATE}, not {self.sample_rate!r}")


StreamSpec = Frames | Values | Audio


@dataclass(frozen=True)
class Windows:
    """One sample per anchor time: every episode is visited at `anchor_fps` anchors per second.

    Each stream is read at its offsets around the anchor (history frames, a future action chunk,
    an audio range). Anchors lie in [0, duration) of the episode; what a window needs from beyond
    an episode's edge is clamped to it and flagged in `<stream>_is_pad`, as LeRobot does.
    """

    anchor_fps: float
    streams: Mapping[str, StreamSpec]

    def __post_init__(self):
        object.__setattr__(self, "anchor_fps", _rate(self.anchor_fps, "anchor_fps"))
        object.__setattr__(self, "streams", _streams(self.streams))

    def describe(self) -> dict:
        return {"kind": "windows", "anchor_fps": self.anchor_fps, "streams": _describe(self.streams)}

    def check_against(self, schema: DatasetSchema) -> None:
        for name, stream in self.streams.items():
            _check_stream(schema, name, stream, np.diff(stream.offsets) if hasattr(stream, "offsets") else None)


@dataclass(frozen=True)
class Sequences:
    """Whole episodes, or consecutive chunks of at most `max_seconds`, for world models.

    Cameras and low-dim streams are read on a grid of `fps` per second from the chunk's start
    (a `Values(rate=...)` keeps its own rate; offsets are not used here), audio over the whole
    chunk. Chunks shorter than `min_seconds` (an episode's tail) are left out.
    """

    fps: float
    streams: Mapping[str, StreamSpec]
    max_seconds: float | None = None
    min_seconds: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "fps", _rate(self.fps, "fps"))
        if self.max_seconds is not None and not _seconds(self.max_seconds, "max_seconds", 0.0) > 0:
            raise SpecError(f"max_seconds must be positive, not {self.max_seconds}")
        object.__setattr__(self, "min_seconds", _seconds(self.min_seconds, "min_seconds", 0.0))
        object.__setattr__(self, "streams", _streams(self.streams))

    def rate_of(self, name: str) -> float:
        """Values per second of a camera or low-dim stream in a sequence."""
        stream = self.streams[name]
        return float(getattr(stream, "rate", None) or self.fps)

    def describe(self) -> dict:
        return {
            "kind": "sequences",
            "fps": self.fps,
            "max_seconds": self.max_seconds,
            "min_seconds": self.min_seconds,
            "streams": _describe(self.streams),
        }

    def check_against(self, schema: DatasetSchema) -> None:
        for name, stream in self.streams.items():
            spacing = None if isinstance(stream, Audio) else np.array([1.0 / self.rate_of(name)])
            _check_stream(schema, name, stream, spacing)


Spec = Windows | Sequences


MAX_SPAN_SECONDS = MAX_EPISODE_SECONDS  # no offset, window or chunk reaches further than an episode may last
MAX_OFFSETS = 4096  # times per stream per sample: each is a frame or a row every sample of a batch holds


def option_int(value: Any, what: str, low: int, high: int) -> int:
    """A spec option that is a whole number in [low, high], or a SpecError naming it."""
    return checks.option_int(value, what, low, high, SpecError)


def option_number(value: Any, what: str, low: float, high: float) -> float:
    """A spec option that is a finite number in [low, high], or a SpecError naming it."""
    return checks.option_number(value, what, low, high, SpecError)


def option_pair(value: Any, what: str) -> tuple[Any, Any]:
    """An option that is two values (a tuple or list of two), or a SpecError naming it."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise SpecError(f"{what} is two values, not {value!r:.60}")
    return value[0], value[1]


def _seconds(value, what: str, low: float = -MAX_SPAN_SECONDS, high: float = MAX_SPAN_SECONDS) -> float:
    """`value` as a finite float within [low, high]: NaN, infinities, text and absurd sizes are refused here,
    where the spec is made, not found later as wrong samples, endless anchors or a memory bomb."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecError(f"{what} is {value!r:.60}, not a number")
    number = float(value)
    if not (math.isfinite(number) and low <= number <= high):
        raise SpecError(f"{what} is {number}, outside [{low:g}, {high:g}]")
    return number


def _rate(value, what: str) -> float:
    rate = _seconds(value, what, 0.0, MAX_RATE)
    if rate <= 0:
        raise SpecError(f"{what} must be positive, not {value}")
    return rate


def _offsets(offsets: Sequence[float]) -> tuple[float, ...]:
    if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Sequence):
        raise SpecError(f"offsets are a sequence of seconds, not {type(offsets).__name__} {offsets!r:.60}")
    if len(offsets) > MAX_OFFSETS:
        raise SpecError(f"{len(offsets)} offsets; a stream of a sample takes at most {MAX_OFFSETS}")
    values = tuple(_seconds(x, "an offset") for x in offsets)
    if not values:
        raise SpecError("give at least one offset")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise SpecError(f"offsets must increase: {list(values)}")
    return values


def _streams(streams: Mapping[str, StreamSpec]) -> dict[str, StreamSpec]:
    if not streams:
        raise SpecError("a spec needs at least one stream")
    for name, stream in streams.items():
        if not isinstance(stream, (Frames, Values, Audio)):
            raise SpecError(f"stream '{name}': expected Frames, Values or Audio, got {type(stream).__name__}")
    return dict(streams)


# Options added since resume states were first written: left out of a spec's description while
# unset, so that states saved before them stay valid.
_LATER_OPTIONS = {"normalize": None, "resize": None, "channels_first": False, "pad_to": None, "dtype": "uint8"}


def _describe(streams: Mapping[str, StreamSpec]) -> dict:
    return {
        name: {
            "type": type(s).__name__,
            **{
                k: (v.__dict__ if isinstance(v, Resize) else v)
                for k, v in s.__dict__.items()
                if not (k in _LATER_OPTIONS and v == _LATER_OPTIONS[k])
            },
        }
        for name, s in streams.items()
    }


_EXPECTED = {Frames: VideoStream, Values: LowdimStream, Audio: AudioStream}


def _check_stream(schema: DatasetSchema, name: str, spec: StreamSpec, spacing: np.ndarray | None) -> None:
    try:
        stored = schema.stream(name)
    except KeyError as exc:
        raise SpecError(str(exc.args[0])) from None
    expected = _EXPECTED[type(spec)]
    if not isinstance(stored, expected):
        raise SpecError(
            f"stream '{name}' is {stored.kind}, so it cannot be read as {type(spec).__name__}"
            f" (use {_SPEC_FOR[stored.kind]} for it)"
        )
    if spacing is None or len(spacing) == 0:
        return
    finest = float(np.min(spacing))
    if isinstance(stored, VideoStream):
        period = 1.0 / stored.fps
        if finest < period * (1 - 1e-6):
            raise SpecError(
                f"stream '{name}' is recorded at {stored.fps:g} frames/s, but the spec asks for frames"
                f" {finest:g} s apart, which would repeat frames; space them at least {period:g} s apart"
            )
    elif (
        isinstance(stored, LowdimStream) and stored.rate and isinstance(spec, Values) and spec.interpolation != "linear"
    ):
        period = 1.0 / stored.rate
        if finest < period * (1 - 1e-6):
            raise SpecError(
                f"stream '{name}' is recorded at {stored.rate:g} Hz, but the spec asks for values {finest:g} s"
                f" apart ({1 / finest:g} Hz); space them at least {period:g} s apart, or use"
                " interpolation='linear' to resample it"
            )


_SPEC_FOR = {"video": "Frames", "lowdim": "Values", "audio": "Audio", "text": "the 'task' key of each batch"}
