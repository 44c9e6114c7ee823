"""Mixtures: several stores read as one, each with a weight and a map from its stream names.

A `Mixture` is a plain value, like a spec. When a loader is built its sources are opened and
checked against the spec (`open_sources`): every stream the spec reads must exist in at least
one source, with the same kind, frame size (unless frames are resized), low-dim width (unless
`Values(pad_to=...)`) and audio layout everywhere; a source that lacks a stream gets padding
for it, with `<stream>_is_pad` all true. An epoch holds `epoch_samples` samples, each source
contributing its weight's share (of samples, or of tokens with `weight_by="tokens"`): every
sample of a source once per whole pass its share allows, then a part of its order of the next pass
(`planning.mixed_order`), so up- and down-sampling are exact and reproducible.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

import numpy as np

from mmdata.errors import OptionError, SpecError
from mmdata.planning.episodes import Episodes
from mmdata.planning.orders import MAX_MIXED_SLOTS
from mmdata.planning.specs import Audio, Frames, Spec, Values, option_int, option_number
from mmdata.schema import AudioStream, LowdimStream, VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.filesystem import DEFAULT_READ_POLICY, ReadPolicy
from mmdata.store.handle import Store
from mmdata.store.lru import ByteBudgetCache

WeightBy = Literal["samples", "tokens"]
NormalizeWith = Literal["source", "pooled"]
MAX_WEIGHT = 1e12  # weights are relative; this keeps their sum finite and the shares meaningful
# Slots an epoch of a mixture may hold (`mixed_order`: nothing of the epoch's size is made).
MAX_EPOCH_SAMPLES = MAX_MIXED_SLOTS


@dataclass(frozen=True)
class Source:
    """One store of a mixture: a path, URL, open `Store` or `Dataset`, its `weight` (None: its natural share,
    in proportion to its samples), `streams` renaming stored names to the training names
    ({"observation.images.top": "cam_high"}; unmapped streams keep their names), a `name` for
    batches and `stats()` (default: the store's folder name) and an optional episode filter."""

    dataset: str | Store | Dataset
    weight: float | None = None
    streams: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    episodes: Episodes | None = None

    def __post_init__(self):
        if self.weight is not None:
            object.__setattr__(self, "weight", option_number(self.weight, "Source weight", 0.0, MAX_WEIGHT))
        if not isinstance(self.streams, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.streams.items()
        ):
            raise SpecError(f"Source streams maps stored names to training names (text), not {self.streams!r:.80}")
        if self.name is not None and not isinstance(self.name, str):
            raise SpecError(f"Source name is text, not {self.name!r:.60}")
        targets = list(self.streams.values())
        doubled = sorted({t for t in targets if targets.count(t) > 1})
        if doubled:
            raise SpecError(f"source stream map sends several streams to {', '.join(doubled)}")
        object.__setattr__(self, "streams", dict(self.streams))

    def label(self) -> str:
        if self.name:
            return self.name
        url = self.dataset.url if isinstance(self.dataset, (Store, Dataset)) else str(self.dataset)
        return PurePosixPath(url.rstrip("/")).name or url


@dataclass(frozen=True)
class Mixture:
    """Sources read as one dataset (see the module docstring).

    `epoch_samples` is the epoch's size (default: all the sources' samples together);
    `weight_by` says whether weights are shares of samples or of tokens; `normalize_with` says
    whose statistics `Values(normalize=...)` uses: each sample's own source (the default: the
    sources of a mixture are usually other robots, whose state and action differ in range and
    meaning, as Octo and OpenVLA normalize per dataset) or the statistics pooled over the mixture
    with the weights.
    """

    sources: Sequence[Source]
    epoch_samples: int | None = None
    weight_by: WeightBy = "samples"
    normalize_with: NormalizeWith = "source"

    def __post_init__(self):
        sources = tuple(s if isinstance(s, Source) else Source(s) for s in self.sources)
        if not sources:
            raise SpecError("a mixture needs at least one source")
        object.__setattr__(self, "sources", sources)
        given = [s.weight is not None for s in sources]
        if any(given) and not all(given):
            raise SpecError("give every source a weight, or none (each then weighs its share of samples)")
        if all(given) and not sum(s.weight for s in sources) > 0:
            raise SpecError("the sources' weights add up to 0")
        if self.epoch_samples is not None:
            option_int(self.epoch_samples, "epoch_samples", 1, MAX_EPOCH_SAMPLES)
        if self.weight_by not in ("samples", "tokens"):
            raise SpecError(f"weight_by is 'samples' or 'tokens', not '{self.weight_by}'")
        if self.normalize_with not in ("source", "pooled"):
            raise SpecError(f"normalize_with is 'source' or 'pooled', not '{self.normalize_with}'")
        labels = [s.label() for s in sources]
        if len(set(labels)) != len(labels):
            raise SpecError(f"sources need distinct names (got {labels}); set Source(name=...)")

    def describe(self) -> dict:
        return {
            "sources": [
                {
                    "name": s.label(),
                    "weight": s.weight,
                    "streams": s.streams,
                    "episodes": s.episodes.describe() if s.episodes is not None else None,
                }
                for s in self.sources
            ],
            "epoch_samples": self.epoch_samples,
            "weight_by": self.weight_by,
            "normalize_with": self.normalize_with,
        }


@dataclass
class OpenSource:
    """A source as a loader reads it: its open store, name, the stored name of each training stream
    it has, its episode filter, and the (shift, scale) of each stream the spec normalizes."""

    store: Store
    name: str
    streams: dict[str, str]
    episodes: Episodes | None = None
    normalizers: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class Filler:
    """What a stream looks like in every source, so that a source lacking it gets padding of that shape."""

    shape: tuple[int, ...]
    dtype: np.dtype
    rate: float | None = None


def as_mixture(dataset: Any, episodes: Any = None) -> Mixture:
    """`dataset` as a mixture: itself, or one source of it (with `episodes`, which a mixture gives per source)."""
    if not isinstance(dataset, Mixture):
        return Mixture([Source(dataset, episodes=episodes)])
    if episodes is not None:
        raise OptionError("a mixture filters episodes per source: give Source(..., episodes=...) instead")
    return dataset


def open_sources(
    mixture: Mixture, verify: bool, cache_bytes: int, read_policy: ReadPolicy = DEFAULT_READ_POLICY
) -> list[OpenSource]:
    """Open every source's store (no decoder: the loader decodes). A `Store` or `Dataset` given has its store
    copied, and the copy gets a memory cache of its own of `cache_bytes` (unless it was opened with a larger one)."""
    opened = []
    for source in mixture.sources:
        given = source.dataset.store if isinstance(source.dataset, Dataset) else source.dataset
        if isinstance(given, Store):
            store = copy.copy(given)
            store.cache = ByteBudgetCache(max(cache_bytes, given.cache.max_bytes))
        else:
            store = Store(str(given), verify, cache_bytes, read_policy)
        present = {s.name for s in store.schema.streams}
        unknown = sorted(set(source.streams) - present)
        if unknown:
            raise SpecError(
                f"source '{source.label()}' maps streams it does not have: {', '.join(unknown)}"
                f" (its streams: {', '.join(sorted(present))})"
            )
        training = {source.streams.get(name, name): name for name in present}
        opened.append(OpenSource(store, source.label(), training, source.episodes))
    return opened


def check_sources(spec: Spec, sources: list[OpenSource]) -> dict[str, Filler]:
    """Check `spec` against every source (SpecError naming the source and stream) and return, per
    stream, the shape its values take in every batch (what a source lacking it is padded with)."""
    if len(sources) == 1 and all(stored == name for name, stored in sources[0].streams.items()):
        spec.check_against(sources[0].store.schema)  # a single store's own messages, as before mixtures
    fillers = {}
    for name, stream in spec.streams.items():
        having = [s for s in sources if name in s.streams]
        if not having:
            raise SpecError(
                f"no source has stream '{name}'"
                + (
                    f" (map a stream to it: Source(..., streams={{'stored.name': '{name}'}}))"
                    if len(sources) > 1
                    else ""
                )
            )
        for source in having:
            _check_in_source(spec, name, stream, source)
        if isinstance(stream, Frames):
            fillers[name] = _frame_filler(name, stream, [(s, s.store.schema.video(s.streams[name])) for s in having])
        elif isinstance(stream, Values):
            fillers[name] = _values_filler(name, stream, [(s, s.store.schema.lowdim(s.streams[name])) for s in having])
        else:
            fillers[name] = _audio_filler(name, stream, [(s, s.store.schema.audio(s.streams[name])) for s in having])
    return fillers


def _check_in_source(spec: Spec, name: str, stream: Any, source: OpenSource) -> None:
    stored_name = source.streams[name]
    renamed = dataclasses.replace(spec, streams={stored_name: stream})
    try:
        renamed.check_against(source.store.schema)
    except SpecError as exc:
        where = f"source '{source.name}'" + (f" (stream '{stored_name}')" if stored_name != name else "")
        raise SpecError(f"{where}: {exc}") from None


def _frame_filler(name: str, stream: Frames, stored: list[tuple[OpenSource, VideoStream]]) -> Filler:
    if stream.resize is not None:
        height, width = stream.resize.size
    else:
        sizes = {(v.height, v.width) for _, v in stored}
        if len(sizes) > 1:
            listed = ", ".join(f"'{s.name}' {v.width}x{v.height}" for s, v in stored)
            raise SpecError(
                f"camera '{name}' has frames of different sizes in the sources ({listed}); deliver them at one"
                " size with Frames(..., resize=mmdata.Resize(size=(H, W)))"
            )
        height, width = sizes.pop()
    shape = (3, height, width) if stream.channels_first else (height, width, 3)
    return Filler(shape, np.dtype(np.uint8))


def _values_filler(name: str, stream: Values, stored: list[tuple[OpenSource, LowdimStream]]) -> Filler:
    shapes = {tuple(v.shape) for _, v in stored}
    if stream.pad_to is not None:
        too_wide = [(s.name, v.shape) for s, v in stored if len(v.shape) != 1 or v.shape[0] > stream.pad_to]
        if too_wide:
            raise SpecError(
                f"stream '{name}' of source '{too_wide[0][0]}' has shape {tuple(too_wide[0][1])}, which"
                f" Values(pad_to={stream.pad_to}) cannot hold (it pads one dimension up to that width)"
            )
        shape: tuple[int, ...] = (stream.pad_to,)
    elif len(shapes) > 1:
        listed = ", ".join(f"'{s.name}' {tuple(v.shape)}" for s, v in stored)
        raise SpecError(
            f"stream '{name}' has different widths in the sources ({listed}); pad them to one width with"
            f" Values(..., pad_to={max(int(np.prod(v.shape)) for _, v in stored)})"
        )
    else:
        shape = shapes.pop()
    if stream.normalize is not None:
        dtype = np.dtype(np.float32)
    else:
        dtype = np.result_type(*[np.dtype(v.dtype) for _, v in stored])
    return Filler(shape, dtype)


def _audio_filler(name: str, stream: Audio, stored: list[tuple[OpenSource, AudioStream]]) -> Filler:
    rates = {stream.sample_rate or v.sample_rate for _, v in stored}
    channels = {1 if stream.mono else v.channels for _, v in stored}
    if len(rates) > 1 or len(channels) > 1:
        listed = ", ".join(f"'{s.name}' {v.sample_rate} Hz x {v.channels}" for s, v in stored)
        raise SpecError(
            f"audio '{name}' differs across the sources ({listed}); give Audio(sample_rate=..., mono=True)"
            " to deliver one layout"
        )
    return Filler((channels.pop(),), np.dtype(np.float32), float(rates.pop()))


def source_targets(mixture: Mixture, counts: Sequence[int], mean_costs: Sequence[float]) -> np.ndarray:
    """Samples each source contributes to an epoch: its weight's share of `epoch_samples`, by samples or
    by tokens (a source of costlier samples then gives fewer), rounded so that they add up exactly."""
    counts_array = np.asarray(counts, np.float64)
    total = int(mixture.epoch_samples or counts_array.sum())
    weights = np.array([s.weight if s.weight is not None else c for s, c in zip(mixture.sources, counts)], np.float64)
    if mixture.weight_by == "tokens":
        weights = weights / np.maximum(np.asarray(mean_costs, np.float64), 1e-12)
    weights[counts_array == 0] = 0
    if not weights.max() > 0:
        raise SpecError("no source with a positive weight has samples for this spec")
    shares = weights / weights.max()  # (weights near the float maximum would add up to infinity)
    exact = shares / shares.sum() * total
    targets = np.floor(exact).astype(np.int64)
    short = total - int(targets.sum())
    targets[np.argsort(-(exact - targets), kind="stable")[:short]] += 1
    return targets
