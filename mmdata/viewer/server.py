"""The viewer's HTTP server: a store's pages served on 127.0.0.1, an episode's page made the first time it is asked
for, the episode table answered a page at a time (`rows.json`), videos answered by byte range, every answer under
the pages' Content-Security-Policy."""

from __future__ import annotations

import errno
import functools
import http.server
import re
import sys
import threading
import urllib.parse
from pathlib import Path

from mmdata.checks import dump_json
from mmdata.errors import MmdataError, OptionError
from mmdata.store.handle import Store
from mmdata.viewer.episode_table import EpisodeTable, TableQuery
from mmdata.viewer.pages import CONTENT_SECURITY_POLICY, PAGE_ROWS, ROWS_URL, served_page_of, write_episode_page

EPISODE_PAGE = re.compile(r"^/episode_(\d{6,9})\.html$")
# One range, its ends at most 18 digits (a larger number is no byte of any file: the request is answered whole).
RANGE = re.compile(r"^bytes=(\d{0,18})-(\d{0,18})$")
RANGE_CHUNK_BYTES = 1 << 20


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
    episodes, page_of = table if table is not None else EpisodeTable(store), served_page_of(store)

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
                    body = dump_json(episodes.page(asked, page_of)).encode()
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
