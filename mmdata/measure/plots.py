"""`mmdata bench --plot`: charts of a run (where the time went, and the input stall) or of a sweep (samples/s per
setting). matplotlib is the `bench` extra's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmdata.errors import MissingDependencyError
from mmdata.measure.sweep import label


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            "the plot needs matplotlib: pip install 'mmdata[bench]' (or leave out --plot)"
        ) from exc
    return plt


def plot_stages(document: dict[str, Any], path: Path, title: str) -> None:
    """Where one run's time went, as stacked bars: the main thread's shares of the wall time and, with workers,
    each stage's share of their busy time; the input stall (share of steps that waited) in the title."""
    plt = _pyplot()
    stages = document["stages"]
    bars = [("main thread\n(share of wall time)", stages["main_thread"])]
    if "workers" in stages:
        bars.append(("workers\n(share of busy time)", stages["workers"]["stages"]))
    figure, axis = plt.subplots(figsize=(9, 1.6 + 1.1 * len(bars)))
    colours = plt.get_cmap("tab20").colors
    names = sorted({name for _, shares in bars for name in shares})
    for position, (_, shares) in enumerate(bars):
        left = 0.0
        for name in names:
            share = shares.get(name, {}).get("share", 0.0)
            if share <= 0:
                continue
            axis.barh(position, share, left=left, color=colours[names.index(name) % len(colours)], label=name)
            if share > 0.06:
                axis.text(left + share / 2, position, f"{name}\n{share:.0%}", ha="center", va="center", fontsize=7)
            left += share
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    axis.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    axis.set_yticks(range(len(bars)), [label_ for label_, _ in bars], fontsize=8)
    axis.set_xlim(0, 1)
    axis.set_xlabel("share")
    figures = document["figures"]
    axis.set_title(
        f"{title}: {figures['samples_per_s']:,.1f} samples/s, input stall {figures['stall_fraction']:.1%} of steps",
        fontsize=9,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str, show_stalls: bool = False) -> None:
    """A bar chart of samples/s per setting, with the input-stall fraction when `show_stalls`
    (meaningful when a training step was simulated)."""
    plt = _pyplot()
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
