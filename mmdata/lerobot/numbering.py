"""How LeRobot numbers the frames of a store's episodes, for batches that carry LeRobot's fields.

A store converted from LeRobot keeps, per episode (in its metadata), LeRobot's `episode_index`, the
dataset-wide `index` of its first frame, each frame's `task_index` (as runs: a task may change part-way) with
the tasks' texts, and its `string` features as runs of texts. Other stores get the manifest order, frames
counted across episodes, and task_index -1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmdata.checks import as_int
from mmdata.errors import IntegrityError
from mmdata.store.handle import Store


@dataclass(frozen=True)
class FrameRuns:
    """Values that hold from a frame of an episode on: `keys` are (manifest row << 32) + that frame, ascending,
    with every episode's first run at frame 0."""

    keys: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, runs: list[list[tuple[int, Any]]], dtype: Any) -> FrameRuns:
        """From each manifest row's runs `[(first frame, value), ...]`, in row order."""
        keys = [(row << 32) + first for row, episode in enumerate(runs) for first, _ in episode]
        values = [value for episode in runs for _, value in episode]
        return cls(np.array(keys, np.int64), np.array(values, dtype=dtype))

    def at(self, rows: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """The value at frame `frames[i]` of the episode at manifest row `rows[i]`."""
        keys = (rows.astype(np.int64) << 32) + np.maximum(frames, 0)
        return self.values[np.searchsorted(self.keys, keys, side="right") - 1]


@dataclass(frozen=True)
class EpisodeNumbering:
    """LeRobot's numbers for each stored episode (by manifest row) and its frames (see the module)."""

    episode_index: np.ndarray
    index_from: np.ndarray
    tasks: FrameRuns
    task_texts: dict[int, str]
    texts: dict[str, FrameRuns]  # LeRobot `string` features

    @classmethod
    def of(cls, dataset: Store, fps: float) -> EpisodeNumbering:
        rows = [dataset.manifest.row(i) for i in range(dataset.schema.num_episodes)]
        frames = [int(round(float(row["duration"]) * fps)) for row in rows]
        counted = np.concatenate([[0], np.cumsum(frames)[:-1]]).astype(np.int64)
        episodes: list[int] = []
        starts: list[int] = []
        tasks: list[list[tuple[int, int]]] = []
        task_texts: dict[int, str] = {}
        texts: list[dict[str, list[tuple[int, str]]]] = []
        for position, row in enumerate(rows):
            metadata = dataset.metadata_of(row)
            try:
                episodes.append(
                    as_int(metadata.get("lerobot_episode_index", position), "'lerobot_episode_index'", 0, 2**62)
                )
                starts.append(
                    as_int(metadata.get("lerobot_index_from", int(counted[position])), "'lerobot_index_from'", 0, 2**62)
                )
                runs, named = _task_runs(metadata)
                texts.append(_text_runs(metadata))
            except ValueError as exc:
                raise IntegrityError(f"episode '{row['key']}': its metadata {exc}; convert the store again") from exc
            tasks.append(runs)
            task_texts |= named
        features = sorted({name for episode in texts for name in episode})
        return cls(
            np.array(episodes, np.int64),
            np.array(starts, np.int64),
            FrameRuns.of(tasks, np.int64),
            task_texts,
            {name: FrameRuns.of([episode.get(name, [(0, "")]) for episode in texts], object) for name in features},
        )

    def task_index(self, rows: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """The `task_index` of frame `frames[i]` of the episode at manifest row `rows[i]`."""
        return self.tasks.at(rows, frames)

    def task_text(self, task_index: np.ndarray, stored: Sequence[str]) -> list[str]:
        """Each frame's task text as LeRobot names it, else the text the store holds for its episode."""
        return [self.task_texts.get(int(number), text) for number, text in zip(task_index, stored)]


def _task_runs(metadata: dict[str, Any]) -> tuple[list[tuple[int, int]], dict[int, str]]:
    """An episode's task runs `[(first frame, task_index), ...]` (starting at frame 0, ascending) and task texts
    from its metadata; stores converted before runs were kept name one task for the episode."""
    first_task = metadata.get("lerobot_task_indices") or [-1]
    runs = metadata.get("lerobot_task_runs") or [[0, first_task[0] if isinstance(first_task, list) else first_task]]
    texts = metadata.get("lerobot_tasks") or {}
    checked = _checked_runs(runs, "lerobot_task_runs", lambda task: as_int(task, "a task_index", -1, 2**62))
    if not isinstance(texts, dict) or not all(isinstance(t, str) and k.isdigit() for k, t in texts.items()):
        raise ValueError("'lerobot_tasks' is not an object of task_index -> text")
    return checked, {int(number): text for number, text in texts.items()}


def _text_runs(metadata: dict[str, Any]) -> dict[str, list[tuple[int, str]]]:
    """An episode's `string` features as runs `[(first frame, text), ...]` (`lerobot_text_runs`)."""
    features = metadata.get("lerobot_text_runs") or {}
    if not isinstance(features, dict):
        raise ValueError("'lerobot_text_runs' is not an object of feature -> runs")
    return {str(name): _checked_runs(runs, f"lerobot_text_runs['{name}']", _text) for name, runs in features.items()}


def _checked_runs(runs: Any, what: str, value: Any) -> list[tuple[int, Any]]:
    """`runs` as [(first frame, value), ...], starting at frame 0 and going forward, each value checked."""
    if not isinstance(runs, list) or not runs or not all(isinstance(run, list) and len(run) == 2 for run in runs):
        raise ValueError(f"'{what}' is not a list of [first frame, value] pairs")
    checked = [(as_int(first, f"a first frame of '{what}'", 0, 2**31), value(item)) for first, item in runs]
    if checked[0][0] != 0 or any(a[0] >= b[0] for a, b in zip(checked, checked[1:])):
        raise ValueError(f"'{what}' does not start at frame 0 and go forward")
    return checked


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a text run holds {type(value).__name__}, not text")
    return value
