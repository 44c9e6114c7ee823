"""The viewer's static pages: one for the store, one per episode asked for, with their videos beside them.

The store page reads only the manifest's columns it shows (never a shard), so it opens for a store of any
size: a written page holds the first `INLINE_ROWS` episodes, a served one asks the server for a page of the
table at a time (`episode_table`); an episode page reads that episode alone. Each page carries its data as
JSON inside the page and the folder holds everything it loads (`static/`: the viewer's script and style;
`media/`: the remuxed videos), so it works from a file:// URL, behind `mmdata view --serve`, or copied to a
machine offline.
"""

from __future__ import annotations

import contextlib
import html
import math
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmdata.checks import dump_json
from mmdata.errors import MmdataError
from mmdata.schema import AudioStream, LowdimStream, VideoStream
from mmdata.store.filesystem import write_text_atomically
from mmdata.store.handle import Store
from mmdata.store.remux import write_episode_video
from mmdata.store.statistics import read_stats, stream_figures
from mmdata.viewer.episode_table import COLUMNS, EpisodeTable

STATIC = Path(__file__).resolve().parent / "static"
WAVEFORM_BUCKETS = 2000
# Rows a written store page holds; a larger store's whole table is paged by `mmdata view --serve`.
INLINE_ROWS = 20_000
PAGE_ROWS = 500
ROWS_URL = "rows.json"


def episode_page_name(index: int) -> str:
    return f"episode_{index:06d}.html"


