"""Diffusion Policy / UMI replay buffers: Zarr v2 or v3, a folder or a `.zarr.zip`.

`data/<key>` arrays hold every episode end to end and `meta/episode_ends` the cumulative end row
of each episode. Arrays of uint8 `[N, H, W, 3]` become cameras, the others low-dim streams, all
at the fixed rate given as `fps`. Image arrays compressed with imagecodecs codecs (JPEG-XL,
JPEG 2000) need the `imagecodecs` package, which registers them with numcodecs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmdata.errors import SourceError
from mmdata.importers.arrays import ArrayCameraSource, ArrayLowdimSource, ZarrArray
from mmdata.importers.episode import EpisodeSource
from mmdata.importers.zarr_groups import missing_codec, open_replay_group

MAX_EPISODES = 10_000_000


def is_replay_buffer(path: Path) -> bool:
    if path.suffix == ".zip" or path.name.endswith(".zarr.zip"):
        return True
    return any((path / "meta" / "episode_ends" / marker).exists() for marker in ("zarr.json", ".zarray"))


def discover_replay_episodes(path: str | Path, fps: float | None, task: str = "") -> list[EpisodeSource]:
    """One episode per `meta/episode_ends` entry of the replay buffer at `path`."""
    path = Path(path)
    if not fps:
        raise SourceError.for_source(
            str(path), None, "a replay buffer does not state its control rate", "give it with --fps"
        )
    try:
        group = open_replay_group(str(path))
        ends = _episode_ends(group["meta"]["episode_ends"], path)
        data = group["data"]
        keys = sorted(data.array_keys()) if hasattr(data, "array_keys") else sorted(data)
    except KeyError as exc:
        raise SourceError.for_source(
            str(path), None, f"no {exc} in the store", "a replay buffer has data/<key> arrays and meta/episode_ends"
        ) from exc
    except (OSError, ValueError) as exc:
        missing = missing_codec(exc)
        if missing is not None:
            raise SourceError.for_source(
                str(path), f"{path}/data", f"an array is {missing}", "pip install imagecodecs"
            ) from exc
        raise SourceError.for_source(str(path), None, f"not a readable Zarr store: {exc}") from exc
    if len(ends) == 0 or ends[0] < 1 or (np.diff(ends) <= 0).any():
        raise SourceError.for_source(
            str(path), f"{path}/meta/episode_ends", "must be positive, increase strictly and hold at least one end"
        )
    cameras: list[str] = []  # the keys of arrays of images
    lowdim: list[str] = []
    for key in keys:
        try:
            array = data[key]
        except (ValueError, KeyError) as exc:
            missing = missing_codec(exc)
            raise SourceError.for_source(
                str(path), f"{path}/data/{key}", str(missing or exc), "pip install imagecodecs" if missing else None
            ) from exc
        if array.shape[0] != ends[-1]:
            raise SourceError.for_source(
                str(path), f"{path}/data/{key}", f"has {array.shape[0]} rows but meta/episode_ends ends at {ends[-1]}"
            )
        is_image = array.dtype == np.uint8 and len(array.shape) == 4 and array.shape[-1] == 3
        (cameras if is_image else lowdim).append(key)
    starts = np.concatenate([[0], ends[:-1]])
    episodes = []
    for index, (start, stop) in enumerate(zip(starts.tolist(), ends.tolist())):
        episodes.append(
            EpisodeSource(
                name=f"episode_{index:06d}",
                task=task,
                metadata={"source_format": "zarr replay buffer", "rows": [start, stop]},
                cameras=tuple(
                    ArrayCameraSource(k, ZarrArray(str(path), f"data/{k}", start, stop), fps) for k in cameras
                ),
                lowdim=tuple(ArrayLowdimSource(k, ZarrArray(str(path), f"data/{k}", start, stop), fps) for k in lowdim),
            )
        )
    return episodes


def _episode_ends(array, path: Path) -> np.ndarray:
    """`meta/episode_ends`, after checking from its metadata that it is a modest 1-D integer array."""
    shape, dtype = tuple(array.shape), np.dtype(array.dtype)
    if len(shape) != 1 or dtype.kind not in "iu" or shape[0] > MAX_EPISODES:
        raise SourceError.for_source(
            str(path),
            f"{path}/meta/episode_ends",
            f"is {dtype} {shape}, not a list of at most {MAX_EPISODES} integer row ends",
        )
    return np.asarray(array[:], dtype=np.int64)
