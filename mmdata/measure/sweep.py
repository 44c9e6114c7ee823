"""Sweep mode: the same bench over a grid of loader settings, and a plot of throughput per setting."""

from __future__ import annotations

import itertools
from typing import Any

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