def write_site(
    store: Store,
    out: Path,
    episodes: Iterable[int] = (),
    link_all: bool = False,
    table: EpisodeTable | None = None,
) -> Path:
    """The store page (`index.html`) and the page of each of `episodes` into folder `out`; returns the
    store page's path. The store page links the episodes whose pages exist, or, with `link_all` (a server
    that makes them when asked, and answers `rows.json` with the table a page at a time), every intact episode.
    `table`: the store's episode table, read already (the server's)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "static").mkdir(exist_ok=True)
    for name in ("viewer.js", "viewer.css"):
        shutil.copyfile(STATIC / name, out / "static" / name)
    written = {index: write_episode_page(store, index, out) for index in episodes}
    page = out / "index.html"
    pages = {index: path.name for index, path in written.items()}
    data = store_data(store, pages, out, served=link_all, table=table)
    _write_page(page, f"mmdata view: {store.url}", _store_body(store, data), data)
    return page


def store_data(
    store: Store,
    pages: dict[int, str],
    out: Path | None = None,
    served: bool = False,
    table: EpisodeTable | None = None,
) -> dict[str, Any]:
    """What the store page shows, from the manifest's columns (`table`, read here unless given): totals,
    statistics, and the episodes' rows: the first `INLINE_ROWS` in the page (an episode links to its page where
    `pages` names one or, with `out`, where one was written before), or, `served`, none: the page asks the server
    for them (`ROWS_URL`) a page at a time."""
    table = table if table is not None else EpisodeTable(store)
    data: dict[str, Any] = {
        "page": "store",
        "columns": list(COLUMNS),
        "totals": table.totals() | _stream_totals(store, table),
        "stats": _stats(store),
    }
    if served:
        return data | {"rows_url": ROWS_URL, "page_rows": PAGE_ROWS, "episodes": []}

    def page_of(index: int) -> str | None:
        name = episode_page_name(index)
        return pages.get(index) or (name if out is not None and (out / name).exists() else None)

    shown = np.arange(min(table.count, INLINE_ROWS))
    return data | {"episodes": table.rows(shown, page_of), "truncated": table.count > INLINE_ROWS}


def served_page_of(store: Store) -> Callable[[int], str | None]:
    """Where a served store page links an episode: its page, which the server makes when first asked for (none for
    a damaged episode)."""
    return lambda index: None if index in store.damaged else episode_page_name(index)


def _stream_totals(store: Store, table: EpisodeTable) -> dict[str, dict[str, Any]]:
    """Each stream's items (frames, samples, rows) in all, and its stored bytes when the manifest was checked whole
    (a small one; summing a large manifest's pieces would read every row group: None then)."""
    streams = [stream for stream in store.schema.streams if stream.kind != "text"]
    totals = {}
    for stream in streams:
        size = None
        if store.manifest.checked_whole:
            column = f"{stream.name}/segments" if isinstance(stream, VideoStream) else f"{stream.name}/data"
            pieces = store.table.column(column).combine_chunks()
            pieces = pieces.flatten() if pa.types.is_list(pieces.type) else pieces
            size = int(pc.sum(pieces.field("size")).as_py() or 0)
        totals[stream.name] = {"count": table.items[stream.name], "bytes": size}
    return totals


def _stats(store: Store) -> dict[str, dict[str, Any]]:
    """Each low-dim stream's figures from `stats.json`, as checked where any reader takes them (a stream whose
    figures are malformed is left out of the page, as a store without statistics shows none)."""
    try:
        stats = read_stats(store)
    except MmdataError:
        return {}
    shown = {}
    for stream in store.schema.streams:
        if not isinstance(stream, LowdimStream):
            continue
        where = f"{store.url}/{store.schema.stats_file}"
        try:
            figures = stream_figures(stats, stream.name, ("min", "max", "mean", "std"), where)
        except MmdataError:
            continue
        with contextlib.suppress(MmdataError):  # (quantiles are optional)
            figures |= stream_figures(stats, stream.name, ("q01", "q99"), where, len(figures["mean"]))
        count = stats["lowdim"][stream.name].get("count")
        shown[stream.name] = {key: values.tolist() for key, values in figures.items()} | {
            "count": count if isinstance(count, int) and not isinstance(count, bool) else None
        }
    return shown


def write_episode_page(store: Store, index: int, out: Path) -> Path:
    """Episode `index`'s page and its remuxed videos into `out`; returns the page's path."""
    if not 0 <= index < len(store):
        count = len(store)
        raise MmdataError(f"episode {index} is not in the store: it has {count} (0 to {count - 1})")
    if index in store.damaged:
        raise MmdataError(f"episode {index} is damaged: {store.damaged[index]}; run `mmdata verify {store.url}`")
    row = store.manifest.row(index)
    media = out / "media" / f"episode_{index:06d}"
    media.mkdir(parents=True, exist_ok=True)
    cameras: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    audio = None
    for stream in store.schema.streams:
        if isinstance(stream, VideoStream):
            stem = media / stream.name.replace("/", "_")
            video = write_episode_video(store, index, stream.name, stem, playable_in_browsers=True)
            times = store.timestamps_of(row, stream.name)
            cameras.append(
                {
                    "name": stream.name,
                    "src": video.path.relative_to(out).as_posix(),
                    "mime": video.mime,
                    "frames": video.frames,
                    "fps": stream.fps,
                    "times": [round(float(t), 6) for t in times],
                }
            )
        elif isinstance(stream, LowdimStream):
            span = store.lowdim_span(index, stream.name, -math.inf, math.inf)
            values = np.asarray(span.values, np.float64).reshape(len(span.values), -1)
            series.append({"name": stream.name, "times": _rounded(span.timestamps), "values": _rounded(values)})
        elif isinstance(stream, AudioStream) and audio is None:
            span = store.audio_span(index, stream.name, -math.inf, math.inf)
            audio = _waveform(np.asarray(span.values, np.float64), np.asarray(span.timestamps))
    if not cameras:
        raise MmdataError(f"store {store.url} has no camera: the episode page shows cameras")
    first = cameras[0]
    t0 = min([first["times"][0], *(s["times"][0] for s in series if s["times"])])
    t1 = max([first["times"][-1] + 1 / first["fps"], *(s["times"][-1] for s in series if s["times"])])
    data = {
        "page": "episode",
        "index": index,
        "key": row["key"],
        "task": row["task"],
        "duration": float(row["duration"]),
        "metadata": store.metadata_of(row),
        "cameras": cameras,
        "fps": first["fps"],
        "frame_times": first["times"],
        "series": series,
        "audio": audio,
        "t0": t0,
        "t1": t1,
    }
    page = out / episode_page_name(index)
    _write_page(page, f"episode {index} ({row['key']})", _episode_body(data), data)
    return page


def _rounded(values: np.ndarray) -> list:
    return np.round(np.asarray(values, np.float64), 6).tolist()


def _waveform(samples: np.ndarray, times: np.ndarray) -> dict[str, Any] | None:
    """Peaks of the first channel in WAVEFORM_BUCKETS buckets, in [0, 1]."""
    if not len(samples):
        return None
    channel = np.abs(samples.reshape(len(samples), -1)[:, 0])
    peak = channel.max() or 1.0
    buckets = np.array_split(channel, min(WAVEFORM_BUCKETS, len(channel)))
    duration = float(times[-1] - times[0]) if len(times) > 1 else 0.0
    return {"t0": float(times[0]), "duration": duration, "peaks": [round(float(b.max() / peak), 4) for b in buckets]}


def _store_body(store: Store, data: dict[str, Any]) -> str:
    totals = data["totals"]
    streams = "".join(
        f"<span>{html.escape(name)}: {figures['count']:,} items"
        + (f", {figures['bytes'] / 1e6:.1f} MB" if figures["bytes"] is not None else "")
        + "</span>"
        for name, figures in totals.items()
        if isinstance(figures, dict)
    )
    stats = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(_ranges(figures))}</td></tr>"
        for name, figures in data["stats"].items()
    )
    headers = "".join(f'<th data-column="{c}">{c}</th>' for c in COLUMNS)
    return f"""<h1>{html.escape(store.url)}</h1>
<p class="totals"><span id="episode-count">{totals["episodes"]} episodes</span>
<span>{totals["hours"]:.3f} hours</span>{streams}</p>
<p><input id="filter" placeholder="filter by key or task">
<label><input type="checkbox" id="damaged-only"> damaged only</label>
<span id="shown"></span> <span id="pager" hidden><button id="previous">previous</button>
<button id="next">next</button></span>
<span class="help">(click a column to sort; an episode's link opens its page)</span></p>
<table id="episodes"><thead><tr>{headers}</tr></thead><tbody></tbody></table>
<h2>Statistics (stats.json)</h2>
<p class="help">per dimension: min .. max (line), 1st .. 99th percentile (box), mean (dot) ± std (bar)</p>
<div id="stat-plots"></div>
<table id="stats">{stats or "<tr><td>no stats.json: run mmdata stats</td></tr>"}</table>"""


