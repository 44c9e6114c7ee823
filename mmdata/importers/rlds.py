"""RLDS datasets (TFDS builder folders of TFRecord files: Open X-Embodiment, DROID) -> `EpisodeSource`s,
read without TensorFlow.

A TFDS RLDS record is one episode: a `tf.train.Example` whose keys are flat feature paths. Each
`steps/<path>` holds one entry per step, flattened: an encoded JPEG/PNG per step for an image, the
step's values for a tensor (reshaped by `features.json`). `episode_metadata/<key>` holds one value.
The mapping to streams:

- every `steps/observation/<key>` Image (or those `image_keys` names) -> a camera named `<key>`;
- every numeric `steps/<path>` Tensor or Scalar (`observation/state`, `action`, `reward`, `discount`,
  `is_first`, ...) -> a low-dim stream named by its path with `/` as `.` (`observation.state`);
- the first step's `language_instruction` (or `language_instruction` anywhere in the steps) -> the task;
- `episode_metadata/*` -> the episode's metadata.

RLDS stores no timestamps: step `i` is at `i / fps` seconds (`--fps`, the dataset's control rate).
Episodes are numbered in the order of the TFRecord files and of the records in them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mmdata.checks import as_int, parse_json
from mmdata.errors import SourceError
from mmdata.importers.arrays import ArrayCameraSource, ArrayLowdimSource, ArrayShape
from mmdata.importers.episode import EpisodeSource, require_common_streams
from mmdata.importers.files import file_problem, listed
from mmdata.importers.tfrecord import Feature, TFRecordError, iter_record_spans, parse_example, read_record

SHARD = re.compile(r".*\.tfrecord-(\d+)-of-(\d+)$")
MAX_FEATURES = 4096
NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                  "float32", "float64")  # fmt: skip
IMAGE_CLASS = "tensorflow_datasets.core.features.image_feature.Image"
NUMERIC_CLASSES = ("tensor_feature.Tensor", "scalar.Scalar")
TEXT_CLASS = "text_feature.Text"
INSTRUCTION = "language_instruction"


@dataclass(frozen=True)
class StepFeature:
    """One per-step feature of the dataset, from `features.json`."""

    path: str  # below `steps/`, e.g. "observation/image"
    kind: str  # "image", "numeric" or "text"
    shape: tuple[int, ...]
    dtype: str


def is_rlds_builder(path: Path) -> bool:
    return (path / "features.json").is_file() and (path / "dataset_info.json").is_file()


def holds_rlds_builder(path: Path) -> bool:
    """Whether `path` is a TFDS builder folder or holds one (at most three levels down: name/version)."""
    if is_rlds_builder(path):
        return True
    return any(
        is_rlds_builder(p.parent) for depth in ("*/", "*/*/", "*/*/*/") for p in path.glob(f"{depth}features.json")
    )


def discover_rlds_episodes(
    root: str | Path, fps: float | None, task: str = "", image_keys: list[str] | None = None
) -> list[EpisodeSource]:
    """One EpisodeSource per record of the builder folder `root` (or the one builder folder under it)."""
    builder = _builder_folder(Path(root))
    if fps is None or not fps > 0:
        raise SourceError.for_source(
            str(builder), None, "RLDS stores no timestamps", "give the dataset's control rate with --fps (Hz)"
        )
    features = step_features(builder)
    cameras = [f for f in features if f.kind == "image" and f.path.startswith("observation/")]
    if image_keys:
        known = {f.path.rsplit("/", 1)[-1]: f for f in cameras}
        unknown = sorted(set(image_keys) - set(known))
        if unknown:
            raise SourceError.for_source(
                str(builder), None, f"no image feature {unknown} in features.json", f"choose from {sorted(known)}"
            )
        cameras = [known[key] for key in image_keys]
    numeric = [f for f in features if f.kind == "numeric"]
    episodes = []
    for path in _record_files(builder):
        found = 0
        why = file_problem(path, builder)
        if why is not None:
            name = f"{path.name}#0"
            problem = SourceError(name, str(path), f"{why}; its records cannot be read", "replace or remove the file")
            episodes.append(EpisodeSource(name, problem=problem))
            continue
        try:
            for offset, _ in iter_record_spans(path):
                episodes.append(_episode(RecordAddress(str(path), offset, found), cameras, numeric, fps, task))
                found += 1
        except TFRecordError as exc:
            name = f"{path.name}#{found}"
            why = f"{exc}; the records after it in this file cannot be found either"
            episodes.append(EpisodeSource(name, problem=SourceError(name, str(path), why, "re-copy the file")))
    if not episodes:
        raise SourceError.for_source(str(builder), None, "the dataset holds no episode", "check the folder")
    return require_common_streams(episodes)


def step_features(builder: Path) -> list[StepFeature]:
    """The per-step features `features.json` declares, flattened to paths below `steps/`."""
    where = builder / "features.json"
    try:
        document = parse_json(where.read_bytes())
        top = document["featuresDict"]["features"]
        steps = top["steps"]["sequence"]["feature"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError.for_source(
            str(where), None, f"not the features.json of an RLDS dataset (no 'steps' sequence: {exc})", None
        ) from exc
    found: list[StepFeature] = []
    _flatten(steps, "", found, str(where))
    return found


def _flatten(node: Any, prefix: str, found: list[StepFeature], where: str) -> None:
    if not isinstance(node, dict):
        raise SourceError.for_source(where, None, f"feature '{prefix}' is not an object", None)
    name = str(node.get("pythonClassName", ""))
    try:
        if "featuresDict" in node:
            children = node["featuresDict"]["features"]
            if not isinstance(children, dict):
                raise TypeError("its featuresDict.features is not an object")
            if len(found) + len(children) > MAX_FEATURES:
                raise ValueError(f"it declares more than {MAX_FEATURES} features")
            for key, child in children.items():
                _flatten(child, f"{prefix}/{key}" if prefix else str(key), found, where)
        elif name == IMAGE_CLASS:
            found.append(StepFeature(prefix, "image", _shape(node["image"]["shape"]), "uint8"))
        elif name.endswith(NUMERIC_CLASSES):
            tensor = node["tensor"]
            shape, dtype = _shape(tensor.get("shape", {})), _numeric_dtype(tensor["dtype"])
            found.append(StepFeature(prefix, "numeric", shape, dtype))
        elif name.endswith(TEXT_CLASS):
            found.append(StepFeature(prefix, "text", (), "string"))
        else:
            raise SourceError.for_source(
                where,
                None,
                f"feature '{prefix}' is a {name or 'feature of no class'}, which the RLDS importer does not read",
                "report it with the dataset's features.json",
            )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        what = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        raise SourceError.for_source(
            where, None, f"feature '{prefix}' ({name or 'no class'}) is malformed: {what}", "fix features.json"
        ) from None


def _shape(shape: Any) -> tuple[int, ...]:
    """A feature's `shape: {dimensions: [...]}`: at most 8 sizes of 0..2^20 values in all (-1: any length)."""
    dimensions = shape.get("dimensions", []) if isinstance(shape, dict) else None
    if not isinstance(dimensions, list) or len(dimensions) > 8:
        raise ValueError(f"its shape is {str(shape)[:60]}, not {{dimensions: [sizes]}}")
    sizes = tuple(as_int(_whole(v), "a size", -1, 1 << 20) for v in dimensions)
    if math.prod(abs(size) for size in sizes) > 1 << 20:
        raise ValueError(f"its shape {sizes} holds more than {1 << 20} values per step")
    return sizes


