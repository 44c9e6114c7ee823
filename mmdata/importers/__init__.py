"""Input formats -> `EpisodeSource` descriptions the converter consumes.

`discover_episodes(path, "auto")` recognises the format: a LeRobot dataset (`meta/info.json`),
a replay-buffer Zarr store (`meta/episode_ends`, or a `.zarr.zip`), HDF5 recordings (`.hdf5` /
`.h5` files), an RLDS / TFDS builder folder (`features.json` + `dataset_info.json`), MCAP robot
logs (`.mcap` files), ROS bags (`.bag` files, ROS 2 SQLite bag folders), or the raw layout (a folder of
episode folders).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mmdata.errors import SourceError
from mmdata.importers.episode import AudioSource, CameraSource, EpisodeSource, LowdimSource
from mmdata.importers.raw import discover_raw_episodes
from mmdata.importers.topic_map import TopicMap, load_topic_map

FORMATS = ("raw", "lerobot", "hdf5", "zarr-replay", "rlds", "mcap", "rosbag")


def detect_format(path: str | Path) -> str:
    """The input format of `path`, when exactly one fits."""
    from mmdata.importers.hdf5 import hdf5_files
    from mmdata.importers.mcap_log import holds_mcap_logs
    from mmdata.importers.rlds import holds_rlds_builder
    from mmdata.importers.rosbag_log import holds_bags
    from mmdata.importers.zarr_replay import is_replay_buffer

    path = Path(path)
    if not path.exists():
        raise SourceError.for_source(
            str(path), None, "the source does not exist", "give the folder or file of the recordings"
        )
    found = []
    if (path / "meta" / "info.json").is_file():
        found.append("lerobot")
    if is_replay_buffer(path):
        found.append("zarr-replay")
    if (path.is_file() or path.is_dir()) and hdf5_files(path):
        found.append("hdf5")
    if path.is_dir() and holds_rlds_builder(path):
        found.append("rlds")
    if holds_mcap_logs(path):
        found.append("mcap")
    if holds_bags(path):
        found.append("rosbag")
    if path.is_dir() and not found and any(p.is_dir() and not p.name.startswith(".") for p in path.iterdir()):
        found.append("raw")
    if len(found) != 1:
        what = f"could be {' or '.join(found)}" if found else "matches no input format mmdata reads"
        raise SourceError.for_source(
            str(path), None, f"the input format is ambiguous: it {what}", "name it with --from"
        )
    return found[0]


def discover_episodes(
    path: str | Path,
    source_format: str = "auto",
    fps: float | None = None,
    task: str = "",
    image_keys: list[str] | None = None,
    topic_map: TopicMap | None = None,
) -> list[EpisodeSource]:
    """Describe the episodes at `path` in `source_format` ("auto" to detect it); `image_keys` picks an
    RLDS dataset's cameras (default: every image under `observation/`), `topic_map` an MCAP log's
    streams (default: `mcap_log.default_topic_map`)."""
    from mmdata.importers.hdf5 import discover_hdf5_episodes
    from mmdata.importers.lerobot_folders import discover_lerobot_episodes
    from mmdata.importers.mcap_log import discover_mcap_episodes, discover_rosbag_episodes
    from mmdata.importers.rlds import discover_rlds_episodes
    from mmdata.importers.zarr_replay import discover_replay_episodes

    if source_format == "auto":
        source_format = detect_format(path)
    readers: dict[str, Callable[[], list[EpisodeSource]]] = {
        "raw": lambda: discover_raw_episodes(path),
        "lerobot": lambda: discover_lerobot_episodes(path),
        "hdf5": lambda: discover_hdf5_episodes(path, fps, task),
        "zarr-replay": lambda: discover_replay_episodes(path, fps, task),
        "rlds": lambda: discover_rlds_episodes(path, fps, task, image_keys),
        "mcap": lambda: discover_mcap_episodes(path, topic_map, task),
        "rosbag": lambda: discover_rosbag_episodes(path, topic_map, task),
    }
    if source_format not in readers:
        raise SourceError.for_source(
            str(path), None, f"unknown input format '{source_format}'", f"choose one of {FORMATS}"
        )
    return readers[source_format]()


def shipped_stats(path: str | Path, source_format: str = "auto") -> dict | None:
    """Normalization statistics the source format ships, keyed by format (LeRobot's `meta/stats.json`
    as `{"lerobot": ...}`); None when it ships none."""
    from mmdata.importers.lerobot_folders import lerobot_stats

    if source_format == "auto":
        source_format = detect_format(path)
    if source_format == "lerobot":
        found = lerobot_stats(path)
        return {"lerobot": found} if found is not None else None
    return None


__all__ = [
    "FORMATS",
    "AudioSource",
    "CameraSource",
    "EpisodeSource",
    "LowdimSource",
    "detect_format",
    "discover_episodes",
    "discover_raw_episodes",
    "load_topic_map",
    "shipped_stats",
    "TopicMap",
]
