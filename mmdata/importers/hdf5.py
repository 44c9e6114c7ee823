"""HDF5 recordings, read with h5py: ALOHA / ACT (one file per episode) and robomimic (one file of demos).

- ALOHA / ACT: `/observations/images/<cam>` (`[T, H, W, 3]` uint8, or one JPEG per row as padded
  uint8 rows or variable-length bytes) becomes camera `<cam>`; `/observations/<key>` (qpos, qvel,
  effort, ...) becomes low-dim stream `<key>`; `/action` becomes `action`; the file's attributes
  (e.g. `sim`) become metadata.
- robomimic: `data/demo_N/obs/<key>` becomes camera `<key>` when it holds uint8 `[T, H, W, 3]`
  images and low-dim stream `<key>` otherwise; `data/demo_N/actions` becomes `action`,
  `rewards` and `dones` become `reward` and `done`; `data.attrs["env_args"]` names the task.

Both record at a fixed control rate that the files do not state: it is given as `fps`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from mmdata.checks import as_text, check_json_value, parse_json
from mmdata.errors import SourceError
from mmdata.importers.arrays import ArrayCameraSource, ArrayLowdimSource, Hdf5Array, hdf5_dataset
from mmdata.importers.episode import CameraInput, EpisodeSource, LowdimInput, require_common_streams
from mmdata.importers.files import file_problem, listed

SUFFIXES = (".hdf5", ".h5", ".he5")


def hdf5_files(root: Path) -> list[Path]:
    """`root` itself when it is an HDF5 file, else the HDF5 files in the folder `root`."""
    if root.is_file():
        return [root] if root.suffix.lower() in SUFFIXES else []
    if not root.is_dir():
        return []
    return listed(root, lambda name: Path(name).suffix.lower() in SUFFIXES)


def discover_hdf5_episodes(root: str | Path, fps: float | None, task: str = "") -> list[EpisodeSource]:
    """Every episode of an ALOHA folder (or file) or a robomimic file; per-episode problems are recorded."""
    import h5py

    root = Path(root)
    if not fps:
        raise SourceError.for_source(
            str(root), None, "HDF5 recordings do not state their control rate", "give it with --fps (ALOHA: 50)"
        )
    files = hdf5_files(root)
    if not files:
        raise SourceError.for_source(str(root), None, "holds no .hdf5 / .h5 files")
    episodes: list[EpisodeSource] = []
    for path in files:
        why = file_problem(path, root if root.is_dir() else root.parent)
        if why is not None:
            problem = SourceError(path.stem, str(path), why, "replace it with the recording's file, or remove it")
            episodes.append(EpisodeSource(name=path.stem, problem=problem))
            continue
        try:
            with h5py.File(path, "r") as handle:
                data = _child(handle, "data", path.stem, path)
                if data is not None and any(k.startswith("demo") for k in data):
                    episodes += _robomimic(path, data, float(fps), task)
                else:
                    episodes.append(_described(path.stem, path, partial(_aloha, path, handle, float(fps), task)))
        except SourceError as failure:
            episodes.append(EpisodeSource(name=path.stem, problem=failure))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            problem = SourceError(path.stem, str(path), f"unreadable: {exc}")
            episodes.append(EpisodeSource(name=path.stem, problem=problem))
    return require_common_streams(episodes, _missing_key)


def _described(name: str, path: Path, describe: Callable[[], EpisodeSource]) -> EpisodeSource:
    """`describe()`, or an episode that carries the problem found while describing it."""
    try:
        return describe()
    except SourceError as failure:
        return EpisodeSource(name=name, problem=failure)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        return EpisodeSource(name=name, problem=SourceError(name, str(path), f"unreadable: {exc}"))


def _child(group, key: str, episode: str, path: Path):
    """`group[key]` when it exists in this file, None when absent; a link to another file is refused."""
    import h5py

    link = group.get(key, getlink=True)
    if link is None:
        return None
    if isinstance(link, h5py.ExternalLink):
        raise SourceError(episode, str(path), f"'{key}' links to another file ({link.filename})", "copy the data in")
    return group[key]


def _members(group, episode: str, path: Path) -> list[tuple[str, Any]]:
    """(name, node) of a group's members in name order, each checked by `_child`."""
    return [(key, _child(group, key, episode, path)) for key in sorted(group)]