def _whole(value: Any) -> Any:
    """A size as features.json writes it (`"7"`, as protobuf's JSON writes int64) or as a number."""
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 12 else value


def _numeric_dtype(dtype: Any) -> str:
    if not isinstance(dtype, str) or dtype not in NUMERIC_DTYPES:
        raise ValueError(f"its dtype is {str(dtype)[:40]!r}, not one of {', '.join(NUMERIC_DTYPES)}")
    return dtype


def _builder_folder(root: Path) -> Path:
    if is_rlds_builder(root):
        return root
    found = sorted({p.parent for p in root.glob("**/features.json") if is_rlds_builder(p.parent)})
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise SourceError.for_source(
            str(root),
            None,
            f"{what} TFDS builder folders (features.json + dataset_info.json) found",
            "give the folder of one dataset version, e.g. .../fractal20220817_data/0.1.0",
        )
    return found[0]


def _record_files(builder: Path) -> list[Path]:
    files = listed(builder, lambda name: SHARD.match(name) is not None)
    return sorted(files, key=lambda p: (p.name.split(".tfrecord-")[0], _shard_number(p.name)))


def _shard_number(name: str) -> int:
    matched = SHARD.match(name)
    assert matched is not None, "a record file is listed by its name matching SHARD"
    return int(matched.group(1))


def _episode(
    record: RecordAddress, cameras: list[StepFeature], numeric: list[StepFeature], fps: float, task: str
) -> EpisodeSource:
    """The episode of one record, described from its address alone: its task, metadata and step count are
    read by the conversion worker (`RecordReading.complete`), so discovering a dataset reads no record."""
    name = f"{Path(record.path).name}#{record.number}"
    return EpisodeSource(
        name,
        task=task,
        metadata={"rlds_file": Path(record.path).name, "rlds_record": record.number},
        cameras=tuple(
            ArrayCameraSource(f.path.rsplit("/", 1)[-1], StepArray(record, f"steps/{f.path}", (), "object"), fps)
            for f in cameras
        ),
        lowdim=tuple(
            ArrayLowdimSource(f.path.replace("/", "."), StepArray(record, f"steps/{f.path}", f.shape, f.dtype), fps)
            for f in numeric
        ),
        deferred=RecordReading(record, tuple(cameras), tuple(numeric)),
    )


