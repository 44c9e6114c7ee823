"""`mmdata export STORE DST --to lerobot`: a store, or some of its episodes, in another project's format."""

from __future__ import annotations

import argparse
import itertools

from mmdata.errors import OptionError
from mmdata.exporters.lerobot_v3 import export_lerobot
from mmdata.tools.formatting import format_seconds
from mmdata.tools.storage import add_storage_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "export",
        help="write a store (or some episodes) as a LeRobot v3.0 dataset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Write a store's episodes as a LeRobot v3.0 dataset (meta/info.json, meta/stats.json,\n"
            "meta/tasks.parquet, meta/episodes/, data/chunk-*/file-*.parquet, videos/<camera>/...),\n"
            "which LeRobot 0.4-0.6 loads with LeRobotDataset(repo_id, root=DST).\n\n"
            "One row per camera frame (the cameras must share a rate and be evenly spaced), with\n"
            "LeRobot's timestamp, frame_index, episode_index, index and task_index counted over the\n"
            "exported episodes. Low-dim streams stamped at the frame times are written as stored,\n"
            "others sampled at them (nearest value; the report names them). H.264, HEVC, AV1 and VP9\n"
            "cameras are remuxed without re-encoding (the same frames, bit for bit); others are\n"
            "encoded as LeRobot does (AV1, key frame every 2 frames, crf 30). Audio is left out.\n"
            "DST must be new; it is written as DST.partial and renamed when complete.\n"
            "See docs/append-export.md."
        ),
    )
    parser.add_argument("store", help="store folder or fsspec URL")
    parser.add_argument("destination", help="folder for the dataset (new, or empty)")
    parser.add_argument("--to", choices=["lerobot"], default="lerobot", help="format (default lerobot: v3.0)")
    parser.add_argument(
        "--episodes", help="episodes to export, by store number: 0,3,10-19 (default: every intact episode)"
    )
    parser.add_argument(
        "--rename",
        metavar="STREAM=KEY,...",
        help="LeRobot feature keys for streams, e.g. state=observation.state,cam_high=observation.images.top"
        " (default: the stream names; a store converted from LeRobot already has LeRobot's)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = export_lerobot(
        args.store,
        args.destination,
        episodes=itertools.chain.from_iterable(parse_episodes(args.episodes)) if args.episodes is not None else None,
        rename=parse_rename(args.rename) if args.rename else None,
        progress=not args.quiet,
    )
    print(
        f"exported {report.episodes} episodes ({report.frames} frames) to {report.destination} (LeRobot v3.0) in"
        f" {format_seconds(report.seconds)}"
    )
    if report.remuxed:
        print(f"  remuxed, not re-encoded: {', '.join(report.remuxed)}")
    if report.reencoded:
        print(f"  encoded as LeRobot does (AV1): {', '.join(report.reencoded)}")
    if report.resampled:
        print(f"  sampled at the frame times (nearest value): {', '.join(report.resampled)}")
    if report.left_out:
        print(f"  left out (LeRobot datasets hold no audio): {', '.join(report.left_out)}")
    return 0


def parse_episodes(text: str) -> list[range]:
    """`0,3,10-19` as ranges of episode numbers (a range is checked against the store as it is read, never made
    whole); OptionError naming the part that is not a number or a range."""
    chosen: list[range] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or len(first) > 18 or len(last) > 18:
            raise OptionError(f"--episodes: {part!r} is not an episode number or a range like 10-19")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise OptionError(f"--episodes: '{part}' is not a range of episode numbers from low to high")
        chosen.append(range(low, high + 1))
    return chosen


def parse_rename(text: str) -> dict[str, str]:
    """`a=b,c=d` as {"a": "b", "c": "d"}."""
    pairs = {}
    for part in text.split(","):
        name, equals, key = part.partition("=")
        if not equals or not name.strip() or not key.strip():
            raise OptionError(f"--rename: '{part}' is not STREAM=KEY")
        pairs[name.strip()] = key.strip()
    return pairs
