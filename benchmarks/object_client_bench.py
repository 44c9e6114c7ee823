"""obstore (Rust `object_store`: pooled ranged GETs, the interpreter lock released) against `store.s3_plain` (signed
by botocore, sent by urllib3) for the byte ranges a loader reads from S3 (issue 56, item 8), measured in one run.

moto's S3 server runs in a process of its own (`s3_processes.py`), behind a latency proxy where a part says so.
Three parts, each client in alternating rounds (medians):

- `requests`: this process's CPU and the wall time of one ranged GET of 16 KiB, 256 KiB and 2 MiB, sequential
  (s3fs's `cat_file` beside them, what every read was before `s3_plain`);
- `loader`: `mmdata.DataLoader` (the policy windows of `remote_bench.py`, batch 32, reading in its own process:
  see `fork`) reading the store from S3 at 0 and 20 ms of added latency, its byte ranges read by `s3_plain` or by
  obstore put in its place (`ObstoreReads`, the same `read(path, offset, size)` with errors mapped as `s3_plain`
  maps them and obstore's own retries off, so the read policy retries both alike): samples/s and CPU per sample;
- `faults`: an epoch through a proxy that refuses every 4th ranged read (503) and resets every 7th connection,
  read by each client: the batches against local disk's, and the retries it took;
- `fork`: a process that read through obstore forks (as a loader's workers are forked after its process opened
  the store) and the child reads through obstore: whether it gets its bytes within 20 s (obstore's Rust runtime
  does not survive a fork).

usage: PYTHONPATH=.:benchmarks python benchmarks/object_client_bench.py [--record object_clients_cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from machine import machine_name, write_results  # noqa: E402
from process_time import measure as timed_loop  # noqa: E402
from remote_bench import SPEC  # noqa: E402
from s3_processes import moto_process, proxy_process  # noqa: E402

import mmdata  # noqa: E402
from mmdata.conversion.pipeline import ConvertOptions, convert  # noqa: E402
from mmdata.errors import StorageBusyError  # noqa: E402
from mmdata.importers.raw import discover_raw_episodes  # noqa: E402
from mmdata.store import s3_plain  # noqa: E402
from mmdata.synthetic import SynthSpec, write_synthetic_dataset  # noqa: E402
from tests.s3_server import CREDENTIALS, S3Proxy  # noqa: E402

BUCKET = "bench-clients"
SIZES = (16 << 10, 256 << 10, 2 << 20)


class ObstoreReads:
    """`s3_plain.PlainS3Reader.read` done by obstore: one `S3Store` per bucket and process, its retries off (the read
    policy retries), 404 as FileNotFoundError, a range past the end as no bytes, throttling and failing servers as
    StorageBusyError, a broken connection as ConnectionError."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._stores: dict[tuple[int, str], Any] = {}

    def read(self, path: str, offset: int, size: int) -> bytes | None:
        import obstore
        from obstore.exceptions import GenericError, NotFoundError

        bucket, _, key = path.partition("/")
        try:
            return bytes(obstore.get_range(self._store(bucket), key, start=offset, length=size))
        except NotFoundError as exc:
            raise FileNotFoundError(f"s3://{path} does not exist") from exc
        except GenericError as exc:
            text = str(exc)
            if "Range" in text and ("416" in text or "not satisfiable" in text.lower()):
                return b""
            if any(f"{status}" in text for status in (429, 500, 502, 503, 504)):
                raise StorageBusyError(f"s3://{path}: {text.splitlines()[0]}") from exc
            raise ConnectionError(f"s3://{path}: {text.splitlines()[0]}") from exc

    def _store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        key = (os.getpid(), bucket)  # (a forked worker opens its own: a Rust runtime does not survive a fork)
        if key not in self._stores:
            self._stores[key] = S3Store(
                bucket,
                endpoint=self.endpoint,
                region=CREDENTIALS["AWS_DEFAULT_REGION"],
                access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                virtual_hosted_style_request=False,
                client_options={"allow_http": True, "timeout": timedelta(seconds=10)},
                retry_config={"max_retries": 0},
            )
        return self._stores[key]


