"""The (shift, scale) that `Values(normalize=...)` applies, from each source's `stats.json`.

A sample is normalized with its own source's statistics by default; a mixture with
`normalize_with="pooled"` uses the statistics of the mixture as sampled instead: each source
weighs its share of the epoch's samples. Pooled means, standard deviations, minima and maxima
are exact (moments of a mixture distribution). Pooled percentiles would need each source's whole
distribution, which `stats.json` does not keep, so pooled "quantile" normalization is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmdata.errors import SpecError
from mmdata.moments import mixture_figures
from mmdata.planning.mixture import NormalizeWith, OpenSource
from mmdata.planning.specs import Spec, Values
from mmdata.store.statistics import normalizer, read_stats, stream_figures


def attach_normalizers(
    sources: Sequence[OpenSource], spec: Spec, shares: Sequence[float], normalize_with: NormalizeWith = "source"
) -> None:
    """Fill in every source's normalizers for the streams the spec normalizes; a missing or unusable
    stats.json fails here, when the loader is built, not in a worker."""
    wanted = {n: s for n, s in spec.streams.items() if isinstance(s, Values) and s.normalize is not None}
    if not wanted:
        return
    stats = {id(source): read_stats(source.store) for source in sources if set(wanted) & set(source.streams)}
    for name, stream in wanted.items():
        having = [(s, share) for s, share in zip(sources, shares) if name in s.streams]
        if normalize_with == "pooled" and len(having) > 1:
            pooled = _pooled(name, stream, [(stats[id(s)], s, share) for s, share in having])
            for source, _ in having:
                source.normalizers[name] = pooled
            continue
        mode = stream.normalize
        assert mode is not None
        for source, _ in having:
            stored = source.streams[name]
            width = int(np.prod(source.store.schema.lowdim(stored).shape))
            source.normalizers[name] = normalizer(stats[id(source)], stored, mode, width, _stats_path(source))


def _pooled(name: str, stream: Values, having: list[tuple[dict, OpenSource, float]]) -> tuple[np.ndarray, np.ndarray]:
    if stream.normalize == "quantile":
        raise SpecError(
            f"stream '{name}': pooled percentiles need each source's whole distribution, which stats.json does"
            " not keep; normalize with each source's own statistics (normalize_with='source') or pool"
            " 'mean_std' or 'min_max'"
        )
    assert stream.normalize is not None
    keys = ("mean", "std", "min", "max")
    figures = [stream_figures(stats, source.streams[name], keys, _stats_path(source)) for stats, source, _ in having]
    widths = {len(f["mean"]) for f in figures}
    if len(widths) > 1:
        raise SpecError(f"stream '{name}' has different widths in the sources, so its statistics cannot be pooled")
    total = sum(share for _, _, share in having) or 1.0
    mean, std, low, high = mixture_figures(
        [share / total for _, _, share in having], *([f[k] for f in figures] for k in keys)
    )
    pooled = {"lowdim": {name: {"mean": mean, "std": std, "min": low, "max": high}}}
    return normalizer(pooled, name, stream.normalize, len(mean), "the mixture's pooled statistics")


def _stats_path(source: OpenSource) -> str:
    return f"{source.store.url}/{source.store.schema.stats_file}"
