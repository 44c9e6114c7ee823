"""The decoded-frame cache (issue 29, item 2) against none, under the orders there are, in one run.

lerobot_bench.py's mmdata workload (`cam_high` at t-0.1 s and t, `cam_wrist` at t, state, 16 actions at
30 Hz, every frame an anchor, batch 8, 2 workers) on 24 synthetic episodes of 4.4-6 s (two cameras at
30 fps) converted with the defaults (gop 8), with `Reading(frame_cache_bytes=0)` and with the default
bound, for the "locality", "global" and "blocks" orders; each run in a fresh interpreter, the configurations
alternating by round. Reports samples/s, samples per CPU-second, decode waste (frames decoded per frame
delivered) and the cache's peak bytes per worker. Writes benchmarks/results/frame_cache_cpu.json.

usage: python benchmarks/frame_cache_bench.py [--rounds 2] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lerobot_bench import MEASURE_WITH_MIXING
from machine import machine_name
from redesign_cost_bench import POLICY_WINDOWS
from verify_cost_bench import run

from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent
CODE = (
    POLICY_WINDOWS
    + """
loader = mmdata.DataLoader(
    {store!r}, spec, batch_size=8, shuffle={mode!r}, num_workers=2,
    reading=mmdata.Reading(frame_cache_bytes={cache}),
)
"""
    + MEASURE_WITH_MIXING
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    configurations = [(mode, cache) for mode in ("locality", "global", "blocks") for cache in (0, 256 << 20)]
    runs: dict[str, list[dict]] = {f"{mode}, cache {cache >> 20} MiB": [] for mode, cache in configurations}
    with tempfile.TemporaryDirectory(prefix="mmdata-frame-cache-bench-") as folder:
        root = Path(folder)
        write_synthetic_dataset(root / "raw", SynthSpec(episodes=24, min_seconds=4.4, max_seconds=6.0, seed=1))
        command = [sys.executable, "-m", "mmdata", "convert", str(root / "raw"), str(root / "store.wds"), "--quiet"]
        subprocess.run(command, check=True, cwd=HERE.parent)
        for number in range(args.rounds):
            order = configurations if number % 2 == 0 else configurations[::-1]
            for mode, cache in order:
                code = CODE.format(
                    bench=str(HERE), store=str(root / "store.wds"), mode=mode, cache=cache, seconds=args.seconds
                )
                result = run(HERE.parent, code)
                runs[f"{mode}, cache {cache >> 20} MiB"].append(result)
                print(number, mode, cache >> 20, json.dumps(result), flush=True)
    keys = ("samples_per_s", "samples_per_cpu_s", "decode_waste", "frame_cache_peak_bytes", "episodes_per_batch")
    medians = {
        name: {key: statistics.median(r[key] for r in results) for key in keys} for name, results in runs.items()
    }
    record = {
        "benchmark": "frame_cache_bench",
        "machine": machine_name(),
        "rounds": args.rounds,
        "runs": runs,
        "medians": medians,
    }
    path = HERE / "results" / "frame_cache_cpu.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(medians, indent=1))
    print(f"written {path}")


if __name__ == "__main__":
    main()
