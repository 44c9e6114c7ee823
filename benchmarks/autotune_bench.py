"""`num_workers="auto"` against every fixed worker count, under a simulated training loop, in one run.

A LeRobot-shaped store (24 episodes of 6 s, two 224x224 cameras at 30 fps, state and action) is read with
policy windows (cam_high at t-0.1 s and t, cam_wrist at t, state at t-0.1 s and t, 16 actions), batch 8, by a
training loop that takes a batch and then spends S ms on it (sleeping: a GPU-bound step; `--busy`: spinning, so
the loop keeps a core busy). Each configuration runs in a fresh interpreter for `--seconds`, in `--rounds` rounds
whose order rotates (this VM's speed drifts); medians are reported.

- S = 0 (throughput): auto's samples/s against the best fixed count's;
- S = 20, 50, 100 ms: the share of steps the loop waited more than 2 ms for (after the first 2 s, when the
  workers start cold; with them too, apart), and the loader's CPU (main process less the loop's own, plus
  workers) against the least of any fixed count that stalls at most 1% of steps;
- a loop whose step goes from 20 to 80 ms and back (4x slower, then 4x faster): auto's settings over time, the
  seconds until the stall is back under 1% after each change, and the batches, identical to a fixed run's;
- peak memory (main process and workers' peak RSS summed) of auto and of the fixed count it matched.

Results: benchmarks/results/autotune_<tag>.json (+ a plot of the changing run's settings) with the machine named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_name

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STALL_MS = 2.0  # (a ready batch is handed over in about 0.2 ms here; 2 ms is data the loop waited for)
WARM_UP_S = 2.0  # the steps of a run's first seconds (workers starting cold) are counted apart

CHILD = r"""
import hashlib, json, os, sys, time
import mmdata
from mmdata.loading.feed import peak_rss_bytes

store, workers, schedule = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
seconds, busy = float(sys.argv[4]), sys.argv[5] == "1"
workers = workers if workers == "auto" else int(workers)
spec = mmdata.Windows(anchor_fps=30, streams={
    "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "cam_wrist": mmdata.Frames(offsets=[0.0]),
    "state": mmdata.Values(offsets=[-0.1, 0.0]), "action": mmdata.Values(offsets=[i / 30 for i in range(16)])})
built = time.perf_counter()
runtime = mmdata.Runtime(decoder="pyav")
loader = mmdata.DataLoader(store, spec, batch_size=8, num_workers=workers, seed=1, runtime=runtime)

def work(ms):
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1000
    if busy:
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(ms / 1000)

def loop_ms(at):  # the loop's step at `at` seconds: [[from, ms], ...]
    ms = schedule[0][1]
    for start, value in schedule:
        if at >= start:
            ms = value
    return ms

waits, digests, timeline = [], [], []
first = None
cpu0 = time.process_time()
spun = 0.0
start = None
iterator = iter(loader)
while True:
    asked = time.perf_counter()
    try:
        batch = next(iterator)
    except StopIteration:  # (the next epoch: the workers carry on into it)
        iterator = iter(loader)
        batch = next(iterator)
    now = time.perf_counter()
    if first is None:
        first, start = now - built, now
        loader.reset_stats()
        cpu0 = time.process_time()
    else:
        waits.append(now - asked)
    digest = hashlib.sha1(batch["sample_index"].numpy().tobytes())
    digest.update(batch["cam_high"].numpy().tobytes()[::4099])
    digests.append(digest.hexdigest()[:12])
    elapsed = now - start
    timeline.append([round(elapsed, 3), round(1000 * waits[-1], 2) if waits else 0.0, loader.num_workers])
    if elapsed >= seconds:
        break
    ms = loop_ms(elapsed)
    spin0 = time.process_time()
    work(ms)
    if busy:
        spun += time.process_time() - spin0
