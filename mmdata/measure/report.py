"""The `mmdata bench` result: a JSON document (schema `docs/bench.schema.json`), its table, and the
comparison of two results that fails on a regression."""

from __future__ import annotations

import datetime
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from mmdata.checks import parse_json, shown
from mmdata.errors import OptionError

SCHEMA = "mmdata.bench/1"
HIGHER_IS_BETTER = ("samples_per_s", "frames_per_s", "tokens_per_s", "mb_per_s")
LOWER_IS_BETTER = ("latency_p95_ms",)
FRACTIONS_LOWER_IS_BETTER = ("stall_fraction",)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {}
    for package in ("mmdata", "torch", "numpy", "av", "numba", "nvidia-dali-cuda130", "decord"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def build_document(config: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of one bench run: machine, versions, configuration and everything measured."""
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "config": config,
        **measured,
    }


def headline(document: dict[str, Any]) -> dict[str, float]:
    """The figures `--compare` checks, flattened."""
    figures = document["figures"]
    values = {name: float(figures[name]) for name in (*HIGHER_IS_BETTER, *FRACTIONS_LOWER_IS_BETTER)}
    values["latency_p95_ms"] = float(figures["latency_ms"].get("p95", 0.0))
    return values


def compare(old: dict[str, Any], new: dict[str, Any], max_regression: float) -> list[str]:
    """The headline figures of `new` that are worse than `old` by more than `max_regression`.

    Rates and latency compare relatively (5% = 0.05 of the old value); the stall fraction, already
    a share, compares in absolute points.
    """
    before, after = headline(old), headline(new)
    problems = []
    for name in HIGHER_IS_BETTER:
        if before[name] > 0 and (before[name] - after[name]) / before[name] > max_regression:
            problems.append(
                f"{name} fell from {before[name]:g} to {after[name]:g} ({after[name] / before[name] - 1:+.1%})"
            )
    for name in LOWER_IS_BETTER:
        if before[name] > 0 and (after[name] - before[name]) / before[name] > max_regression:
            problems.append(
                f"{name} rose from {before[name]:g} to {after[name]:g} ({after[name] / before[name] - 1:+.1%})"
            )
    for name in FRACTIONS_LOWER_IS_BETTER:
        if after[name] - before[name] > max_regression:
            problems.append(f"{name} rose from {before[name]:.1%} to {after[name]:.1%}")
    return problems


def parse_fraction(text: str) -> float:
    """'5%' or '0.05' as 0.05."""
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if value < 0:
        raise ValueError(f"a regression limit cannot be negative: {text}")
    return value


def load(path: str | Path) -> dict[str, Any]:
    """A result `mmdata bench --json` wrote, with every figure the table, the comparison and the plots read
    checked first; OptionError naming the file and the figure otherwise."""
    try:
        document = parse_json(Path(path).read_bytes(), max_bytes=MAX_RESULT_BYTES)
    except OSError as exc:
        raise OptionError(f"{path} cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise OptionError(f"{path} {exc}; give a file `mmdata bench --json` wrote") from None
    problem = result_problem(document)
    if problem is not None:
        raise OptionError(f"{path} is not an mmdata bench result: {problem}; give a file `mmdata bench --json` wrote")
    return document


MAX_RESULT_BYTES = 64 << 20
_CONFIG_TEXTS = ("dataset", "spec_name", "layout", "decoder", "device")
_CONFIG_COUNTS = ("num_workers", "warmup")
_FIGURES = (
    "steps",
    "wall_seconds",
    "samples_per_s",
    "frames_per_s",
    "tokens_per_s",
    "mb_per_s",
    "stall_fraction",
    "mean_stall_ms",
    "decode_waste",
    "packing_efficiency",
    "rank_token_spread",
)
_OPTIONAL_FIGURES = (
    "step_ms_measured",
    "frame_cache_bound_mb",
    "frame_cache_horizon",
    "frame_cache_peak_mb",
    "frames_evicted",
    "episodes_per_batch",
    "episodes_shared_with_previous",
    "episode_lag1_correlation",
    "instrumentation_share",
    "gpu_memory_mb",
)


def result_problem(document: Any) -> str | None:
    """What in a bench result is missing or of the wrong type (None: nothing), for each field `format_table`,
    `compare` and the plots read."""
    if not isinstance(document, dict):
        return "it is not a JSON object"
    if document.get("schema") != SCHEMA:
        return f"its schema is {document.get('schema')!r}, not {SCHEMA!r}"
    config, figures, stages = document.get("config"), document.get("figures"), document.get("stages")
    if not isinstance(config, dict) or not isinstance(figures, dict) or not isinstance(stages, dict):
        return "it lacks its config, figures or stages"
    for name in _CONFIG_TEXTS:
        if not isinstance(config.get(name), str):
            return f"config.{name} is {shown(config.get(name))}, not text"
    for name in _CONFIG_COUNTS:
        if not _is_number(config.get(name)):
            return f"config.{name} is {shown(config.get(name))}, not a number"
    for name in ("batch_tokens", "batch_size", "step_ms"):
        if config.get(name) is not None and not _is_number(config[name]):
            return f"config.{name} is {shown(config[name])}, not a number"
    problem = _numbers_problem(figures, _FIGURES, "figures") or _numbers_problem(
        {k: v for k, v in figures.items() if k in _OPTIONAL_FIGURES}, (), "figures", optional=True
    )
    if problem:
        return problem
    for name in ("latency_ms", "peak_rss_mb_per_worker"):
        table = figures.get(name)
        if not isinstance(table, dict) or not all(_is_number(v) for v in table.values()):
            return f"figures.{name} is {shown(table)}, not numbers by name"
    problem = _shares_problem(stages.get("main_thread"), "stages.main_thread")
    if problem:
        return problem
    workers = stages.get("workers")
    if workers is not None:
        if not isinstance(workers, dict) or not _is_number(workers.get("utilization")):
            return f"stages.workers is {shown(workers)}, not a utilization and stages"
        problem = _shares_problem(workers.get("stages"), "stages.workers.stages")
        if problem:
            return problem
    for number, row in enumerate(document.get("sweep") or []):
        if not isinstance(row, dict) or not isinstance(row.get("setting"), dict):
            return f"sweep[{number}] is {shown(row)}, not a setting and its figures"
        problem = _numbers_problem(row.get("figures"), ("samples_per_s", "frames_per_s", "stall_fraction"), "sweep")
        if problem:
            return problem
    if document.get("baseline") is not None:
        baseline, ratios = document["baseline"], document.get("ratios")
        problem = _numbers_problem(baseline, ("samples_per_s", "frames_per_s"), "baseline") or _numbers_problem(
            ratios, ("samples_per_s", "frames_per_s"), "ratios"
        )
        if problem:
            return problem
        if not isinstance(baseline.get("name"), str) or not isinstance(baseline.get("description"), str):
            return "baseline lacks its name or description"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers_problem(table: Any, names: tuple[str, ...], where: str, optional: bool = False) -> str | None:
    if not isinstance(table, dict):
        return f"{where} is {shown(table)}, not an object"
    for name in names if not optional else tuple(table):
        if not _is_number(table.get(name)):
            return f"{where}.{name} is {shown(table.get(name))}, not a number"
    return None


def _shares_problem(stages: Any, where: str) -> str | None:
    if not isinstance(stages, dict):
        return f"{where} is {shown(stages)}, not shares by stage"
    for name, value in stages.items():
        if not isinstance(value, dict) or not _is_number(value.get("share")):
            return f"{where}.{name} is {shown(value)}, not a share"
    return None


def format_table(document: dict[str, Any]) -> str:
    """The human-readable table of a bench result."""
    c, f = document["config"], document["figures"]
    latency = f["latency_ms"]
    lines = [
        f"mmdata bench: {c['dataset']} | spec {c['spec_name']} | {c['layout']}"
        + (f" {c['batch_tokens']} tokens" if c.get("batch_tokens") else f" batch {c.get('batch_size')}")
        + (f" | order {c['shuffle']}" if c.get("shuffle") else "")
        + f" | {c['num_workers']} workers | decoder {c['decoder']} | {c['device']}",
        f"  {f['steps']} steps in {f['wall_seconds']:.2f} s after {c['warmup']} warm-up steps"
        + (f", simulated step {c['step_ms']:g} ms" if c.get("step_ms") else ""),
        "",
        _row("samples/s", f"{f['samples_per_s']:,.1f}"),
        _row("frames/s", f"{f['frames_per_s']:,.1f}"),
        _row("tokens/s", f"{f['tokens_per_s']:,.0f}"),
        _row("MB/s read", f"{f['mb_per_s']:,.2f}"),
        _row("packing efficiency", f"{f['packing_efficiency']:.2%}"),
        _row("rank token spread", f"{f['rank_token_spread']:.2%}"),
        _row(
            "batch latency p50/p95/p99", "/".join(f"{latency.get(q, 0.0):.1f}" for q in ("p50", "p95", "p99")) + " ms"
        ),
        _row(
            "input stall",
            f"{f['stall_fraction']:.1%} of steps, mean {f['mean_stall_ms']:.1f} ms"
            + (f" (a step took {f['step_ms_measured']:.1f} ms)" if f.get("step_ms_measured") else ""),
        ),
        _row("decode waste", f"{f['decode_waste']:.2f} frames decoded per frame delivered"),
        *_cpu_rows(f),
        *_text_rows(f, ("frame cache", "frame_cache"), ("WHY THE WASTE", "decode_waste_cause")),
        _row("peak RSS per worker", ", ".join(f"{v:,.0f}" for v in f["peak_rss_mb_per_worker"].values()) + " MB"),
    ]
    if "episodes_per_batch" in f:  # (results written before the mixing figures existed have none)
        lines.append(
            _row(
                "mixing",
                f"{f['episodes_per_batch']:.2f} episodes per batch, {f['episodes_shared_with_previous']:.0%} shared"
                f" with the batch before, lag-1 correlation {f['episode_lag1_correlation']:+.2f}",
            )
        )
    if "instrumentation_share" in f:
        lines.append(_row("stage timers' cost", f"{f['instrumentation_share']:.4%} of a step"))
    if "gpu_memory_mb" in f:
        lines.append(_row("GPU memory (max allocated)", f"{f['gpu_memory_mb']:,.0f} MB"))
    lines += ["", "where the time went:"]
    main = document["stages"]["main_thread"]
    lines.append("  main thread (share of wall time): " + _shares_text(main))
    workers = document["stages"].get("workers")
    if workers:
        lines.append(
            f"  workers ({c['num_workers']}, {workers['utilization']:.0%} busy; share of busy time): "
            + _shares_text(workers["stages"])
        )
        if workers["utilization"] > 1.05:
            lines.append(
                f"  note: the workers were busy {workers['utilization']:.0%} of the measured time, so batches read"
                " before it began are in these rates; the sustained rate is about"
                f" {f['frames_per_s'] / workers['utilization']:,.0f} frames/s (raise --steps or --warmup)"
            )
    tuning = (document.get("loader_stats") or {}).get("autotune")
    if tuning:
        lines += ["", f'num_workers="auto" (at most {tuning["most_workers"]}), its settings over time:']
        for setting in tuning["settings"][-12:]:
            lines.append(
                f"  {setting['at']:7.1f} s  {setting['workers']} workers, read-ahead {setting['read_ahead']}:"
                f" {setting['reason']}"
            )
    sweep = document.get("sweep")
    if sweep:
        lines += ["", "sweep:"]
        for row in sweep:
            f = row["figures"]
            setting = " ".join(f"{k}={v}" for k, v in row["setting"].items())
            lines.append(
                f"  {setting:40s} {f['samples_per_s']:10,.1f} samples/s {f['frames_per_s']:10,.1f} frames/s"
                f"  stall {f['stall_fraction']:.1%}"
            )
    baseline = document.get("baseline")
    if baseline:
        ratios = document["ratios"]
        lines += [
            "",
            f"baseline {baseline['name']} ({baseline['description']}): {baseline['samples_per_s']:,.1f} samples/s,"
            f" {baseline['frames_per_s']:,.1f} frames/s",
            f"  mmdata / baseline: {ratios['samples_per_s']:.2f}x samples/s, {ratios['frames_per_s']:.2f}x frames/s",
        ]
    return "\n".join(lines)


def _cpu_rows(f: dict[str, Any]) -> list[str]:
    """The loader's CPU per sample, against the decode floor where it was measured."""
    if "cpu_ms_per_sample" not in f:  # (results written before these figures existed have none)
        return []
    text = f"{f['cpu_ms_per_sample']:.2f} ms per sample"
    if "decode_cpu_ms_per_sample" in f:
        text += f" ({f['decode_cpu_ms_per_sample']:.2f} ms of it in the decoder)"
    if "cpu_over_decode_floor" in f:
        text += (
            f", {f['cpu_over_decode_floor']:.2f}x the decode floor ({f['decode_floor_ms_per_sample']:.2f} ms: the"
            " frames delivered, decoded once in order with RGB conversion)"
        )
    rows = [_row("loader CPU", text)]
    if "stage_cpu_ms_per_sample" in f:
        by_stage = ", ".join(f"{stage} {ms:.3f}" for stage, ms in f["stage_cpu_ms_per_sample"].items())
        rows.append(_row("CPU by stage (ms/sample)", by_stage))
    return rows


def _shares_text(stages: dict[str, dict[str, float]]) -> str:
    return " | ".join(f"{name} {value['share']:.1%}" for name, value in stages.items() if value["share"] >= 0.0005)


def _text_rows(figures: dict[str, Any], *rows: tuple[str, str]) -> list[str]:
    """A row per (name, figure) whose figure is text (older results have none)."""
    return [_row(name, figures[key]) for name, key in rows if isinstance(figures.get(key), str)]


def _row(name: str, value: str) -> str:
    return f"  {name:28s} {value}"
