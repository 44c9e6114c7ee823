"""Sweep mode: the same bench over a grid of loader settings, and a plot of throughput per setting."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from mmdata.errors import MissingDependencyError

SWEEPABLE = {
    "num_workers": int,
    "decoder": str,
    "batch_size": int,
    "batch_tokens": int,
    "layout": str,
    "prefetch_factor": int,
    "shuffle": str,
    "device": str,
    "decode_in": str,
}


def parse_sweep(items: list[str]) -> list[dict[str, Any]]:
    """`["num_workers=0,2,4", "decoder=pyav,decord"]` -> every combination, as loader keyword arguments."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, separator, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not separator or not values:
            raise ValueError(f"sweep axis '{item}' must look like name=value1,value2")
        if key not in SWEEPABLE:
            raise ValueError(f"cannot sweep '{key}'; sweepable: {', '.join(SWEEPABLE)}")
        try:
            axes[key] = [SWEEPABLE[key](v.strip()) for v in values.split(",") if v.strip()]
        except ValueError as exc:
            raise ValueError(f"sweep axis '{item}': {exc}") from exc
    return [dict(zip(axes, combination)) for combination in itertools.product(*axes.values())]


def label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str, show_stalls: bool = False) -> None:
    """A bar chart of samples/s per setting, with the input-stall fraction when `show_stalls`
    (meaningful when a training step was simulated)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            "the sweep plot needs matplotlib: pip install 'mmdata[bench]' (or leave out --plot)"
        ) from exc
    names = [label(row["setting"]) for row in rows]
    rates = [row["figures"]["samples_per_s"] for row in rows]
    stalls = [row["figures"]["stall_fraction"] for row in rows]
    figure, axis = plt.subplots(figsize=(max(6, 1.2 * len(rows) + 2), 4.5))
    bars = axis.bar(range(len(rows)), rates, color="#3b75af")
    axis.bar_label(bars, labels=[f"{r:,.0f}" for r in rates], fontsize=8)
    axis.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel("samples/s")
    axis.set_title(title, fontsize=10)
    if show_stalls:
        twin = axis.twinx()
        twin.plot(range(len(rows)), [100 * s for s in stalls], "o-", color="#c44e52")
        twin.set_ylabel("input stall, % of steps", color="#c44e52")
        twin.set_ylim(0, 105)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
