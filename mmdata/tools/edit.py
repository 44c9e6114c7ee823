"""`mmdata edit STORE delete|keep|remove-stream|add-stream|split|merge|compact ...`: a store's next version, or new
stores made from it, their manifests pointing at the shards and arrays where the episodes are (no media copied, but
by compact, which copies it byte for byte into a store of its own), published by writing `dataset.json` last."""

from __future__ import annotations

import argparse
import textwrap

from mmdata.editing.added_streams import MATCHES, add_streams
from mmdata.editing.compaction import compact_store
from mmdata.editing.derived import ValidationChoice, merge_stores, split_store
from mmdata.editing.edits import EditReport, edit_store, remove_stream
from mmdata.editing.selection import EpisodeSelection
from mmdata.errors import OptionError
from mmdata.tools.export import parse_episodes
from mmdata.tools.storage import add_storage_options

PUBLISHING = (
    " dataset.json is written last, in one step: a reader sees the version before or the new one, one that opened"
    " the version before keeps reading it, and an edit that fails leaves the store as it was."
)
DERIVED = (
    " The new stores hold a manifest, statistics and dataset.json, and no media: their rows name the stores"
    " holding the shards or arrays (dataset.json's 'origins', paths relative to the new store), which must stay"
    " where they are. They lie beside those stores, on the same filesystem."
)


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "edit",
        help="delete or keep episodes, add or remove a stream, split into train/validation, merge stores, compact",
        description=textwrap.fill(
            "Edit a store without re-encoding media: delete episodes or keep only some (by id, task or duration),"
            " remove a stream, or add one from another store, as the store's next version; split it into train and"
            " validation stores, or merge stores with the same streams into a new one (none of these copies media);"
            " compact a store into a new one holding exactly its episodes (media copied byte for byte). Local"
            " folders and object storage." + PUBLISHING,
            100,
        ),
        epilog=(
            "examples:\n  mmdata edit robot.wds delete --episodes 3,17,40-44\n"
            "  mmdata edit robot.wds split --train robot-train.wds --validation robot-val.wds --fraction 0.1\n"
            "  mmdata edit robot-a.wds merge robot-b.wds --into robots.wds\n"
            "  mmdata edit robot.wds add-stream --from robot-depth.wds --stream depth\n"
            "  mmdata edit robots.wds compact --into s3://bucket/robots.zarr --layout zarr\n"
            "each action has its own --help: mmdata edit STORE split --help"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_storage_options(common)
    stats = argparse.ArgumentParser(add_help=False)
    stats.add_argument(
        "--keep-stats",
        action="store_true",
        help="keep the (first) store's statistics, marked so, instead of reading every episode again",
    )
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("--episodes", help="episode ids: 3,7,10-19")
    selection.add_argument("--task", action="append", help="an exact task text (repeat for several)")
    selection.add_argument("--min-seconds", type=float, help="episodes at least this long")
    selection.add_argument("--max-seconds", type=float, help="episodes at most this long")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, verb in (("delete", "without the episodes named"), ("keep", "with only the episodes named")):
        actions.add_parser(
            action,
            parents=[selection, stats, common],
            help=f"the store's next version {verb}",
            description=(
                f"Write the store's next version {verb}: a new manifest of the kept episodes, numbered 0..n-1,"
                " pointing at the shards and arrays where they are (a WebDataset reader of the shards still sees"
                " every episode), and statistics computed again over them." + PUBLISHING
            ),
        )
    removing = actions.add_parser(
        "remove-stream",
        parents=[common],
        help="the store's next version without a stream",
        description=(
            "Write the store's next version without a stream: its manifest columns, its entry in dataset.json and in"
            " the statistics (the others' are kept as they are). Its media stay in the shards and arrays, unread."
            + PUBLISHING
        ),
    )
    removing.add_argument("stream", help="the stream's name, as `mmdata inspect` lists it")
    adding = actions.add_parser(
        "add-stream",
        parents=[stats, common],
        help="the store's next version with a stream of another store",
        description=(
            "Write the store's next version with streams of another store of the same layout (a stream converted"
            " later from the same recordings: a depth camera, another view): each episode gets the stream of the"
            " other store's episode of the same source (the recording it was converted from), or of the same"
            " number (--match order). The media stay in the other store, which must lie beside this one and stay"
            " there (dataset.json's 'stream_origins' names it); `compact` copies them in. An episode the stream"
            " would leave inconsistent (a stream that ends after it) is refused, naming it." + PUBLISHING
        ),
    )
    adding.add_argument("--from", dest="other", required=True, help="the store holding the stream (folder or URL)")
    adding.add_argument(
        "--stream", dest="streams", action="append", required=True, help="a stream to add (repeat for several)"
    )
    adding.add_argument(
        "--match", choices=MATCHES, default="source", help="how episodes are matched: by source (default) or order"
    )
    splitting = actions.add_parser(
        "split",
        parents=[selection, stats, common],
        help="split into new train and validation stores",
        description=(
            "Split the store into a validation store (the episodes --episodes/--task/--min-seconds/--max-seconds"
            " name, or --fraction of them drawn by --seed: the same store, fraction and seed always draw the same"
            " episodes) and a train store (the others), each with statistics of its own episodes." + DERIVED
        ),
    )
    splitting.add_argument("--train", required=True, help="where the train store goes (a new folder or URL)")
    splitting.add_argument("--validation", required=True, help="where the validation store goes")
    splitting.add_argument("--fraction", type=float, help="the share of episodes drawn for validation, in (0, 1)")
    splitting.add_argument("--seed", type=int, default=0, help="the seed the --fraction draw uses (default 0)")
    merging = actions.add_parser(
        "merge",
        parents=[stats, common],
        help="merge the store and others of the same streams into a new store",
        description=(
            "Merge the store and the others given (the same layout and streams, each described alike; the error"
            " names the streams that differ) into a new store: their episodes in order, renumbered, with"
            " statistics over all of them." + DERIVED
        ),
    )
    merging.add_argument("others", nargs="+", help="the other stores, in the order their episodes follow")
    merging.add_argument("--into", required=True, help="where the merged store goes (a new folder or URL)")
    compacting = actions.add_parser(
        "compact",
        parents=[common],
        help="write the store's episodes again as a store of their own (media copied, not re-encoded)",
        description=(
            "Write the store's episodes (its current version) as a new store that holds exactly them: every"
            " segment, audio track and low-dim array copied byte for byte into new shards or arrays (nothing"
            " decoded or re-encoded), the shard members named by the episodes' current keys, nothing pointing"
            " outside it. What makes a store edited by deletions smaller, a split or merged store independent of"
            " its origins, or a store of the other layout. Statistics are computed over the new store. The store"
            " compacted is only read; dataset.json is written last (into object storage: staged locally, then"
            " uploaded, dataset.json last)."
        ),
    )
    compacting.add_argument("--into", required=True, help="where the new store goes (a new or empty folder, or URL)")
    compacting.add_argument("--layout", choices=("wds", "zarr"), help="the new store's layout (default: the same)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    progress = not args.no_progress
    if args.action == "remove-stream":
        reports = [remove_stream(args.path, args.stream, progress)]
    elif args.action == "add-stream":
        reports = [add_streams(args.path, args.other, args.streams, args.match, not args.keep_stats, progress)]
    elif args.action == "compact":
        reports = [compact_store(args.path, args.into, args.layout, progress)]
    elif args.action == "merge":
        reports = [merge_stores([args.path, *args.others], args.into, not args.keep_stats, progress)]
    elif args.action == "split":
        named = _selection(args)
        if (named is None) == (args.fraction is None):
            raise OptionError(
                "name the validation episodes by --fraction, or by --episodes, --task, --min-seconds or"
                " --max-seconds (one way, not both)"
            )
        choice = ValidationChoice(named, args.fraction, args.seed)
        reports = list(split_store(args.path, args.train, args.validation, choice, not args.keep_stats, progress))
    else:
        named = _selection(args)
        if named is None:
            raise OptionError(f"name the episodes to {args.action}: --episodes, --task, --min-seconds or --max-seconds")
        reports = [edit_store(args.path, args.action, named, not args.keep_stats, progress)]
    for report in reports:
        print(_described(report))
    return 0


def _selection(args: argparse.Namespace) -> EpisodeSelection | None:
    selection = EpisodeSelection(
        ids=parse_episodes(args.episodes) if args.episodes else None,
        tasks=args.task,
        min_seconds=args.min_seconds,
        max_seconds=args.max_seconds,
    )
    return None if selection.describe() == "every episode" else selection


def _described(report: EditReport) -> str:
    return (
        f"{report.url}: version {report.version}, {report.episodes_after} episodes (of {report.episodes_before});"
        f" manifest {report.manifest_file}; statistics {report.stats}"
    )
