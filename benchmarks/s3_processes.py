"""An S3 server (moto) and a latency proxy (`tests.s3_server.S3Proxy`) in processes of their own, for benchmarks.

Real object storage is not in the trainer's process: in it, moto and the proxy would hold the Python lock of the
process that receives the batches (moto copies a whole object for every ranged GET) and their CPU would count as
the loader's. Here each runs detached (not a descendant of this process, so a loader's CPU counted over its process
tree leaves theirs out) and their CPU is read by pid. On a machine of few cores they still take cores from the
loader: `cpu_seconds` says how much.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from process_time import tree_cpu_seconds

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))  # the repository: its tests' S3 proxy and credentials

from tests.s3_server import pointed_at  # noqa: E402

_PROXY = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.s3_server import S3Proxy
proxy = S3Proxy(sys.argv[2], latency_s=float(sys.argv[3]))
print(proxy.url, flush=True)
for line in sys.stdin:
    print(proxy.ranged, flush=True)
"""


@dataclass
class Detached:
    """A process started through a shell that exits at once, so it is nobody's child here: its pid, and its pipes."""

    pid: int
    stdin: object
    stdout: object

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        for _ in range(50):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def detached(arguments: list[str]) -> Detached:
    """Start `arguments` detached; its standard input and output stay connected to this process."""
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in arguments)
    shell = subprocess.Popen(
        ["sh", "-c", f"exec 3<&0; {quoted} <&3 3<&- & echo $!"],  # (a background job's input is /dev/null else)
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pid = int(shell.stdout.readline())
    shell.wait()
    return Detached(pid, shell.stdin, shell.stdout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def moto_process() -> Iterator[tuple[str, Detached]]:
    """moto's S3 server on 127.0.0.1 in a detached process, with this process and the ones it starts pointed at it
    (`tests.s3_server.pointed_at`); yields its endpoint and process."""
    port = free_port()
    server = detached([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto's server did not start on port {port}")
        endpoint = f"http://127.0.0.1:{port}"
        with pointed_at(endpoint):
            yield endpoint, server
    finally:
        server.stop()


@dataclass
class ProxyProcess:
    """`S3Proxy` in a detached process: its URL, and the byte-range reads it has seen (asked through its pipe)."""

    url: str
    process: Detached

    @property
    def ranged(self) -> int:
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())


@contextlib.contextmanager
def proxy_process(upstream: str, latency_s: float) -> Iterator[ProxyProcess]:
    """A proxy adding `latency_s` to every request to `upstream`, in a detached process."""
    process = detached([sys.executable, "-c", _PROXY, str(REPOSITORY), upstream, str(latency_s)])
    try:
        yield ProxyProcess(process.stdout.readline().strip(), process)
    finally:
        process.stop()