wall = time.perf_counter() - start
stats = loader.stats()
main_cpu = time.process_time() - cpu0 - spun
worker_cpu = sum(stats["worker_cpu_seconds"].values())
peak = peak_rss_bytes() + sum(stats["peak_rss_bytes_per_worker"].values())
warm = [row[1] for row in timeline[1:] if row[0] >= %(warm)s]
print(json.dumps({
    "samples_per_s": stats["samples"] / wall, "steps": len(waits), "first_batch_s": first,
    "stalled_share": sum(ms > %(stall)s for ms in warm) / max(1, len(warm)),
    "stalled_share_with_warm_up": sum(w * 1000 > %(stall)s for w in waits) / max(1, len(waits)),
    "loader_cores": (main_cpu + worker_cpu) / wall, "peak_rss_mb": peak / 2**20,
    "digests": digests, "timeline": timeline, "autotune": stats.get("autotune"), "workers_at_end": loader.num_workers,
}))
loader.close()
""".replace("%(stall)s", str(STALL_MS)).replace("%(warm)s", str(WARM_UP_S))


def make_store(folder: Path) -> Path:
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes
    from mmdata.synthetic import CameraSpec, SynthSpec, write_synthetic_dataset

    raw = folder / "raw"
    cameras = (CameraSpec("cam_high", 224, 224), CameraSpec("cam_wrist", 224, 224))
    write_synthetic_dataset(raw, SynthSpec(episodes=24, min_seconds=6, max_seconds=6, cameras=cameras))
    store = folder / "store.wds"
    convert(discover_raw_episodes(raw), store, ConvertOptions(layout="wds", progress=False))
    return store


def run(store: Path, workers: str, schedule: list[list[float]], seconds: float, busy: bool) -> dict:
    args = [sys.executable, "-c", CHILD, str(store), workers, json.dumps(schedule), str(seconds), "1" if busy else "0"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds * 10 + 120)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_row(rows: list[dict]) -> dict:
    keys = (
        "samples_per_s",
        "stalled_share",
        "stalled_share_with_warm_up",
        "loader_cores",
        "peak_rss_mb",
        "first_batch_s",
    )
    return {key: round(statistics.median(row[key] for row in rows), 4) for key in keys}


def recovery_seconds(timeline: list[list[float]], change: float, until: float) -> float | None:
    """Seconds after `change` from which at most 1% of the steps up to `until` waited more than STALL_MS."""
    after = [row for row in timeline if change <= row[0] < until]
    stalled_from = [0] * (len(after) + 1)
    for index in range(len(after) - 1, -1, -1):
        stalled_from[index] = stalled_from[index + 1] + (after[index][1] > STALL_MS)
    for index, row in enumerate(after):
        if stalled_from[index] <= 0.01 * (len(after) - index):
            return round(row[0] - change, 2)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fixed", default="0,1,2,3", help="the fixed worker counts to compare")
    parser.add_argument("--loops", default="0,20,50,100", help="the loop's step, ms")
    parser.add_argument("--busy", action="store_true", help="the loop spins (keeps a core busy) rather than sleeps")
    parser.add_argument("--changing-seconds", type=float, default=36.0)
    parser.add_argument("--store", type=Path, help="a store made by an earlier run (default: made afresh)")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args()
    fixed = args.fixed.split(",")
    loops = [float(ms) for ms in args.loops.split(",")]
    rows: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = args.store if args.store and args.store.exists() else make_store(Path(folder))
        configs = [(ms, w) for ms in loops for w in [*fixed, "auto"]]
        for round_ in range(args.rounds):
            shift = round_ % len(configs)
            for ms, workers in configs[shift:] + configs[:shift]:
                row = run(store, workers, [[0, ms]], args.seconds, args.busy)
                rows.setdefault(str(ms), {}).setdefault(workers, []).append(row)
                print(f"S={ms:g} ms workers={workers}: {row['samples_per_s']:.1f} samples/s, stalled"
                      f" {row['stalled_share']:.1%}, {row['loader_cores']:.2f} cores, end {row['workers_at_end']}",
                      flush=True)  # fmt: skip
        third = args.changing_seconds / 3
        schedule = [[0, 20], [third, 80], [2 * third, 20]]
        changing_auto = run(store, "auto", schedule, args.changing_seconds, args.busy)
        changing_fixed = run(store, "2", schedule, args.changing_seconds, args.busy)

    results: dict = {"machine": machine_name(), "busy_loop": args.busy, "seconds": args.seconds, "rounds": args.rounds}
    table = {ms: {w: median_row(r) for w, r in by.items()} for ms, by in rows.items()}
    results["by_loop_ms"] = table
    targets = []
    for ms, by in table.items():
        auto = by["auto"]
        fixed_rows = {w: row for w, row in by.items() if w != "auto"}
        if float(ms) == 0:
            best_w, best = max(fixed_rows.items(), key=lambda kv: kv[1]["samples_per_s"])
            ratio = auto["samples_per_s"] / best["samples_per_s"]
            targets.append({"name": f"S=0: auto vs best fixed ({best_w}) samples/s", "measured": round(ratio, 3),
                            "target": ">= 0.95", "met": ratio >= 0.95})  # fmt: skip
            matched = best_w
        else:
            fed = {w: row for w, row in fixed_rows.items() if row["stalled_share"] <= 0.01}
            least_w = min(fed, key=lambda w: fed[w]["loader_cores"]) if fed else None
            ratio = auto["loader_cores"] / fed[least_w]["loader_cores"] if least_w else None
            targets.append({"name": f"S={ms}: auto stalled share", "measured": auto["stalled_share"],
                            "target": "<= 0.01", "met": auto["stalled_share"] <= 0.01})  # fmt: skip
            targets.append({"name": f"S={ms}: auto CPU vs least fixed that is fed ({least_w})",
                            "measured": round(ratio, 3) if ratio else None, "target": "<= 1.2",
                            "met": ratio is not None and ratio <= 1.2})  # fmt: skip
            matched = least_w
        if matched is not None:
            memory = auto["peak_rss_mb"] / by[matched]["peak_rss_mb"]
            targets.append({"name": f"S={ms}: auto peak memory vs fixed {matched}", "measured": round(memory, 3),
                            "target": "<= 1.0 (+5% noise)", "met": memory <= 1.05})  # fmt: skip
    third = args.changing_seconds / 3
    timeline = changing_auto["timeline"]
    slower = recovery_seconds(timeline, third, 2 * third)
    faster = recovery_seconds(timeline, 2 * third, args.changing_seconds + 1)
    common = min(len(changing_auto["digests"]), len(changing_fixed["digests"]))
    identical = changing_auto["digests"][:common] == changing_fixed["digests"][:common]
    results["changing_loop"] = {
        "schedule_ms": schedule,
        "auto": {k: v for k, v in changing_auto.items() if k != "digests"},
        "fixed_2": {k: v for k, v in changing_fixed.items() if k not in ("digests", "timeline")},
        "recovery_after_slower_s": slower,
        "recovery_after_faster_s": faster,
        "steps_compared": common,
        "batches_identical": identical,
    }
    for name, value in (("4x slower", slower), ("4x faster", faster)):
        targets.append({"name": f"changing loop: back to <= 1% stall after {name}", "measured": value,
                        "target": "<= 10 s", "met": value is not None and value <= 10})  # fmt: skip
    targets.append({"name": "changing loop: batches identical to fixed 2 workers", "measured": f"{common} steps",
                    "target": "identical", "met": identical})  # fmt: skip
    results["targets"] = targets
    for row in targets:
        print(f"{'met ' if row['met'] else 'MISS'} {row['name']}: {row['measured']} (target {row['target']})")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"autotune_{args.tag}.json"
    out.write_text(json.dumps(results, indent=1))
    plot(changing_auto, schedule, RESULTS / f"autotune_{args.tag}_changing.png")
    print(f"wrote {out}")


def plot(run_: dict, schedule: list[list[float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    timeline = run_["timeline"]
    at = [row[0] for row in timeline]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    top.step(at, [row[2] for row in timeline], where="post", label="workers (auto)")
    loop = [next(ms for start, ms in reversed(schedule) if t >= start) for t in at]
    top.set_ylabel("workers")
    twin = top.twinx()
    twin.plot(at, loop, color="grey", linestyle=":", label="loop step (ms)")
    twin.set_ylabel("loop step, ms")
    bottom.plot(at, [row[1] for row in timeline], linewidth=0.7)
    bottom.set_ylabel("wait per step, ms")
    bottom.set_xlabel("seconds")
    figure.suptitle(f"num_workers='auto' under a changing loop ({machine_name()})", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
