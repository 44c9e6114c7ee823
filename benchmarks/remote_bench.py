"""The loader reading from S3 against local disk, measured in one run.

A synthetic store (WebDataset, or Zarr with `--layout zarr`) is read by `mmdata.DataLoader`
(policy windows: 2 frames of one camera, state and a 50-step action chunk; 2 workers) from
local disk, and from a moto S3 server
on 127.0.0.1 behind a proxy that adds 0, 20 and 100 ms to every request (each in a process of its own,
`s3_processes.py`, as object storage is not in the trainer's process), with the micro-batch's
pieces fetched ahead in coalesced requests and without (each piece its own request), and with
the local disk cache (`ReadPolicy(cache_dir=...)`) warmed by one epoch beforehand, as a second
epoch finds it, and (`--compare-s3fs`) coalesced with every byte range read by s3fs rather than by plain
signed GETs (`ReadPolicy(plain_s3_gets=False)`, what every read was before `store.s3_plain`). Loaders run in
alternating rounds; samples/s are medians. Beside them, samples per
CPU-second of the loader's worker processes alone: the S3 server and the proxy run on the same cores,
so on a small machine their CPU takes the workers' place (`server_cpu_share`: their CPU per second of a
run; moto copies a whole object for every ranged GET, which object storage does not). Results go to
`benchmarks/results/remote_<tag>.json`, machine named.

Needs the dev extra (moto[server], s3fs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: its tests' S3 server

import fsspec.config  # noqa: E402
import s3fs  # noqa: E402
import torch  # noqa: E402
from machine import machine_name  # noqa: E402
from process_time import measure as timed_loop  # noqa: E402
from s3_processes import moto_process, proxy_process  # noqa: E402

import mmdata  # noqa: E402
from mmdata.conversion.pipeline import ConvertOptions, convert  # noqa: E402
from mmdata.importers.raw import discover_raw_episodes  # noqa: E402
from mmdata.store.piece_readers import WdsPieceReader, ZarrPieceReader  # noqa: E402
from mmdata.synthetic import SynthSpec, write_synthetic_dataset  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SPEC = mmdata.Windows(
    anchor_fps=10,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[-0.1, 0.0]),
        "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
    },
)


def loader_for(url: str, args, cache_dir: str | None = None, plain: bool = True) -> mmdata.DataLoader:
    policy = mmdata.ReadPolicy(cache_dir=cache_dir, coalesce_gap=args.coalesce_gap, plain_s3_gets=plain)
    reading = mmdata.Reading(policy=policy)
    return mmdata.DataLoader(url, SPEC, batch_size=args.batch_size, num_workers=args.workers, seed=1, reading=reading)


def one_epoch(loader: mmdata.DataLoader) -> None:
    try:
        for _ in loader:
            pass
    finally:
        loader.close()


def run(make, args) -> dict:
    """Samples/s of a fresh loader from `make()` over `args.seconds`, after one warm-up batch."""
    loader = make()
    try:
        return timed_loop(lambda: iter(loader), lambda b: len(b["sample_index"]), args.seconds)
    finally:
        loader.close()


def record_run(measured: dict, rates: list[float], workers: list[float]) -> None:
    """Keep a run's samples/s and its workers' samples per CPU-second."""
    rates.append(measured["samples_per_s"])
    workers.append(round(measured["samples"] / max(measured["children_cpu_s"], 1e-9), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument(
        "--workers", type=lambda v: v if v == "auto" else int(v), default=2, help='a count, or "auto" (its tuner)'
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latencies", type=float, nargs="+", default=[0, 20, 100], help="milliseconds")
    parser.add_argument("--layout", choices=("wds", "zarr"), default="wds")
    parser.add_argument("--coalesce-gap", type=int, default=1 << 20, help="ReadPolicy.coalesce_gap, bytes (1 MiB)")
    parser.add_argument("--tag", default="cpu", help="results go to remote_<tag>.json")
    parser.add_argument("--compare-s3fs", action="store_true", help="also read every range by s3fs, coalesced")
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mmdata-remote-bench-") as folder, moto_process() as (endpoint, server):
        raw, store = Path(folder) / "raw", Path(folder) / f"store.{args.layout}"
        write_synthetic_dataset(raw, SynthSpec(episodes=args.episodes, min_seconds=5.0, max_seconds=20.0))
        convert(discover_raw_episodes(raw), store, ConvertOptions(layout=args.layout, progress=False))
        upload = s3fs.S3FileSystem(endpoint_url=endpoint)
        upload.mkdir("bench-bucket")
        upload.put(str(store), f"bench-bucket/store.{args.layout}", recursive=True)
        url = f"s3://bench-bucket/store.{args.layout}"
        settings = {"local": None}
        for latency in args.latencies:
            settings[f"s3 {latency:g} ms coalesced"] = (latency, True, None, True)
            if args.compare_s3fs:
                settings[f"s3 {latency:g} ms coalesced, s3fs reads"] = (latency, True, None, False)
            settings[f"s3 {latency:g} ms one request each"] = (latency, False, None, True)
            cache = str(Path(folder) / "cache")
            settings[f"s3 {latency:g} ms coalesced, warm disk cache"] = (latency, True, cache, True)
        one_epoch(loader_for(url, args, str(Path(folder) / "cache")))  # a first epoch fills the cache
        runs: dict[str, list[float]] = {name: [] for name in settings}
        worker_rates: dict[str, list[float]] = {name: [] for name in settings}
        server_cpu: dict[str, list[float]] = {name: [] for name in settings}
        requests: dict[str, int] = {}
        reader = WdsPieceReader if args.layout == "wds" else ZarrPieceReader
        original = reader.fetches_ahead
        for number in range(args.rounds):
            names = list(settings)
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                setting = settings[name]
                if setting is None:
                    measured = run(lambda: loader_for(str(store), args), args)
                    record_run(measured, runs[name], worker_rates[name])
                    server_cpu[name].append(0.0)
                    continue
                latency, coalesced, cache_dir, plain = setting
                with proxy_process(endpoint, latency / 1000) as proxy:
                    fsspec.config.conf["s3"] = {"endpoint_url": proxy.url}
                    s3fs.S3FileSystem.clear_instance_cache()
                    reader.fetches_ahead = original if coalesced else property(lambda self: False)
                    try:
                        before, started_run = server.cpu_seconds() + proxy.process.cpu_seconds(), time.perf_counter()
                        measured = run(lambda c=cache_dir, p=plain: loader_for(url, args, c, p), args)
                        spent = server.cpu_seconds() + proxy.process.cpu_seconds() - before
                        server_cpu[name].append(round(spent / (time.perf_counter() - started_run), 3))
                        record_run(measured, runs[name], worker_rates[name])
                    finally:
                        reader.fetches_ahead = original
                        fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
                        s3fs.S3FileSystem.clear_instance_cache()
                    requests[name] = proxy.ranged
                print(f"round {number + 1}: {name:50s} {runs[name][-1]:8.1f} samples/s", flush=True)
    local = statistics.median(runs["local"])
    local_workers = statistics.median(worker_rates["local"])
    results = {
        name: {
            "samples_per_s": round(statistics.median(values), 1),
            "of_local": round(statistics.median(values) / local, 3),
            "rounds": values,
            "samples_per_worker_cpu_s": round(statistics.median(worker_rates[name]), 1),
            "worker_cpu_of_local": round(statistics.median(worker_rates[name]) / local_workers, 3),
            "server_cpu_share": round(statistics.median(server_cpu[name]), 3),
            "range_requests_last_round": requests.get(name),
        }
        for name, values in runs.items()
    }
    for name, row in results.items():
        print(
            f"{name:50s} {row['samples_per_s']:8.1f} samples/s  {row['of_local']:.0%} of local disk;"
            f" per worker CPU-second {row['worker_cpu_of_local']:.0%} of local's;"
            f" server CPU {row['server_cpu_share']:.2f}"
        )
    record = {
        "benchmark": "remote_bench",
        "machine": machine_name(),
        "layout": args.layout,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "seconds_per_round": args.seconds,
        "rounds": args.rounds,
        "coalesce_gap": args.coalesce_gap,
        "byte_ranges_read_by": "plain signed GETs (store.s3_plain) but where a row says s3fs",
        "spec": SPEC.describe(),
        "versions": {"mmdata": mmdata.__version__, "torch": torch.__version__, "s3fs": s3fs.__version__},
        "server": "moto's server on 127.0.0.1 behind tests.s3_server.S3Proxy, each in a process of its own",
        "results": results,
        "wall_seconds": round(time.time() - started),
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"remote_{args.tag}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
