"""LeRobot compatibility: `LeRobotLoader` gives the batches of LeRobot's `LeRobotDataset` + torch `DataLoader`
from an mmdata store (see `loader.py` and `docs/lerobot.md`). Its names are imported when first used, so that
what needs only LeRobot's numbering (the LeRobot export) does not import torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EpisodeNumbering": "mmdata.lerobot.numbering",
    "LeRobotLoader": "mmdata.lerobot.loader",
    "to_unit_float": "mmdata.lerobot.loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mmdata.lerobot' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
