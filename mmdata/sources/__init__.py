"""Readers of recorded episodes: each turns one input format into `EpisodeSource`s."""

from mmdata.sources.episode import AudioSource, CameraSource, EpisodeSource, LowdimSource
from mmdata.sources.raw import discover_raw_episodes

__all__ = ["AudioSource", "CameraSource", "EpisodeSource", "LowdimSource", "discover_raw_episodes"]
