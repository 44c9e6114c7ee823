"""LeRobotDataset folders (v3.0 and v2.1), read without lerobot installed.

- v3.0: `meta/info.json`, `meta/tasks.parquet`, `meta/episodes/chunk-*/file-*.parquet` (one row
  per episode: its data file and row range, and per camera the video file and the
  [from_timestamp, to_timestamp) it occupies there), `data/chunk-*/file-*.parquet` holding the
  rows of many episodes, `videos/<key>/chunk-*/file-*.mp4` concatenating many episodes.
- v2.1: `meta/info.json`, `meta/episodes.jsonl`, `meta/tasks.jsonl`, one
  `data/chunk-*/episode_*.parquet` and one `videos/chunk-*/<key>/episode_*.mp4` per episode.

Video features become cameras (named by their LeRobot key), the other numeric features low-dim
streams (times from the `timestamp` column), the episode's tasks the task text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.errors import SourceError
from mmdata.sources.arrays import ParquetRowsSource
from mmdata.sources.episode import CameraSource, EpisodeSource

INFO = "meta/info.json"
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


def is_lerobot(root: Path) -> bool:
    return (root / INFO).is_file() and (
        (root / "meta" / "episodes").is_dir() or (root / "meta/episodes.jsonl").is_file()
    )


def discover_lerobot_episodes(root: str | Path) -> list[EpisodeSource]:
    """Describe every episode of the LeRobot dataset at `root`; per-episode problems are recorded."""
    root = Path(root)
    info = _read_info(root)
    version = str(info.get("codebase_version", ""))
    if version.startswith("v3"):
        return _discover_v3(root, info)
    if version.startswith("v2"):
        return _discover_v21(root, info)
    raise SourceError.for_source(
        str(root), INFO, f"codebase_version '{version}' is not supported", "mmdata reads LeRobot v2.1 and v3.0 datasets"
    )


def _read_info(root: Path) -> dict[str, Any]:
    path = root / INFO
    if not path.is_file():
        raise SourceError.for_source(
            str(root),
            str(path),
            "missing meta/info.json",
            "give the folder of a LeRobot dataset (the one holding meta/, data/ and videos/)",
        )
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError.for_source(str(root), str(path), f"unreadable: {exc}") from exc
    for key in ("fps", "features"):
        if key not in info:
            raise SourceError.for_source(str(root), str(path), f"has no '{key}'", "the file is not a LeRobot info.json")
    return info


def _features(info: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(video keys, numeric low-dim keys) of the dataset."""
    videos, lowdim = [], []
    for key, feature in info["features"].items():
        dtype = feature.get("dtype")
        if dtype == "video":
            videos.append(key)
        elif dtype == "image":
            raise SourceError.for_source(
                "dataset", INFO, f"feature '{key}' is stored as images in Parquet", "convert it with use_videos=True"
            )
        elif dtype in NUMERIC and key not in BOOKKEEPING:
            lowdim.append(key)
    return videos, lowdim


def _discover_v3(root: Path, info: dict[str, Any]) -> list[EpisodeSource]:
    import pyarrow.parquet as pq

    videos, lowdim = _features(info)
    fps = float(info["fps"])
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise SourceError.for_source(str(root), "meta/episodes", "holds no episodes table (chunk-*/file-*.parquet)")
    episodes = [row for path in files for row in pq.read_table(path).to_pylist()]
    episodes.sort(key=lambda row: row["episode_index"])
    data_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    sources = []
    for row in episodes:
        index = int(row["episode_index"])
        name = f"episode_{index:06d}"
        data_path = root / info["data_path"].format(
            chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
        )
        try:
            first = _rows_of(data_path, row, data_rows, name)
            cameras = tuple(_camera_v3(root, info, row, key, name) for key in videos)
        except SourceError as problem:
            sources.append(EpisodeSource(name=name, problem=problem))
            continue
        length = int(row["length"])
        streams = tuple(ParquetRowsSource(key, str(data_path), key, index, first, length, fps) for key in lowdim)
        sources.append(
            EpisodeSource(
                name=name,
                task=_task_text(row.get("tasks")),
                metadata=_metadata(info, index, row.get("tasks")),
                cameras=cameras,
                lowdim=streams,
            )
        )
    return sources


