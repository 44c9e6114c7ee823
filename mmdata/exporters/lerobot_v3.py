"""`mmdata export STORE DST --to lerobot`: a store (or some of its episodes) as a LeRobot v3.0 dataset, the
layout LeRobot 0.4-0.6 reads (`meta/info.json`, `meta/stats.json`, `meta/tasks.parquet`, `meta/episodes/`,
`data/chunk-*/file-*.parquet`, `videos/<camera>/chunk-*/file-*.mp4`).

A LeRobot dataset has one row per frame at one rate: here the cameras' frames, which must share a rate and
be evenly spaced (LeRobot's own check allows 0.1 ms). Each row gets LeRobot's bookkeeping as LeRobot writes
it: `timestamp` = frame_index / fps, `frame_index`, `episode_index` and `index` counted over the exported
episodes, `task_index` into the tasks of the exported frames (a store converted from LeRobot keeps each
frame's task, which may change part-way). A low-dim stream stamped at the frames' times is written as
stored; another is sampled at the frame times (the nearest value; the report names it). Cameras are
remuxed, not re-encoded, when their codec goes into MP4 (H.264, HEVC, AV1, VP9), else encoded as LeRobot
encodes (AV1, a key frame every 2 frames, crf 30). Audio has no place in a LeRobot dataset and is left out
(the report says so). Everything is written into `DST.partial/` and renamed to DST at the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from mmdata.checks import dump_json, inside
from mmdata.codecs.align import values_at
from mmdata.errors import DestinationError, ExportError, OptionError
from mmdata.lerobot.numbering import EpisodeNumbering
from mmdata.schema import LowdimStream, VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.handle import Store, open_store
from mmdata.store.hold import locked_folder
from mmdata.store.remux import write_episode_video

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_MB = 100
VIDEO_FILE_MB = 500
TIME_TOLERANCE = 1e-4  # seconds: LeRobot's default tolerance_s
REMUXED_CODECS = ("h264", "hevc", "av1", "vp9")
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
FRAMES_FOR_IMAGE_STATS = 16  # per episode, spread over it
BOOKKEEPING = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64"}
BOOKKEEPING |= {"task_index": "int64"}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
PARTIAL_MARK = ".mmdata-export"
INNER_WORK_FOLDER = ".mmdata-export.partial"


@dataclass
class ExportReport:
    """What an export wrote, and what it could not write as stored."""

    destination: str
    episodes: int = 0
    frames: int = 0
    remuxed: list[str] = field(default_factory=list)
    reencoded: list[str] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    seconds: float = 0.0


def export_lerobot(
    store: str | Store,
    destination: str | Path,
    episodes: Iterable[int] | None = None,
    rename: Mapping[str, str] | None = None,
    progress: bool = True,
) -> ExportReport:
    """Write the store's episodes `episodes` (default: every one whose manifest row is intact), in store order,
    as a LeRobot v3.0 dataset at `destination` (a new folder); `rename` maps stream names to LeRobot feature
    keys (`{"state": "observation.state"}`). See the module docstring."""
    started = time.perf_counter()
    store = store if isinstance(store, Store) else open_store(str(store))
    chosen = chosen_episodes(store, episodes)
    keys = feature_keys(store, rename or {})
    cameras = [s for s in store.schema.streams if isinstance(s, VideoStream)]
    lowdim = [s for s in store.schema.streams if isinstance(s, LowdimStream)]
    for stream in lowdim:
        if len(stream.shape) > 1:
            raise ExportError(
                f"low-dim stream '{stream.name}' has shape {list(stream.shape)}; a LeRobot feature of numbers is a"
                " vector: export a store whose streams are vectors"
            )
    fps = frame_rate(cameras)
    root = Path(os.path.abspath(destination))
    _refuse_inside_store(root, store)
    report = ExportReport(str(destination))
    report.left_out = [s.name for s in store.schema.streams if s.kind == "audio"]
    with _working_in(root) as work:
        try:
            writer = _Writer(work, store, keys, cameras, lowdim, fps)
            chosen_shown = tqdm(chosen, unit="episode", desc="export -> lerobot", disable=not progress)
            for position, index in enumerate(chosen_shown):
                writer.add_episode(position, index, report)
            writer.finish()
            work.joinpath(PARTIAL_MARK).unlink()
            _publish(work, root)
        except BaseException as exc:
            shutil.rmtree(work, ignore_errors=True)  # nothing half-written is left behind
            if isinstance(exc, OSError):
                raise _write_failure(root, exc) from exc
            raise
    report.episodes, report.frames = len(chosen), writer.total
    report.remuxed = [s.name for s in cameras if s.codec in REMUXED_CODECS]
    report.reencoded = [s.name for s in cameras if s.codec not in REMUXED_CODECS]
    report.seconds = time.perf_counter() - started
    return report


def chosen_episodes(store: Store, episodes: Iterable[int] | None) -> list[int]:
    """The manifest rows to export, in store order; an episode out of range or damaged is refused by number (the
    first out of range ends the listing, so a range far larger than the store is never made whole)."""
    if episodes is None:
        return [i for i in range(len(store)) if i not in store.damaged]
    chosen: set[int] = set()
    for index in episodes:
        if isinstance(index, bool) or not isinstance(index, int | np.integer) or not 0 <= index < len(store):
            raise OptionError(f"episode {index!r} is not in '{store.url}', which holds episodes 0-{len(store) - 1}")
        if index in store.damaged:
            raise ExportError(f"episode {index} of '{store.url}' is damaged ({store.damaged[index]}); leave it out")
        chosen.add(int(index))
    if not chosen:
        raise OptionError("no episode to export: --episodes lists none")
    return sorted(chosen)


def feature_keys(store: Store, rename: Mapping[str, str]) -> dict[str, str]:
    """Each camera's and low-dim stream's LeRobot feature key: its name, or what `rename` maps it to. A key names a
    folder of the dataset (`videos/<key>/`), so it must be one plain path component: LeRobot's own rule (no '/'),
    no '\\', no control characters, not '.' or '..', not empty."""
    streams = {s.name for s in store.schema.streams if s.kind in ("video", "lowdim")}
    unknown = sorted(set(rename) - streams)
    if unknown:
        raise OptionError(f"--rename names streams the store does not have as cameras or low-dim: {unknown}")
    keys = {name: rename.get(name, name) for name in sorted(streams)}
    for name, key in keys.items():
        problem = feature_key_problem(key)
        if problem is not None:
            raise OptionError(f"the LeRobot feature key {key!r} for stream '{name}' {problem}; --rename it to another")
    taken = [key for key in keys.values() if key in BOOKKEEPING]
    if taken or len(set(keys.values())) != len(keys):
        raise OptionError(
            f"feature keys must be distinct and not LeRobot's own ({', '.join(BOOKKEEPING)}): {sorted(keys.values())}"
        )
    return keys


def feature_key_problem(key: str) -> str | None:
    """Why `key` cannot be a LeRobot feature key that names a folder of the dataset, or None."""
    if not isinstance(key, str) or not key.strip():
        return "is empty"
    if "/" in key or "\\" in key:
        return "holds '/' or '\\' (LeRobot's feature keys hold no '/'; a key names one folder)"
    if key in (".", "..") or any(ord(character) < 32 or ord(character) == 127 for character in key):
        return "is '.' or '..' or holds a control character"
    if len(key.encode("utf-8", "surrogatepass")) > 200:
        return "is longer than 200 bytes"
    return None


def frame_rate(cameras: list[VideoStream]) -> float:
    """The dataset's one rate: its cameras'."""
    if not cameras:
        raise ExportError("the store has no camera: a LeRobot dataset's rows follow the frames of its cameras")
    rates = sorted({camera.fps for camera in cameras})
    if len(rates) > 1:
        raise ExportError(
            f"the cameras run at different rates ({rates} fps); a LeRobot dataset has one: export the cameras of one"
            " rate (convert the others into a store of their own)"
        )
    odd = [c.name for c in cameras if c.coded_size != (c.width, c.height)]
    if odd:
        raise ExportError(f"cameras {odd} have an odd side, which LeRobot's 4:2:0 videos cannot hold")
    return rates[0]


def _refuse_inside_store(root: Path, store: Store) -> None:
    """A LeRobot dataset written into the store's own folder would sit among its files (where `convert
    --overwrite` of the store would later delete it): refused."""
    if store.holds(root):
        raise DestinationError(
            f"'{root}' lies inside the store '{store.url}'; export into a folder outside it (the store is not changed)"
        )


@contextlib.contextmanager
def _working_in(root: Path) -> Iterator[Path]:
    """The folder the export is written into before it is published (`_work_folder`), locked while the block runs:
    an unfinished export's work folder is removed only when no export holds it (a second export into one place at
    once is refused, naming it, instead of deleting the first's work)."""
    work = _work_folder(root)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locked_folder(work))
        except BlockingIOError:
            raise DestinationError(
                f"another export is writing '{root}' now (into '{work}'); wait for it to end, or export elsewhere"
            ) from None
        try:
            if any(entry.name != PARTIAL_MARK for entry in work.iterdir()):  # (an unfinished export's, no one's now)
                shutil.rmtree(work)
                work.mkdir()
                (work / PARTIAL_MARK).touch()
                held.close()
                held.enter_context(locked_folder(work))
        except OSError as exc:
            raise _write_failure(work, exc) from exc
        yield work


def _work_folder(root: Path) -> Path:
    """The folder the export is written into before it is published: `DST.partial/` beside a new destination, or,
    for an existing empty folder (the current one, a folder made for it), a hidden folder inside it, so that the
    folder itself is kept. Refuses a destination that is a link, a file, or a folder that holds anything (but an
    unfinished export's work folder, kept for `_working_in` to remove), and a work folder that is not an unfinished
    export's."""
    if root.is_symlink():
        raise DestinationError(
            f"'{root}' is a symbolic link (to '{os.path.realpath(root)}'); export into a new folder, or into the"
            " folder it points to by that folder's own path"
        )
    if root.exists():
        if not root.is_dir():
            raise DestinationError(f"'{root}' exists and is not a folder; export into a new folder")
        work = root / INNER_WORK_FOLDER
        others = [entry.name for entry in root.iterdir() if entry != work]
        if others:
            raise DestinationError(f"'{root}' exists and is not empty (it holds {others[:3]}); export into a new one")
    else:
        work = root.with_name(root.name + ".partial")
    try:
        if work.exists() or work.is_symlink():
            if work.is_symlink() or not (work / PARTIAL_MARK).is_file():
                raise DestinationError(f"'{work}' exists and is not an unfinished export's; move it away")
            return work
        work.mkdir(parents=True)
        (work / PARTIAL_MARK).touch()
    except OSError as exc:
        raise _write_failure(work, exc) from exc
    return work


def _publish(work: Path, root: Path) -> None:
    """The finished export moved to `root`: the work folder renamed to it, or, inside an existing folder, its
    entries moved up (`meta/`, which makes it a dataset, last) and the work folder removed."""
    if work.parent != root:
        work.rename(root)
        return
    for entry in sorted(work.iterdir(), key=lambda path: path.name == "meta"):
        entry.rename(root / entry.name)
    work.rmdir()


def _write_failure(where: Path, error: OSError) -> DestinationError:
    """A DestinationError saying what could not be written and what to do."""
    if error.errno == errno.ENOSPC:
        return DestinationError(f"the disk is full while exporting to '{where}'; free space and export again")
    if isinstance(error, PermissionError):
        return DestinationError(f"cannot write '{error.filename or where}': permission denied; export elsewhere")
    return DestinationError(f"writing the export to '{where}' failed: {error.strerror or error}")


class _Writer:
    """Writes the exported episodes one by one: data rows into files of about DATA_FILE_MB, a video per camera
    per episode, and accumulates what `meta/` needs."""

    def __init__(
        self,
        work: Path,
        store: Store,
        keys: dict[str, str],
        cameras: list[VideoStream],
        lowdim: list[LowdimStream],
        fps: float,
    ):
        self.work, self.store, self.keys, self.cameras, self.lowdim, self.fps = work, store, keys, cameras, lowdim, fps
        self.numbering = EpisodeNumbering.of(store, fps)
        self.dataset = Dataset(store, decoder="pyav")
        self.total = 0
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict[str, Any]] = []
        self.values: dict[str, list[np.ndarray]] = {key: [] for key in [*BOOKKEEPING, *(keys[s.name] for s in lowdim)]}
        self.pixels = {camera.name: np.zeros((3, 256), np.int64) for camera in cameras}
        self.sampled = dict.fromkeys((camera.name for camera in cameras), 0)
        self.robot_type: str | None = None
        self.schema = pa.schema([(keys[s.name], _arrow_type(s)) for s in lowdim] + _bookkeeping_fields())
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._file = 0

    def add_episode(self, position: int, index: int, report: ExportReport) -> None:
        row = self.store.manifest.row(index)
        clock = self._frame_clock(row)
        count = len(clock)
        columns: dict[str, Any] = {}
        for stream in self.lowdim:
            values, on_clock = self._values_on(index, stream, clock)
            if not on_clock and stream.name not in report.resampled:
                report.resampled.append(stream.name)
            columns[self.keys[stream.name]] = values
        texts = self._frame_tasks(index, row, count)
        columns["timestamp"] = (np.arange(count) / self.fps).astype(np.float32)
        columns["frame_index"] = np.arange(count, dtype=np.int64)
        columns["episode_index"] = np.full(count, position, np.int64)
        columns["index"] = np.arange(self.total, self.total + count, dtype=np.int64)
        columns["task_index"] = np.array([self.tasks.setdefault(text, len(self.tasks)) for text in texts], np.int64)
        for key, values in columns.items():
            self.values[key].append(np.asarray(values, np.float64).reshape(count, -1))
        chunk, file = self._add_rows(columns)
        entry: dict[str, Any] = {
            "episode_index": position,
            "tasks": list(dict.fromkeys(texts)),
            "length": count,
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": self.total,
            "dataset_to_index": self.total + count,
        }
        video_chunk, video_file = divmod(position, CHUNKS_SIZE)
        for camera in self.cameras:
            key = self.keys[camera.name]
            path = self._target(VIDEO_PATH.format(video_key=key, chunk_index=video_chunk, file_index=video_file))
            self._write_video(index, camera, path)
            self._count_pixels(index, camera, clock)
            entry |= {
                f"videos/{key}/chunk_index": video_chunk,
                f"videos/{key}/file_index": video_file,
                f"videos/{key}/from_timestamp": 0.0,
                f"videos/{key}/to_timestamp": count / self.fps,
            }
        entry |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        self.episodes.append(entry)
        self.total += count
        if self.robot_type is None and isinstance(self.store.metadata_of(row).get("robot_type"), str):
            self.robot_type = self.store.metadata_of(row)["robot_type"]

    def _frame_clock(self, row: dict) -> np.ndarray:
        """The episode's frame times: its cameras' (one count, evenly spaced at the rate)."""
        times = {camera.name: self.store.timestamps_of(row, camera.name) for camera in self.cameras}
        counts = {name: len(t) for name, t in times.items()}
        if len(set(counts.values())) > 1:
            raise ExportError(
                f"episode '{row['key']}': its cameras hold different frame counts {counts}; a LeRobot row holds one"
                " frame of each"
            )
        for name, stamps in times.items():
            drift = np.abs(stamps - stamps[0] - np.arange(len(stamps)) / self.fps) if len(stamps) else np.zeros(1)
            if drift.max() > TIME_TOLERANCE:
                frame = int(np.argmax(drift))
                raise ExportError(
                    f"episode '{row['key']}', camera '{name}': frame {frame} is {drift.max() * 1000:.2f} ms off the"
                    f" {self.fps:g} fps grid; LeRobot needs evenly spaced frames (within {TIME_TOLERANCE * 1000:g} ms)"
                )
        return times[self.cameras[0].name]

    def _values_on(self, index: int, stream: LowdimStream, clock: np.ndarray) -> tuple[np.ndarray, bool]:
        """The stream's values at the frame times: as stored when stamped at them, else the nearest ones."""
        data = self.store.lowdim_span(index, stream.name, -np.inf, np.inf)
        values, stamps = np.asarray(data.values), np.asarray(data.timestamps)
        if len(stamps) == len(clock) and (not len(clock) or np.abs(stamps - clock).max() <= TIME_TOLERANCE):
            return values, True
        if not len(stamps):
            raise ExportError(f"episode {index}: low-dim stream '{stream.name}' holds no value to sample")
        return values_at(stamps, values, clock, "nearest")[0], False

    def _frame_tasks(self, index: int, row: dict, count: int) -> list[str]:
        """Each frame's task text: LeRobot's own per frame for a store converted from LeRobot, else the episode's."""
        indices = self.numbering.tasks.at(np.full(count, index), np.arange(count))
        return [self.numbering.task_texts.get(int(i), row["task"]) if i >= 0 else row["task"] for i in indices]

    def _add_rows(self, columns: dict[str, Any]) -> tuple[int, int]:
        table = pa.table(
            {name: _arrow_column(columns[name], self.schema.field(name).type) for name in self.schema.names}
        )
        if self._pending and self._pending_bytes + table.nbytes > DATA_FILE_MB << 20:
            self._flush()
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        return divmod(self._file, CHUNKS_SIZE)

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk, file = divmod(self._file, CHUNKS_SIZE)
        path = self._target(DATA_PATH.format(chunk_index=chunk, file_index=file))
        pq.write_table(pa.concat_tables(self._pending).cast(self.schema), path)
        self._pending, self._pending_bytes = [], 0
        self._file += 1

    def _write_video(self, index: int, camera: VideoStream, path: Path) -> None:
        stem = path.with_suffix("")
        if camera.codec in REMUXED_CODECS:
            write_episode_video(self.store, index, camera.name, stem, container="mp4")
        else:
            _encode_as_lerobot(self.dataset, index, camera, path)

    def _count_pixels(self, index: int, camera: VideoStream, clock: np.ndarray) -> None:
        picked = np.unique(np.linspace(0, len(clock) - 1, min(FRAMES_FOR_IMAGE_STATS, len(clock))).round().astype(int))
        if not len(picked):
            return
        frames = np.asarray(self.dataset.frames_at(index, camera.name, clock[picked]).values).reshape(-1, 3)
        self.sampled[camera.name] += len(picked)
        self.pixels[camera.name] += np.stack([np.bincount(frames[:, c], minlength=256) for c in range(3)])

    def finish(self) -> None:
        self._flush()
        pq.write_table(pa.Table.from_pylist(self.episodes), self._target("meta/episodes/chunk-000/file-000.parquet"))
        _write_tasks(self._target("meta/tasks.parquet"), self.tasks)
        self._target("meta/info.json").write_text(dump_json(self._info(), indent=4))
        self._target("meta/stats.json").write_text(dump_json(self._stats(), indent=4))

    def _target(self, relative: str) -> Path:
        """The path of `relative` in the export, its folder made; ExportError unless it lies inside the export
        (links resolved): no name may lead a write outside the destination."""
        path = self.work / relative
        if not inside(self.work, path):
            raise ExportError(f"'{relative}' would be written outside the export folder '{self.work}'; refused")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _info(self) -> dict[str, Any]:
        features: dict[str, Any] = {}
        for camera in self.cameras:
            features[self.keys[camera.name]] = {
                "dtype": "video",
                "shape": [camera.height, camera.width, 3],
                "names": ["height", "width", "channels"],
                "info": {
                    "video.height": camera.height,
                    "video.width": camera.width,
                    "video.codec": camera.codec if camera.codec in REMUXED_CODECS else "av1",
                    "video.pix_fmt": "yuv420p",
                    "video.is_depth_map": False,
                    "video.fps": _plain(self.fps),
                    "video.channels": 3,
                    "has_audio": False,
                },
            }
        for stream in self.lowdim:
            width = int(np.prod(stream.shape, dtype=np.int64)) if stream.shape else 1
            features[self.keys[stream.name]] = {"dtype": stream.dtype, "shape": [width], "names": None}
        for name, dtype in BOOKKEEPING.items():
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        episodes = len(self.episodes)
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": episodes,
            "total_frames": self.total,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_MB,
            "video_files_size_in_mb": VIDEO_FILE_MB,
            "fps": _plain(self.fps),
            "splits": {"train": f"0:{episodes}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": features,
        }

    def _stats(self) -> dict[str, Any]:
        """LeRobot's `meta/stats.json`: per feature min, max, mean, std, count and the quantiles it keeps; images
        per channel, in [0, 1], shaped [3, 1, 1], from frames spread over every episode."""
        stats: dict[str, Any] = {}
        for key, parts in self.values.items():
            rows = np.concatenate(parts) if parts else np.zeros((0, 1))
            if not len(rows):
                continue
            figures = {"min": rows.min(0), "max": rows.max(0), "mean": rows.mean(0), "std": rows.std(0)}
            figures |= {f"q{round(q * 100):02d}": np.quantile(rows, q, axis=0) for q in QUANTILES}
            stats[key] = {name: value.tolist() for name, value in figures.items()} | {"count": [len(rows)]}
        for camera in self.cameras:
            counts = self.pixels[camera.name]
            if not counts.sum():
                continue
            levels = np.arange(256) / 255.0
            total = counts.sum(1)
            mean = (counts * levels).sum(1) / total
            std = np.sqrt((counts * (levels - mean[:, None]) ** 2).sum(1) / total)
            cumulative = np.cumsum(counts, axis=1) / total[:, None]
            figures = {
                "min": np.array([levels[np.flatnonzero(c)[0]] for c in counts]),
                "max": np.array([levels[np.flatnonzero(c)[-1]] for c in counts]),
                "mean": mean,
                "std": std,
            }
            for q in QUANTILES:
                figures[f"q{round(q * 100):02d}"] = np.array([levels[np.searchsorted(c, q)] for c in cumulative])
            shaped = {name: value.reshape(3, 1, 1).tolist() for name, value in figures.items()}
            stats[self.keys[camera.name]] = shaped | {"count": [self.sampled[camera.name]]}
        return stats


def _encode_as_lerobot(dataset: Dataset, index: int, camera: VideoStream, path: Path) -> None:
    """The camera's frames encoded as LeRobot encodes them: AV1 (SVT-AV1), a key frame every 2 frames, crf 30."""
    frames = np.asarray(dataset.read_episode(index, [camera.name])[camera.name].values)
    partial = path.with_name(path.stem + ".partial.mp4")
    with av.open(str(partial), "w") as output:
        stream = output.add_stream("libsvtav1", rate=Fraction(camera.fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = camera.width, camera.height, "yuv420p"
        stream.options = {"g": "2", "crf": "30"}
        for pixels in frames:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        output.mux(stream.encode())
    partial.replace(path)


def _write_tasks(path: Path, tasks: dict[str, int]) -> None:
    """`meta/tasks.parquet` as pandas writes it (LeRobot reads it with pandas): the task text is the index."""
    table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()), "__index_level_0__": list(tasks)})
    pandas = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object", "metadata": None}
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }  # fmt: skip
    pq.write_table(table.replace_schema_metadata({"pandas": json.dumps(pandas)}), path)


def _arrow_type(stream: LowdimStream) -> pa.DataType:
    """A vector feature as LeRobot stores it: a fixed-size list; a feature of one value as a plain column."""
    element = pa.from_numpy_dtype(np.dtype(stream.dtype))
    width = int(np.prod(stream.shape, dtype=np.int64)) if stream.shape else 1
    return element if width == 1 else pa.list_(element, width)


def _arrow_column(values: Any, kind: pa.DataType) -> pa.Array:
    array = np.asarray(values)
    if pa.types.is_fixed_size_list(kind):
        flat = np.ascontiguousarray(array.reshape(len(array), -1)).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, kind.value_type), kind.list_size)
    return pa.array(array.reshape(len(array)), kind)


def _bookkeeping_fields() -> list[tuple[str, pa.DataType]]:
    return [(name, pa.from_numpy_dtype(np.dtype(dtype))) for name, dtype in BOOKKEEPING.items()]


def _plain(rate: float) -> int | float:
    """A rate as LeRobot writes it: an int when it is whole."""
    return int(rate) if float(rate).is_integer() else float(rate)
