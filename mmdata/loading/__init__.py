"""Loading for training: the DataLoader, its option groups and the loading chain it runs (see `chain.py`);
the sampling specs, re-exported from `mmdata.planning`.

The specs are plain values and import without torch; `DataLoader` (which needs torch) is
imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmdata.planning.episodes import Episodes
from mmdata.planning.specs import Audio, Frames, Resize, Sequences, Values, Windows

if TYPE_CHECKING:
    from mmdata.loading.dataloader import DataLoader

__all__ = ["Audio", "DataLoader", "Episodes", "Frames", "Resize", "Sequences", "Values", "Windows"]


def __getattr__(name: str) -> Any:
    if name == "DataLoader":
        from mmdata.loading.dataloader import DataLoader

        return DataLoader
    raise AttributeError(f"module 'mmdata.loading' has no attribute '{name}'")
