"""Which episodes an edit names: by id, by task text, by duration; checked against the store's manifest columns
before anything is written, so that a selection naming an episode the store lacks fails with the ids named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import EditError, OptionError


@dataclass(frozen=True)
class EpisodeSelection:
    """Episodes named by any of: `ids` (episode numbers), `tasks` (exact task texts), a duration of at least
    `min_seconds` and at most `max_seconds`. Every given condition must hold; none given names every episode."""

    ids: Sequence[int] | None = None
    tasks: Sequence[str] | None = None
    min_seconds: float | None = None
    max_seconds: float | None = None

    def __post_init__(self):
        if self.ids is not None and any(not isinstance(i, (int, np.integer)) or i < 0 for i in self.ids):
            raise OptionError(f"episode ids are whole numbers from 0, not {list(self.ids)[:10]}")
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
            wanted = np.unique(np.asarray(list(self.ids), np.int64))
            unknown = wanted[wanted >= count]
            if len(unknown):
                raise EditError(
                    f"episode ids {unknown[:10].tolist()} are not in the store (it has episodes 0..{count - 1})"
                )
            by_id = np.zeros(count, bool)
            by_id[wanted] = True
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
            shown = ", ".join(str(i) for i in list(self.ids)[:8]) + (", ..." if len(self.ids) > 8 else "")
            parts.append(f"ids {shown}")
        if self.tasks is not None:
            parts.append("tasks " + ", ".join(repr(t) for t in self.tasks))
        if self.min_seconds is not None:
            parts.append(f"at least {self.min_seconds:g} s")
        if self.max_seconds is not None:
            parts.append(f"at most {self.max_seconds:g} s")
        return "; ".join(parts) or "every episode"