def _rows_of(path: Path, row: dict, cache: dict, episode: str) -> int:
    """Where the episode's rows start in its data file, after checking they are its rows."""
    import pyarrow.parquet as pq

    if str(path) not in cache:
        if not path.is_file():
            raise SourceError(episode, str(path), "the data file is missing")
        table = pq.read_table(path, columns=["index", "episode_index"])
        cache[str(path)] = (table.column("index").to_numpy(), table.column("episode_index").to_numpy())
    global_index, owners = cache[str(path)]
    start, stop = int(row["dataset_from_index"]), int(row["dataset_to_index"])
    first = int(np.searchsorted(global_index, start))
    last = int(np.searchsorted(global_index, stop))
    index, length = int(row["episode_index"]), int(row["length"])
    _require_owner(
        owners[first:last],
        index,
        length,
        episode,
        path,
        f"rows with index {start}..{stop - 1} should be episode {index}'s {length} rows, but the file has"
        f" {last - first} such rows",
        "meta/episodes",
    )
    return first


def _camera_v3(root: Path, info: dict, row: dict, key: str, episode: str) -> CameraSource:
    path = root / info["video_path"].format(
        video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"]
    )
    if not path.is_file():
        raise SourceError(episode, str(path), f"the video of camera '{key}' is missing")
    start = float(row[f"videos/{key}/from_timestamp"])
    end = float(row[f"videos/{key}/to_timestamp"])
    return CameraSource(key, str(path), start, end, int(row["length"]))


def _discover_v21(root: Path, info: dict[str, Any]) -> list[EpisodeSource]:
    videos, lowdim = _features(info)
    fps = float(info["fps"])
    chunk_size = int(info.get("chunks_size", 1000))
    episodes = _read_jsonl(root / "meta/episodes.jsonl", root)
    sources = []
    for row in sorted(episodes, key=lambda r: r["episode_index"]):
        index = int(row["episode_index"])
        name = f"episode_{index:06d}"
        chunk = index // chunk_size
        data_path = root / info["data_path"].format(episode_chunk=chunk, episode_index=index)
        length = int(row["length"])
        try:
            _check_episode_file(data_path, index, length, name)
        except SourceError as problem:
            sources.append(EpisodeSource(name=name, problem=problem))
            continue
        cameras = []
        for key in videos:
            path = root / info["video_path"].format(episode_chunk=chunk, video_key=key, episode_index=index)
            cameras.append(CameraSource(key, str(path), expected_frames=length))
        missing = [c for c in cameras if not Path(c.path).is_file()]
        if missing:
            problem = SourceError(name, missing[0].path, f"the video of camera '{missing[0].name}' is missing")
            sources.append(EpisodeSource(name=name, problem=problem))
            continue
        streams = tuple(ParquetRowsSource(key, str(data_path), key, index, 0, length, fps) for key in lowdim)
        sources.append(
            EpisodeSource(
                name=name,
                task=_task_text(row.get("tasks")),
                metadata=_metadata(info, index, row.get("tasks")),
                cameras=tuple(cameras),
                lowdim=streams,
            )
        )
    return sources


def _check_episode_file(path: Path, index: int, length: int, episode: str) -> None:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise SourceError(episode, str(path), "the data file is missing")
    owners = pq.read_table(path, columns=["episode_index"]).column("episode_index").to_numpy()
    _require_owner(
        owners,
        index,
        length,
        episode,
        path,
        f"meta/episodes.jsonl says episode {index} has {length} rows, but the file holds {len(owners)}",
        "meta/episodes.jsonl",
    )


def _require_owner(
    owners: np.ndarray, index: int, length: int, episode: str, path: Path, problem: str, table: str
) -> None:
    """The rows that should be the episode's are `length` rows whose episode_index is `index`."""
    if len(owners) != length or (owners != index).any():
        found = sorted(set(owners.tolist()))
        raise SourceError(
            episode,
            str(path),
            f"{problem}, with episode_index {found[:5]}",
            f"the data file disagrees with {table}; re-export the dataset, or pass --skip-bad",
        )


def _read_jsonl(path: Path, root: Path) -> list[dict]:
    if not path.is_file():
        raise SourceError.for_source(str(root), str(path), "missing", "a LeRobot v2.1 dataset lists its episodes there")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise SourceError.for_source(str(root), str(path), f"unreadable: {exc}") from exc


def _task_text(tasks: Any) -> str:
    if tasks is None:
        return ""
    if isinstance(tasks, str):
        return tasks
    return "; ".join(str(t) for t in tasks)


def _metadata(info: dict, index: int, tasks: Any) -> dict[str, Any]:
    return {
        "source_format": f"lerobot {info.get('codebase_version')}",
        "lerobot_episode_index": index,
        "robot_type": info.get("robot_type"),
        "tasks": list(tasks) if tasks is not None and not isinstance(tasks, str) else tasks,
    }
