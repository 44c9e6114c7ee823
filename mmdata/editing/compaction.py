"""A store's episodes written again as a store of their own: every segment, audio track and low-dim array copied
byte for byte (nothing decoded or re-encoded) into new shards or arrays, in either layout.

What an edit does not do: a store whose versions deleted episodes still holds their media, and a split or merged
store reads its media from its origins. `compact_store` makes a store that holds exactly its episodes, names
nothing outside itself, and whose shard members carry the episodes' current keys (what a WebDataset reader of the
shards sees). The store compacted is only read. The new store is written as a conversion writes one:
`dataset.json` last, and a failure removes what it wrote (the destination was new or empty); into object storage,
it is made in a local staging folder and uploaded with `dataset.json` last. A store with damaged episodes is
refused, naming them: they are deleted first.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm

from mmdata.checks import inside, parse_json
from mmdata.editing.edits import EditReport, editable_store
from mmdata.errors import EditError, IntegrityError, OptionError
from mmdata.schema import LAYOUTS, AudioStream, DatasetSchema, Layout, LowdimStream, TextStream, VideoStream
from mmdata.store.encoded import EncodedAudio, EncodedEpisode, EncodedLowdim, EncodedVideo
from mmdata.store.filesystem import join, resolve, write_text_atomically
from mmdata.store.handle import Store
from mmdata.store.hold import StoreHold, empty_folder, hold_store, is_writer_record
from mmdata.store.layout import DATASET_FILE, PARTIAL_DIR
from mmdata.store.manifest import Piece, write_manifest
from mmdata.store.staging import default_staging, is_remote, publish, remove_staging
from mmdata.store.statistics import compute_stats
from mmdata.store.versions import NextVersion, complete_version
from mmdata.store.wds_writer import DEFAULT_SHARD_BYTES, WdsWriter
from mmdata.store.zarr_writer import ZarrWriter

COMPACTION_FILE = "compaction.json"  # in the partial folder: what a compaction under way copies, and how


def compact_store(url: str, into: str, layout: str | None = None, progress: bool = True) -> EditReport:
    """Write the episodes of the store at `url` (its current version) as a new store at `into` (a new or empty
    local folder, or an object-store URL holding nothing), in `layout` (default: the store's own)."""
    if layout and layout not in LAYOUTS:
        raise OptionError(f"layout is one of {', '.join(LAYOUTS)}, not {layout!r}")
    store = editable_store(url)
    chosen: Layout = "wds" if layout == "wds" else "zarr" if layout == "zarr" else store.schema.layout
    remote = is_remote(into)
    local = default_staging(into) if remote else Path(into)
    if remote:
        fs, root = resolve(into)
        if fs.exists(join(root, DATASET_FILE)):
            raise EditError(f"'{into}' is already a complete store; a compacted store goes to a new or empty place")
        if fs.exists(root) and not all(is_writer_record(entry.rstrip("/").rsplit("/", 1)[-1]) for entry in fs.ls(root)):
            raise EditError(f"'{into}' holds objects already; a compacted store goes to a new or empty place")
    if store.damaged:
        why = store.damaged[min(store.damaged)]
        raise EditError(f"'{url}' has damaged episodes ({sorted(store.damaged)[:10]}; {why}); {_delete_first(url)}")
    if local.exists() and not local.is_dir():
        raise EditError(f"'{local}' is a file; a compacted store goes to a new or empty folder")
    existed = local.exists()
    try:
        with hold_store(local, f"mmdata edit {url} compact --into {into}") as hold:
            if remote:
                empty_folder(local)  # (a staging folder an interrupted compaction left)
            else:
                _check_local_destination(store, local, chosen)
            try:
                schema = _write(store, chosen, hold, progress)
            except BaseException:  # (the folder was new, empty or an interrupted compaction's: nothing else removed)
                empty_folder(local)
                raise
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                local.rmdir()  # (only if empty: a writer holding it meanwhile keeps its record there)
        raise
    if remote:
        publish(local, into, overwrite=False, progress=progress)
        remove_staging(local)
    return EditReport(into, 0, len(store), schema.num_episodes, schema.manifest_file, "recomputed")


def _write(store: Store, layout: Layout, hold: StoreHold, progress: bool) -> DatasetSchema:
    """Write `store`'s episodes into a complete store of `layout` in the local folder `hold` holds; its schema."""
    local = Path(hold.root)
    shard_bytes = store.schema.created.get("shard_bytes")
    if not (isinstance(shard_bytes, int) and shard_bytes > 0):
        shard_bytes = DEFAULT_SHARD_BYTES
    (local / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    write_text_atomically(str(local / PARTIAL_DIR / COMPACTION_FILE), json.dumps({"from": store.url, "layout": layout}))
    writer = WdsWriter(local, shard_bytes) if layout == "wds" else ZarrWriter(local)
    writer.restore()
    count = len(store)
    for index in tqdm(range(count), unit="episode", desc=f"compact {store.url}", disable=not progress):
        try:
            episode = stored_episode(store, index)
        except IntegrityError as exc:  # (a large manifest's damaged rows are found as they are read)
            raise EditError(f"episode {index} of '{store.url}' is damaged ({exc}); {_delete_first(store.url)}") from exc
        writer.add(episode, index, {"compacted": index + 1})
    streams = [stream for stream in store.schema.streams if not isinstance(stream, TextStream)]
    rows = writer.finish({"compacted": count}, streams)
    created = {
        **store.schema.created,
        "compacted_from": store.url,
        "layout": layout,
        "shard_bytes": shard_bytes if layout == "wds" else None,
    }
    schema = DatasetSchema(layout=layout, streams=store.schema.streams, num_episodes=len(rows), created=created)
    with NextVersion(hold) as version:

        def write_rows(path: str) -> None:
            write_manifest(rows, schema.streams, path, hold.fs)

        complete_version(version, schema, write_rows, compute_stats, statistics_optional=True)
    return schema


def _delete_first(url: str) -> str:
    return f"nothing was written: delete them first (`mmdata edit {url} delete --episodes ...`), then compact"


def stored_episode(store: Store, index: int) -> EncodedEpisode:
    """Episode `index` of `store` as the writers take an episode: its stored bytes and arrays, as they are."""
    row = store.manifest.row(index)
    episode = EncodedEpisode(index, row["source"], row["task"], store.metadata_of(row))
    for spec in store.schema.streams:
        if isinstance(spec, VideoStream):
            table = store.segment_table(row, spec.name)
            segments = [store.segment_bytes(piece) for piece in table.pieces]
            frames = [int(segment["num_frames"]) for segment in table.segments]
            indexes = table.indexes if all(index is not None for index in table.indexes) else None
            timestamps = store.timestamps_of(row, spec.name)
            episode.videos.append(EncodedVideo(spec, segments, frames, timestamps, indexes))  # type: ignore[arg-type]
        elif isinstance(spec, AudioStream):
            data = store.pieces.read_bytes(Piece.from_dict(row[f"{spec.name}/data"]))
            count, start = int(row[f"{spec.name}/count"]), float(row[f"{spec.name}/t_start"])
            episode.audio.append(EncodedAudio(spec, data, count, start))
        elif isinstance(spec, LowdimStream):
            span = store.lowdim_span(index, spec.name, -math.inf, math.inf)
            episode.lowdim.append(EncodedLowdim(spec, span.values, span.timestamps))
    return episode


def _check_local_destination(store: Store, local: Path, layout: str) -> None:
    """A new or empty folder (or what an interrupted compaction of the same store into the same layout left there,
    which is removed: the folder is held, so that compaction is not running), outside the store compacted and the
    stores it reads media from."""
    if local.is_symlink():
        raise EditError(
            f"'{local}' is a symbolic link (to '{local.resolve()}'); a compacted store is written into a folder, not"
            " through a link: give the folder itself, or remove the link"
        )
    held = [entry for entry in local.iterdir() if not is_writer_record(entry.name)]
    if held:
        interrupted = _interrupted_compaction(local)
        if interrupted is None:
            raise EditError(f"'{local}' is a folder that is not empty; a compacted store goes to a new or empty folder")
        if interrupted != {"from": store.url, "layout": layout} or (local / DATASET_FILE).exists():
            raise EditError(
                f"'{local}' holds what an interrupted compaction of '{interrupted.get('from')}' into"
                f" {interrupted.get('layout')} left ({PARTIAL_DIR}/{COMPACTION_FILE}); run that compaction again to"
                " finish it, or delete the folder, then compact into it"
            )
        empty_folder(local)
    media = [store.root, *(join(store.root, origin) for origin in store.schema.media_stores())]
    if isinstance(store.fs, LocalFileSystem) and any(inside(root, local) for root in media):
        raise EditError(f"'{local}' lies inside a store whose media it copies; write the compacted store beside it")


def _interrupted_compaction(local: Path) -> dict | None:
    """What the compaction interrupted in `local` was (its record in the partial folder), or None."""
    try:
        found = parse_json((local / PARTIAL_DIR / COMPACTION_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else {}
