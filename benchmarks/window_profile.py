"""Where a policy window's time goes: the loader in one process under cProfile, for this tree and
an earlier one (`--baseline-tree`), each on a store it converted itself.

Takes the stores `lerobot_bench.py` leaves in its work folder (`store-windows.*` for this tree,
`store-baseline.*` for the baseline). Per tree and layout: samples/s in one process, the loader's
own stage seconds, and the functions that took the most time (own time), grouped into what the
sparse-windows work set out to remove (container opens, demuxing, colour conversion) and the
rest. Written to benchmarks/results/window_profile_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from machine import machine_name
from verify_cost_bench import run as run_in_tree

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

PROFILE = """
import cProfile, json, pstats, time
import mmdata
spec = mmdata.Windows(anchor_fps=30, streams={{
    "observation.images.cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
    "observation.images.cam_wrist": mmdata.Frames(offsets=[0.0]),
    "observation.state": mmdata.Values(offsets=[-0.1, 0.0]),
    "action": mmdata.Values(offsets=[i / 30 for i in range(16)]),
}})
loader = mmdata.DataLoader({store!r}, spec, batch_size=8, num_workers=0, shuffle="global")
batches = iter(loader)
for _ in range(5):
    next(batches)
profile = cProfile.Profile()
samples, started = 0, time.perf_counter()
profile.enable()
while time.perf_counter() - started < {seconds}:
    try:
        samples += len(next(batches)["sample_index"])
    except StopIteration:
        batches = iter(loader)
profile.disable()
elapsed = time.perf_counter() - started
stats = pstats.Stats(profile).stats
functions = sorted(
    (
        (f"{{path.rsplit('/', 1)[-1]}}:{{name}}", own, calls)
        for (path, line, name), (_, calls, own, _, _) in stats.items()
    ),
    key=lambda item: -item[1],
)
print("RESULT " + json.dumps({{
    "samples_per_s": round(samples / elapsed, 1),
    "seconds": round(elapsed, 2),
    "stages": loader.stats()["worker_stage_seconds"],
    "top": [[name, round(own, 3), calls] for name, own, calls in functions[:25]],
}}))
"""

# Own-time entries by what they are (matched on the function's name).
GROUPS = {
    "container open": ("av.container.core.open",),
    "demux": ("demux", "pyav_decoder.py:<listcomp>"),
    "decode (FFmpeg)": ("'decode' of 'av.codec.context.CodecContext'",),
    "colour conversion": ("'reformat' of", "yuv420_to_rgb"),
    "zstd": ("zstd.decompress",),
}


def profile(tree: Path, store: Path, seconds: float) -> dict:
    figures = run_in_tree(tree, PROFILE.format(store=str(store), seconds=seconds))
    grouped = {group: 0.0 for group in GROUPS}
    for name, own, _ in figures["top"]:
        for group, needles in GROUPS.items():
            if any(needle in name for needle in needles):
                grouped[group] += own
                break
    figures["grouped_seconds"] = {group: round(value, 3) for group, value in grouped.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-data")
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    record: dict = {"benchmark": "window_profile", "machine": machine_name(), "seconds": args.seconds, "runs": {}}
    for layout in ("wds", "zarr"):
        for name, tree, store in (
            ("before", args.baseline_tree.resolve(), args.workdir / f"store-baseline.{layout}"),
            ("after", HERE.parent, args.workdir / f"store-windows.{layout}"),
        ):
            figures = profile(tree, store, args.seconds)
            record["runs"][f"{name} {layout}"] = figures
            print(
                f"{name:6s} {layout:4s} {figures['samples_per_s']:7.1f} samples/s in one process;"
                f" {figures['grouped_seconds']}",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"window_profile_{args.tag}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
