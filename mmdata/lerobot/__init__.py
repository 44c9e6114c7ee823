"""LeRobot compatibility: `LeRobotLoader` gives the batches of LeRobot's `LeRobotDataset` + torch `DataLoader`
from an mmdata store (see `loader.py` and `docs/lerobot.md`)."""

from mmdata.lerobot.loader import LeRobotLoader, to_unit_float
from mmdata.lerobot.numbering import EpisodeNumbering

__all__ = ["EpisodeNumbering", "LeRobotLoader", "to_unit_float"]
