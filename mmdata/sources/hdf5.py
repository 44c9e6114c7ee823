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

import json
from pathlib import Path
from typing import Any

from mmdata.errors import SourceError
from mmdata.sources.arrays import ArrayCameraSource, ArrayLowdimSource, Hdf5Array
from mmdata.sources.episode import EpisodeSource, require_common_streams

SUFFIXES = (".hdf5", ".h5", ".he5")


def hdf5_files(root: Path) -> list[Path]:
    """`root` itself when it is an HDF5 file, else the HDF5 files in the folder `root`."""
    if root.is_file():
        return [root] if root.suffix.lower() in SUFFIXES else []
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)


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
        try:
            with h5py.File(path, "r") as handle:
                if "data" in handle and any(k.startswith("demo") for k in handle["data"]):
                    episodes += _robomimic(path, handle, float(fps), task)
                else:
                    episodes.append(_aloha(path, handle, float(fps), task))
        except OSError as exc:
            problem = SourceError(path.stem, str(path), f"unreadable: {exc}")
            episodes.append(EpisodeSource(name=path.stem, problem=problem))
    return require_common_streams(episodes, _missing_key)


def _missing_key(episode: EpisodeSource, kind: str, name: str) -> str:
    """The file and HDF5 key where a stream other episodes have was looked for."""
    sources = (*episode.cameras, *episode.lowdim)
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
    if "observations" not in handle:
        problem = SourceError(name, str(path), "has no '/observations' group", "expected the ALOHA / ACT layout")
        return EpisodeSource(name=name, problem=problem)
    observations = handle["observations"]
    cameras, lowdim = [], []
    if "images" in observations:
        for cam in sorted(observations["images"]):
            cameras.append(ArrayCameraSource(cam, Hdf5Array(str(path), f"observations/images/{cam}"), fps))
    for key in sorted(observations):
        if key != "images" and isinstance(observations[key], h5py.Dataset):
            lowdim.append(ArrayLowdimSource(key, Hdf5Array(str(path), f"observations/{key}"), fps))
    if "action" in handle:
        lowdim.append(ArrayLowdimSource("action", Hdf5Array(str(path), "action"), fps))
    attrs = _attributes(handle.attrs)
    return EpisodeSource(
        name=name,
        task=str(attrs.pop("task", attrs.pop("language_instruction", task)) or task),
        metadata={"source_format": "hdf5 aloha", **attrs},
        cameras=tuple(cameras),
        lowdim=tuple(lowdim),
    )


def _robomimic(path: Path, handle, fps: float, task: str) -> list[EpisodeSource]:
    data = handle["data"]
    env = _attributes(data.attrs).get("env_args")
    env_name = ""
    if isinstance(env, str):
        try:
            env_name = json.loads(env).get("env_name", "")
        except json.JSONDecodeError:
            env_name = ""
    demos = sorted((k for k in data if k.startswith("demo")), key=lambda k: int(k.split("_")[-1]) if "_" in k else k)
    episodes = []
    for demo in demos:
        group = data[demo]
        name = f"{path.stem}_{demo}"
        cameras, lowdim = [], []
        if "obs" in group:
            for key in sorted(group["obs"]):
                dataset = group["obs"][key]
                address = Hdf5Array(str(path), f"data/{demo}/obs/{key}")
                if dataset.dtype == "uint8" and dataset.ndim == 4 and dataset.shape[-1] == 3:
                    cameras.append(ArrayCameraSource(key, address, fps))
                else:
                    lowdim.append(ArrayLowdimSource(key, address, fps))
        for key, stream in (("actions", "action"), ("rewards", "reward"), ("dones", "done")):
            if key in group:
                lowdim.append(ArrayLowdimSource(stream, Hdf5Array(str(path), f"data/{demo}/{key}"), fps))
        episodes.append(
            EpisodeSource(
                name=name,
                task=task or env_name,
                metadata={"source_format": "hdf5 robomimic", "demo": demo, **_attributes(group.attrs)},
                cameras=tuple(cameras),
                lowdim=tuple(lowdim),
            )
        )
    return episodes


def _attributes(attrs) -> dict[str, Any]:
    """HDF5 attributes as JSON-friendly values."""
    found = {}
    for key, value in attrs.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        found[key] = value
    return found
