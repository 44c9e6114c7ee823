"""`episodes.parquet`: one row per episode with everything a planner needs, and where each piece lives.

Per stream `s` the row has `s/count` (frames, samples or rows), `s/t_start` and `s/t_end`
(seconds), and pieces. A piece is `{path, offset, size, checksum}`:
- WebDataset: `path` is the shard file, `offset`/`size` the member's bytes inside it;
- Zarr: `path` is the array, `offset` its first element (row), `size` the payload's bytes.
Video rows list `s/segments` (a piece plus `first_frame`, `num_frames` each), a
`s/timestamps` piece and `s/packets` (each segment's packet index, or null; absent in stores
written before it existed); audio has `s/data`; low-dim streams have `s/data` and `s/timestamps`.
Written in row groups of `ROW_GROUP_ROWS` rows; `manifest_reader` reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mmdata.schema import Stream
from mmdata.store.filesystem import write_bytes_atomically

PIECE = pa.struct([("path", pa.string()), ("offset", pa.int64()), ("size", pa.int64()), ("checksum", pa.string())])
SEGMENT = pa.struct([("first_frame", pa.int64()), ("num_frames", pa.int64()), *[(f.name, f.type) for f in PIECE]])
# Per segment, its packet index (see mmdata.codecs.packet_index); a column stores written before it lack,
# and stores written before indexes had checksums hold it without one (LEGACY_PACKET_INDEX: not used).
PACKETS_SUFFIX = "/packets"
LEGACY_PACKET_INDEX = pa.struct([("codec_config", pa.binary()), ("packets", pa.binary())])
PACKET_INDEX = pa.struct([*LEGACY_PACKET_INDEX, ("checksum", pa.string())])
# Rows per Parquet row group: a reader of a large manifest reads the row groups of the episodes it reads
# (`manifest_reader`), a few MB each even with every segment's packet index.
ROW_GROUP_ROWS = 4096
# Columns with statistics in the footer: the footer of ten million rows is read whole when a store opens, and
# statistics on every piece's fields would double it for nothing a reader uses.
STATISTICS = ["episode_index", "duration"]
# A split or merged store's rows name the store holding their media (one of dataset.json's `origins`, relative to
# this store; "" for this store itself); stores made otherwise have no such column.
ORIGIN = "origin"
MEMBER = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64()), ("checksum", pa.string())])


@dataclass(frozen=True)
class Piece:
    path: str
    offset: int
    size: int
    checksum: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Piece:
        return cls(row["path"], int(row["offset"]), int(row["size"]), row["checksum"])


def episode_key(index: int) -> str:
    """The episode's key in shards: no dots, so WebDataset groups its members into one sample."""
    return f"episode_{index:06d}"


def renumbered(rows: pa.Table, numbers: np.ndarray) -> pa.Table:
    """Manifest `rows` as the episodes `numbers`: their `episode_index` and their keys (`episode_key`) with them."""
    digits = pc.utf8_lpad(pc.cast(pa.array(numbers, pa.int64()), pa.string()), 6, "0")
    rows = rows.set_column(rows.schema.get_field_index("episode_index"), "episode_index", pa.array(numbers, pa.int64()))
    return rows.set_column(
        rows.schema.get_field_index("key"), "key", pc.binary_join_element_wise("episode_", digits, "")
    )


def rooted_in_origin(row: dict[str, Any], stream_origins: dict[str, str] | None = None) -> dict[str, Any]:
    """A manifest row with the shard and every piece's path made relative to this store (`../origin/shards/...`)
    where another store holds them: the row's `origin` (a split or merged store), or for a stream added from
    another store its entry in `stream_origins` (`mmdata edit add-stream`), so that readers find the media there."""
    origin = row.get(ORIGIN)
    if not origin and not stream_origins:
        return row
    rooted = dict(row)
    for column, value in row.items():
        stream = column.split("/", 1)[0] if "/" in column else None
        prefix = (stream_origins or {}).get(stream) or origin  # type: ignore[arg-type]
        if not prefix:
            continue
        if isinstance(value, dict) and "path" in value:
            rooted[column] = {**value, "path": f"{prefix}/{value['path']}"}
        elif isinstance(value, list) and value and isinstance(value[0], dict) and "path" in value[0]:
            rooted[column] = [{**item, "path": f"{prefix}/{item['path']}"} for item in value]
    if origin and row.get("shard"):
        rooted["shard"] = f"{origin}/{row['shard']}"
    return rooted


def manifest_schema(streams: list[Stream]) -> pa.Schema:
    fields = [
        ("episode_index", pa.int64()),
        ("key", pa.string()),
        ("source", pa.string()),
        ("task", pa.string()),
        ("duration", pa.float64()),
        ("metadata", pa.string()),
        ("shard", pa.string()),
        ("members", pa.list_(MEMBER)),
    ]
    for stream in streams:
        if stream.kind == "text":
            continue
        name = stream.name
        fields += [
            (f"{name}/count", pa.int64()),
            (f"{name}/t_start", pa.float64()),
            (f"{name}/t_end", pa.float64()),
        ]
        if stream.kind == "video":
            fields += [
                (f"{name}/segments", pa.list_(SEGMENT)),
                (f"{name}/timestamps", PIECE),
                (packets_column(name), pa.list_(PACKET_INDEX)),
            ]
        elif stream.kind == "audio":
            fields += [(f"{name}/data", PIECE)]
        else:
            fields += [(f"{name}/data", PIECE), (f"{name}/timestamps", PIECE)]
    return pa.schema(fields)


def packets_column(stream: str) -> str:
    """The column of a camera's per-segment packet indexes (optional: older stores lack it)."""
    return f"{stream}{PACKETS_SUFFIX}"


def base_row(index: int, source: str, task: str, duration: float, metadata: dict, shard: str) -> dict[str, Any]:
    return {
        "episode_index": index,
        "key": episode_key(index),
        "source": source,
        "task": task,
        "duration": duration,
        "metadata": json.dumps(metadata, sort_keys=True),
        "shard": shard,
        "members": [],
    }


def span_columns(stream: Any) -> dict[str, Any]:
    """The `<stream>/count`, `/t_start` and `/t_end` columns of an encoded stream."""
    name = stream.spec.name
    return {f"{name}/count": stream.count, f"{name}/t_start": stream.t_start, f"{name}/t_end": stream.t_end}


def write_manifest(
    rows: list[dict[str, Any]], streams: list[Stream], path: str, fs: fsspec.AbstractFileSystem | None = None
) -> None:
    """Write the manifest atomically (local, or on `fs`): a reader sees the old file or the whole new one."""
    table = pa.Table.from_pylist(rows, schema=manifest_schema(streams))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=ROW_GROUP_ROWS, write_statistics=STATISTICS)
    write_bytes_atomically(path, [sink.getvalue().to_pybytes()], fs)
