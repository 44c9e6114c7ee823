"""What a reliability round cost conversion and the loader, measured against the tree before it.

Each tree converts the same synthetic recordings (2 workers; WebDataset) and then runs the loader of
verify_cost_bench.py over its own store (a tree's stores may carry what an earlier one does not read): loader
samples/s with 2 workers, and CPU milliseconds per sample in one process. With `--copy`, each tree also
converts with `--video-codec copy`: the LeRobot fixture's AV1 videos (tests/fixtures/lerobot_small) and a robot
log of one 640x480 H.264 `foxglove.CompressedVideo` topic (300 frames, no B-frames; written with the tests'
log writer). The trees take turns in each round, in fresh interpreters, first one then the other, then the
other way round; the ratios are this tree's median over the baseline's. `--cpu-rounds` then repeats the
one-process CPU measure alone that many more times (it is cheap, and the VM's swings are larger than what a
check costs): `cpu_ms_more`.

With `--edits`, each tree also edits: a copy of its converted store (delete an episode with the statistics
computed again, then remove a stream) and a manifest of 100,000 episodes (delete one, statistics kept).

usage: python benchmarks/reliability_cost_bench.py --baseline-tree DIR --record NAME [--rounds 4] [--copy]
       [--cpu-rounds N] [--edits]
(DIR: `git worktree add DIR <the commit before the round>`). Writes benchmarks/results/NAME.json.
Recorded: round3_cost (issue 27, baseline 8978f34), round4_cost (issue 38, baseline ac8b010, --copy),
round5_cost (issue 55, baseline 52f9d1f, --edits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from machine import machine_name
from verify_cost_bench import LOADER, LOADER_CPU, run

from mmdata.synthetic import SynthSpec, write_synthetic_dataset

HERE = Path(__file__).resolve().parent
LEROBOT = HERE.parent / "tests" / "fixtures" / "lerobot_small"

CONVERT = """
import json, os, resource, shutil, time
import psutil
from mmdata.conversion.pipeline import ConvertOptions, convert
try:
    from mmdata.importers import discover_episodes
except ImportError:  # trees before the issue-28 package names
    from mmdata.sources import discover_episodes
{options}
shutil.rmtree({store!r}, ignore_errors=True)
sources = discover_episodes({source!r}, {kind!r})
started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
mine = resource.getrusage(resource.RUSAGE_SELF)
convert(sources, {store!r}, options)
seconds = time.perf_counter() - started
# Workers that exited are counted once reaped; idle ones still alive (they exit on their own) by what they used.
while True:
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            break
    except ChildProcessError:
        break
living = sum(sum(c.cpu_times()[:2]) for c in psutil.Process().children(recursive=True))
after, mine_after = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({{"seconds": seconds,
                               "cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime + living
                               + mine_after.ru_utime + mine_after.ru_stime - mine.ru_utime - mine.ru_stime}}))
"""
ENCODED = 'options = ConvertOptions(layout="wds", workers=2, progress=False)'
COPIED = """
from mmdata.codecs.video_encode import VideoEncoding
from mmdata.conversion.encode import EncodeOptions
video = VideoEncoding(codec="copy", segment_frames=32, gop=1)
options = ConvertOptions(layout="wds", encode=EncodeOptions(video=video), workers=2, progress=False)
"""


# Edits of the converted store's copy (statistics computed again: every episode read) and of a manifest of
# 100,000 episodes (statistics kept: the manifest copied a row group at a time), each in a fresh interpreter.
EDITS = """
import json, os, resource, shutil, time
from mmdata.editing.selection import EpisodeSelection
from mmdata.editing.edits import edit_store, remove_stream
shutil.rmtree({copy!r}, ignore_errors=True)
shutil.copytree({store!r}, {copy!r})
figures = {{}}
for name, edit in (
    ("edit_small", lambda: (edit_store({copy!r}, "delete", EpisodeSelection(ids=[0]), progress=False),
                            remove_stream({copy!r}, "audio", progress=False))),
    ("edit_large", lambda: edit_store({large!r}, "delete", EpisodeSelection(ids=[0]), False, progress=False)),
):
    os.sync()  # (the conversions' writes flushed first: an edit's own fsync would otherwise wait for them)
    started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    edit()
    after = resource.getrusage(resource.RUSAGE_SELF)
    figures[name + "_s"] = time.perf_counter() - started
    figures[name + "_cpu_s"] = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
print("RESULT " + json.dumps(figures))
"""
LARGE = """
import json
from mmdata.store.scaled_store import write_scaled_store
write_scaled_store({store!r}, {large!r}, 100_000, 4096)
print("RESULT " + json.dumps({{}}))
"""


def write_log(path: Path) -> Path:
    """The 640x480 H.264 log the copy of robot logs is measured on, written by the tests' log writer."""
    sys.path.insert(0, str(HERE.parent))
    from tests import mcap_logs

    packets = mcap_logs.video_packets("h264", 300, 15, size=(640, 480))
    stamps = [2_000_000_000 + int(number / 15 * 1e9) for number in range(len(packets))]
    return mcap_logs.write_video_log(path, "h264", packets, stamps)


