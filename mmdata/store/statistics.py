"""Normalization statistics of a store: per low-dim stream and dimension, per camera and channel.

Low-dim streams get count, mean, std, min, max and the 1st / 99th percentiles of every
dimension, over every row of every episode. Moments are accumulated per episode and merged with
Chan et al.'s pairwise update, so partial results (from workers, shards or appends) combine exactly; they
are kept in the file ("moments") for that.
Percentiles come from a second pass: a histogram of `QUANTILE_BINS` equal bins over [min, max]
per dimension, each percentile reported at the upper edge of the bin it falls in, so it lies
within one bin width (`quantile_error`, stated with it) of the exact value (numpy's
`quantile(..., method="inverted_cdf")`).
Cameras get the mean and std of each RGB channel (in [0, 1]) over a seeded sample of frames.
A stream holding NaN or infinite values gets its count and `"non_finite": true` only.

`mmdata stats PATH` writes them to `stats.json` beside `dataset.json` (or to the file an appended
version's `dataset.json` names).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mmdata.checks import dump_json, option_number, parse_json
from mmdata.errors import OptionError, ReadError, StoreError
from mmdata.moments import Moments, mixture_figures
from mmdata.schema import LowdimStream, VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.filesystem import join, read_file, write_text_atomically
from mmdata.store.handle import Store

STATS_VERSION = 1
QUANTILE_BINS = 8192
QUANTILES = (0.01, 0.99)
MAX_STATS_BYTES = 64 << 20


# Decoded camera frames held at once while their histograms are counted (counting one channel takes
# another 8 bytes per pixel for a moment)
CAMERA_BLOCK_BYTES = 16 << 20


def compute_stats(
    dataset: Dataset,
    camera_frames: int = 256,
    seed: int = 0,
    moments: dict[str, Moments] | None = None,
) -> dict[str, Any]:
    """The statistics of every low-dim stream and camera of `dataset` (see the module docstring).

    `moments` per low-dim stream, when already known (merged from conversion workers), spare the
    first pass over the values; the percentile pass always reads them. The moments are kept under
    "moments", exactly, for an append to merge its own into.
    """
    episodes = [i for i in range(len(dataset)) if i not in dataset.damaged]
    result: dict[str, Any] = {
        "version": STATS_VERSION,
        "episodes": len(episodes),
        "lowdim": {},
        "cameras": {},
        "moments": {},
    }
    cameras = [s.name for s in dataset.schema.streams if isinstance(s, VideoStream)] if camera_frames > 0 else []
    for stream in dataset.schema.streams:
        if isinstance(stream, LowdimStream):
            known = (moments or {}).get(stream.name)
            if known is None:
                known = Moments()
                for episode in episodes:
                    known = known.merge(Moments.of(_rows(dataset, stream.name, episode)))
            result["lowdim"][stream.name] = _lowdim_stats(dataset, stream.name, episodes, known)
            result["moments"][stream.name] = known.to_json()  # what an append merges its episodes' into
    for name in cameras:
        result["cameras"][name] = _camera_stats(dataset, name, episodes, camera_frames, seed)
    return result


def _rows(dataset: Dataset, name: str, episode: int) -> np.ndarray:
    values = dataset.read_episode(episode, [name])[name].values
    return np.asarray(values, np.float64).reshape(len(values), -1)


def _lowdim_stats(dataset: Dataset, name: str, episodes: list[int], moments: Moments) -> dict[str, Any]:
    if not moments.count:
        return {"count": 0}
    if not all(np.isfinite(a).all() for a in (moments.mean, moments.m2, moments.low, moments.high)):
        # NaN or infinite values (or sums past float64): no figure would mean anything; the loader
        # refuses to normalize by them and says so
        return {"count": moments.count, "non_finite": True}
    width = np.where(moments.high > moments.low, (moments.high - moments.low) / QUANTILE_BINS, 0.0)
    counts = np.zeros((len(moments.mean), QUANTILE_BINS), np.int64)
    for episode in episodes:
        bins = _bins(_rows(dataset, name, episode), moments.low, width)
        for dim in range(bins.shape[1]):
            counts[dim] += np.bincount(bins[:, dim], minlength=QUANTILE_BINS)
    # the percentile q is the value of rank ceil(q * n) (1-based)
    ranks = [max(int(np.ceil(quantile * moments.count)), 1) for quantile in QUANTILES]
    return _figures(
        moments.count, moments.mean, moments.std, moments.low, moments.high, width, np.cumsum(counts, axis=1), ranks
    )


def _figures(
    count: int,
    mean: np.ndarray,
    std: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    width: np.ndarray,
    cumulative: np.ndarray,
    thresholds: Sequence[float],
) -> dict[str, Any]:
    """A stream's entry in stats.json; each percentile of QUANTILES is reported at the upper edge of the
    first histogram bin whose cumulative count (per dimension, `cumulative`) reaches its threshold."""
    figures: dict[str, Any] = {
        "count": count,
        "mean": mean.tolist(),
        "std": std.tolist(),
        "min": low.tolist(),
        "max": high.tolist(),
        "quantile_error": width.tolist(),
    }
    for quantile, threshold in zip(QUANTILES, thresholds):
        upper = np.array([np.searchsorted(cumulative[dim], threshold) + 1 for dim in range(len(width))])
        figures[f"q{round(quantile * 100):02d}"] = np.minimum(low + upper * width, high).tolist()
    return figures


def pooled_stats(datasets: list[Dataset], weights: list[float]) -> dict[str, Any]:
    """The statistics of a mixture as sampled: each store weighs `weights[i]` (normalized to shares) of
    the rows, spread evenly over its own rows, for every low-dim stream all the stores have with one
    width. Moments are those of the mixture distribution (exact); percentiles come from one histogram
    over the pooled range with each store's counts weighted, within one bin width as for one store."""
    if len(weights) != len(datasets):
        raise OptionError(f"give one weight per store ({len(datasets)}), not {len(weights)}")
    checked = [option_number(w, f"the weight of store {i + 1}", 0.0, 1e12) for i, w in enumerate(weights)]
    if not sum(checked) > 0:
        raise OptionError(f"the stores' weights add up to 0: {checked}")
    shares = np.asarray(checked, np.float64) / float(np.sum(checked))
    parts = [(d, [i for i in range(len(d)) if i not in d.damaged]) for d in datasets]
    names = set.intersection(*[{s.name for s in d.schema.streams if isinstance(s, LowdimStream)} for d in datasets])
    result: dict[str, Any] = {
        "version": STATS_VERSION,
        "pooled": [{"store": d.url, "share": float(w)} for d, w in zip(datasets, shares)],
        "lowdim": {},
        "cameras": {},
    }
    for name in sorted(names):
        moments = [Moments() for _ in parts]
        for number, (dataset, episodes) in enumerate(parts):
            for episode in episodes:
                moments[number] = moments[number].merge(Moments.of(_rows(dataset, name, episode)))
        if len({m.mean.shape for m in moments if m.count}) > 1 or not all(m.count for m in moments):
            continue
        if not all(np.isfinite(a).all() for m in moments for a in (m.mean, m.m2, m.low, m.high)):
            result["lowdim"][name] = {"count": int(sum(m.count for m in moments)), "non_finite": True}
            continue
        mean, std, low, high = mixture_figures(
            shares,
            [m.mean for m in moments],
            [m.std for m in moments],
            [m.low for m in moments],
            [m.high for m in moments],
        )
        width = np.where(high > low, (high - low) / QUANTILE_BINS, 0.0)
        weighted = np.zeros((len(mean), QUANTILE_BINS))
        for share, figures, (dataset, episodes) in zip(shares, moments, parts):
            for episode in episodes:
                bins = _bins(_rows(dataset, name, episode), low, width)
                for dim in range(bins.shape[1]):
                    weighted[dim] += np.bincount(bins[:, dim], minlength=QUANTILE_BINS) * (share / figures.count)
        # cumulative weights are shares of the mixture: the percentile q is where they reach q
        thresholds = [quantile - 1e-12 for quantile in QUANTILES]
        count = int(sum(m.count for m in moments))
        result["lowdim"][name] = _figures(count, mean, std, low, high, width, np.cumsum(weighted, axis=1), thresholds)
    return result


