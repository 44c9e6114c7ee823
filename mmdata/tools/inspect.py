"""`mmdata inspect PATH`: what a store holds, from its schema and manifest alone."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pyarrow as pa

from mmdata.checks import dump_json
from mmdata.schema import DERIVING, AudioStream, LowdimStream, VideoStream
from mmdata.store.handle import Store
from mmdata.tools.formatting import format_bytes, format_seconds, terminal_text
from mmdata.tools.storage import add_storage_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "inspect",
        help="show a store's schema, episode counts, durations, sizes and per-stream summary",
        description="Summarise a store from dataset.json and episodes.parquet, without reading shards.",
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_storage_options(parser)
    parser.set_defaults(run=run)


def summarize(dataset: Store) -> dict[str, Any]:
    """Counts, durations and sizes over the episodes whose manifest rows passed the store's checks."""
    intact = np.ones(dataset.table.num_rows, bool)
    intact[list(dataset.damaged)] = False
    table = dataset.table.filter(pa.array(intact))
    durations = np.asarray(table.column("duration").to_pylist(), dtype=np.float64)
    streams = []
    for stream in dataset.schema.streams:
        if stream.kind == "text":
            tasks = table.column("task").to_pylist()
            streams.append({"name": stream.name, "kind": "text", "distinct": len(set(tasks))})
            continue
        counts = table.column(f"{stream.name}/count").to_pylist()
        entry: dict[str, Any] = {"name": stream.name, "kind": stream.kind, "count": int(sum(counts))}
        if isinstance(stream, VideoStream):
            segments = table.column(f"{stream.name}/segments").to_pylist()
            entry.update(
                codec=stream.codec,
                width=stream.width,
                height=stream.height,
                fps=stream.fps,
                segment_frames=stream.segment_frames,
                gop=stream.gop,
                crf=stream.crf,
                segments=sum(len(s) for s in segments),
                bytes=sum(p["size"] for s in segments for p in s),
            )
        else:
            pieces = table.column(f"{stream.name}/data").to_pylist()
            entry["bytes"] = sum(p["size"] for p in pieces)
            if isinstance(stream, AudioStream):
                entry.update(
                    codec=stream.codec,
                    sample_rate=stream.sample_rate,
                    channels=stream.channels,
                    sample_dtype=stream.sample_dtype,
                )
            elif isinstance(stream, LowdimStream):
                entry.update(shape=list(stream.shape), dtype=stream.dtype, rate=stream.rate)
        streams.append(entry)
    shards = set(dataset.columns(["shard"]).column("shard").filter(pa.array(intact)).to_pylist()) - {""}
    return {
        "path": dataset.url,
        "format_version": dataset.schema.format_version,
        "layout": dataset.schema.layout,
        "episodes": len(dataset),
        "damaged_episodes": sorted(dataset.damaged),
        "shards": len(shards),
        "duration_seconds": {
            "total": float(durations.sum()),
            "min": float(durations.min()) if len(durations) else 0.0,
            "median": float(np.median(durations)) if len(durations) else 0.0,
            "max": float(durations.max()) if len(durations) else 0.0,
        },
        "streams": streams,
        "created": dataset.schema.created,
        "history": dataset.schema.history,
        "origins": dataset.schema.origins,
        "stream_origins": dataset.schema.stream_origins,
    }


def _describe(entry: dict[str, Any]) -> str:
    kind = entry["kind"]
    if kind == "text":
        return f"{entry['distinct']} distinct tasks"
    if kind == "video":
        return (
            f"{entry['width']}x{entry['height']} @ {entry['fps']:g} fps, {entry['codec']} crf {entry['crf']},"
            f" {entry['segment_frames']}-frame segments, gop {entry['gop']}; {entry['count']} frames in"
            f" {entry['segments']} segments, {format_bytes(entry['bytes'])}"
        )
    if kind == "audio":
        return (
            f"{entry['sample_rate']} Hz x {entry['channels']}, {entry['codec']} {entry['sample_dtype']};"
            f" {entry['count']} samples, {format_bytes(entry['bytes'])}"
        )
    rate = f"@ {entry['rate']:g} Hz" if entry["rate"] else "explicit timestamps"
    size = format_bytes(entry["bytes"])
    return f"{entry['dtype']} {tuple(entry['shape'])} {rate}; {entry['count']} rows, {size}"


def run(args: argparse.Namespace) -> int:
    summary = summarize(Store(args.path))
    if args.json:
        print(dump_json(summary, indent=2))
        return 0
    d = summary["duration_seconds"]
    print(f"{summary['path']}: mmdata store, format {summary['format_version']}, layout {summary['layout']}")
    shards = f" in {summary['shards']} shards" if summary["shards"] else ""
    print(f"  episodes  {summary['episodes']}{shards}")
    if summary["damaged_episodes"]:
        damaged = summary["damaged_episodes"]
        print(f"  damaged   {len(damaged)} episodes fail the manifest checks ({damaged[:10]}); run `mmdata verify`")
    print(
        f"  duration  {format_seconds(d['total'])} in all; per episode min {d['min']:.1f} s,"
        f" median {d['median']:.1f} s, max {d['max']:.1f} s"
    )
    print("  streams")
    width = max(len(s["name"]) for s in summary["streams"])
    for entry in summary["streams"]:
        print(f"    {entry['name']:<{width}}  {entry['kind']:<6}  {_describe(entry)}")
    if summary["origins"]:
        print(f"  media     in the stores {', '.join(map(terminal_text, summary['origins']))} (split or merged from)")
    for name, origin in summary["stream_origins"].items():
        print(f"  media     of '{terminal_text(name)}' in the store {terminal_text(origin)} (added from)")
    if summary["history"]:
        first = summary["history"][0]
        print("  history")
        if first.get("edit") not in DERIVING:
            converted = first["episodes_before"] if first.get("edit") else first["first_episode"]
            print(f"    converted             episodes 0-{converted - 1}")
        for entry in summary["history"]:
            if entry.get("edit"):
                print(
                    f"    {terminal_text(entry['time'])}  edited: {terminal_text(entry['source'])},"
                    f" {entry['episodes_before']} -> {entry['episodes']} episodes"
                )
                continue
            last = entry["first_episode"] + entry["episodes"] - 1
            print(
                f"    {terminal_text(entry['time'])}  appended {entry['episodes']} episodes"
                f" ({entry['first_episode']}-{last}) from {terminal_text(entry['source'])}"
            )
    return 0