def plain_reader(endpoint: str) -> s3_plain.PlainS3Reader:
    from botocore.credentials import Credentials

    key, secret = CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    return s3_plain.PlainS3Reader(endpoint, CREDENTIALS["AWS_DEFAULT_REGION"], Credentials(key, secret))


def request_costs(endpoint: str, filesystem, rounds: int) -> list[dict]:
    """Per size and client: the median over `rounds` of the CPU and wall time of one of 100 sequential GETs."""
    filesystem.pipe(f"{BUCKET}/blob", os.urandom(8 << 20))
    clients = {
        "s3fs": lambda offset, size: filesystem.cat_file(f"{BUCKET}/blob", start=offset, end=offset + size),
        "s3_plain": plain_reader(endpoint).read,
        "obstore": ObstoreReads(endpoint).read,
    }
    rows = []
    for size in SIZES:
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        for _ in range(rounds):
            for name, client in clients.items():
                read = (lambda o, s, c=client: c(f"{BUCKET}/blob", o, s)) if name != "s3fs" else client
                for warm in range(5):
                    assert len(read(warm * 4096, size)) == size
                cpu, wall, count = time.process_time(), time.perf_counter(), 100
                for i in range(count):
                    read(i * 4096, size)
                figures[name].append(((time.process_time() - cpu) / count, (time.perf_counter() - wall) / count))
        row: dict[str, Any] = {"bytes": size}
        for name, measured in figures.items():
            row[f"{name}_cpu_ms"] = round(1000 * statistics.median(c for c, _ in measured), 3)
            row[f"{name}_wall_ms"] = round(1000 * statistics.median(w for _, w in measured), 3)
        row["obstore_cpu_of_plain"] = round(row["obstore_cpu_ms"] / row["s3_plain_cpu_ms"], 3)
        rows.append(row)
        print(row, flush=True)
    return rows


def loader_rate(url: str, reads, seconds: float) -> dict:
    """Samples/s of the loader over `url` with `reads` reading every byte range (None: `s3_plain`'s own), and its
    workers' CPU per sample."""
    original = s3_plain.PlainS3Reader.read
    if reads is not None:
        s3_plain.PlainS3Reader.read = lambda reader, *arguments: reads.read(*arguments)  # (forked workers inherit it)
    try:
        loader = mmdata.DataLoader(url, SPEC, batch_size=32, num_workers=0, seed=1)
        measured = timed_loop(lambda: iter(loader), lambda batch: len(batch["sample_index"]), seconds)
        loader.close()
    finally:
        s3_plain.PlainS3Reader.read = original
    return measured


def faulty_epoch(store_url: str, local: list, make_reads, upstream: str) -> dict:
    """One epoch of the store read through a proxy that refuses and resets reads: the same batches as local disk's?"""
    import fsspec.config
    import s3fs

    proxy = S3Proxy(upstream, refuse_every=4, reset_every=7)
    saved = dict(fsspec.config.conf.get("s3", {}))
    original = s3_plain.PlainS3Reader.read
    try:
        fsspec.config.conf["s3"] = {**saved, "endpoint_url": proxy.url}
        s3fs.S3FileSystem.clear_instance_cache()
        reads = make_reads(proxy.url) if make_reads is not None else None
        if reads is not None:
            s3_plain.PlainS3Reader.read = lambda reader, *arguments: reads.read(*arguments)
        policy = mmdata.ReadPolicy(timeout_s=10, attempts=6, backoff_s=0.01, max_backoff_s=0.05)
        spec = mmdata.Windows(anchor_fps=2, streams={"cam_high": mmdata.Frames(), "state": mmdata.Values()})
        loader = mmdata.DataLoader(
            mmdata.open_dataset(store_url, read_policy=policy), spec, batch_size=4, seed=3, num_workers=0
        )
        remote = list(loader)
        same = len(remote) == len(local) and all(
            all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a if k != "task")
            for a, b in zip(remote, local)
        )
        return {"identical_batches": bool(same), "faults": proxy.faults, "read_retries": loader.stats()["read_retries"]}
    finally:
        s3_plain.PlainS3Reader.read = original
        fsspec.config.conf["s3"] = saved
        s3fs.S3FileSystem.clear_instance_cache()
        proxy.close()


