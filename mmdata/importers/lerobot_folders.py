"""LeRobotDataset folders (v3.0 and v2.1), read without lerobot installed.

- v3.0: `meta/info.json`, `meta/tasks.parquet`, `meta/episodes/chunk-*/file-*.parquet` (one row
  per episode: its data file and row range, and per camera the video file and the
  [from_timestamp, to_timestamp) it occupies there), `data/chunk-*/file-*.parquet` holding the
  rows of many episodes, `videos/<key>/chunk-*/file-*.mp4` concatenating many episodes.
- v2.1: `meta/info.json`, `meta/episodes.jsonl`, `meta/tasks.jsonl`, one
  `data/chunk-*/episode_*.parquet` and one `videos/chunk-*/<key>/episode_*.mp4` per episode.

Video and image features (pictures stored in the data files) become cameras, named by their LeRobot key;
the other numeric features low-dim streams (times from the `timestamp` column); the tasks the episode's
frames name, its task text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from string import Formatter
from typing import Any

import numpy as np

from mmdata.checks import as_int, as_number, as_text, check_json_value, inside, parse_json, relative_path_problem
from mmdata.errors import SourceError
from mmdata.importers.arrays import ArrayCameraSource, ParquetImages, ParquetRowsSource, parquet_rows
from mmdata.importers.episode import CameraInput, CameraSource, EpisodeSource, require_parquet_bytes
from mmdata.importers.files import regular_file_problem
from mmdata.importers.limits import MAX_LOWDIM_BYTES, MAX_METADATA_BYTES
from mmdata.schema import MAX_RATE

INFO = "meta/info.json"
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
NUMERIC = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
MAX_EPISODE_ROWS = 10**8
MAX_STATS_BYTES = 64 << 20
MAX_TASK_CHANGES = 1 << 16
MAX_TASK_INDEX = 1 << 31
DATA_FILES_KEPT = 2  # data files whose index columns discovery keeps at once
MAX_TEXT_RUN_CHARS = 1 << 20  # the texts one episode's text feature may keep in its metadata


def is_lerobot(root: Path) -> bool:
    return (root / INFO).is_file() and (
        (root / "meta" / "episodes").is_dir() or (root / "meta/episodes.jsonl").is_file()
    )


def lerobot_stats(root: str | Path) -> dict[str, Any] | None:
    """LeRobot's own normalization statistics (`meta/stats.json`, keyed by feature name), when the
    dataset ships them and they parse; kept in the converted store beside mmdata's."""
    path = Path(root) / "meta" / "stats.json"
    if not path.is_file() or path.stat().st_size > MAX_STATS_BYTES:
        return None
    try:
        stats = parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


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
        info = parse_json(path.read_bytes(), MAX_METADATA_BYTES)
        if not isinstance(info, dict):
            raise ValueError("does not hold a JSON object")
        for key in ("fps", "features"):
            if key not in info:
                raise ValueError(f"has no '{key}'; the file is not a LeRobot info.json")
        info["fps"] = as_number(info["fps"], "'fps'", high=MAX_RATE, positive=True)
        if not isinstance(info["features"], dict) or not all(isinstance(f, dict) for f in info["features"].values()):
            raise ValueError("'features' is not an object of feature descriptions")
        for key in ("data_path", "video_path", "codebase_version"):
            if info.get(key) is not None:  # video_path is null in a dataset without video features
                as_text(info[key], f"'{key}'", 4096)
        if "chunks_size" in info:
            info["chunks_size"] = as_int(info["chunks_size"], "'chunks_size'", 1)
    except (OSError, ValueError) as exc:
        raise SourceError.for_source(str(root), str(path), f"unusable: {exc}", "fix or re-export it") from exc
    return info


def _path_from_template(root: Path, info: dict, key: str, episode: str, **fields: Any) -> Path:
    """`info[key]` (data_path / video_path) filled in with `fields`, which must be plain integers
    (and the video key): only `{name}` or `{name:03d}`-style fields of those names, no attribute
    or index access, and the path must stay inside the dataset."""
    template = info.get(key)
    if template is None:
        raise SourceError.for_source(str(root), INFO, f"has no '{key}'", "it is not a LeRobot v2.1/v3.0 info.json")
    try:
        for _, name, spec, conversion in Formatter().parse(template):
            if name is None:
                continue
            if name not in fields or conversion is not None or not re.fullmatch(r"0?[0-9]{0,2}d?", spec or ""):
                raise ValueError(f"field {{{name}{':' + spec if spec else ''}}} is not one LeRobot fills in")
        values = {k: v if k == "video_key" else as_int(v, f"'{k}' of the episode's row", 0) for k, v in fields.items()}
        relative = template.format(**values)
    except (ValueError, KeyError, IndexError) as exc:
        raise SourceError(episode, str(root / INFO), f"'{key}' {template!r}: {exc}", "fix meta/info.json") from exc
    problem = relative_path_problem(relative)
    path = root / relative
    if problem is not None or not inside(root, path):
        raise SourceError(
            episode, str(path), f"'{key}' names a file outside the dataset ({problem or 'a link out'})", "fix it"
        )
    return path


