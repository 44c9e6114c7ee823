"""`mmdata edit STORE delete|keep ...`: the store's next version without some episodes, or with only some, its
manifest pointing at the same shards and arrays (no media copied), published in one step."""

from __future__ import annotations

import argparse

from mmdata.editing.selection import EpisodeSelection
from mmdata.editing.versions import edit_store
from mmdata.errors import OptionError
from mmdata.tools.storage import add_storage_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "edit",
        help="delete episodes, or keep only some (by id, task or duration), as the store's next version",
        description=(
            "Write the store's next version without the episodes named (delete) or with only those (keep):"
            " a new manifest of the kept episodes, numbered 0..n-1, pointing at the shards and arrays where"
            " they are (no media is copied or re-encoded; a WebDataset reader of the shards still sees every"
            " episode), and statistics computed again over them. dataset.json is replaced last, in one step:"
            " a reader sees the version before or the new one, and one that opened the version before keeps"
            " reading it. An edit that fails leaves the store as it was. Local folders and object storage."
        ),
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    parser.add_argument("action", choices=("delete", "keep"), help="delete the episodes named, or keep only them")
    parser.add_argument("--episodes", help="episode ids: 3,7,10-19")
    parser.add_argument("--task", action="append", help="an exact task text (repeat for several)")
    parser.add_argument("--min-seconds", type=float, help="episodes at least this long")
    parser.add_argument("--max-seconds", type=float, help="episodes at most this long")
    parser.add_argument(
        "--keep-stats",
        action="store_true",
        help="keep the version before's statistics (marked so) instead of reading every kept episode again",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    selection = EpisodeSelection(
        ids=episode_ids(args.episodes) if args.episodes else None,
        tasks=args.task,
        min_seconds=args.min_seconds,
        max_seconds=args.max_seconds,
    )
    if selection.describe() == "every episode":
        raise OptionError("name the episodes to delete or keep: --episodes, --task, --min-seconds or --max-seconds")
    report = edit_store(args.path, args.action, selection, not args.keep_stats, not args.no_progress)
    print(
        f"{report.url}: version {report.version}, {report.episodes_after} episodes (of {report.episodes_before});"
        f" manifest {report.manifest_file}; statistics {report.stats}"
    )
    return 0


def episode_ids(text: str) -> list[int]:
    """Episode ids from "3,7,10-19"."""
    ids: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise OptionError(f"--episodes takes ids and ranges like 3,7,10-19, not {text!r}") from None
        if low < 0 or high < low:
            raise OptionError(f"--episodes: {part!r} is not an id or a range low-high of ids from 0")
        ids.extend(range(low, high + 1))
    return ids