@dataclass(frozen=True)
class RecordReading:
    """What an RLDS episode's record says beyond its streams: the steps every feature agrees on, the
    task (`language_instruction`) and `episode_metadata/*`; read where the episode is converted."""

    record: RecordAddress
    cameras: tuple[StepFeature, ...]
    numeric: tuple[StepFeature, ...]

    def complete(self, source: EpisodeSource) -> EpisodeSource:
        try:
            example = _record(self.record.path, self.record.offset, self.record.number)
        except TFRecordError as exc:
            raise SourceError(source.name, self.record.path, str(exc)) from exc
        _step_count(example, self.cameras, self.numeric, source.name, self.record.path)
        task = source.task
        instruction = example.get(f"steps/{INSTRUCTION}")
        if instruction is not None and instruction.kind == "bytes" and instruction.values:
            task = instruction.values[0].decode("utf-8", errors="replace")
        metadata = dict(source.metadata)
        for key, feature in example.items():
            if key.startswith("episode_metadata/") and len(feature.values) == 1:
                value = feature.values[0]
                metadata[key.removeprefix("episode_metadata/")] = (
                    value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value.item()
                )
        return replace(source, task=task, metadata=metadata, deferred=None)


def _step_count(example: dict[str, Feature], cameras, numeric, name: str, path: str) -> int:
    counts = {}
    for feature in (*cameras, *numeric):
        found = example.get(f"steps/{feature.path}")
        if found is None:
            raise SourceError(
                name, path, f"the record has no feature 'steps/{feature.path}' that features.json declares"
            )
        per_step = int(np.prod(feature.shape, dtype=np.int64)) if feature.kind == "numeric" else 1
        if per_step == 0 or len(found.values) % per_step:
            raise SourceError(name, path, f"'steps/{feature.path}' holds {len(found.values)} values, not whole steps")
        counts[feature.path] = len(found.values) // per_step
    if len(set(counts.values())) > 1:
        raise SourceError(name, path, f"features disagree on the number of steps: {counts}")
    return next(iter(counts.values()), 0)


@dataclass(frozen=True)
class RecordAddress:
    path: str
    offset: int
    number: int


@lru_cache(maxsize=2)
def _record(path: str, offset: int, number: int) -> dict[str, Feature]:
    """The features of the `number`-th record, whose framing starts at `offset` (CRCs checked; the last two
    kept, since a worker reads each episode's streams one after another)."""
    return parse_example(read_record(path, offset, number), f"{path}: record {number} at byte {offset}")


@dataclass(frozen=True)
class StepArray:
    """One per-step feature of one RLDS record, as the array importers' `ArrayRef`: rows are steps."""

    record: RecordAddress
    key: str
    row_shape: tuple[int, ...]
    dtype: str

    @property
    def path(self) -> str:
        return self.record.path

    def where(self) -> str:
        return f"{self.record.path}@{self.record.offset}:{self.key}"

    def shape(self, episode: str) -> ArrayShape:
        dtype = np.dtype(object) if self.dtype == "object" else np.dtype(self.dtype)
        rows = len(self._values(episode)) // self._per_step
        return ArrayShape(rows, self.row_shape, dtype, rows * max(1, dtype.itemsize) * self._per_step)

    def read(self, episode: str, first: int = 0, last: int | None = None) -> np.ndarray:
        values = self._values(episode)
        steps = len(values) // self._per_step
        last = steps if last is None else last
        if self.dtype == "object":
            items = np.empty(max(0, min(last, steps) - first), dtype=object)
            items[:] = values[first:last]
            return items
        rows = np.asarray(values[: steps * self._per_step]).reshape(steps, *self.row_shape)[first:last]
        return self._as_declared(rows, episode, first)

    def _as_declared(self, rows: np.ndarray, episode: str, first: int) -> np.ndarray:
        """`rows` as the declared dtype; a value it cannot hold (300 as uint8, 0.5 as an integer) is the
        episode's error, never a value wrapped or cut silently."""
        target = np.dtype(self.dtype)
        if target == np.uint64 and rows.dtype == np.int64:
            return rows.view(np.uint64)  # protobuf's int64 list carries uint64 values as two's complement
        flat = rows.reshape(len(rows), -1)
        if target.kind in "iub":
            low, high = (0, 1) if target.kind == "b" else (np.iinfo(target).min, np.iinfo(target).max)
            wrong = (flat < low) | (flat > high)
            if flat.dtype.kind == "f":
                wrong |= ~np.isfinite(flat) | (flat != np.round(flat))
            if wrong.any():
                step, column = (int(n) for n in np.argwhere(wrong)[0])
                value = flat[step, column].item()
                raise SourceError(
                    episode,
                    self.where(),
                    f"step {first + step} holds {value!r}, which {target} (the declared dtype) cannot hold"
                    f" ({int(wrong.sum())} such value(s))",
                    "fix the dtype in features.json or the records",
                )
        return rows.astype(target)

    @property
    def _per_step(self) -> int:
        return max(1, int(np.prod(self.row_shape, dtype=np.int64)))

    def _values(self, episode: str):
        try:
            features = _record(self.record.path, self.record.offset, self.record.number)
        except TFRecordError as exc:
            raise SourceError(episode, self.record.path, str(exc)) from exc
        if self.key not in features:
            raise SourceError(episode, self.record.path, f"the record has no feature '{self.key}'")
        return features[self.key].values
