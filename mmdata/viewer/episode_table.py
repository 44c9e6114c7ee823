"""The store page's table of episodes, from the manifest's planning columns only: a page of it at a time, sorted
and filtered over every episode, so that a store of millions of episodes is shown without sending its rows to the
browser (`mmdata view --serve` answers `rows.json` from it) or reading its pieces."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import OptionError
from mmdata.schema import VideoStream
from mmdata.store.handle import Store
from mmdata.store.manifest import episode_key

COLUMNS = ("index", "key", "duration", "task", "frames", "damaged")
KEY_PREFIX, KEY_DIGITS = "episode_", 6  # what `episode_key` writes
MAX_PAGE_ROWS = 5000
MAX_FILTER_CHARS = 200


@dataclass(frozen=True)
class TableQuery:
    """Which rows of the table a page shows: `limit` rows from `offset` of the episodes whose key or task holds
    `words` (any case) and, with `damaged_only`, that the store's checks flag, sorted by `sort`."""

    offset: int = 0
    limit: int = 500
    sort: str = "index"
    ascending: bool = True
    words: str = ""
    damaged_only: bool = False

    def __post_init__(self):
        for name, low, high in (("offset", 0, 1 << 40), ("limit", 1, MAX_PAGE_ROWS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise OptionError(f"{name} is a whole number from {low} to {high}, not {value!r}")
        if self.sort not in COLUMNS:
            raise OptionError(f"sort is one of {', '.join(COLUMNS)}, not {self.sort!r:.40}")
        if not isinstance(self.words, str) or len(self.words) > MAX_FILTER_CHARS:
            raise OptionError(f"the filter is text of at most {MAX_FILTER_CHARS} characters")


class EpisodeTable:
    """Every episode's index, duration, task and frames per camera, held as arrays (a few bytes per episode), and
    each stream's items in all."""

    def __init__(self, store: Store):
        self.store = store
        self.cameras = [s.name for s in store.schema.streams if isinstance(s, VideoStream)]
        streams = [s.name for s in store.schema.streams if s.kind != "text"]
        table = store.columns(["duration", "task", *(f"{name}/count" for name in streams)])
        self.count = table.num_rows
        self.items = {name: int(pc.sum(table.column(f"{name}/count")).as_py() or 0) for name in streams}
        self.durations = table.column("duration").to_numpy()
        tasks = pc.fill_null(pc.cast(table.column("task"), pa.string()), "").combine_chunks().dictionary_encode()
        self.task_texts: list[str] = tasks.dictionary.to_pylist()
        self.task_codes = tasks.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        self.frames = {name: table.column(f"{name}/count").to_numpy() for name in self.cameras}
        self._orders: dict[tuple[str, bool], np.ndarray] = {}

    def totals(self) -> dict[str, Any]:
        """Episodes and hours (each stream's items, frames, samples or rows, in all: `items`); a duration that is
        not a number (a damaged episode's) counts for none."""
        durations = self.durations[np.isfinite(self.durations)]
        return {"episodes": self.count, "hours": round(float(durations.sum()) / 3600, 4)}

    def page(self, query: TableQuery, page_of: Callable[[int], str | None]) -> dict[str, Any]:
        """The rows `query` asks for (`page_of(index)`: the episode's page, or None), how many match, how many
        there are."""
        chosen = self.matching(query)
        shown = chosen[query.offset : query.offset + query.limit]
        return {"rows": self.rows(shown, page_of), "matched": int(len(chosen)), "total": self.count}

    def matching(self, query: TableQuery) -> np.ndarray:
        """The row numbers `query` matches, in its order."""
        order = self._order(query.sort, query.ascending)
        if not query.words and not query.damaged_only:
            return order
        keep = np.ones(self.count, bool)
        if query.damaged_only:
            keep &= self._damaged_mask()
        if query.words:
            words = query.words.lower()
            tasks = np.array([words in text.lower() for text in self.task_texts], bool)
            keep &= tasks[self.task_codes] | self.key_mask(words)
        return order[keep[order]]

    def rows(self, numbers: np.ndarray, page_of: Callable[[int], str | None]) -> list[dict[str, Any]]:
        """The table's rows of episodes `numbers`, as the page shows them: a value that is not a number (a damaged
        row's) shown as none, and the row flagged damaged."""
        damaged = self.store.damaged
        shown = []
        for index in numbers:
            duration = float(self.durations[index])
            frames = {name: float(self.frames[name][index]) for name in self.cameras}
            problem = damaged.get(int(index))
            if problem is None and not all(math.isfinite(value) for value in (duration, *frames.values())):
                problem = f"episode {int(index)}'s manifest row holds a duration or frame count that is not a number"
            shown.append(
                {
                    "index": int(index),
                    "key": episode_key(int(index)),
                    "duration": round(duration, 3) if math.isfinite(duration) else None,
                    "task": self.task_texts[self.task_codes[index]],
                    "frames": ", ".join(
                        f"{name}: {int(count) if math.isfinite(count) else '?'}" for name, count in frames.items()
                    ),
                    "damaged": problem,
                    "page": page_of(int(index)),
                }
            )
        return shown

    def _order(self, sort: str, ascending: bool) -> np.ndarray:
        """Row numbers sorted by `sort` (ties in index order), kept for the next page of the same sort."""
        if sort == "damaged":  # (not kept: a manifest read by row group finds damaged rows as it reads them)
            return self._sorted(self._damaged_mask().astype(np.int64), ascending)
        if (sort, ascending) not in self._orders:
            if sort in ("index", "key"):
                order = np.arange(self.count) if ascending else np.arange(self.count)[::-1].copy()
            elif sort == "duration":
                order = self._sorted(self.durations, ascending)
            elif sort == "task":
                ranks = np.argsort(np.argsort(np.array(self.task_texts, dtype=object), kind="stable"), kind="stable")
                order = self._sorted(ranks[self.task_codes], ascending)
            else:
                first = self.frames[self.cameras[0]] if self.cameras else np.zeros(self.count)
                order = self._sorted(first, ascending)
            self._orders = {(sort, ascending): order}
        return self._orders[(sort, ascending)]

    def _sorted(self, values: np.ndarray, ascending: bool) -> np.ndarray:
        keys = values if ascending else -values.astype(np.float64)
        return np.lexsort((np.arange(self.count), keys))

    def _damaged_mask(self) -> np.ndarray:
        mask = np.zeros(self.count, bool)
        mask[list(self.store.damaged)] = True
        return mask

    def key_mask(self, words: str) -> np.ndarray:
        """Which episodes' keys (`episode_key`: "episode_" and the number, at least 6 digits) hold `words` (lower
        case), worked out on the numbers: making ten million key strings to search takes seconds."""
        numbers = np.arange(self.count, dtype=np.int64)
        if words in KEY_PREFIX:
            return np.ones(self.count, bool)
        mask = np.zeros(self.count, bool)
        for cut in range(len(KEY_PREFIX)):  # the words run from the prefix's end into the number's first digits
            head, rest = KEY_PREFIX[cut:], words[len(KEY_PREFIX) - cut :]
            if words.startswith(head) and rest.isdigit() and rest.isascii():
                mask |= _digits_at(numbers, rest, first_only=True)
        if words.isdigit() and words.isascii():
            mask |= _digits_at(numbers, words, first_only=False)
        return mask


def _digits_at(numbers: np.ndarray, digits: str, first_only: bool) -> np.ndarray:
    """Whether each number, written with at least `KEY_DIGITS` digits (zero-padded), holds `digits` (at its start
    with `first_only`)."""
    wanted, length = int(digits), len(digits)
    mask = np.zeros(len(numbers), bool)
    width = KEY_DIGITS
    while True:
        low = 0 if width == KEY_DIGITS else 10 ** (width - 1)
        if low >= len(numbers):
            return mask
        inside = numbers[low : 10**width]
        for place in range(width - length + 1) if length <= width else ():
            mask[low : low + len(inside)] |= (inside // 10 ** (width - length - place)) % 10**length == wanted
            if first_only:
                break
        width += 1
