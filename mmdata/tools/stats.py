"""`mmdata stats PATH`: compute a store's normalization statistics and write them to stats.json."""

from __future__ import annotations

import argparse

from mmdata.dataset import open_dataset
from mmdata.stats import QUANTILE_BINS, compute_stats, write_stats


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "stats",
        help="compute normalization statistics (low-dim and camera) and write stats.json beside dataset.json",
        description=(
            "Compute, over every episode, each low-dim stream's count, mean, std, min, max and 1st/99th"
            f" percentiles per dimension (percentiles from a {QUANTILE_BINS}-bin histogram, within one bin"
            " width, stated as quantile_error), and each camera's mean and std per RGB channel in [0, 1]"
            " over a seeded sample of frames. Written to stats.json in the store (replacing one there)."
        ),
    )
    parser.add_argument("path", help="store folder or fsspec URL")
    parser.add_argument(
        "--camera-frames", type=int, default=256, help="frames sampled per camera (default 256; 0 skips cameras)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the frame sample (default 0)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    dataset = open_dataset(args.path, cache_bytes=256 << 20)
    stats = compute_stats(dataset, args.camera_frames, args.seed)
    path = write_stats(dataset, stats)
    for name, figures in stats["lowdim"].items():
        print(f"{name}: {figures['count']} rows x {len(figures.get('mean', []))} dims")
    for name, figures in stats["cameras"].items():
        mean = ", ".join(f"{v:.3f}" for v in figures["mean"])
        print(f"{name}: {figures['frames']} frames, mean RGB ({mean})")
    print(f"written {path}")
    return 0
