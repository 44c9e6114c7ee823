"""`mmdata bench`: is the input pipeline on the critical path of the step, and which stage?"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmdata.checks import dump_json
from mmdata.errors import MmdataError, OptionError
from mmdata.measure.plots import plot_stages, plot_sweep
from mmdata.measure.presets import PRESETS, default_tokens_per, preset_spec
from mmdata.measure.progress import SettlingLine
from mmdata.measure.report import build_document, compare, format_table, load, parse_fraction
from mmdata.measure.sweep import label, parse_sweep
from mmdata.planning.orders import SHUFFLE_MODES
from mmdata.store.dataset import open_dataset
from mmdata.store.filesystem import ReadPolicy
from mmdata.store.handle import open_store
from mmdata.tools.storage import add_storage_options

if TYPE_CHECKING:
    from mmdata.loading.dataloader import DataLoader


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure the loader on a store: throughput, stalls, and where every millisecond goes",
        description=(
            "Run mmdata.DataLoader on DATASET for --steps steps after --warmup, and print samples/s,"
            " frames/s, tokens/s, MB/s, packing efficiency, rank token spread, batch latency percentiles,"
            " the input-stall fraction at a simulated --step-ms training step, decode waste, peak memory,"
            " and the share of wall time each stage took (in the workers and in the main thread)."
            " Without DATASET, a small synthetic store is made first."
        ),
        epilog=(
            "examples:\n"
            "  mmdata bench /data/robot.wds --spec policy --num-workers 8 --step-ms 200\n"
            "  mmdata bench /data/robot.wds --json new.json --compare old.json --max-regression 5%\n"
            "  mmdata bench /data/robot.wds --baseline naive\n"
            "  mmdata bench /data/robot.wds --sweep num_workers=0,2,4 decoder=pyav,decord --plot sweep.png"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", nargs="?", help="store path or URL (default: a synthetic demo store)")
    spec = parser.add_argument_group("what to load")
    spec.add_argument("--spec", choices=PRESETS, default="policy", help="sampling preset (default: policy)")
    spec.add_argument("--streams", help="comma-separated streams to read (default: all)")
    spec.add_argument("--anchor-fps", type=float, help="anchors per second (policy 10, clips 5) or sequence fps")
    spec.add_argument("--max-seconds", type=float, default=8.0, help="sequence chunk length (default 8 s)")
    batching = parser.add_argument_group("batching (batch_size=, or mmdata.Batching)")
    batch = batching.add_mutually_exclusive_group()
    batch.add_argument("--batch-tokens", type=int, help="token budget per micro-batch (default 16384)")
    batch.add_argument("--batch-size", type=int, help="samples per micro-batch instead of a token budget")
    batching.add_argument("--tokens-per", help="tokens per frame / value / audio second, e.g. cam_high=256,audio=50")
    batching.add_argument(
        "--layout", choices=("packed", "padded"), help="default: packed with tokens, padded with size"
    )
    shuffling = parser.add_argument_group("order (shuffle=)")
    shuffling.add_argument(
        "--shuffle",
        choices=SHUFFLE_MODES,
        default="auto",
        help="the epoch's order (default auto: 'blocks' where the spec reads a camera, else 'locality');"
        " the report names the order resolved",
    )
    loader = parser.add_argument_group("runtime (num_workers=, prefetch_factor=, mmdata.Runtime)")
    loader.add_argument(
        "--num-workers",
        type=_auto_or_count("a number of worker processes"),
        default=2,
        help='worker processes (default 2), or "auto": chosen while it runs; the report lists its settings over time',
    )
    loader.add_argument("--prefetch-factor", type=int, default=2)
    loader.add_argument(
        "--decoder",
        default="auto",
        help="auto, pyav, spdl (a segment per call on threads), decord, dali-cpu, dali, nvdec (PyNvVideoCodec fed"
        " packets, no container), spdl-nvdec (NVDEC through SPDL, a segment per call) or hybrid (DALI on the GPU and"
        " PyAV on the host sharing each batch)",
    )
    loader.add_argument(
        "--hybrid-gpu",
        choices=("dali", "nvdec", "spdl-nvdec"),
        default="dali",
        help="the GPU side of --decoder hybrid (default dali); the host side is PyAV in the workers",
    )
    loader.add_argument("--decode-in", choices=("workers", "main"), help="where video is decoded")
    loader.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    loader.add_argument("--world-size", type=int, default=1, help="plan for this many ranks (this process is rank 0)")
    loader.add_argument("--profile-ranges", action="store_true", help="mark stages for torch.profiler and Nsight")
    spec.add_argument("--seed", type=int, default=0)
    reading = parser.add_argument_group("reading (mmdata.Reading)")
    reading.add_argument(
        "--frame-cache-bytes",
        type=_auto_or_count("a number of bytes"),
        default="auto",
        help="decoded frames each worker keeps for its next steps: 'auto' (default) sizes the bound from the plan"
        " within a share of the memory; a number of bytes fixes it; 0 turns the cache off",
    )
    reading.add_argument(
        "--cache-dir",
        help="keep pieces fetched from object storage on local disk here (ReadPolicy.cache_dir): a second run reads"
        " them from disk",
    )
    run = parser.add_argument_group("the run")
    run.add_argument("--steps", type=int, default=50, help="measured steps (default 50)")
    run.add_argument(
        "--warmup",
        type=int,
        help="steps before measuring (default: workers x prefetch factor + 2, so the measured steps do not"
        " start from a queue the workers filled in advance)",
    )
    run.add_argument("--step-ms", type=float, default=0.0, help="simulate a training step of this many ms")
    output = parser.add_argument_group("output and comparison")
    output.add_argument("--json", help="write the full result here (schema: docs/bench.schema.json)")
    output.add_argument("--compare", help="an earlier --json result; exit 1 if a headline figure regressed")
    output.add_argument("--max-regression", default="5%", help="allowed regression for --compare (default 5%%)")
    output.add_argument("--from-json", help="report (and --compare) this earlier result instead of running")
    output.add_argument("--baseline", choices=("naive",), help="also run the naive webdataset + PyAV loader")
    output.add_argument("--baseline-seconds", type=float, default=20.0, help="how long to run the baseline")
    output.add_argument("--sweep", nargs="+", metavar="NAME=V1,V2", help="run every combination of these settings")
    output.add_argument(
        "--plot",
        help="PNG chart: where the time went and the input stall, or with --sweep samples/s per setting (needs"
        " matplotlib: pip install 'mmdata[bench]')",
    )
    add_storage_options(parser)
    parser.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    try:
        limit = parse_fraction(args.max_regression)
    except ValueError as exc:
        raise MmdataError(f"--max-regression: {exc}") from None
    if args.plot:
        args.plot = plot_path(args.plot)
    if args.from_json:
        document = load(args.from_json)
    elif args.dataset:
        document = _measure(args, args.dataset)
    else:
        with tempfile.TemporaryDirectory(prefix="mmdata-bench-") as folder:
            document = _measure(args, _demo_store(Path(folder)))
    print(format_table(document))
    if args.plot and not args.sweep:
        plot_stages(document, args.plot, f"mmdata bench {document['config'].get('spec_name', '')}".strip())
        print(f"plot written to {args.plot}")
    if args.json and not args.from_json:
        Path(args.json).write_text(dump_json(document, indent=1) + "\n")
        print(f"\nwritten {args.json}")
    if args.compare:
        problems = compare(load(args.compare), document, limit)
        if problems:
            print(f"\nREGRESSION against {args.compare} (limit {limit:.1%}):")
            for problem in problems:
                print(f"  {problem}")
            return 1
        print(f"\nno headline figure regressed by more than {limit:.1%} against {args.compare}")
    return 0


PLOT_FORMATS = (".png", ".svg", ".pdf")


def plot_path(text: str) -> Path:
    """Where --plot writes: the file named (".png" added to a name without a suffix); OptionError for a folder or
    a format the chart is not written in, before anything is measured."""
    path = Path(text)
    if path.is_dir():
        raise OptionError(f"--plot '{text}' is a folder; name the chart's file, such as {path / 'bench.png'}")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise OptionError(f"--plot '{text}': a chart is written as {', '.join(PLOT_FORMATS)}, not {path.suffix}")
    return path


def _measure(args: argparse.Namespace, dataset: str) -> dict[str, Any]:
    from mmdata.loading.dataloader import DataLoader
    from mmdata.measure.runner import run_loader

    schema = open_store(dataset).schema
    spec = preset_spec(
        schema, args.spec, args.streams.split(",") if args.streams else None, args.anchor_fps, args.max_seconds
    )
    tokens_per = default_tokens_per(spec, args.spec) | _parse_tokens(args.tokens_per)
    options: dict[str, Any] = {
        "tokens_per": tokens_per,
        "batch_tokens": args.batch_tokens if args.batch_tokens or args.batch_size else 16384,
        "batch_size": args.batch_size,
        "layout": args.layout,
        "shuffle": args.shuffle,
        "num_workers": args.num_workers,
        "prefetch_factor": args.prefetch_factor,
        "decoder": _decoder(args),
        "decode_in": args.decode_in,
        "device": args.device,
        "rank": 0,
        "world_size": args.world_size,
        "profiler_ranges": args.profile_ranges,
        "frame_cache_bytes": args.frame_cache_bytes,
    }
    loader = DataLoader(dataset, spec, seed=args.seed, **_groups(args, options))
    warmup = _warmup(args, options)
    settling = SettlingLine(loader.stats) if args.num_workers == "auto" else None
    measured = run_loader(loader, args.steps, warmup, args.step_ms, progress=settling)
    config = {
        "dataset": dataset,
        "spec_name": args.spec,
        "spec": spec.describe(),
        "tokens_per": tokens_per,
        "batch_tokens": options["batch_tokens"],
        "batch_size": args.batch_size,
        "layout": loader.layout,
        "shuffle": loader.shuffle,
        "num_workers": loader.num_workers,
        "prefetch_factor": args.prefetch_factor,
        "decoder": loader.decoder.describe(),
        "decode_in": "main" if loader.decode_in_main else "workers",
        "device": str(loader.device),
        "world_size": args.world_size,
        "seed": args.seed,
        "cache_dir": args.cache_dir,
        "frame_cache_bytes": args.frame_cache_bytes,
        "steps": args.steps,
        "warmup": warmup,
        "step_ms": args.step_ms,
        "samples": len(loader.samples),
    }
    if args.sweep:
        measured["sweep"] = _sweep(args, dataset, spec, options)
    if args.baseline:
        measured.update(_baseline(args, dataset, spec, loader, measured["figures"]))
    return build_document(config, measured)


def _decoder(args: argparse.Namespace) -> Any:
    """`--decoder` by name, or the hybrid decoder built with `--hybrid-gpu` as its GPU side."""
    if args.decoder != "hybrid" or args.hybrid_gpu == "dali":
        return args.decoder
    import torch

    from mmdata.codecs.decoders import make_video_decoder

    device = torch.device(args.device).index or 0
    helpers = max(1, _first_workers(args.num_workers))
    return make_video_decoder("hybrid", [], gpu=args.hybrid_gpu, helpers=helpers, device_id=device)


def _auto_or_count(what: str) -> Callable[[str], int | str]:
    """An option's parser that takes "auto" or a whole number (`what`, named when refused)."""

    def parse(text: str) -> int | str:
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'auto' or {what}, not {text!r}") from None

    return parse


