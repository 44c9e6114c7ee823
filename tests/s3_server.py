"""An S3 server and a misbehaving network on 127.0.0.1, for measuring and testing object-storage reads.

`local_s3_server()` starts moto's S3 server (`pip install moto[server]`) and points fsspec at it;
`S3Proxy` sits in front of it and adds what real object storage does to a reader: a round-trip
latency per request, 503 SlowDown answers and reset connections on a share of byte-range reads
(deterministically, every n-th), while counting the range reads it saw.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextlib.contextmanager
def local_s3_server() -> Iterator[str]:
    """A moto S3 server on a free port of 127.0.0.1 with fsspec (this process and the workers it forks,
    and `FSSPEC_S3_ENDPOINT_URL` for subprocesses) pointed at it; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        with pointed_at(endpoint):
            yield endpoint
    finally:
        server.stop()


@contextlib.contextmanager
def local_s3_bucket(bucket: str) -> Iterator[Any]:
    """`local_s3_server()` with `bucket` made (moto keeps its buckets per process, across servers); yields an s3fs
    filesystem on it."""
    import s3fs

    with local_s3_server() as endpoint:
        filesystem = s3fs.S3FileSystem(endpoint_url=endpoint)
        if not filesystem.exists(bucket):
            filesystem.mkdir(bucket)
        yield filesystem


@contextlib.contextmanager
def pointed_at(endpoint: str) -> Iterator[None]:
    """This process's fsspec, the workers it forks and (`FSSPEC_S3_ENDPOINT_URL`) its subprocesses pointed at the
    S3 server `endpoint` with test credentials; the environment and fsspec's configuration restored after."""
    import fsspec.config

    saved_environment = {key: os.environ.get(key) for key in [*CREDENTIALS, "FSSPEC_S3_ENDPOINT_URL"]}
    saved_config = fsspec.config.conf.get("s3")
    os.environ.update(CREDENTIALS)
    os.environ["FSSPEC_S3_ENDPOINT_URL"] = endpoint
    fsspec.config.conf["s3"] = {**(saved_config or {}), "endpoint_url": endpoint}
    _clear_s3_instances()
    try:
        yield
    finally:
        _clear_s3_instances()
        if saved_config is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = saved_config
        for key, value in saved_environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _clear_s3_instances() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


class S3Proxy:
    """An HTTP proxy on 127.0.0.1 in front of `upstream` that waits `latency_s` before answering each
    request, answers 503 SlowDown to every `refuse_every`-th byte-range read and resets the
    connection of every `reset_every`-th (0: never), and forwards the rest (10 s bound upstream), each GET's
    answer changed by `rewrite(path, request headers, status, headers, body)` where given (a server that
    misbehaves).
    `ranged` counts the byte-range reads, `faults` the ones it failed."""

    def __init__(
        self,
        upstream: str,
        latency_s: float = 0.0,
        refuse_every: int = 0,
        reset_every: int = 0,
        rewrite: Callable[[str, dict, int, list, bytes], tuple[int, list, bytes]] | None = None,
    ):
        self.ranged = 0
        self.faults = 0
        target = urlsplit(upstream)
        lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle stalls

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if latency_s:
                    time.sleep(latency_s)
                if self.command == "GET" and "Range" in self.headers:
                    with lock:
                        proxy.ranged += 1
                        number = proxy.ranged
                    if reset_every and number % reset_every == 0:
                        proxy.faults += 1
                        self.close_connection = True
                        # RST at once, as a load balancer dropping the connection does
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.connection.close()
                        return
                    if refuse_every and number % refuse_every == 0:
                        proxy.faults += 1
                        self._answer(503, [("Content-Type", "application/xml")], SLOW_DOWN)
                        return
                upstream_connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
                try:
                    upstream_connection.connect()
                    upstream_connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    headers["Host"] = target.netloc
                    upstream_connection.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream_connection.getresponse()
                    payload = response.read()
                    dropped = {"transfer-encoding", "connection"}
                    if self.command != "HEAD":
                        dropped.add("content-length")
                    kept = [(k, v) for k, v in response.getheaders() if k.lower() not in dropped]
                    status = response.status
                    if rewrite is not None and self.command == "GET":
                        status, kept, payload = rewrite(self.path, dict(self.headers), status, kept, payload)
                    self._answer(status, kept, payload)
                finally:
                    upstream_connection.close()

            def _answer(self, status: int, headers: list[tuple[str, str]], payload: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                if self.command != "HEAD":  # a HEAD answer carries the object's length, as upstream gave it
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="mmdata-s3-proxy", daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
