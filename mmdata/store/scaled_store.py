"""A store of millions of episodes made from a small real one: its manifest rows repeated in turn over its shards
and arrays (linked, not copied). What the scale tests and `benchmarks/scale_bench.py` open, plan, read and edit,
with no more media than the small store holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mmdata.store.manifest import ROW_GROUP_ROWS, STATISTICS, renumbered


def write_scaled_store(
    source: str | Path, destination: str | Path, episodes: int, row_group_rows: int = ROW_GROUP_ROWS
) -> Path:
    """A store of `episodes` episodes whose manifest rows repeat the rows of the converted store at `source` in
    turn, over its shards and arrays (linked, not copied): a store of millions of episodes that opens, plans and
    reads like a real one, with no more media than `source` has. What the scale tests and benchmarks open. The
    manifest is written a row group (of `row_group_rows`) at a time, so ten million rows take the memory of one."""
    source, destination = Path(source), Path(destination)
    document = json.loads((source / "dataset.json").read_text())
    manifest = document.get("manifest", "episodes.parquet")
    table = pq.read_table(source / manifest)
    destination.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name not in ("dataset.json", manifest):
            (destination / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    with pq.ParquetWriter(
        destination / manifest, table.schema, compression="zstd", write_statistics=STATISTICS
    ) as writer:
        for first in range(0, episodes, row_group_rows):
            numbers = np.arange(first, min(episodes, first + row_group_rows), dtype=np.int64)
            writer.write_table(renumbered(table.take(pa.array(numbers % table.num_rows)), numbers))
    document["num_episodes"] = episodes
    (destination / "dataset.json").write_text(json.dumps(document, indent=1))
    return destination