def _groups(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """The loader's keywords from the options set by name (PyTorch's words plainly, the rest in their groups),
    reading through `--cache-dir` when given."""
    from mmdata.loading.loader_options import Reading, split_keywords

    torch_words, groups = split_keywords({k: v for k, v in options.items() if v is not None})
    if args.cache_dir:
        groups["reading"] = dataclasses.replace(
            groups["reading"] or Reading(), policy=ReadPolicy(cache_dir=args.cache_dir)
        )
    return {**torch_words, **{group: value for group, value in groups.items() if value is not None}}


def _sweep(args: argparse.Namespace, dataset: str, spec, options: dict[str, Any]) -> list[dict[str, Any]]:
    from mmdata.loading.dataloader import DataLoader
    from mmdata.measure.runner import run_loader

    rows = []
    for setting in parse_sweep(args.sweep):
        overrides = dict(setting)
        if "batch_size" in overrides:
            overrides["batch_tokens"] = None
        elif "batch_tokens" in overrides:
            overrides["batch_size"] = None
        loader = DataLoader(dataset, spec, seed=args.seed, **_groups(args, options | overrides))
        figures = run_loader(loader, args.steps, _warmup(args, options | overrides), args.step_ms)["figures"]
        rows.append({"setting": setting, "decoder": loader.decoder.describe(), "figures": figures})
        print(
            f"sweep {label(setting):40s} {figures['samples_per_s']:10,.1f} samples/s"
            f" {figures['frames_per_s']:10,.1f} frames/s  stall {figures['stall_fraction']:.1%}"
        )
    if args.plot:
        title = f"mmdata bench {args.spec} on {Path(dataset).name}" + (
            f", {args.step_ms:g} ms step" if args.step_ms else ""
        )
        plot_sweep(rows, args.plot, title, show_stalls=args.step_ms > 0)
        print(f"plot written to {args.plot}")
    return rows


def _baseline(args: argparse.Namespace, dataset: str, spec, loader: DataLoader, figures: dict) -> dict[str, Any]:
    from mmdata.measure.naive import export_naive_shards, naive_loader, run_naive
    from mmdata.measure.runner import simulated_step

    samples_per_batch = max(1, round(figures["samples_per_s"] * figures["wall_seconds"] / max(1, figures["steps"])))
    with tempfile.TemporaryDirectory(prefix="mmdata-naive-") as folder:
        started = time.perf_counter()
        shards = export_naive_shards(open_dataset(dataset), Path(folder))
        print(f"baseline: wrote {len(shards)} naive shards in {time.perf_counter() - started:.1f} s")
        baseline = naive_loader(shards, spec, samples_per_batch, loader.num_workers)
        measured = run_naive(baseline, spec, args.baseline_seconds, step=simulated_step(args.step_ms, loader.device))
    measured.update(
        name="naive",
        description="webdataset + PyAV decoding whole videos per sample + padding collate",
        batch_size=samples_per_batch,
    )
    ratios = {
        key: round(figures[key] / measured[key], 3) if measured[key] else None
        for key in ("samples_per_s", "frames_per_s")
    }
    return {"baseline": measured, "ratios": ratios}


def _warmup(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """--warmup, or enough steps to drain what the workers read ahead before measuring starts."""
    if args.warmup is not None:
        return args.warmup
    return _first_workers(options["num_workers"]) * options["prefetch_factor"] + 2


def _first_workers(num_workers: int | str) -> int:
    """The workers a loader given `num_workers` starts with ("auto": where its tuner starts)."""
    from mmdata.loading.loader_options import worker_count

    return worker_count("auto" if num_workers == "auto" else int(num_workers), None).first


def _parse_tokens(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    tokens = {}
    for item in text.split(","):
        name, separator, value = item.partition("=")
        if not separator:
            raise MmdataError(f"--tokens-per item '{item}' must look like stream=tokens")
        tokens[name.strip()] = float(value)
    return tokens


def _demo_store(folder: Path) -> str:
    from mmdata.conversion.pipeline import ConvertOptions, convert
    from mmdata.importers.raw import discover_raw_episodes
    from mmdata.synthetic import SynthSpec, write_synthetic_dataset

    started = time.perf_counter()
    raw = folder / "raw"
    write_synthetic_dataset(raw, SynthSpec(episodes=6, min_seconds=2.0, max_seconds=8.0))
    store = folder / "demo.wds"
    convert(discover_raw_episodes(raw), store, ConvertOptions(layout="wds", progress=False))
    print(f"made a synthetic demo store ({store}) in {time.perf_counter() - started:.1f} s\n")
    return str(store)
