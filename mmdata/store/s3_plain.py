"""Byte ranges of S3 objects read by plain signed GETs on pooled connections: the reads a loader makes by the
thousand, at about a third of the CPU of s3fs's (its asyncio client spends about 2.6 ms of CPU on a ranged GET; a
GET signed by botocore's SigV4 and sent by urllib3, 0.9 ms: `benchmarks/results/s3_request_cost_cpu.json`).

Only for the filesystems whose options it understands (credentials, endpoint, region, anonymous access): any other
s3fs option, or an answer it does not expect (a redirect to another region, a refused signature), leaves the read,
and every later one of that filesystem, to s3fs, which knows them all (a missing object is missing to both). So a
read it makes is one s3fs would make, and one it cannot make is s3fs's as before. Throttling, server errors and
broken connections are raised as transient errors, for the read policy to retry as it retries s3fs's.
"""

from __future__ import annotations

import errno
import os
import re
import threading
from typing import Any
from urllib.parse import quote

from mmdata.errors import StorageBusyError

# Options of an s3fs filesystem that a plain GET honours; any other sends its reads to s3fs.
_UNDERSTOOD = frozenset(
    {"key", "secret", "token", "endpoint_url", "client_kwargs", "anon", "skip_instance_cache", "use_listings_cache"}
)
_CLIENT_OPTIONS = frozenset({"endpoint_url", "region_name"})
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_TRANSIENT = frozenset({429, 500, 502, 503, 504})
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}


class PlainS3Reader:
    """Ranged GETs of objects of one S3 endpoint, signed with `credentials` (None: anonymous) for `region`."""

    def __init__(self, endpoint: str | None, region: str, credentials: Any):
        self.endpoint, self.region, self.credentials = endpoint, region, credentials
        self._pools: dict[int, Any] = {}  # per process: a forked worker opens connections of its own
        self._lock = threading.Lock()

    def read(self, path: str, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset` of `bucket/key` (fewer at the object's end), or None where s3fs should read
        (an answer a plain GET does not handle)."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        bucket, _, key = path.partition("/")
        headers = {"Range": f"bytes={offset}-{offset + size - 1}"}
        request = AWSRequest(method="GET", url=self._url(bucket, key), headers=headers)
        if self.credentials is not None:
            S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)
        import urllib3

        try:
            answer = self._pool().request(
                "GET", request.url, headers=dict(request.headers.items()), preload_content=True, retries=False
            )
        except urllib3.exceptions.HTTPError as exc:  # (a reset, refused or timed-out connection: tried again)
            raise ConnectionError(f"s3://{path}: {type(exc).__name__}: {exc}") from exc
        if answer.status in (200, 206):
            return bytes(answer.data)
        if answer.status == 416:  # (the range starts at or past the object's end, as s3fs reads it: nothing)
            return b""
        if answer.status == 404:
            raise FileNotFoundError(errno.ENOENT, f"s3://{path} does not exist")
        if answer.status in _TRANSIENT:
            raise StorageBusyError(f"s3://{path}: the server answered {answer.status} (throttled or failing)")
        return None

    def _url(self, bucket: str, key: str) -> str:
        """The object's URL, its key percent-encoded as written: a `.` or `..` segment encoded too, so that no HTTP
        client resolves it into another prefix's or bucket's key (`resolve` refuses them in users' URLs)."""
        quoted = "/".join(_DOT_SEGMENTS.get(part, part) for part in quote(key, safe="/~").split("/"))
        if self.endpoint:
            return f"{self.endpoint.rstrip('/')}/{bucket}/{quoted}"
        if _DNS_BUCKET.fullmatch(bucket):
            return f"https://{bucket}.s3.{self.region}.amazonaws.com/{quoted}"
        return f"https://s3.{self.region}.amazonaws.com/{bucket}/{quoted}"

    def _pool(self) -> Any:
        import urllib3

        pid = os.getpid()
        pool = self._pools.get(pid)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(pid, urllib3.PoolManager(maxsize=32, timeout=urllib3.Timeout(60.0)))
        return pool

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pools": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
_CONFIGURED_KEYS = ("endpoint_url", "services", "s3", "use_fips_endpoint", "use_dualstack_endpoint")


def _configured_elsewhere(session: Any) -> bool:
    """Whether botocore's environment or configuration file sets where or how S3 is reached (an endpoint, FIPS or
    dual-stack endpoints, S3 addressing): what s3fs honours and a plain GET to AWS's endpoint would not."""
    if any(os.environ.get(name) for name in _ENDPOINT_VARIABLES):
        return True
    try:
        scoped = session.get_scoped_config()
    except Exception:  # (a profile named in the environment that the files lack: s3fs reports it)
        return True
    return any(
        key in scoped for key in ("endpoint_url", "services", "s3", "use_fips_endpoint", "use_dualstack_endpoint")
    )


def plain_reader_for(fs: Any) -> PlainS3Reader | None:
    """A plain reader for the s3fs filesystem `fs`, or None where its options ask for more than a plain GET does
    (or it is no s3fs filesystem, or no credentials are found and it is not anonymous)."""
    if type(fs).__name__ != "S3FileSystem" or not type(fs).__module__.startswith("s3fs"):
        return None
    options = dict(getattr(fs, "storage_options", {}))
    client = options.get("client_kwargs") or {}
    if set(options) - _UNDERSTOOD or not isinstance(client, dict) or set(client) - _CLIENT_OPTIONS:
        return None
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    import botocore.session

    session = botocore.session.Session()
    if endpoint is None and _configured_elsewhere(session):
        return None
    region = client.get("region_name") or session.get_config_variable("region") or "us-east-1"
    if options.get("anon"):
        return PlainS3Reader(endpoint, region, None)
    if options.get("key") and options.get("secret"):
        from botocore.credentials import Credentials

        return PlainS3Reader(endpoint, region, Credentials(options["key"], options["secret"], options.get("token")))
    credentials = session.get_credentials()
    return None if credentials is None else PlainS3Reader(endpoint, region, credentials)
