"""`mmdata view STORE`: look at a store in a browser: its episodes as a table, and an episode's cameras
playing in sync beside its low-dim streams (see `mmdata.viewer`)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
from pathlib import Path

from mmdata.errors import DestinationError, MmdataError, OptionError
from mmdata.store.handle import Store
from mmdata.tools.storage import add_storage_options
from mmdata.viewer.episode_table import EpisodeTable
from mmdata.viewer.pages import write_site
from mmdata.viewer.rerun_export import write_rerun_recording
from mmdata.viewer.server import view_server


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "view",
        help="look at a store in a browser: the episode table, and an episode's cameras in sync with its streams",
        description=textwrap.fill(
            "Write a store's pages for a browser: index.html (every episode as a table to sort and filter, with"
            " durations, tasks, frames per camera and the episodes the store's checks flag; totals; the statistics"
            " of stats.json) and, per --episode, a page with the cameras playing in sync (the stored video remuxed,"
            " not re-encoded), each low-dim stream plotted against time with a cursor that follows the video and"
            " seeks it when clicked, the audio's waveform, the task and the metadata. Space plays or pauses, the"
            " arrow keys step a frame. The folder holds everything the pages load: it works offline and can be"
            " copied. The store page reads the manifest only; an episode page reads that episode.",
            100,
        ),
        epilog="examples:\n  mmdata view /data/robot.wds --episode 3 --out /tmp/robot-view\n"
        "  mmdata view s3://bucket/robot.wds --serve --port 8000\n"
        "  mmdata view /data/robot.wds --episode 3 --rerun episode3.rrd",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    parser.add_argument(
        "--episode", type=int, action="append", default=[], help="write this episode's page too (repeatable)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, help="folder to write the pages into (default: a new temporary folder)")
    where.add_argument(
        "--serve", action="store_true", help="serve the pages on 127.0.0.1 (episode pages made when first opened)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000; 0: any free one)")
    parser.add_argument(
        "--rerun",
        type=Path,
        metavar="OUT.rrd",
        help="instead of pages, write the one --episode as a Rerun recording (cameras, low-dim streams as scalar"
        " series and the task on the episode's timeline; needs pip install 'mmdata[view]')",
    )
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise OptionError(f"--port is 0 to 65535, not {args.port}")
    store = Store(args.path)
    if args.rerun is not None:
        if len(args.episode) != 1 or args.serve or args.out is not None:
            raise MmdataError("--rerun writes one episode: give exactly one --episode, without --out or --serve")
        print(f"written {write_rerun_recording(store, args.episode[0], args.rerun)}")
        return 0
    if args.out is not None:
        _check_out(args.out, store)
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="mmdata-view-"))
    server, table = None, EpisodeTable(store)
    if args.serve:
        try:
            server = view_server(store, out, args.port, table)  # (a port in use is refused before anything is written)
        except OptionError:
            shutil.rmtree(out, ignore_errors=True)
            raise
    page = write_site(store, out, args.episode, link_all=args.serve, table=table)
    if server is None:
        print(f"open {page.resolve().as_uri()}")
        return 0
    host, port = str(server.server_address[0]), server.server_address[1]
    print(f"serving {store.url} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _check_out(out: Path, store: Store) -> None:
    """Refuse an --out that is not a folder, or that lies inside the store (its pages would sit among the store's
    files, where `convert --overwrite` of the store deletes them)."""
    if out.exists() and not out.is_dir():
        raise DestinationError(f"--out '{out}' is a file, not a folder; name a folder for the pages")
    if store.holds(out):
        raise DestinationError(
            f"--out '{out}' lies inside the store '{store.url}'; write the pages into a folder outside it"
        )
