"""mmdata.DataLoader against the naive webdataset + PyAV loader, same data and workers, in one run.

The spec is the loader issue's policy window: 2 frames of cam_high (t - 0.1 s, t), 2 states,
a 50-step action chunk and 1 s of 16 kHz audio per anchor, anchors at 10 Hz. Each loader runs
for `--seconds` after one warm-up batch, epoch after epoch; samples/s and delivered
frames/s are compared, and the results are written with the machine named.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from machine import machine_name

import mmdata
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.loading.feed import peak_rss_bytes
from mmdata.measure.naive import export_naive_shards, naive_loader, run_naive
from mmdata.measure.runner import run_for_seconds
from mmdata.synthetic import SynthSpec, write_synthetic_dataset

RESULTS = Path(__file__).parent / "results"
POLICY_WINDOWS = mmdata.Windows(
    anchor_fps=10,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[-0.1, 0.0]),
        "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
        "audio": mmdata.Audio(window=(-1.0, 0.0), sample_rate=16000),
    },
)
TOKENS_PER = {"cam_high": 256, "action": 1, "state": 1, "audio": 50}
FRAMES_PER_SAMPLE = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--min-seconds", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per loader")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    args = parser.parse_args()

    spec = SynthSpec(episodes=args.episodes, min_seconds=args.min_seconds, max_seconds=args.max_seconds)
    with tempfile.TemporaryDirectory(prefix="mmdata-loader-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, spec)
        store = Path(folder) / "store.wds"
        convert(discover_raw_episodes(raw), store, ConvertOptions(layout="wds", progress=False))
        shards = export_naive_shards(mmdata.open_dataset(store), Path(folder) / "naive")

        loader = mmdata.DataLoader(
            store,
            POLICY_WINDOWS,
            num_workers=args.workers,
            batching=mmdata.Batching(tokens_per=TOKENS_PER, batch_tokens=args.batch_tokens),
        )
        per_batch = round(len(loader.samples) / max(len(loader), 1))
        results = {
            "mmdata": run_for_seconds(
                loader, args.seconds, lambda b: (len(b["sample_index"]), FRAMES_PER_SAMPLE * len(b["sample_index"]))
            )
        }
        stats = loader.stats()
        timer = time.perf_counter()
        for _ in range(10_000):
            state = loader.state_dict()
        state_cost_us = (time.perf_counter() - timer) / 10_000 * 1e6
        results["mmdata"].update(
            state_dict_us=round(state_cost_us, 2),
            state_dict_bytes=len(json.dumps(state)),
            decoder=stats["decoder"],
            decode_waste=stats["decode_waste"],
            worker_stage_seconds=stats["worker_stage_seconds"],
            peak_rss_mb_per_worker={k: round(v / 2**20) for k, v in stats["peak_rss_bytes_per_worker"].items()},
        )
        for name, once in (("naive", False), ("naive_decode_once_per_episode", True)):
            baseline = naive_loader(shards, POLICY_WINDOWS, per_batch, args.workers, decode_once_per_episode=once)
            results[name] = run_naive(baseline, POLICY_WINDOWS, args.seconds)

    base = results["naive"]["samples_per_s"]
    fixed = results["naive_decode_once_per_episode"]["samples_per_s"]
    ratios = {
        "mmdata_vs_naive": round(results["mmdata"]["samples_per_s"] / base, 2),
        "mmdata_vs_naive_decode_once": round(results["mmdata"]["samples_per_s"] / fixed, 2),
    }
    for name, row in results.items():
        print(f"{name:32s} {row['samples_per_s']:9.1f} samples/s {row['frames_per_s']:9.1f} frames/s")
    print(f"state_dict: {results['mmdata']['state_dict_bytes']} bytes as JSON, {results['mmdata']['state_dict_us']} us")
    print(
        f"mmdata vs naive: {ratios['mmdata_vs_naive']}x; vs naive decoding each episode once:"
        f" {ratios['mmdata_vs_naive_decode_once']}x"
    )
    record = {
        "benchmark": "loader_bench",
        "machine": machine_name(),
        "workers": args.workers,
        "spec": POLICY_WINDOWS.describe(),
        "tokens_per": TOKENS_PER,
        "batch_tokens": args.batch_tokens,
        "samples_per_batch": per_batch,
        "dataset": {"episodes": args.episodes, "min_seconds": args.min_seconds, "max_seconds": args.max_seconds},
        "versions": {"mmdata": mmdata.__version__, "torch": torch.__version__},
        "main_process_peak_rss_mb": round(peak_rss_bytes() / 2**20),
        "results": results,
        "ratios": ratios,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"loader_{args.tag}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
