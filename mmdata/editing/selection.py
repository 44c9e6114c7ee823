"""Which episodes an edit names: by id, by task text, by duration; checked against the store's manifest columns
before anything is written, so that a selection naming an episode the store lacks fails with the ids named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import EditError, OptionError


@dataclass(frozen=True)
class EpisodeSelection:
    """Episodes named by any of: `ids` (episode numbers, and `range`s of them: a range is never made whole, so
    `range(4_000_000_000)` costs what the store's episodes cost), `tasks` (exact task texts), a duration of at least
    `min_seconds` and at most `max_seconds`. Every given condition must hold; none given names every episode."""

    ids: Sequence[int | range] | range | None = None
    tasks: Sequence[str] | None = None
    min_seconds: float | None = None
    max_seconds: float | None = None
    _ranges: tuple[range, ...] = field(init=False, repr=False, compare=False, default=())  # `ids` as ranges

    def __post_init__(self):
        if self.ids is not None:
            object.__setattr__(self, "ids", _id_ranges(self.ids))
            object.__setattr__(self, "_ranges", self.ids)
        for name in ("min_seconds", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise OptionError(f"{name} is a finite number of seconds from 0, not {value!r}")
        if self.min_seconds is not None and self.max_seconds is not None and self.min_seconds > self.max_seconds:
            raise OptionError(f"min_seconds {self.min_seconds} is above max_seconds {self.max_seconds}")

    @property
    def columns(self) -> tuple[str, ...]:
        """The manifest columns `rows` reads."""
        needed = ["duration"] if self.min_seconds is not None or self.max_seconds is not None else []
        return (*needed, *(["task"] if self.tasks is not None else []))

    def rows(self, table: pa.Table, count: int) -> np.ndarray:
        """The rows (of `count`; `table` holds `columns` of each) the selection names, ascending."""
        named = np.ones(count, bool)
        if self.ids is not None:
            by_id = np.zeros(count, bool)
            unknown: list[int] = []
            for ids in self._ranges:
                by_id[ids.start : min(ids.stop, count) : ids.step] = True
                beyond = ids[max(0, -(-(count - ids.start) // ids.step)) :]  # (its ids from `count` on, not made)
                unknown.extend(beyond[: 10 - len(unknown)] if len(unknown) < 10 else [])
            if unknown:
                raise EditError(
                    f"episode ids {sorted(set(unknown))[:10]} are not in the store (it has episodes 0..{count - 1})"
                )
            named &= by_id
        if self.tasks is not None:
            named &= pc.is_in(table.column("task"), value_set=pa.array(list(self.tasks), pa.string())).to_numpy(
                zero_copy_only=False
            )
        if self.min_seconds is not None or self.max_seconds is not None:
            duration = table.column("duration").to_numpy()
            named &= duration >= (self.min_seconds or 0.0) - 1e-9
            if self.max_seconds is not None:
                named &= duration <= self.max_seconds + 1e-9
        return np.flatnonzero(named)

    def describe(self) -> str:
        parts = []
        if self.ids is not None:
            written = [_written(ids) for ids in self._ranges[:8]]
            parts.append("ids " + ", ".join(written) + (", ..." if len(self._ranges) > 8 else ""))
        if self.tasks is not None:
            parts.append("tasks " + ", ".join(repr(t) for t in self.tasks))
        if self.min_seconds is not None:
            parts.append(f"at least {self.min_seconds:g} s")
        if self.max_seconds is not None:
            parts.append(f"at most {self.max_seconds:g} s")
        return "; ".join(parts) or "every episode"


MAX_ID_PARTS = 1 << 20  # ids and ranges one selection may list


def _id_ranges(ids: object) -> tuple[range, ...]:
    """`ids` (a range, or a sequence of ids and ranges) as ranges of ids from 0 going up; OptionError otherwise."""
    items = [ids] if isinstance(ids, range) else ids
    if isinstance(items, str | bytes) or not isinstance(items, Sequence | np.ndarray):
        raise OptionError(f"episode ids are a list of whole numbers from 0 (or ranges), not {ids!r:.80}")
    if len(items) > MAX_ID_PARTS:
        raise OptionError(f"episode ids list {len(items)} items; name at most {MAX_ID_PARTS} (ranges count one each)")
    ranges = []
    for item in items:
        if isinstance(item, range):
            if item.start < 0 or item.step < 1:
                raise OptionError(f"an episode id range goes up from 0, not {item!r}")
            ranges.append(item)
        elif isinstance(item, int | np.integer) and not isinstance(item, bool) and item >= 0:
            ranges.append(range(int(item), int(item) + 1))
        else:
            raise OptionError(f"episode ids are whole numbers from 0, not {item!r:.80}")
    return tuple(ranges)


def _written(ids: range) -> str:
    """A range of ids as `--episodes` writes it: 3, 10-19, or 0-99 every 10."""
    if len(ids) == 1:
        return str(ids.start)
    last = ids[-1] if len(ids) else ids.start
    return f"{ids.start}-{last}" + (f" every {ids.step}" if ids.step != 1 else "")
