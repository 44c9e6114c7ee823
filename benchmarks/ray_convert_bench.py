"""Conversion with the Ray engine against the local process pool on one host, same input, one run.

Both engines get the same CPUs (`--cpus`: pool workers, and the Ray cluster's CPUs). The rounds
alternate (local, ray, local, ray, ...) so that the machine's drift hits both; the figure is the
median of the per-round ratios. Ray's time is measured on a cluster already running (as on a real
cluster), and the time to start a local cluster on this machine is reported on its own. Each
Ray store is checked to equal the local store byte for byte. Results go to
benchmarks/results/ray_convert_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from machine import RESULTS, machine_name

from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import SynthSpec, episode_seconds, write_synthetic_dataset


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=64 << 20)
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    args = parser.parse_args()

    import ray

    spec = SynthSpec(episodes=args.episodes, min_seconds=args.min_seconds, max_seconds=args.max_seconds)
    frames = sum(round(s * spec.fps) * len(spec.cameras) for s in episode_seconds(spec))
    local = ConvertOptions(shard_bytes=args.shard_size, workers=args.cpus, progress=False)
    on_ray = ConvertOptions(shard_bytes=args.shard_size, progress=False, engine="ray")
    seconds: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="mmdata-ray-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, spec)
        sources = discover_raw_episodes(raw)
        started = time.perf_counter()
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        cluster_start_s = time.perf_counter() - started
        try:
            for round_number in range(args.rounds):
                for engine, options in (("local", local), ("ray", on_ray)):
                    destination = Path(folder) / f"{engine}-{round_number}"
                    started = time.perf_counter()
                    report = convert(sources, destination, options)
                    seconds[engine].append(time.perf_counter() - started)
                    print(f"round {round_number} {engine:5s} {seconds[engine][-1]:6.1f} s  {report.converted} episodes")
                if _files(Path(folder) / f"ray-{round_number}") != _files(Path(folder) / f"local-{round_number}"):
                    raise SystemExit("the Ray store differs from the local one")
                for engine in seconds:
                    for path in sorted((Path(folder) / f"{engine}-{round_number}").rglob("*"), reverse=True):
                        path.unlink() if path.is_file() else path.rmdir()
        finally:
            ray.shutdown()

    ratios = [r / loc for r, loc in zip(seconds["ray"], seconds["local"])]
    result = {
        "benchmark": "ray_convert_bench",
        "machine": machine_name(),
        "cpus": args.cpus,
        "dataset": {**asdict(spec), "cameras": [asdict(c) for c in spec.cameras], "frames": frames},
        "seconds": {engine: [round(s, 2) for s in values] for engine, values in seconds.items()},
        "frames_per_s": {engine: round(frames / statistics.median(values), 1) for engine, values in seconds.items()},
        "ray_over_local_time": round(statistics.median(ratios), 3),
        "ray_local_cluster_start_s": round(cluster_start_s, 2),
        "stores_identical": True,
    }
    print(
        f"local {result['frames_per_s']['local']:.0f} frames/s, ray {result['frames_per_s']['ray']:.0f} frames/s:"
        f" ray takes {result['ray_over_local_time']:.2f}x the local time (target <= 1.10);"
        f" starting a local cluster adds {cluster_start_s:.1f} s"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"ray_convert_{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
