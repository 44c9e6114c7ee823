"""Which episodes a loader samples from, chosen from the manifest alone (no shard is opened)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.errors import SpecError

RowTest = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Episodes:
    """Episode filter: by `ids` (episode_index values), by exact `tasks` text, and by `where`.

    `where` is a pyarrow compute expression over manifest columns
    (`pyarrow.compute.field("duration") > 5`) or a function of one manifest row (a dict) that
    returns True to keep it. All given conditions must hold.
    """

    ids: Sequence[int] | None = None
    tasks: Sequence[str] | None = None
    where: pc.Expression | RowTest | None = None

    def columns(self) -> tuple[str, ...] | None:
        """The manifest columns `select` reads (None: every column, as a `where` may name any)."""
        if self.where is not None:
            return None
        return tuple(name for name, given in (("episode_index", self.ids), ("task", self.tasks)) if given is not None)

    def select(self, table: pa.Table) -> np.ndarray:
        """Row numbers of the manifest `table` that pass, ascending."""
        keep = np.ones(table.num_rows, dtype=bool)
        if self.ids is not None:
            wanted = np.asarray(list(self.ids), dtype=np.int64)
            present = table.column("episode_index").to_numpy()
            unknown = np.setdiff1d(wanted, present)
            if len(unknown):
                raise SpecError(
                    f"episode ids {unknown[:10].tolist()} are not in the dataset (it has {table.num_rows} episodes,"
                    f" ids {int(present.min())}..{int(present.max())})"
                )
            keep &= np.isin(present, wanted)
        if self.tasks is not None:
            keep &= np.isin(np.asarray(table.column("task").to_pylist(), dtype=object), list(self.tasks))
        if isinstance(self.where, pc.Expression):
            marked = table.append_column("__row", pa.array(np.arange(table.num_rows)))
            keep &= np.isin(np.arange(table.num_rows), marked.filter(self.where).column("__row").to_numpy())
        elif callable(self.where):
            keep &= np.array([bool(self.where(row)) for row in table.to_pylist()], dtype=bool)
        elif self.where is not None:
            raise SpecError(f"where must be a pyarrow compute expression or a function of a row, not {self.where!r}")
        selected = np.flatnonzero(keep)
        if len(selected) == 0:
            raise SpecError(f"the episode filter {self.describe()} keeps no episode of the dataset")
        return selected

    def describe(self) -> dict:
        where = self.where
        if callable(where) and not isinstance(where, pc.Expression):
            where = f"{getattr(where, '__module__', '')}.{getattr(where, '__qualname__', repr(where))}"
        return {"ids": None if self.ids is None else list(map(int, self.ids)), "tasks": self.tasks, "where": str(where)}
