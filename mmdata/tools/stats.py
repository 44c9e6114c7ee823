"""`mmdata stats PATH`: compute a store's normalization statistics and write them to stats.json;
`mmdata stats A B C --weights ... --out FILE`: the statistics of a mixture of stores, pooled."""

from __future__ import annotations

import argparse
from pathlib import Path

from mmdata.checks import dump_json
from mmdata.store.dataset import open_dataset
from mmdata.store.statistics import QUANTILE_BINS, compute_stats, pooled_stats, write_stats
from mmdata.tools.storage import add_storage_options


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "stats",
        help="compute normalization statistics (low-dim and camera) and write stats.json beside dataset.json",
        description=(
            "Compute, over every episode, each low-dim stream's count, mean, std, min, max and 1st/99th"
            f" percentiles per dimension (percentiles from a {QUANTILE_BINS}-bin histogram, within one bin"
            " width, stated as quantile_error), and each camera's mean and std per RGB channel in [0, 1]"
            " over a seeded sample of frames. Written to stats.json in the store (replacing one there)."
            " Given several stores, the low-dim statistics of their mixture instead, each store weighing its"
            " --weights share of the rows (default: equal shares), written to --out or printed; the loader"
            " pools mean_std and min_max itself (Mixture(normalize_with='pooled'))."
        ),
    )
    parser.add_argument("path", nargs="+", help="store folder or fsspec URL (several: a mixture, pooled)")
    parser.add_argument("--weights", type=float, nargs="+", help="share of each store in a mixture (default equal)")
    parser.add_argument("--out", help="file for a mixture's pooled statistics (default: print them)")
    parser.add_argument(
        "--camera-frames", type=int, default=256, help="frames sampled per camera (default 256; 0 skips cameras)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the frame sample (default 0)")
    add_storage_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if len(args.path) > 1 or args.weights or args.out:
        return run_pooled(args)
    dataset = open_dataset(args.path[0], cache_bytes=256 << 20)
    stats = compute_stats(dataset, args.camera_frames, args.seed)
    path = write_stats(dataset, stats)
    for name, figures in stats["lowdim"].items():
        print(f"{name}: {figures['count']} rows x {len(figures.get('mean', []))} dims")
    for name, figures in stats["cameras"].items():
        mean = ", ".join(f"{v:.3f}" for v in figures["mean"])
        print(f"{name}: {figures['frames']} frames, mean RGB ({mean})")
    print(f"written {path}")
    return 0


def run_pooled(args: argparse.Namespace) -> int:
    weights = args.weights or [1.0] * len(args.path)
    stats = pooled_stats([open_dataset(path, cache_bytes=256 << 20) for path in args.path], weights)
    text = dump_json(stats, indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        for name, figures in stats["lowdim"].items():
            print(f"{name}: {figures['count']} rows pooled from {len(args.path)} stores")
        print(f"written {args.out}")
    else:
        print(text, end="")
    return 0
