"""Loading for training: sampling specs, the DataLoader, and the read / collate stages it runs."""

from mmdata.loading.dataloader import DataLoader
from mmdata.loading.episodes import Episodes
from mmdata.loading.specs import Audio, Frames, Sequences, SpecError, Values, Windows

__all__ = ["Audio", "DataLoader", "Episodes", "Frames", "Sequences", "SpecError", "Values", "Windows"]
