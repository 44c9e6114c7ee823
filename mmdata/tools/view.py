"""`mmdata view STORE`: look at a store in a browser: its episodes as a table, and an episode's cameras
playing in sync beside its low-dim streams (see `mmdata.viewer`)."""

from __future__ import annotations

import argparse
import errno
import functools
import http.server
import re
import shutil
import sys
import tempfile
import textwrap
import threading
import urllib.parse
from pathlib import Path

from mmdata.checks import dump_json
from mmdata.errors import DestinationError, MmdataError, OptionError
from mmdata.store.handle import Store
from mmdata.tools.storage import add_storage_options
from mmdata.viewer.episode_table import EpisodeTable, TableQuery
from mmdata.viewer.pages import (
    CONTENT_SECURITY_POLICY,
    PAGE_ROWS,
    ROWS_URL,
    served_page_of,
    write_episode_page,
    write_site,
)
from mmdata.viewer.rerun_export import write_rerun_recording

EPISODE_PAGE = re.compile(r"^/episode_(\d{6,9})\.html$")
# One range, its ends at most 18 digits (a larger number is no byte of any file: the request is answered whole).
RANGE = re.compile(r"^bytes=(\d{0,18})-(\d{0,18})$")
RANGE_CHUNK_BYTES = 1 << 20


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
    host, port = server.server_address[:2]
    print(f"serving {store.url} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def table_query(fields: dict[str, list[str]]) -> TableQuery:
    """The `TableQuery` a `rows.json` request's parameters (offset, limit, sort, order=asc|desc, q, damaged=1)
    ask for; OptionError when one is malformed."""

    def one(name: str, default: str) -> str:
        values = fields.get(name, [default])
        if len(values) != 1:
            raise OptionError(f"give {name} once")
        return values[0]

    try:
        offset, limit = int(one("offset", "0")), int(one("limit", str(PAGE_ROWS)))
    except ValueError:
        raise OptionError("offset and limit are whole numbers") from None
    order = one("order", "asc")
    if order not in ("asc", "desc"):
        raise OptionError(f"order is asc or desc, not {order!r:.20}")
    return TableQuery(offset, limit, one("sort", "index"), order == "asc", one("q", ""), one("damaged", "") == "1")


def _check_out(out: Path, store: Store) -> None:
    """Refuse an --out that is not a folder, or that lies inside the store (its pages would sit among the store's
    files, where `convert --overwrite` of the store deletes them)."""
    if out.exists() and not out.is_dir():
        raise DestinationError(f"--out '{out}' is a file, not a folder; name a folder for the pages")
    if store.holds(out):
        raise DestinationError(
            f"--out '{out}' lies inside the store '{store.url}'; write the pages into a folder outside it"
        )


class _QuietServer(http.server.ThreadingHTTPServer):
    """The view server: a browser that goes away mid-answer (a tab closed while a video loads) is no error to print."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def view_server(
    store: Store, out: Path, port: int, table: EpisodeTable | None = None
) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the folder `out`, making an episode's page the first time it is asked for and
    answering `rows.json` from `table` (the store's episode table; read here unless given). OptionError when the
    port cannot be taken."""
    lock, table_lock = threading.Lock(), threading.Lock()  # (pages are made while the table is paged)
    table, page_of = table if table is not None else EpisodeTable(store), served_page_of(store)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == f"/{ROWS_URL}":
                self._send_rows(query)
                return
            found = EPISODE_PAGE.match(path)
            if found is not None and not (out / self.path.lstrip("/").split("?", 1)[0]).exists():
                try:
                    with lock:
                        write_episode_page(store, int(found.group(1)), out)
                except MmdataError as exc:
                    # the reason goes into the page, escaped; the status line carries fixed text only (a store's
                    # path could hold characters a header cannot, or a line break that would start another)
                    self.send_error(404, "episode page not available", explain=str(exc))
                    return
            if self.headers.get("Range") and self._send_range():
                return
            super().do_GET()

        def _send_rows(self, query: str) -> None:
            """A page of the store's episode table as JSON (`TableQuery`'s fields as URL parameters)."""
            try:
                try:
                    fields = urllib.parse.parse_qs(query, max_num_fields=16)
                except ValueError:
                    raise OptionError("a rows.json request takes at most 16 parameters") from None
                asked = table_query(fields)
                with table_lock:
                    body = dump_json(table.page(asked, page_of)).encode()
                status = 200
            except OptionError as exc:
                body, status = dump_json({"error": str(exc)}).encode(), 400
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def end_headers(self) -> None:
            self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            self.send_header("X-Content-Type-Options", "nosniff")
            super().end_headers()

        def _send_range(self) -> bool:
            """A `Range: bytes=a-b` request for a file, answered 206 with those bytes, read and sent a bounded
            chunk at a time (browsers seek videos so; a server without ranges makes every seek go back to the
            start). False: not a range of a file (then the whole file is sent)."""
            found = RANGE.match(self.headers["Range"].strip())
            path = Path(self.translate_path(self.path))
            if found is None or not path.is_file():
                return False
            size = path.stat().st_size
            first_text, last_text = found.groups()
            if first_text:
                first = int(first_text)
                last = min(int(last_text), size - 1) if last_text else size - 1
            elif last_text:  # the last N bytes
                first, last = max(0, size - int(last_text)), size - 1
            else:
                first, last = 0, -1
            if first > last or first >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
            self.send_response(206)
            self.send_header("Content-Type", self.guess_type(str(path)))
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            with path.open("rb") as file:
                file.seek(first)
                left = last - first + 1
                while left:
                    chunk = file.read(min(left, RANGE_CHUNK_BYTES))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
            return True

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
            pass

    try:
        return _QuietServer(("127.0.0.1", port), functools.partial(Handler, directory=str(out)))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OptionError(
                f"--port {port}: another program is listening on 127.0.0.1:{port}; pass --port 0 to take any free"
                " port, or another number"
            ) from None
        raise OptionError(
            f"--port {port} cannot be used ({exc.strerror}); pass --port 0 to take any free port"
        ) from None