def round_ratios(figures: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """Per figure, the median over rounds of this tree's value over the baseline's in the same round: the VM's
    swings move both trees of a round alike, so this is steadier than a ratio of medians."""
    this, baseline = figures["this"], figures["baseline"]
    return {
        key: round(statistics.median(a / b for a, b in zip(this[key], baseline[key])), 4) for key in this if this[key]
    }


def order_balanced_ratios(figures: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """Per figure, the geometric mean over rounds of this tree's value over the baseline's. The trees take turns
    going first, so over an even number of rounds a cost that falls on whichever goes first (the VM after the
    conversions: up to 40% more CPU for the 100,000-episode edit) cancels out, where a median of ratios keeps it."""
    this, baseline = figures["this"], figures["baseline"]
    return {
        key: round(statistics.geometric_mean(a / b for a, b in zip(this[key], baseline[key])), 4)
        for key in this
        if this[key]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True)
    parser.add_argument("--record", required=True, help="the results file's name, without .json")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--copy", action="store_true", help="also measure --video-codec copy conversions")
    parser.add_argument("--cpu-rounds", type=int, default=0, help="more rounds of the loader's CPU per sample alone")
    parser.add_argument("--edits", action="store_true", help="also measure edits (a small store, 100,000 episodes)")
    args = parser.parse_args()
    trees = {"this": HERE.parent, "baseline": args.baseline_tree.resolve()}
    with tempfile.TemporaryDirectory(prefix="mmdata-reliability-bench-") as folder:
        raw = Path(folder) / "raw"
        write_synthetic_dataset(raw, SynthSpec(episodes=6, min_seconds=5.0, max_seconds=15.0))
        conversions = {"convert": (str(raw), "raw", ENCODED)}
        if args.copy:
            log = write_log(Path(folder) / "camera.mcap")
            conversions |= {"copy_lerobot": (str(LEROBOT), "lerobot", COPIED), "copy_log": (str(log), "mcap", COPIED)}
        keys = [f"{name}_{figure}" for name in conversions for figure in ("s", "cpu_s")]
        if args.edits:
            keys += [f"{name}_{figure}" for name in ("edit_small", "edit_large") for figure in ("s", "cpu_s")]
        figures = {
            name: {key: [] for key in [*keys, "loader_samples_per_s", "cpu_ms", "cpu_ms_more"]} for name in trees
        }
        for number in range(args.rounds):
            order = list(trees.items()) if number % 2 == 0 else list(trees.items())[::-1]
            for conversion, (source, kind, options) in conversions.items():
                for name, tree in order:
                    store = str(Path(folder) / f"{name}-{conversion}.wds")
                    code = CONVERT.format(source=source, kind=kind, store=store, options=options)
                    converted = run(tree, code)
                    figures[name][f"{conversion}_s"].append(converted["seconds"])
                    figures[name][f"{conversion}_cpu_s"].append(converted["cpu_s"])
            for name, tree in order if args.edits else ():
                store, large = str(Path(folder) / f"{name}-convert.wds"), str(Path(folder) / f"{name}-large.wds")
                if number == 0:
                    run(tree, LARGE.format(store=store, large=large))
                copy = str(Path(folder) / f"{name}-edited.wds")
                for key, value in run(tree, EDITS.format(store=store, copy=copy, large=large)).items():
                    figures[name][key].append(value)
            for name, tree in order:
                store = str(Path(folder) / f"{name}-convert.wds")
                loaded = run(tree, LOADER.format(store=store, workers=2, verify=True, seconds=args.seconds))
                figures[name]["loader_samples_per_s"].append(loaded["samples_per_s"])
                figures[name]["cpu_ms"].append(
                    run(tree, LOADER_CPU.format(store=store, workers=0, verify=True))["cpu_ms_per_sample"]
                )
            print(
                f"round {number}: "
                + json.dumps({n: {k: round(v[-1], 3) for k, v in f.items() if v} for n, f in figures.items()}),
                flush=True,
            )
        for number in range(args.cpu_rounds):
            order = list(trees.items()) if number % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                store = str(Path(folder) / f"{name}-convert.wds")
                measured = run(tree, LOADER_CPU.format(store=store, workers=0, verify=True))
                figures[name]["cpu_ms_more"].append(measured["cpu_ms_per_sample"])
    medians = {
        name: {key: statistics.median(values) for key, values in by.items() if values} for name, by in figures.items()
    }
    record = {
        "benchmark": "reliability_cost_bench",
        "machine": machine_name(),
        "baseline_tree": str(args.baseline_tree),
        "rounds": args.rounds,
        "runs": figures,
        "medians": medians,
        "this_over_baseline": {
            key: round(medians["this"][key] / medians["baseline"][key], 4) for key in medians["this"]
        },
        "median_of_round_ratios": round_ratios(figures),
        "order_balanced_ratios": order_balanced_ratios(figures),
    }
    path = HERE / "results" / f"{args.record}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"median": record["median_of_round_ratios"], "balanced": record["order_balanced_ratios"]}))
    print(f"written {path}")


if __name__ == "__main__":
    main()