def _ranges(figures: dict[str, Any]) -> str:
    """Per dimension: min .. max (mean ± std)."""
    lows, highs = figures.get("min", []), figures.get("max", [])
    means, stds = figures.get("mean", []), figures.get("std", [])
    return "; ".join(
        f"[{i}] {lo:.3g} .. {hi:.3g} ({m:.3g} ± {s:.3g})"
        for i, (lo, hi, m, s) in enumerate(zip(lows, highs, means, stds))
    )


def _episode_body(data: dict[str, Any]) -> str:
    videos = "".join(
        f"""<div class="camera"><b>{html.escape(c["name"])}</b>
<video muted preload="auto" data-camera="{html.escape(c["name"])}" data-frames="{int(c["frames"])}">
<source src="{html.escape(quote(c["src"]))}" type="{html.escape(c["mime"])}"></video></div>"""
        for c in data["cameras"]
    )
    metadata = html.escape(dump_json(data["metadata"], indent=1))
    wave = '<h2>Audio</h2><canvas id="waveform" class="plot" width="900" height="80"></canvas>' if data["audio"] else ""
    return f"""<p><a href="index.html">all episodes</a></p>
<h1>Episode {data["index"]}: {html.escape(data["key"])}</h1>
<p>Task: <b id="task">{html.escape(data["task"])}</b>, {data["duration"]:.3f} s</p>
<p><button id="play">play / pause</button> frame <b id="frame">0</b>
<span class="help">(space: play or pause; left / right arrow: one frame; click a plot to go to that time)</span></p>
<div class="cameras">{videos}</div>
<h2>Low-dim streams</h2><div id="plots"></div>{wave}
<h2>Metadata</h2><pre>{metadata}</pre>"""


# What a page may load and run: the viewer's own script and style, its videos, the served table's rows, nothing
# else (no inline script, no request leaving the folder or the server); the server sends the same policy as a header.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self';"
    " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Characters that could end or change the <script> element holding the page's data, or end a line in older
# JavaScript, written as JSON escapes (which JSON.parse reads back as the same text).
_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def script_json(data: Any) -> str:
    """`data` as JSON that can sit inside a <script> element whatever text it holds, every number a JSON number
    (`checks.dump_json`: one that is not finite written as null)."""
    return dump_json(data).translate(_SCRIPT_ESCAPES)


def _write_page(path: Path, title: str, body: str, data: dict[str, Any]) -> None:
    payload = script_json(data)
    text = f"""<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="static/viewer.css"></head>
<body>{body}
<script id="data" type="application/json">{payload}</script>
<script src="static/viewer.js"></script></body></html>
"""
    write_text_atomically(str(path), text)
