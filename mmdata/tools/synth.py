"""`mmdata synth DST`: write a synthetic raw dataset to try conversion on."""

from __future__ import annotations

import argparse

from mmdata.synthetic import SynthSpec, write_synthetic_dataset


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "synth",
        help="write a synthetic raw dataset (2 cameras, audio, 14-D state and action)",
        description=(
            "Write episodes in the raw layout: cam_high (224x224) and cam_wrist (208x160) at 30 fps with"
            " moving content and a frame-index stripe, 16 kHz audio with a known tone pattern, 14-D"
            " state and action at 50 Hz, and a task string. Lengths spread from --min-seconds to"
            " --max-seconds."
        ),
    )
    parser.add_argument("destination", help="folder to write episode folders into")
    parser.add_argument("--episodes", type=int, default=12, help="number of episodes (default 12)")
    parser.add_argument("--min-seconds", type=float, default=3.0, help="shortest episode (default 3)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="longest episode (default 60)")
    parser.add_argument(
        "--lowdim-format",
        choices=["npy", "parquet"],
        default="npy",
        help="write state/action as .npy files or one lowdim.parquet (default npy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = SynthSpec(
        episodes=args.episodes,
        min_seconds=args.min_seconds,
        max_seconds=args.max_seconds,
        lowdim_format=args.lowdim_format,
        seed=args.seed,
    )
    folders = write_synthetic_dataset(args.destination, spec)
    print(f"wrote {len(folders)} episodes to {args.destination}")
    return 0
