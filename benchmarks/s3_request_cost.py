"""What a read from object storage costs the reader, request by request (issue 42, item 5).

moto's S3 server runs in a process of its own (as a real object store is not in the trainer's process). Two parts:

- `requests`: the client CPU and wall time of one ranged GET through s3fs (`cat_file`), for 16 KiB, 256 KiB and
  2 MiB, sequential: what each request of a loader costs its worker besides the bytes;
- `gaps`: a loader (policy windows of `remote_bench.py`, batch 32, no workers: the fetching in this process)
  reading 150 steps from local disk and from S3 with the coalescing gap (`ReadPolicy(coalesce_gap=...)`, ranges
  of one shard at most this far apart fetched in one request) at 0 B to 16 MiB: requests, bytes fetched against
  bytes needed, wall and CPU seconds, local disk alongside.

usage: PYTHONPATH=.:benchmarks python benchmarks/s3_request_cost.py [--record s3_request_cost_cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import machine_name, write_results  # noqa: E402
from remote_bench import SPEC  # noqa: E402
from s3_processes import moto_process  # noqa: E402

import mmdata  # noqa: E402
from mmdata.conversion.pipeline import ConvertOptions, convert  # noqa: E402
from mmdata.importers.raw import discover_raw_episodes  # noqa: E402
from mmdata.store import piece_readers  # noqa: E402
from mmdata.synthetic import SynthSpec, write_synthetic_dataset  # noqa: E402

GAPS = [0, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
STEPS = 150


def request_costs(filesystem) -> list[dict]:
    filesystem.pipe("bench-cost/blob", os.urandom(8 << 20))
    rows = []
    for size in (16 << 10, 256 << 10, 2 << 20):
        for _ in range(10):
            filesystem.cat_file("bench-cost/blob", start=0, end=size)
        cpu, wall, count = time.process_time(), time.perf_counter(), 100
        for i in range(count):
            filesystem.cat_file("bench-cost/blob", start=i * 4096, end=i * 4096 + size)
        rows.append(
            {
                "bytes": size,
                "client_cpu_ms": round((time.process_time() - cpu) / count * 1000, 2),
                "wall_ms": round((time.perf_counter() - wall) / count * 1000, 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


def read_steps(url: str, gap: int) -> dict:
    """150 steps of the loader over `url` with coalescing `gap`: time, CPU, requests and bytes."""
    tally = {"requests": 0, "fetched_bytes": 0, "needed_bytes": 0}
    original = piece_readers.coalesce

    def counted(pieces, *arguments, **options):
        pieces = list(pieces)
        spans = original(pieces, *arguments, **options)
        tally["requests"] += len(spans)
        tally["fetched_bytes"] += sum(span.end - span.start for span in spans)
        tally["needed_bytes"] += sum(piece.size for piece in set(pieces))
        return spans

    piece_readers.coalesce = counted
    try:
        reading = mmdata.Reading(policy=mmdata.ReadPolicy(coalesce_gap=gap))
        loader = mmdata.DataLoader(url, SPEC, batch_size=32, num_workers=0, seed=1, reading=reading)
        batches = iter(loader)
        next(batches)
        cpu, wall, samples = time.process_time(), time.perf_counter(), 0
        for _, batch in zip(range(STEPS), batches):
            samples += len(batch["sample_index"])
        figures = {"samples": samples, "seconds": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        loader.close()
    finally:
        piece_readers.coalesce = original
    return {**figures, **tally}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", default=None, help="write benchmarks/results/<NAME>.json")
    args = parser.parse_args()
    import s3fs

    with moto_process() as (endpoint, _):
        filesystem = s3fs.S3FileSystem(endpoint_url=endpoint)
        filesystem.mkdir("bench-cost")
        report = {"machine": machine_name(), "server": "moto in its own process", "requests": []}
        report["requests"] = request_costs(filesystem)
        with tempfile.TemporaryDirectory() as folder:
            raw, store = Path(folder) / "raw", Path(folder) / "store.wds"
            write_synthetic_dataset(raw, SynthSpec(episodes=8, min_seconds=5.0, max_seconds=20.0))
            convert(discover_raw_episodes(raw), store, ConvertOptions(progress=False))
            filesystem.put(str(store), "bench-cost/store.wds", recursive=True)
            rows = []
            for gap in GAPS:
                local = read_steps(str(store), gap)
                remote = read_steps("s3://bench-cost/store.wds", gap)
                rows.append(
                    {
                        "gap_bytes": gap,
                        "requests": remote["requests"],
                        "fetched_mb": round(remote["fetched_bytes"] / 1e6, 1),
                        "needed_mb": round(remote["needed_bytes"] / 1e6, 1),
                        "s3_seconds": round(remote["seconds"], 3),
                        "s3_cpu_s": round(remote["cpu_s"], 3),
                        "local_seconds": round(local["seconds"], 3),
                        "of_local": round(local["seconds"] / remote["seconds"], 3),
                    }
                )
                print(rows[-1], flush=True)
            report["gaps"] = rows
    if args.record:
        write_results(args.record, report)


if __name__ == "__main__":
    main()