def _bins(rows: np.ndarray, low: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The histogram bin of every value of `rows` (bins of `width` from `low`; one bin where width is 0)."""
    bins = np.zeros(rows.shape, np.int64)
    spread = width > 0
    bins[:, spread] = np.clip((rows[:, spread] - low[spread]) / width[spread], 0, QUANTILE_BINS - 1)
    return bins


def _camera_stats(dataset: Dataset, name: str, episodes: list[int], frames: int, seed: int) -> dict[str, Any]:
    """Mean and std of each RGB channel in [0, 1] over `frames` frames drawn evenly across episodes, decoded
    at most CAMERA_BLOCK_BYTES at a time into per-channel histograms (memory does not grow with frame size)."""
    rng = np.random.default_rng(seed)
    spec = dataset.schema.video(name)
    block = max(1, CAMERA_BLOCK_BYTES // (spec.width * spec.height * 3))
    counts, sampled = np.zeros((3, 256), np.int64), 0
    for episode, take in zip(episodes, _spread(frames, len(episodes))):
        times = dataset.timestamps_of(dataset.manifest.row(episode), name)
        if not take or not len(times):
            continue
        picked = np.sort(rng.choice(len(times), size=min(take, len(times)), replace=False))
        for first in range(0, len(picked), block):
            pixels = np.asarray(dataset.frames_at(episode, name, times[picked[first : first + block]]).values)
            pixels = pixels.reshape(-1, 3)
            counts += np.stack([np.bincount(pixels[:, channel], minlength=256) for channel in range(3)])
        sampled += len(picked)
    moments = Moments.of_levels(np.arange(256) / 255.0, counts) if sampled else Moments()
    return {"frames": sampled, "mean": moments.mean.tolist(), "std": moments.std.tolist()}


def _spread(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal counts."""
    base, extra = divmod(total, max(parts, 1))
    return [base + (i < extra) for i in range(parts)]


def write_stats(dataset: Store | Dataset, stats: dict[str, Any]) -> str:
    """Write the statistics file `dataset.json` names (`stats.json`, or an appended version's) beside it,
    atomically in a local folder; its path."""
    path = join(dataset.root, dataset.schema.stats_file)
    write_text_atomically(path, dump_json(stats, indent=1) + "\n", dataset.fs)
    return path


def read_stats(dataset: Store | Dataset) -> dict[str, Any]:
    """The store's `stats.json`; StoreError naming the fix when it has none or it is unreadable."""
    name = dataset.schema.stats_file
    path = join(dataset.root, name)
    try:
        stats = parse_json(read_file(dataset.fs, path, MAX_STATS_BYTES, dataset.read_policy))
    except ReadError as exc:
        raise StoreError(
            f"'{dataset.url}' has no readable {name} ({exc}); run `mmdata stats {dataset.url}` to compute it"
        ) from exc
    except ValueError as exc:
        raise StoreError(f"{dataset.url}/{name} {exc}; run `mmdata stats {dataset.url}` again") from exc
    if (
        not isinstance(stats, dict)
        or stats.get("version") != STATS_VERSION
        or not isinstance(stats.get("lowdim"), dict)
    ):
        raise StoreError(f"{dataset.url}/{name} is not version {STATS_VERSION} statistics; run `mmdata stats` again")
    return stats


def normalizer(stats: dict[str, Any], stream: str, mode: str, width: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) per dimension so that (x - shift) / scale normalizes `stream` by `mode`; `where` names
    the statistics in errors."""
    keys = {"mean_std": ("mean", "std"), "min_max": ("min", "max"), "quantile": ("q01", "q99")}[mode]
    figures = stream_figures(stats, stream, keys, where, width)
    first, second = (figures[key] for key in keys)
    if mode == "mean_std":
        shift, scale = first, second
    else:
        shift, scale = (first + second) / 2, (second - first) / 2
    return shift.astype(np.float32), np.where(scale > 1e-8, scale, 1.0).astype(np.float32)


def stream_figures(
    stats: dict[str, Any], stream: str, keys: tuple[str, ...], where: str, width: int | None = None
) -> dict[str, np.ndarray]:
    """The figures `keys` of low-dim `stream` in a `stats.json` document, each checked: present, one finite
    number per dimension (`width` of them, when given), a std not negative, a min not above its max and a
    q01 not above its q99. A StoreError names what is wrong: statistics someone else wrote are data."""
    entry = stats.get("lowdim", {}).get(stream) if isinstance(stats.get("lowdim"), dict) else None
    if isinstance(entry, dict) and entry.get("non_finite"):
        raise StoreError(
            f"{where}: stream '{stream}' holds NaN or infinite values, so it has no statistics to normalize by;"
            " clean the recordings and convert again, or read it without normalize="
        )
    if not isinstance(entry, dict) or any(key not in entry for key in keys):
        raise StoreError(f"{where} has no {'/'.join(keys)} for stream '{stream}'; run `mmdata stats`")
    figures = {}
    for key in keys:
        try:
            values = np.asarray(entry[key], np.float64)
        except (TypeError, ValueError):
            values = np.empty(0)
        if values.ndim != 1 or not len(values) or (width is not None and len(values) != width):
            wanted = f"{width} numbers" if width is not None else "a list of numbers"
            raise StoreError(f"{where}: '{key}' of stream '{stream}' is not {wanted}; run `mmdata stats` again")
        if not np.isfinite(values).all():
            raise StoreError(f"{where}: '{key}' of stream '{stream}' holds values that are not finite")
        figures[key] = values
    if len({len(v) for v in figures.values()}) > 1:
        raise StoreError(f"{where}: the figures of stream '{stream}' have different widths; run `mmdata stats` again")
    for low, high in (("min", "max"), ("q01", "q99")):
        if low in figures and high in figures and (figures[low] > figures[high]).any():
            raise StoreError(f"{where}: stream '{stream}' has a {low} above its {high}; run `mmdata stats` again")
    if "std" in figures and (figures["std"] < 0).any():
        raise StoreError(f"{where}: stream '{stream}' has a negative std; run `mmdata stats` again")
    return figures
