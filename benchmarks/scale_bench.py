"""What planning an epoch costs one rank as stores grow to a billion samples and worlds to 1,024 ranks, in one run.

Three parts, each a curve rather than one point:

- `plan`: manifests of 10^5 to 10^7 episodes (synthetic rows in memory: key, shard, duration; planning reads nothing
  else), windows giving 10^7 to 10^9 samples. Per (store, world size): one rank's (the last) time to plan the epoch
  and make its first step, in the "blocks" and "locality" orders (one planner, each order evaluated position by
  position), also resumed at half the world size half-way through; the planner's peak memory (tracemalloc, Python
  and numpy allocations) and what the planner with its steps pickles to (what a spawned worker receives).
- `first_batch`: `iter(DataLoader)` to its first batch for the last rank of 1,024 over a real store of 4 episodes
  of 5 minutes (low-dim only) read at an anchor rate that gives 10^9 samples ("auto" resolves to "blocks"), and
  over a mixture of it and its Zarr copy (0.7/0.3) of 10^9 slots; the process's resident memory growth.
- `manifest`: stores of 10^5 to 10^7 episodes (`write_scaled_store`: synthetic rows over a small real store's
  shards), each opened in a fresh process: `open_dataset` time, a loader's plan and first step for the last of 1,024
  ranks, the first batch, and the process's resident memory after each (torch and every import included).
- `edit`: `mmdata edit` on stores of 10^5 and 10^6 episodes (statistics kept): a 90/10 split by fraction into two
  new stores, a merge of two such stores (twice the episodes), deleting 1% of the episodes, then keeping 90% of the
  rest; no media byte is copied (the new stores hold a manifest, statistics and dataset.json).
- `mixture`: a mixture of three such manifests (10^5 and 10^6 episodes in all, 60/30/10% of them, weights
  0.5/0.3/0.2, so sources are weighed up and down) with epochs of 10^7 to 10^9 slots: one rank's plan and first
  step, fresh and resumed at half the world, in the "blocks" and "locality" orders; over rank 0's
  first 2,000 batches of 8, each source's share of a batch (mean and the largest miss of its weight) and the mixing
  figures of each source's samples.
- `packed`: a token budget over sequences (4 s of actions, 40 tokens when whole, in micro-batches of 1,024 tokens)
  over manifests of 10^5 to 10^7 episodes of lognormal durations (about 100 sequences each): one rank's plan and
  first step, fresh and resumed at half the world, in the "blocks" order (windows packed into a fixed number of
  micro-batches); what counting the samples consumed costs (`count_consumed_ms`: once per `state_dict()`, a window
  packed in the training loop's process; measured after each of 50 steps); and over 10^4 episodes, against the
  "locality" order packed the same way on the same samples: fill (tokens per micro-batch over the budget), samples
  left out, spread of the ranks' tokens within a step and the mixing figures of rank 0's micro-batches.
- `mixing`: rank 0's micro-batches of 8 over 1,000 episodes of 300 windows (segments of 32 windows): distinct
  episodes per batch, episodes shared with the batch before, lag-1 correlation of the batches' mean episode, in the
  "blocks" and "locality" orders (`mmdata bench`'s figures).

usage: python benchmarks/scale_bench.py [--quick] [--parts plan first_batch manifest edit mixture packed mixing]
       [--record scale_cpu]
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import RESULTS, machine_name, write_results  # noqa: E402

import mmdata  # noqa: E402
from mmdata.conversion.pipeline import ConvertOptions, convert  # noqa: E402
from mmdata.editing.derived import ValidationChoice, merge_stores, split_store  # noqa: E402
from mmdata.editing.edits import edit_store  # noqa: E402
from mmdata.editing.selection import EpisodeSelection  # noqa: E402
from mmdata.importers.raw import discover_raw_episodes  # noqa: E402
from mmdata.measure.runner import mixing_figures  # noqa: E402
from mmdata.planning.mixture import Mixture, Source, source_targets  # noqa: E402
from mmdata.planning.orders import OrderRecipe, shard_run_starts  # noqa: E402
from mmdata.planning.planner import (  # noqa: E402
    PlannedSource,
    Planner,
    PlanSettings,
    Stretch,  # noqa: E402
)
from mmdata.planning.sample_index import SampleIndex  # noqa: E402
from mmdata.store.scaled_store import write_scaled_store  # noqa: E402
from mmdata.synthetic import SynthSpec, write_synthetic_dataset  # noqa: E402

BATCH, LANES, OPEN, BLOCK = 8, 8, 8, 32
SPEC_FPS = 10.0


def synthetic_manifest(episodes: int, samples_per_episode: int) -> pa.Table:
    """The columns planning reads, for `episodes` rows of `samples_per_episode` windows at SPEC_FPS."""
    rows = np.arange(episodes, dtype=np.int64)
    keys = pc.binary_join_element_wise("episode_", pc.cast(pa.array(rows), pa.string()), "")
    shards = pc.binary_join_element_wise("shard-", pc.cast(pa.array(rows // 1000), pa.string()), ".tar", "")
    return pa.table({"key": keys, "shard": shards, "duration": np.full(episodes, samples_per_episode / SPEC_FPS)})


def spec() -> mmdata.Windows:
    return mmdata.Windows(anchor_fps=SPEC_FPS, streams={"action": mmdata.Values(offsets=[0.0, 0.1])})


def planned_source(table: pa.Table, index: SampleIndex, order: str, block: int = BLOCK) -> PlannedSource:
    """One manifest as the planner plans it in `order` ("blocks": blocks of `block` windows, a stored segment's)."""
    if order == "locality":
        codes = pc.dictionary_encode(table.column("shard")).combine_chunks().indices.to_numpy(zero_copy_only=False)
        recipe = OrderRecipe("locality", run_starts=shard_run_starts(codes, index.firsts))
    else:
        recipe = OrderRecipe(order, block=block, open_blocks=OPEN)
    return PlannedSource(index, table.column("shard"), recipe)


def planner_in(order: str):
    """A maker of the planner of one manifest in `order`, batches of BATCH."""

    def make(table: pa.Table) -> Planner:
        settings = PlanSettings(None, BATCH, shuffle=order, lanes=LANES, open_segments=OPEN)
        return Planner([planned_source(table, SampleIndex(table, spec(), None, None), order)], settings)

    return make


block_planner, locality_planner = planner_in("blocks"), planner_in("locality")


def measured(make_planner, table: pa.Table | list[pa.Table], world: int, stretches: list[Stretch]) -> dict:
    """One rank's cost: making the planner (what a loader does once), planning the epoch, its first step."""
    gc.collect()
    tracemalloc.start()
    started = time.perf_counter()
    planner = make_planner(table)
    made = time.perf_counter()
    plan = planner.epoch_plan(1, 0, stretches, world)
    planned = time.perf_counter()
    steps = planner.rank_steps(plan, world - 1)
    steps[0]
    first = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pickled = len(pickle.dumps((planner, steps)))
    return {
        "planner_s": round(made - started, 4),
        "plan_s": round(planned - made, 4),
        "first_step_s": round(first - planned, 5),
        "total_s": round(first - started, 4),
        "peak_mb": round(peak / 1e6, 1),
        "pickled_mb": round(pickled / 1e6, 2),
        "steps": len(steps),
    }


def plan_curve(sizes: list[tuple[int, int]], worlds: list[int]) -> list[dict]:
    rows = []
    for episodes, per_episode in sizes:
        table = synthetic_manifest(episodes, per_episode)
        samples = episodes * per_episode
        for order, make in (("blocks", block_planner), ("locality", locality_planner)):
            for world in worlds:
                fresh = measured(make, table, world, [])
                half = fresh["steps"] // 2 // 2  # half the epoch at twice the world size, then this world size
                elastic = measured(make, table, world, [Stretch(world * 2, half)])
                row = {"order": order, "episodes": episodes, "samples": samples, "world_size": world}
                row.update(fresh)
                row.update({f"elastic_{key}": value for key, value in elastic.items() if key != "steps"})
                rows.append(row)
                print(row, flush=True)
        del table
    return rows


def first_batch(samples: int, world: int) -> dict:
    """`iter(DataLoader)` to the first batch of the last rank, over a real store read at `samples` windows, and over
    a mixture of it and a Zarr copy (weights 0.7/0.3) of `samples` slots."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        synth = SynthSpec(episodes=4, min_seconds=300.0, max_seconds=300.0, cameras=())  # windows at < 1 MHz
        write_synthetic_dataset(root / "raw", synth)
        convert(discover_raw_episodes(root / "raw"), root / "store.wds", ConvertOptions(progress=False))
        convert(discover_raw_episodes(root / "raw"), root / "store.zarr", ConvertOptions(layout="zarr", progress=False))
        dataset = mmdata.open_dataset(str(root / "store.wds"))
        seconds = sum(float(dataset.manifest.row(i)["duration"]) for i in range(len(dataset)))
        windows = mmdata.Windows(anchor_fps=samples / seconds, streams={"action": mmdata.Values(offsets=[0.0, 0.1])})
        figures = {"store": first_batch_of(dataset, windows, world)}
        sources = [mmdata.Source(dataset, 0.7, name="wds"), mmdata.Source(str(root / "store.zarr"), 0.3, name="zarr")]
        figures["mixture"] = first_batch_of(mmdata.Mixture(sources, epoch_samples=samples), windows, world)
    print(figures, flush=True)
    return figures


def first_batch_of(dataset, windows: mmdata.Windows, world: int) -> dict:
    gc.collect()
    rss_before = resident_mb()
    started = time.perf_counter()
    loader = mmdata.DataLoader(
        dataset,
        windows,
        batch_size=BATCH,
        seed=1,
        runtime=mmdata.Runtime(rank=world - 1, world_size=world),
        num_workers=0,
    )
    built = time.perf_counter()
    next(iter(loader))
    done = time.perf_counter()
    figures = {
        "samples": int(loader.source_targets.sum()),
        "world_size": world,
        "order": loader.shuffle,
        "build_s": round(built - started, 3),
        "first_batch_s": round(done - started, 3),
        "rss_growth_mb": round(resident_mb() - rss_before, 1),
        "steps_per_rank": len(loader),
    }
    loader.close()
    return figures


def resident_mb() -> float:
    """The process's resident memory now (Linux; elsewhere its peak), in MB."""
    status = Path("/proc/self/status")
    if status.exists():
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


MANIFEST_CHILD = """
import json, sys, time
sys.path[:0] = [{root!r}]
import mmdata
def resident():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) / 1024
streams = {{"cam_high": mmdata.Frames(offsets=[-0.1, 0.0]), "state": mmdata.Values()}}
spec = mmdata.Windows(anchor_fps=10, streams=streams)
started = time.perf_counter()
dataset = mmdata.open_dataset({store!r})
opened = time.perf_counter()
figures = {{"open_s": round(opened - started, 3), "open_rss_mb": round(resident())}}
loader = mmdata.DataLoader(dataset, spec, batch_size=8, runtime=mmdata.Runtime(rank=1023, world_size=1024), seed=1)
plan = loader.epoch_plan()
loader.planner.rank_steps(plan, 1023)[0]
planned = time.perf_counter()
figures.update(order=loader.shuffle, samples=len(loader.samples), plan_s=round(planned - opened, 3),
               open_and_plan_s=round(planned - started, 3), plan_rss_mb=round(resident()))
next(iter(loader))
figures.update(first_batch_s=round(time.perf_counter() - planned, 3), first_batch_rss_mb=round(resident()))
loader.close()
print(json.dumps(figures))
"""


def small_real_store(root: Path) -> Path:
    """A converted store of 3 short episodes under `root`: the shards a scaled store's rows point at."""
    write_synthetic_dataset(root / "raw", SynthSpec(episodes=3, min_seconds=1.5, max_seconds=3.0))
    convert(discover_raw_episodes(root / "raw"), root / "real.wds", ConvertOptions(progress=False))
    return root / "real.wds"


def manifest_curve(sizes: list[int]) -> list[dict]:
    """Open, plan and first batch over stores of `sizes` episodes, each in a fresh process."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        real = small_real_store(root)
        for episodes in sizes:
            store = write_scaled_store(real, root / f"scaled-{episodes}.wds", episodes)
            code = MANIFEST_CHILD.format(root=str(Path(__file__).resolve().parents[1]), store=str(store))
            child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            row = {"episodes": episodes, "manifest_mb": round((store / "episodes.parquet").stat().st_size / 1e6, 1)}
            row.update(json.loads(child.stdout.strip().splitlines()[-1]))
            rows.append(row)
            print(row, flush=True)
            shutil.rmtree(store)
    return rows


def edit_curve(sizes: list[int]) -> list[dict]:
    """Seconds of `mmdata edit` (statistics kept) on stores of `sizes` episodes: a 90/10 split by fraction, a merge
    of two such stores, deleting 1% of the episodes, then keeping 90% of the rest."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        real = small_real_store(root)
        for episodes in sizes:
            store = str(write_scaled_store(real, root / f"edit-{episodes}.wds", episodes))
            other = str(write_scaled_store(real, root / f"other-{episodes}.wds", episodes))
            media = sum(p.stat().st_size for p in (real / "shards").iterdir())
            started = time.perf_counter()
            choice = ValidationChoice(fraction=0.1, seed=0)
            split_store(store, str(root / "train"), str(root / "validation"), choice, False, False)
            split = time.perf_counter()
            merged = merge_stores([store, other], str(root / "merged"), False, False)
            merge = time.perf_counter()
            deleted = edit_store(store, "delete", EpisodeSelection(ids=range(0, episodes, 100)), False, False)
            between = time.perf_counter()
            kept = edit_store(
                store, "keep", EpisodeSelection(ids=range(deleted.episodes_after * 9 // 10)), False, False
            )
            done = time.perf_counter()
            after = sum(p.stat().st_size for p in (real / "shards").iterdir())
            row = {
                "episodes": episodes,
                "split_90_10_s": round(split - started, 2),
                "merge_two_s": round(merge - split, 2),
                "merged_episodes": merged.episodes_after,
                "delete_1_percent_s": round(between - merge, 2),
                "keep_90_percent_s": round(done - between, 2),
                "episodes_after": kept.episodes_after,
                "media_bytes_written": after - media,
                "new_store_bytes": sum(
                    p.stat().st_size for name in ("train", "validation", "merged") for p in (root / name).iterdir()
                ),
            }
            rows.append(row)
            print(row, flush=True)
            for path in (store, other, root / "train", root / "validation", root / "merged"):
                shutil.rmtree(path)
    return rows


def mixing(episodes: int = 1000, per_episode: int = 300) -> dict:
    """`mmdata bench`'s mixing figures over rank 0's whole epoch, in both orders."""
    table = synthetic_manifest(episodes, per_episode)
    figures = {}
    for order, make in (("blocks", block_planner), ("locality", locality_planner)):
        planner = make(table)
        plan = planner.epoch_plan(1, 0, [], 1)
        rank_steps = planner.rank_steps(plan, 0)
        batches = [np.asarray([s.episode for s in rank_steps[k][1]]) for k in range(len(rank_steps))]
        figures[order] = mixing_figures(batches)
    print(figures, flush=True)
    return figures


PACKED_BUDGET = 1024
PACKED_SPEC = mmdata.Sequences(fps=SPEC_FPS, max_seconds=4.0, streams={"action": mmdata.Values()})


def lognormal_manifest(episodes: int, seed: int = 0) -> pa.Table:
    """Planning columns for `episodes` rows of lognormal durations (median 300 s, mean about 400 s)."""
    durations = np.random.default_rng(seed).lognormal(np.log(300.0), 0.75, episodes)
    shards = pc.binary_join_element_wise("shard-", pc.cast(pa.array(np.arange(episodes) // 1000), pa.string()), "")
    return pa.table({"shard": shards, "duration": durations})


def packed_planner(table: pa.Table, order: str = "blocks") -> Planner:
    settings = PlanSettings(PACKED_BUDGET, None, shuffle=order)
    return Planner([planned_source(table, SampleIndex(table, PACKED_SPEC, None, None), order, block=1)], settings)


def packed_curve(episode_counts: list[int], worlds: list[int]) -> dict:
    """One rank's cost under a token budget over sequences in the "blocks" order, and the packing's quality
    against the "locality" order's packer over the smallest store."""
    rows = []
    for episodes in episode_counts:
        table = lognormal_manifest(episodes)
        for world in worlds:
            fresh = measured(packed_planner, table, world, [])
            elastic = measured(packed_planner, table, world, [Stretch(world * 2, fresh["steps"] // 4)])
            planner = packed_planner(table)
            plan = planner.epoch_plan(1, 0, [], world)
            started = time.perf_counter()
            for step in range(1, 51):
                plan.samples_consumed(step)
            row = {"episodes": episodes, "samples": planner.slots, "world_size": world, **fresh}
            row["count_consumed_ms"] = round((time.perf_counter() - started) / 50 * 1000, 3)
            row["bins_per_window"] = planner.packing.bins
            row.update({f"elastic_{key}": value for key, value in elastic.items() if key != "steps"})
            rows.append(row)
            print(row, flush=True)
        del table
    return {"budget": PACKED_BUDGET, "plan": rows, "quality": packed_quality(10**4, 8)}


def packed_quality(episodes: int, world: int) -> dict:
    """Fill, samples left out, the ranks' spread within a step and the mixing of rank 0's micro-batches, for
    the "blocks" order's window packing and the "locality" order's packer, on the same samples and budget."""
    table = lognormal_manifest(episodes, seed=1)
    blocks, locality = packed_planner(table), packed_planner(table, "locality")
    index = blocks.sources[0].samples
    figures = {}
    for order, planner in (("blocks", blocks), ("locality", locality)):
        plan = planner.epoch_plan(1, 0, [], world)
        steps = [[plan.plan.micro_batch(s, r) for r in range(world)] for s in range(len(plan.plan))]
        loads = np.array([[index.costs_of(mb).sum() for mb in step] for step in steps])
        episodes_of = [index.episodes_of(step[0])[0] for step in steps]
        figures[order] = {
            "steps": len(steps),
            "fill": round(float(loads.mean() / PACKED_BUDGET), 4),
            "left_out": int(len(plan.left_out)),
            "left_out_share": round(len(plan.left_out) / len(index), 5),
            "rank_spread_of_budget": round(float(((loads.max(axis=1) - loads.min(axis=1)) / PACKED_BUDGET).mean()), 4),
            **mixing_figures(episodes_of),
        }
    print(figures, flush=True)
    return {"episodes": episodes, "samples": len(index), "world_size": world, **figures}


MIXTURE_SHARES, MIXTURE_WEIGHTS = (0.6, 0.3, 0.1), (0.5, 0.3, 0.2)


def mixture_tables(episodes: int) -> list[pa.Table]:
    return [synthetic_manifest(round(episodes * share), 100) for share in MIXTURE_SHARES]


def mixture_targets(tables: list[pa.Table], slots: int) -> np.ndarray:
    mixture = Mixture([Source(f"s{n}", weight) for n, weight in enumerate(MIXTURE_WEIGHTS)], epoch_samples=slots)
    return source_targets(mixture, [t.num_rows * 100 for t in tables], [1.0] * len(tables))


def mixed_planner(slots: int, order: str = "blocks"):
    def make(tables: list[pa.Table]) -> Planner:
        settings = PlanSettings(None, BATCH, shuffle=order, lanes=LANES, open_segments=OPEN)
        sources = [planned_source(t, SampleIndex(t, spec(), None, None), order) for t in tables]
        return Planner(sources, settings, mixture_targets(tables, slots))

    return make


def source_mixing(batches: list[list]) -> dict:
    """Each source's share of a batch (mean, and the largest miss of its weight), and `mmdata bench`'s mixing
    figures of each source's samples (episodes per batch of that source's samples, shared with the batch before
    holding the source, lag-1 correlation of their mean episode), averaged over the sources."""
    per_batch = np.array([np.bincount([s.source for s in b], minlength=3) / len(b) for b in batches])
    figures = [
        mixing_figures([np.asarray(e) for e in ([s.episode for s in b if s.source == source] for b in batches) if e])
        for source in range(3)
    ]
    return {
        "source_share_mean": [round(float(v), 3) for v in per_batch.mean(axis=0)],
        "source_share_largest_miss": round(float(np.abs(per_batch - MIXTURE_WEIGHTS).max()), 3),
        **{key: round(float(np.mean([f[key] for f in figures])), 3) for key in figures[0]},
    }


def mixture_curve(episode_counts: list[int], slot_counts: list[int], worlds: list[int]) -> dict:
    """One rank's planning cost for a mixture of three manifests of each size at each epoch size, in the "blocks"
    and "locality" orders, and how rank 0's batches mix in both over the smallest."""
    rows = []
    for episodes in episode_counts:
        tables = mixture_tables(episodes)
        for slots in slot_counts:
            for order, make in (("blocks", mixed_planner(slots)), ("locality", mixed_planner(slots, "locality"))):
                for world in worlds:
                    fresh = measured(make, tables, world, [])
                    elastic = measured(make, tables, world, [Stretch(world * 2, fresh["steps"] // 4)])
                    row = {"order": order, "episodes": episodes, "slots": slots, "world_size": world, **fresh}
                    row.update({f"elastic_{key}": value for key, value in elastic.items() if key != "steps"})
                    rows.append(row)
                    print(row, flush=True)
        del tables
    tables = mixture_tables(min(episode_counts))
    batches = {}
    for order, make in (("blocks", mixed_planner(10**7)), ("locality", mixed_planner(10**7, "locality"))):
        planner = make(tables)
        steps = planner.rank_steps(planner.epoch_plan(1, 0, [], 1), 0)
        batches[order] = source_mixing([steps[k][1] for k in range(2000)])
    print(batches, flush=True)
    return {"weights": list(MIXTURE_WEIGHTS), "episode_shares": list(MIXTURE_SHARES), "plan": rows, "batches": batches}


def growth(rows: list[dict], order: str, world: int, low: int, high: int, field: str) -> dict | None:
    """How much `field` grows from `low` to `high` samples over the same manifest (the most episodes measured at
    both sizes): the samples' share of the cost, apart from the episodes'."""
    at: dict[int, dict[int, float]] = {}
    for row in rows:
        if row["order"] == order and row["world_size"] == world:
            at.setdefault(row["episodes"], {})[row["samples"]] = row[field]
    both = [episodes for episodes, sizes in at.items() if low in sizes and high in sizes]
    if not both:
        return None
    episodes = max(both)
    return {"episodes": episodes, "ratio": round(at[episodes][high] / max(at[episodes][low], 1e-9), 2)}


def plot(rows: list[dict], path: Path, size: str = "samples") -> None:
    """One rank's planning time and peak memory against the epoch's samples (or a mixture's slots: `size`), a line
    per order and manifest size (episodes), at the largest world size measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = max(row["world_size"] for row in rows)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for order, style in (("blocks", "-o"), ("locality", "--s")):
        for episodes in sorted({row["episodes"] for row in rows}):
            picked = sorted(
                (r for r in rows if r["order"] == order and r["episodes"] == episodes and r["world_size"] == world),
                key=lambda r: r[size],
            )
            if not picked:
                continue
            x = [r[size] for r in picked]
            label = f"{order}, {episodes:.0e} episodes"
            axes[0].plot(x, [r["total_s"] for r in picked], style, label=label)
            axes[1].plot(x, [r["peak_mb"] for r in picked], style, label=label)
    titles = (f"one rank of {world}: planner + epoch plan + first step (s)", f"one rank of {world}: peak memory (MB)")
    for axis, title in zip(axes, titles):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel(f"{size} in the epoch")
        axis.set_title(title, fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


PARTS = ("plan", "first_batch", "manifest", "edit", "mixture", "packed", "mixing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smaller sizes only (a minute)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure (all)")
    parser.add_argument("--record", default=None, help="write benchmarks/results/<NAME>.json (and .png with plan)")
    args = parser.parse_args()
    if args.quick:
        sizes, worlds, first_samples, manifests, edits = (
            [(10**4, 100), (10**5, 100)],
            [8, 1024],
            10**8,
            [10**5],
            [10**4],
        )
    else:
        sizes = [(10**5, 100), (10**6, 10), (10**6, 100), (10**6, 1000), (10**7, 100)]
        worlds, first_samples, manifests, edits = [8, 64, 1024], 10**9, [10**5, 10**6, 10**7], [10**5, 10**6]
    report: dict = {
        "machine": machine_name(),
        "batch_size": BATCH,
        "lanes": LANES,
        "open_blocks": OPEN,
        "block": BLOCK,
    }
    rows = plan_curve(sizes, worlds) if "plan" in args.parts else []
    if rows:
        report["plan"] = rows
        top = max(row["samples"] for row in rows)
        report["growth_blocks_world_1024"] = {
            "samples": [10**7, top],
            "total_s": growth(rows, "blocks", 1024, 10**7, top, "total_s"),
            "peak_mb": growth(rows, "blocks", 1024, 10**7, top, "peak_mb"),
        }
    if "first_batch" in args.parts:
        report["first_batch"] = first_batch(first_samples, 1024)
    if "manifest" in args.parts:
        report["manifest"] = manifest_curve(manifests)
    if "edit" in args.parts:
        report["edit"] = edit_curve(edits)
    if "mixture" in args.parts:
        mixture_episodes = [10**5] if args.quick else [10**5, 10**6]
        report["mixture"] = mixture_curve(mixture_episodes, [10**7, 10**8, 10**9], worlds)
    if "packed" in args.parts:
        report["packed"] = packed_curve([10**5] if args.quick else [10**5, 10**6, 10**7], worlds)
    if "mixing" in args.parts:
        report["mixing"] = mixing()
    if args.record:
        write_results(args.record, report)
        if rows:
            plot(rows, RESULTS / f"{args.record}.png")
        if "mixture" in report:
            plot(report["mixture"]["plan"], RESULTS / f"{args.record}_mixture.png", "slots")


if __name__ == "__main__":
    main()