def _missing_key(episode: EpisodeSource, kind: str, name: str) -> str:
    """The file and HDF5 key where a stream other episodes have was looked for."""
    sources = episode.streams
    path = sources[0].path if sources else episode.name
    if episode.metadata.get("source_format") == "hdf5 robomimic":
        demo = episode.metadata.get("demo", "demo")
        key = {"action": "actions", "reward": "rewards", "done": "dones"}.get(name, f"obs/{name}")
        return f"{path}:/data/{demo}/{key}"
    if kind == "camera":
        return f"{path}:/observations/images/{name}"
    return f"{path}:/{'action' if name == 'action' else f'observations/{name}'}"


def _aloha(path: Path, handle, fps: float, task: str) -> EpisodeSource:
    import h5py

    name = path.stem
    observations = _child(handle, "observations", name, path)
    if observations is None:
        problem = SourceError(name, str(path), "has no '/observations' group", "expected the ALOHA / ACT layout")
        return EpisodeSource(name=name, problem=problem)
    cameras, lowdim = [], []
    images = _child(observations, "images", name, path)
    if images is not None:
        for cam, _ in _members(images, name, path):
            address = Hdf5Array(str(path), f"observations/images/{cam}")
            hdf5_dataset(handle, address.key, name, str(path))
            cameras.append(ArrayCameraSource(cam, address, fps))
    for key, node in _members(observations, name, path):
        if key != "images" and isinstance(node, h5py.Dataset):
            hdf5_dataset(handle, f"observations/{key}", name, str(path))
            lowdim.append(ArrayLowdimSource(key, Hdf5Array(str(path), f"observations/{key}"), fps))
    if _child(handle, "action", name, path) is not None:
        hdf5_dataset(handle, "action", name, str(path))
        lowdim.append(ArrayLowdimSource("action", Hdf5Array(str(path), "action"), fps))
    attrs = _attributes(handle.attrs)
    stated = attrs.pop("task", attrs.pop("language_instruction", task))
    return EpisodeSource(
        name=name,
        task=as_text(stated, "the 'task' attribute") if isinstance(stated, str) and stated else task,
        metadata={"source_format": "hdf5 aloha", **attrs},
        cameras=tuple(cameras),
        lowdim=tuple(lowdim),
    )


def _robomimic(path: Path, data, fps: float, task: str) -> list[EpisodeSource]:
    env = _attributes(data.attrs).get("env_args")
    env_name = ""
    if isinstance(env, str):
        try:
            env_name = as_text(parse_json(env).get("env_name", ""), "env_name")
        except (ValueError, AttributeError):
            env_name = ""
    demos = sorted((k for k in data if k.startswith("demo")), key=_demo_order)
    return [
        _described(f"{path.stem}_{demo}", path, partial(_demo, path, data, demo, fps, task or env_name))
        for demo in demos
    ]


def _demo(path: Path, data, demo: str, fps: float, task: str) -> EpisodeSource:
    name = f"{path.stem}_{demo}"
    group = _child(data, demo, name, path)
    cameras: list[CameraInput] = []
    lowdim: list[LowdimInput] = []
    obs = _child(group, "obs", name, path)
    if obs is not None:
        for key, dataset in _members(obs, name, path):
            address = Hdf5Array(str(path), f"data/{demo}/obs/{key}")
            hdf5_dataset(data.file, address.key, name, str(path))
            if dataset.dtype == "uint8" and dataset.ndim == 4 and dataset.shape[-1] == 3:
                cameras.append(ArrayCameraSource(key, address, fps))
            else:
                lowdim.append(ArrayLowdimSource(key, address, fps))
    for key, stream in (("actions", "action"), ("rewards", "reward"), ("dones", "done")):
        if _child(group, key, name, path) is not None:
            hdf5_dataset(data.file, f"data/{demo}/{key}", name, str(path))
            lowdim.append(ArrayLowdimSource(stream, Hdf5Array(str(path), f"data/{demo}/{key}"), fps))
    return EpisodeSource(
        name=name,
        task=task,
        metadata={"source_format": "hdf5 robomimic", "demo": demo, **_attributes(group.attrs)},
        cameras=tuple(cameras),
        lowdim=tuple(lowdim),
    )


def _demo_order(key: str) -> tuple[int, int, str]:
    """demo_2 before demo_10; names without a number after them, by name."""
    suffix = key.rsplit("_", 1)[-1]
    return (0, int(suffix), key) if suffix.isdigit() else (1, 0, key)


def _attributes(attrs) -> dict[str, Any]:
    """HDF5 attributes as plain JSON values; one JSON cannot hold (NaN, odd types) is kept as its text."""
    found = {}
    for key, value in attrs.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        try:
            check_json_value(value, max_depth=8)
        except ValueError:
            value = repr(value)[:1000]
        found[str(key)] = value
    return found
