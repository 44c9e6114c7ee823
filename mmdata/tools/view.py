"""`mmdata view STORE`: look at a store in a browser: its episodes as a table, and an episode's cameras
playing in sync beside its low-dim streams (see `mmdata.viewer`)."""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import tempfile
import textwrap
import threading
from pathlib import Path

from mmdata.errors import MmdataError
from mmdata.store.handle import Store
from mmdata.tools.storage import add_storage_options
from mmdata.viewer.pages import write_episode_page, write_site
from mmdata.viewer.rerun_export import write_rerun_recording

EPISODE_PAGE = re.compile(r"^/episode_(\d{6})\.html$")
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


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
        raise MmdataError(f"--port is 0 to 65535, not {args.port}")
    store = Store(args.path)
    if args.rerun is not None:
        if len(args.episode) != 1 or args.serve or args.out is not None:
            raise MmdataError("--rerun writes one episode: give exactly one --episode, without --out or --serve")
        print(f"written {write_rerun_recording(store, args.episode[0], args.rerun)}")
        return 0
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="mmdata-view-"))
    page = write_site(store, out, args.episode, link_all=args.serve)
    if not args.serve:
        print(f"open {page.resolve().as_uri()}")
        return 0
    server = view_server(store, out, args.port)
    host, port = server.server_address[:2]
    print(f"serving {store.url} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def view_server(store: Store, out: Path, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the folder `out`, making an episode's page the first time it is asked for."""
    lock = threading.Lock()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            found = EPISODE_PAGE.match(self.path.split("?", 1)[0])
            if found is not None and not (out / self.path.lstrip("/").split("?", 1)[0]).exists():
                try:
                    with lock:
                        write_episode_page(store, int(found.group(1)), out)
                except MmdataError as exc:
                    self.send_error(404, str(exc))
                    return
            if self.headers.get("Range") and self._send_range():
                return
            super().do_GET()

        def _send_range(self) -> bool:
            """A `Range: bytes=a-b` request for a file, answered 206 with those bytes (browsers seek videos so;
            a server without ranges makes every seek go back to the start). False: not a range of a file."""
            found = RANGE.match(self.headers["Range"].strip())
            path = Path(self.translate_path(self.path))
            if found is None or not path.is_file():
                return False
            size = path.stat().st_size
            first = int(found.group(1)) if found.group(1) else max(0, size - int(found.group(2) or 0))
            last = min(int(found.group(2)), size - 1) if found.group(1) and found.group(2) else size - 1
            if first > last or first >= size:
                self.send_error(416, f"range outside the file's {size} bytes")
                return True
            with path.open("rb") as file:
                file.seek(first)
                body = file.read(last - first + 1)
            self.send_response(206)
            self.send_header("Content-Type", self.guess_type(str(path)))
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.write(body)
            return True

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(Handler, directory=str(out)))
