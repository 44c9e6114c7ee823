"""`mmdata verify PATH`: re-read every piece, check checksums, decode every segment and track."""

from __future__ import annotations

import argparse

from mmdata.store.verification import verify_dataset
from mmdata.tools.formatting import format_bytes, terminal_text
from mmdata.tools.storage import add_storage_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "verify",
        help="check every checksum and decode every video segment and audio track; non-zero exit on failure",
        description=(
            "Re-read every stored piece, compare it with the checksum in episodes.parquet, decode every"
            " video segment and audio track, and check counts, shapes and dtypes against the manifest."
            " Lists each failing episode and exits with status 1 if any fails."
        ),
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = verify_dataset(args.path, progress=not args.quiet)
    summary = (
        f"{report.episodes} episodes, {report.pieces} pieces, {format_bytes(report.bytes_read)} read,"
        f" {report.frames_decoded} frames decoded"
    )
    if report.ok:
        print(f"OK {terminal_text(args.path)}: {summary}")
        return 0
    print(f"FAILED {terminal_text(args.path)}: {len(report.failures)} of {report.episodes} episodes bad ({summary})")
    for failure in report.failures:
        print(f"  episode {failure.index} ({terminal_text(failure.source)}):")
        for problem in failure.problems:
            print(f"    {terminal_text(problem)}")
    return 1
