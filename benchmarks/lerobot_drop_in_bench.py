"""`LeRobotLoader` against the native `mmdata.DataLoader` on the same store and window, 2 workers, in one run.

LeRobot's batches hold float32 CHW frames in [0, 1]. The drop-in makes them in the workers, in the pass that
gathers the frames into the batch (`Frames(dtype="float32")`); before, it converted uint8 batches in the training
loop's own thread, a second pass over every frame. Three loaders read the store of `autotune_bench.py` (two
224x224 cameras, LeRobot's windows: each camera at t, state at t, 16 actions) for `--seconds` each, in fresh
interpreters, in `--rounds` rounds whose order rotates: the native loader (uint8 frames), the drop-in (float
frames from the workers) and the drop-in as it was (uint8 from the workers, converted in the loop). Medians of
samples/s; results: benchmarks/results/lerobot_drop_in_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune_bench import make_store
from machine import machine_name

RESULTS = Path(__file__).resolve().parent / "results"

CHILD = r"""
import json, sys, time
import mmdata
from mmdata.lerobot import LeRobotLoader
from mmdata.lerobot.loader import to_unit_float

store, kind, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
actions = [i / 30 for i in range(16)]
if kind == "native":
    spec = mmdata.Windows(anchor_fps=30, streams={
        "cam_high": mmdata.Frames(offsets=[0.0], channels_first=True),
        "cam_wrist": mmdata.Frames(offsets=[0.0], channels_first=True),
        "state": mmdata.Values(offsets=[0.0]), "action": mmdata.Values(offsets=actions)})
    loader = mmdata.DataLoader(store, spec, batch_size=8, num_workers=2, seed=1)
else:
    images = "float" if kind == "drop_in" else "uint8"
    loader = LeRobotLoader(store, delta_timestamps={"action": actions}, batch_size=8, shuffle=True, num_workers=2,
                           images=images, seed=1)
convert = kind == "drop_in_converting_in_loop"
samples, start = 0, None
for batch in loader:
    if convert:
        batch = {k: to_unit_float(v) if k.startswith("cam") else v for k, v in batch.items()}
    if start is None:
        start = time.perf_counter()
        continue
    samples += len(batch["action"])
    if time.perf_counter() - start >= seconds:
        break
wall = time.perf_counter() - start
frames = batch["cam_high"]
print(json.dumps({"samples_per_s": samples / wall, "dtype": str(frames.dtype)}))
"""
KINDS = ("native", "drop_in", "drop_in_converting_in_loop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", type=Path, help="a store made by autotune_bench.py (default: made afresh)")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as folder:
        store = args.store if args.store and args.store.exists() else make_store(Path(folder))
        for round_ in range(args.rounds):
            order = KINDS[round_ % 3 :] + KINDS[: round_ % 3]
            for kind in order:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(store), kind, str(args.seconds)],
                    capture_output=True,
                    text=True,
                    timeout=args.seconds * 10 + 120,
                )
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-3000:])
                row = json.loads(done.stdout.strip().splitlines()[-1])
                rows[kind].append(row)
                print(f"round {round_}: {kind:28s} {row['samples_per_s']:8.1f} samples/s ({row['dtype']})", flush=True)
    medians = {kind: round(statistics.median(r["samples_per_s"] for r in rows[kind]), 1) for kind in KINDS}
    ratio = medians["drop_in"] / medians["native"]
    before = medians["drop_in_converting_in_loop"] / medians["native"]
    results = {
        "machine": machine_name(),
        "seconds": args.seconds,
        "rounds": rows,
        "median_samples_per_s": medians,
        "drop_in_vs_native": round(ratio, 3),
        "converting_in_loop_vs_native": round(before, 3),
        "target": {"name": "LeRobotLoader vs native, 2 workers", "target": ">= 0.9", "met": ratio >= 0.9},
    }
    print(json.dumps({k: v for k, v in results.items() if k != "rounds"}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"lerobot_drop_in_{args.tag}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
