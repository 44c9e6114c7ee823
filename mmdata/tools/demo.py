"""`mmdata demo`: synthesize, convert to both layouts, verify, read back, and report."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np

from mmdata.codecs.audio import decode_audio
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.store.dataset import open_dataset
from mmdata.store.verification import verify_dataset
from mmdata.synthetic import SynthSpec, read_index_stripe, write_synthetic_dataset
from mmdata.tools.formatting import format_bytes


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "demo",
        help="end-to-end demo: synthesize episodes, convert to WebDataset and Zarr, verify, read back",
        description=(
            "Write a small synthetic raw dataset, convert it to both store layouts, verify both, read a"
            " window of a few episodes back and check it against the source (frame stripes, exact"
            " low-dim values, exact audio). Exits non-zero if any check fails."
        ),
    )
    parser.add_argument("--output", help="folder to keep the demo in (default: a temporary folder)")
    parser.add_argument("--episodes", type=int, default=6, help="number of episodes (default 6)")
    parser.add_argument("--workers", type=int, default=None, help="conversion workers (default: all cores)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.output:
        return _demo(Path(args.output), args)
    with tempfile.TemporaryDirectory(prefix="mmdata-demo-") as folder:
        return _demo(Path(folder), args)


def _demo(root: Path, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    raw = root / "raw"
    spec = SynthSpec(episodes=args.episodes, min_seconds=2.0, max_seconds=8.0)
    print(f"1. synthesizing {spec.episodes} episodes ({spec.min_seconds:g}-{spec.max_seconds:g} s) into {raw}")
    write_synthetic_dataset(raw, spec)
    sources = discover_raw_episodes(raw)
    failures = 0
    layouts: tuple[Literal["wds", "zarr"], ...] = ("wds", "zarr")
    for step, layout in enumerate(layouts, start=2):
        store = root / f"demo.{layout}"
        options = ConvertOptions(
            layout=layout, shard_bytes=2_000_000, workers=args.workers, overwrite=True, progress=False
        )
        report = convert(sources, store, options)
        print(
            f"{step}. converted to {layout}: {report.converted} episodes in {report.seconds:.1f} s,"
            f" {format_bytes(report.input_bytes)} -> {format_bytes(report.output_bytes)}"
        )
        verified = verify_dataset(str(store), progress=False)
        status = "OK" if verified.ok else f"FAILED ({len(verified.failures)} episodes)"
        print(f"   verify: {status}, {verified.pieces} pieces, {verified.frames_decoded} frames decoded")
        failures += len(verified.failures)
        failures += _check_read_back(str(store), raw, spec)
        failures += _check_policy_windows(str(store), spec)
    verdict = "all checks passed" if not failures else f"{failures} checks FAILED"
    print(f"demo finished in {time.perf_counter() - started:.1f} s: {verdict}")
    return 0 if not failures else 1


def _check_read_back(store: str, raw: Path, spec: SynthSpec) -> int:
    """Read a one-second window of three episodes and compare it with the source files."""
    dataset = open_dataset(store)
    failures = 0
    for index in range(min(3, len(dataset))):
        episode = dataset.read_episode(index, t0=1.0, t1=2.0)
        source = raw / dataset.manifest.row(index)["source"]
        camera = episode["cam_high"]
        stripes = [read_index_stripe(frame) for frame in camera.values]
        expected = np.rint(camera.timestamps * spec.fps).astype(int).tolist()
        state = episode["state"]
        source_state = np.load(source / "state.npy")[np.rint(state.timestamps * spec.lowdim_rate).astype(int)]
        audio = episode["audio"]
        source_audio, _ = decode_audio(str(source / "audio.wav"))
        first = int(round(audio.timestamps[0] * spec.audio_rate))
        checks = {
            "frames": stripes == expected,
            "state": np.array_equal(state.values, source_state),
            "audio": np.array_equal(audio.values, source_audio.samples[first : first + len(audio.values)]),
        }
        failed = [name for name, ok in checks.items() if not ok]
        failures += len(failed)
        print(
            f"   episode {index} '{episode.task}' [1 s, 2 s): {len(camera.values)} frames"
            f" {camera.values.shape[1:]}, {len(state.values)} state rows, {len(audio.values)} audio samples"
            f" -> {'matches source' if not failed else 'MISMATCH in ' + ', '.join(failed)}"
        )
    return failures


def _check_policy_windows(store: str, spec: SynthSpec) -> int:
    """Sample policy windows by time, as training does: 2 frames per camera, 10 future actions, 1 s of audio."""
    dataset = open_dataset(store)
    rng = np.random.default_rng(0)
    failures = 0
    for _ in range(4):
        index = int(rng.integers(len(dataset)))
        anchor = int(rng.integers(dataset.manifest.row(index)["cam_high/count"])) / spec.fps
        times = [anchor - 0.1, anchor]
        for camera in ("cam_high", "cam_wrist"):
            frames = dataset.frames_at(index, camera, times)
            expected = [max(0, round(t * spec.fps)) for t in times]
            failures += [read_index_stripe(f) for f in frames.values] != expected
            failures += frames.is_pad is None or frames.is_pad.tolist() != [t < 0 for t in times]
        actions = dataset.values_at(index, "action", [anchor + k / spec.lowdim_rate for k in range(10)])
        audio = dataset.audio_between(index, "audio", anchor - 1.0, anchor)
        failures += len(actions.values) != 10 or len(audio.values) != spec.audio_rate
    print(
        f"   policy windows (decoder '{dataset.decoder.name}'): 4 anchors x 2 cameras x 2 frames, 10 actions,"
        f" 1 s audio -> {'frames at the right times' if not failures else f'{failures} MISMATCHES'};"
        f" decode waste {dataset.decoder.stats.decode_waste:.2f}"
    )
    return failures