def _features(info: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(video keys, image keys, numeric low-dim keys, text keys) of the dataset. Image features are encoded
    pictures, one per row of the data files; they become cameras like video features. Text features (dtype
    `string`) are kept per frame as runs in the episode's metadata (`FrameTexts`)."""
    videos, images, lowdim, texts = [], [], [], []
    for key, feature in info["features"].items():
        dtype = feature.get("dtype")
        if dtype == "video":
            videos.append(key)
        elif dtype == "image":
            images.append(key)
        elif dtype == "string":
            texts.append(key)
        elif dtype in NUMERIC and key not in BOOKKEEPING:
            lowdim.append(key)
    return videos, images, lowdim, texts


def _discover_v3(root: Path, info: dict[str, Any]) -> list[EpisodeSource]:
    import pyarrow.parquet as pq

    videos = _features(info)[0]
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise SourceError.for_source(str(root), "meta/episodes", "holds no episodes table (chunk-*/file-*.parquet)")
    wanted = ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index"]
    wanted += ["dataset_to_index"] + [f"videos/{k}/{f}" for k in videos for f in VIDEO_FIELDS]
    episodes = []
    for path in files:
        try:
            table = pq.ParquetFile(path)
            columns = [c for c in wanted if c in table.schema_arrow.names]
            episodes += table.read(columns=columns).to_pylist()
        except (OSError, ValueError) as exc:
            raise SourceError.for_source(str(root), str(path), f"unreadable episodes table: {exc}") from exc
    data_rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    tasks = _task_texts(root / "meta" / "tasks.parquet")
    features = _features(info)
    return [
        _guarded(row, "meta/episodes", functools.partial(_episode_v3, root, info, row, features, data_rows, tasks))
        for row in _sorted_episodes(episodes, root)
    ]


def _episode_v3(root: Path, info: dict, row: dict, features: tuple, data_rows: dict, tasks: dict) -> EpisodeSource:
    videos, images, lowdim, texts = features
    index, name, fps = row["episode_index"], _episode_name(row["episode_index"]), info["fps"]
    length = as_int(row.get("length"), "'length'", 1, MAX_EPISODE_ROWS)
    chunk, file = row.get("data/chunk_index"), row.get("data/file_index")
    data_path = _path_from_template(root, info, "data_path", name, chunk_index=chunk, file_index=file)
    first = _rows_of(data_path, row, length, data_rows, name)
    cameras: list[CameraInput] = [_camera_v3(root, info, row, key, name, length) for key in videos]
    cameras += [_image_camera(key, data_path, first, length, fps) for key in images]
    column = data_rows[str(data_path)][2]
    runs = task_runs(None if column is None else column[first : first + length])
    index_from = as_int(row.get("dataset_from_index"), "'dataset_from_index'", 0)
    streams = [ParquetRowsSource(key, str(data_path), key, index, first, length, fps) for key in lowdim]
    episode = _episode(info, row, runs, tasks, index_from, cameras, streams)
    return replace(episode, deferred=FrameTexts(str(data_path), tuple(texts), first, length)) if texts else episode


def _guarded(row: dict, table: str, describe: Callable[[], EpisodeSource]) -> EpisodeSource:
    """The episode `describe` makes of `row`, or one carrying its problem: a SourceError as raised, any
    other ValueError as the row of `table` being unusable (converted or skipped, as --skip-bad says)."""
    name = _episode_name(row["episode_index"])
    try:
        return describe()
    except SourceError as failure:
        return EpisodeSource(name=name, problem=failure)
    except ValueError as exc:
        unusable = SourceError(name, table, f"its row is unusable: {exc}", "re-export the dataset")
        return EpisodeSource(name=name, problem=unusable)


def _episode(
    info: dict, row: dict, runs: list, tasks: dict, index_from: int, cameras: list, lowdim: list
) -> EpisodeSource:
    """An episode of either version, with its task text and metadata (how LeRobot numbers it)."""
    metadata = _metadata(info, row["episode_index"], row.get("tasks")) | _numbering(index_from, runs, tasks)
    return EpisodeSource(
        name=_episode_name(row["episode_index"]),
        task=_task_text(row.get("tasks"), runs, tasks),
        metadata=metadata,
        cameras=tuple(cameras),
        lowdim=tuple(lowdim),
    )


def _sorted_episodes(rows: list[dict], root: Path) -> list[dict]:
    """Episode rows by episode_index; rows without a usable index, or repeating one, are refused."""
    seen: set[int] = set()
    usable = []
    for position, row in enumerate(rows):
        try:
            index = as_int(row.get("episode_index"), "episode_index", 0, 10**9)
        except ValueError as exc:
            raise SourceError.for_source(
                str(root), "meta/episodes", f"row {position}: {exc}", "re-export the dataset"
            ) from exc
        if index in seen:
            raise SourceError.for_source(
                str(root), "meta/episodes", f"episode_index {index} appears twice", "re-export the dataset"
            )
        seen.add(index)
        usable.append({**row, "episode_index": index})
    return sorted(usable, key=lambda row: row["episode_index"])


def _episode_name(index: int) -> str:
    return f"episode_{index:06d}"


def _rows_of(path: Path, row: dict, length: int, cache: dict, episode: str) -> int:
    """Where the episode's rows start in its data file, after checking they are its rows."""
    import pyarrow.parquet as pq

    if str(path) not in cache:
        if (why := regular_file_problem(path)) is not None:
            raise SourceError(episode, str(path), f"the data file {why}")
        try:
            parquet = pq.ParquetFile(path)
            columns = _with_task_column(parquet, ["index", "episode_index"])
            require_parquet_bytes(parquet, columns, MAX_LOWDIM_BYTES)
            table = parquet.read(columns=columns)
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(episode, str(path), f"unreadable data file: {exc}", "re-export the dataset") from exc
        while len(cache) >= DATA_FILES_KEPT:  # episodes come file by file: memory stays that of a few files
            cache.pop(next(iter(cache)))
        cache[str(path)] = (
            table.column("index").to_numpy(),
            table.column("episode_index").to_numpy(),
            _task_column(table),
        )
    global_index, owners, _ = cache[str(path)]
    start = as_int(row.get("dataset_from_index"), "'dataset_from_index'", 0)
    stop = as_int(row.get("dataset_to_index"), "'dataset_to_index'", start)
    first = int(np.searchsorted(global_index, start))
    last = int(np.searchsorted(global_index, stop))
    index = row["episode_index"]
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


def _camera_v3(root: Path, info: dict, row: dict, key: str, episode: str, length: int) -> CameraSource:
    chunk, file = row.get(f"videos/{key}/chunk_index"), row.get(f"videos/{key}/file_index")
    path = _path_from_template(root, info, "video_path", episode, video_key=key, chunk_index=chunk, file_index=file)
    if (why := regular_file_problem(path)) is not None:
        raise SourceError(episode, str(path), f"the video of camera '{key}' {why}")
    start = as_number(row.get(f"videos/{key}/from_timestamp"), f"'videos/{key}/from_timestamp'", 0)
    end = as_number(row.get(f"videos/{key}/to_timestamp"), f"'videos/{key}/to_timestamp'", start)
    return CameraSource(key, str(path), start, end, length, grid=info["fps"])


def _image_camera(key: str, data_path: Path, first: int, length: int, fps: float) -> ArrayCameraSource:
    return ArrayCameraSource(key, ParquetImages(str(data_path), key, first, length), fps)


def _discover_v21(root: Path, info: dict[str, Any]) -> list[EpisodeSource]:
    features = _features(info)
    episodes = _sorted_episodes(_read_jsonl(root / "meta/episodes.jsonl", root), root)
    tasks = _task_texts(root / "meta" / "tasks.jsonl")
    # LeRobot v2.1 numbers frames across episodes in episode order
    index_from = np.concatenate([[0], np.cumsum([_length_or_zero(row) for row in episodes])]).astype(int).tolist()
    return [
        _guarded(row, "meta/episodes.jsonl", functools.partial(_episode_v21, root, info, row, features, tasks, at))
        for row, at in zip(episodes, index_from)
    ]


def _episode_v21(root: Path, info: dict, row: dict, features: tuple, tasks: dict, index_from: int) -> EpisodeSource:
    videos, images, lowdim, texts = features
    index, name, fps = row["episode_index"], _episode_name(row["episode_index"]), info["fps"]
    chunk = index // info.get("chunks_size", 1000)
    length = as_int(row.get("length"), "'length'", 1, MAX_EPISODE_ROWS)
    data_path = _path_from_template(root, info, "data_path", name, episode_chunk=chunk, episode_index=index)
    runs = task_runs(_check_episode_file(data_path, index, length, name))
    cameras: list[CameraInput] = []
    for key in videos:
        path = _path_from_template(
            root, info, "video_path", name, episode_chunk=chunk, video_key=key, episode_index=index
        )
        if (why := regular_file_problem(path)) is not None:
            raise SourceError(name, str(path), f"the video of camera '{key}' {why}")
        cameras.append(CameraSource(key, str(path), expected_frames=length, grid=fps))
    cameras += [_image_camera(key, data_path, 0, length, fps) for key in images]
    streams = [ParquetRowsSource(key, str(data_path), key, index, 0, length, fps) for key in lowdim]
    episode = _episode(info, row, runs, tasks, index_from, cameras, streams)
    return replace(episode, deferred=FrameTexts(str(data_path), tuple(texts), 0, length)) if texts else episode


@dataclass(frozen=True)
class FrameTexts:
    """An episode's `string` features (a text per frame), read by the conversion worker from the episode's
    rows [first, first + count) of its data file and kept in its metadata as runs, `lerobot_text_runs`:
    feature -> [[first frame, text], ...] (such texts change rarely: an instruction, a phase). A feature whose
    texts change too often to keep so is listed in `lerobot_unread_features` instead."""

    path: str
    columns: tuple[str, ...]
    first: int
    count: int

    def complete(self, source: EpisodeSource) -> EpisodeSource:
        import pyarrow.parquet as pq

        try:
            rows = parquet_rows(pq.ParquetFile(self.path), list(self.columns), self.first, self.count)
        except (OSError, ValueError, KeyError) as exc:
            what = f"cannot read the text features {list(self.columns)}: {exc}"
            raise SourceError(source.name, self.path, what) from exc
        kept, unread = {}, list(source.metadata.get("lerobot_unread_features", []))
        for column in self.columns:
            texts = rows.column(column).to_pylist()
            if not all(text is None or isinstance(text, str) for text in texts):
                raise SourceError(source.name, self.path, f"text feature '{column}' holds values that are not text")
            runs = value_runs(np.array(["" if text is None else text for text in texts], dtype=object))
            if len(runs) <= MAX_TASK_CHANGES and sum(len(text) for _, text in runs) <= MAX_TEXT_RUN_CHARS:
                kept[column] = runs
            else:
                unread.append(column)
        metadata = {**source.metadata, "lerobot_text_runs": kept}
        if unread:
            metadata["lerobot_unread_features"] = sorted(unread)
        return replace(source, metadata=metadata, deferred=None)


def _check_episode_file(path: Path, index: int, length: int, episode: str) -> np.ndarray | None:
    """Check the episode's data file holds its `length` rows; return its `task_index` column (None without one)."""
    import pyarrow.parquet as pq

    if (why := regular_file_problem(path)) is not None:
        raise SourceError(episode, str(path), f"the data file {why}")
    try:
        parquet = pq.ParquetFile(path)
        columns = _with_task_column(parquet, ["episode_index"])
        require_parquet_bytes(parquet, columns, MAX_LOWDIM_BYTES)
        table = parquet.read(columns=columns)
        owners = table.column("episode_index").to_numpy()
    except (OSError, ValueError, KeyError) as exc:
        raise SourceError(episode, str(path), f"unreadable data file: {exc}", "re-export the dataset") from exc
    _require_owner(
        owners,
        index,
        length,
        episode,
        path,
        f"meta/episodes.jsonl says episode {index} has {length} rows, but the file holds {len(owners)}",
        "meta/episodes.jsonl",
    )
    return _task_column(table)


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
        if path.stat().st_size > MAX_METADATA_BYTES * 64:
            raise ValueError("is too large for an episode list")
        rows = [parse_json(line) for line in path.read_bytes().splitlines() if line.strip()]
        if not all(isinstance(row, dict) for row in rows):
            raise ValueError("holds a line that is not a JSON object")
    except (OSError, ValueError) as exc:
        raise SourceError.for_source(str(root), str(path), f"unreadable: {exc}") from exc
    return rows


def _with_task_column(parquet, columns: list[str]) -> list[str]:
    return columns + (["task_index"] if "task_index" in parquet.schema_arrow.names else [])


def _task_column(table) -> np.ndarray | None:
    if "task_index" not in table.column_names:
        return None
    column = table.column("task_index")
    return column.to_numpy() if column.null_count == 0 else None


def task_runs(task_index: np.ndarray | None) -> list[list[int]]:
    """The episode's `task_index` column as runs, `[[first frame, task_index], ...]`: LeRobot keeps a task
    per frame, and an episode's task may change part-way. Empty without the column."""
    if task_index is None or not len(task_index):
        return []
    if task_index.dtype.kind not in "iu" or task_index.min() < 0 or task_index.max() > MAX_TASK_INDEX:
        raise ValueError(f"its task_index column holds {task_index.dtype} values outside 0..{MAX_TASK_INDEX}")
    runs = value_runs(task_index)
    if len(runs) > MAX_TASK_CHANGES:
        raise ValueError(f"its task_index changes {len(runs) - 1} times; mmdata keeps at most {MAX_TASK_CHANGES}")
    return runs


def value_runs(values: np.ndarray) -> list[list[Any]]:
    """`values` (one per frame) as `[[first frame, value], ...]`, a run wherever the value changes."""
    if not len(values):
        return []
    starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
    return [[frame, value] for frame, value in zip(starts.tolist(), values[starts].tolist())]


def _task_text(tasks: Any, runs: list[list[int]], texts: dict[int, str]) -> str:
    """The episode's task text: its frames' tasks in the order they come, joined by '; ' when there are several
    (the episodes table lists them in no particular order); the table's list where frames name unknown tasks."""
    numbers = list(dict.fromkeys(number for _, number in runs))
    if numbers and all(number in texts for number in numbers):
        return "; ".join(texts[number] for number in numbers)
    if tasks is None:
        return ""
    if isinstance(tasks, str):
        return as_text(tasks, "'tasks'")
    if isinstance(tasks, list):
        return "; ".join(as_text(t, "a task") for t in tasks)
    raise ValueError(f"'tasks' is {type(tasks).__name__}, not text or a list of texts")


def _numbering(index_from: int, runs: list[list[int]], texts: dict[int, str]) -> dict[str, Any]:
    """How LeRobot numbers the episode's frames and tasks, for loaders that give LeRobot's index fields
    (`mmdata.lerobot`): the dataset-wide index of its first frame, its frames' `task_index` as runs, and the
    text of each task it uses."""
    used = {str(number): texts[number] for _, number in runs if number in texts}
    return {"lerobot_index_from": index_from, "lerobot_task_runs": runs, "lerobot_tasks": used}


def _task_texts(path: Path) -> dict[int, str]:
    """task_index -> task text from `meta/tasks.parquet` (v3.0: the text is the table's index column) or
    `meta/tasks.jsonl` (v2.1); empty when the file is missing or unreadable (the task text is still kept)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path).to_pylist()
            texts = [next((v for k, v in r.items() if k != "task_index" and isinstance(v, str)), None) for r in table]
            return {int(r["task_index"]): t for t, r in zip(texts, table) if t is not None}
        rows = [parse_json(line) for line in path.read_text().splitlines() if line.strip()]
        return {int(r["task_index"]): r["task"] for r in rows if isinstance(r, dict) and "task" in r}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _length_or_zero(row: dict) -> int:
    try:
        return as_int(row.get("length"), "'length'", 1, MAX_EPISODE_ROWS)
    except ValueError:
        return 0


def _metadata(info: dict, index: int, tasks: Any) -> dict[str, Any]:
    metadata = {
        "source_format": f"lerobot {info.get('codebase_version')}",
        "lerobot_episode_index": index,
        "robot_type": info.get("robot_type"),
        "tasks": list(tasks) if tasks is not None and not isinstance(tasks, str) else tasks,
    }
    unread = sorted(
        str(key)
        for key, feature in info["features"].items()
        if key not in BOOKKEEPING and feature.get("dtype") not in (*NUMERIC, "video", "image", "string")
    )
    if unread:
        metadata["lerobot_unread_features"] = unread
    check_json_value(metadata)
    return metadata