_FORKED = """
import os, sys, time
sys.path[:0] = sys.argv[3:]
from object_client_bench import ObstoreReads
reads = ObstoreReads(sys.argv[1])
reads.read(sys.argv[2], 0, 4)
child = os.fork()
if child == 0:
    reads.read(sys.argv[2], 2, 4)
    os._exit(0)
_, status = os.waitpid(child, 0)
print("child", status, flush=True)
"""


def forked_read(endpoint: str) -> dict:
    """A read through obstore in a process forked from one that read through it: done, or not within 20 s."""
    import subprocess

    here = str(Path(__file__).resolve().parent)
    command = [sys.executable, "-c", _FORKED, endpoint, f"{BUCKET}/blob", here, str(Path(here).parent)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        outcome = "read" if "child 0" in done.stdout else f"failed: {(done.stderr or done.stdout)[-200:]}"
    except subprocess.TimeoutExpired:
        outcome = "no answer within 20 s (the child hangs in obstore's runtime)"
    return {"child_after_parent_read": outcome, "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="per loader run")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 20], help="milliseconds")
    parser.add_argument("--record", default=None, help="write benchmarks/results/<NAME>.json")
    args = parser.parse_args()
    import obstore
    import s3fs

    report: dict[str, Any] = {"machine": machine_name(), "obstore": obstore.__version__, "server": "moto, own process"}
    with moto_process() as (endpoint, _), tempfile.TemporaryDirectory() as folder:
        filesystem = s3fs.S3FileSystem(endpoint_url=endpoint)
        filesystem.mkdir(BUCKET)
        report["requests"] = request_costs(endpoint, filesystem, args.rounds)
        raw, store = Path(folder) / "raw", Path(folder) / "store.wds"
        write_synthetic_dataset(raw, SynthSpec(episodes=8, min_seconds=5.0, max_seconds=20.0))
        convert(discover_raw_episodes(raw), store, ConvertOptions(progress=False))
        filesystem.put(str(store), f"{BUCKET}/store.wds", recursive=True)
        url = f"s3://{BUCKET}/store.wds"
        rows = []
        for latency in args.latencies:
            with proxy_process(endpoint, latency / 1000) as proxy:
                proxy_url = proxy.url
                import fsspec.config

                saved = dict(fsspec.config.conf.get("s3", {}))
                fsspec.config.conf["s3"] = {**saved, "endpoint_url": proxy_url}
                s3fs.S3FileSystem.clear_instance_cache()
                clients = {"s3_plain": None, "obstore": ObstoreReads(proxy_url)}
                runs: dict[str, list[dict]] = {name: [] for name in clients}
                try:
                    for _ in range(args.rounds):
                        for name, reads in clients.items():
                            runs[name].append(loader_rate(url, reads, args.seconds))
                finally:
                    fsspec.config.conf["s3"] = saved
                    s3fs.S3FileSystem.clear_instance_cache()
            row: dict[str, Any] = {"latency_ms": latency}
            for name, measured in runs.items():
                row[f"{name}_samples_per_s"] = round(statistics.median(m["samples_per_s"] for m in measured), 1)
                cpu = [m["own_cpu_s"] / m["samples"] * 1000 for m in measured if m.get("samples")]
                row[f"{name}_cpu_ms_per_sample"] = round(statistics.median(cpu), 3) if cpu else None
            row["obstore_rate_of_plain"] = round(row["obstore_samples_per_s"] / row["s3_plain_samples_per_s"], 3)
            rows.append(row)
            print(row, flush=True)
        report["loader"] = rows
        spec = mmdata.Windows(anchor_fps=2, streams={"cam_high": mmdata.Frames(), "state": mmdata.Values()})
        local = list(mmdata.DataLoader(str(store), spec, batch_size=4, seed=3, num_workers=0))
        report["faults"] = {
            name: faulty_epoch(url, local, make, endpoint)
            for name, make in (("s3_plain", None), ("obstore", ObstoreReads))
        }
        print(report["faults"], flush=True)
        report["fork"] = forked_read(endpoint)
        print(report["fork"], flush=True)
    if args.record:
        write_results(args.record, report)


if __name__ == "__main__":
    main()
