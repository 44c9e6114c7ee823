"""Training-ready batches, measured in one run: frames resized inside the decode against full-size
decoding then a torch resize in the worker, and a mixture of three stores against one store of
the same data.

Resize: a 480x640 store (default `--access both`, and `--access windows` for policy windows)
delivered at 224x224 by `Frames(resize=Resize((224, 224), "shorter_side", "bilinear"))`. The
baseline is the same loader with a backend that decodes full frames and hands them to torch's
antialiased `interpolate` (uint8, its fastest path) in the worker: exactly what a user would
otherwise bolt on per sample. Also reported: the mean absolute difference of the two outputs.

Mixture: the same raw episodes converted once into one store and once split into three stores
(WebDataset, Zarr, WebDataset); `Mixture` of the three with their natural weights (every sample
once per epoch) against the one store, same spec, batch and workers.

Loaders run in alternating rounds, since this VM's speed drifts by up to 2x within minutes;
samples/s are medians over rounds and ratios the median of the ratios within each round.
Results go to `benchmarks/results/training_batches_<tag>.json`, machine named.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from machine import machine_name
from process_time import measure as timed_loop

import mmdata
from mmdata.codecs.decoders.base import SequentialDecoder
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.video_encode import encoding_for_access
from mmdata.conversion.encode import EncodeOptions
from mmdata.conversion.pipeline import ConvertOptions, convert
from mmdata.importers.raw import discover_raw_episodes
from mmdata.synthetic import CameraSpec, SynthSpec, write_synthetic_dataset

RESULTS = Path(__file__).parent / "results"
MODEL_SIZE = (224, 224)


class FullFramesThenTorch(SequentialDecoder):
    """The baseline: PyAV decodes full-size frames; the base class then resizes them with torch
    (`fit_frames`) in the same worker, as a per-sample transform after decoding would."""

    name = "pyav-then-torch"
    codecs = PyAvDecoder.codecs

    def __init__(self):
        super().__init__()
        self.inner = PyAvDecoder()

    def describe(self) -> str:
        return "pyav full frames, then torch interpolate(antialias=True) in the worker"

    def _decode_one(self, request):
        before = self.inner.stats.frames_decoded
        (frames,) = self.inner.decode([dataclasses.replace(request, geometry=None)])
        return frames, self.inner.stats.frames_decoded - before


def resize_spec(interpolation: str) -> mmdata.Windows:
    resize = mmdata.Resize(MODEL_SIZE, "shorter_side", interpolation)
    return mmdata.Windows(anchor_fps=10, streams={"cam_high": mmdata.Frames(offsets=[-0.1, 0.0], resize=resize)})


MIXTURE_SPEC = mmdata.Windows(
    anchor_fps=10,
    streams={
        "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
        "state": mmdata.Values(offsets=[-0.1, 0.0]),
        "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
    },
)


def measure(loaders: dict[str, mmdata.DataLoader], rounds: int, seconds: float) -> dict[str, dict]:
    """Samples/s and samples per CPU-second (main process and workers) of each loader in `rounds`
    rounds whose order rotates: medians, and every round."""
    runs: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in loaders}
    names = list(loaders)
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            figures = timed_loop(lambda name=name: iter(loaders[name]), lambda b: len(b["sample_index"]), seconds)
            runs[name]["wall"].append(figures["samples_per_s"])
            runs[name]["cpu"].append(figures["samples_per_cpu_s"])
            loaders[name].close()
    return {
        name: {
            "samples_per_s": round(statistics.median(v["wall"]), 1),
            "samples_per_cpu_s": round(statistics.median(v["cpu"]), 1),
            "rounds": v["wall"],
            "rounds_per_cpu_s": v["cpu"],
        }
        for name, v in runs.items()
    }


def paired_ratio(first: list[float], second: list[float]) -> float:
    """The median over rounds of first / second measured in the same round (robust to the VM's drift)."""
    return statistics.median(a / b for a, b in zip(first, second))


def resize_part(folder: Path, args) -> dict:
    raw = folder / "raw-480p"
    write_synthetic_dataset(
        raw,
        SynthSpec(
            episodes=args.episodes, min_seconds=4.0, max_seconds=8.0, cameras=(CameraSpec("cam_high", 640, 480),)
        ),
    )
    part: dict = {}
    for access in ("both", "windows"):
        store = folder / f"480p-{access}.wds"
        encode = EncodeOptions(video=encoding_for_access(access))
        convert(discover_raw_episodes(raw), store, ConvertOptions(layout="wds", encode=encode, progress=False))
        for interpolation in ("bilinear", "area"):
            spec = resize_spec(interpolation)
            loaders = {
                "inside_decode": mmdata.DataLoader(
                    str(store), spec, batch_size=args.batch_size, num_workers=args.workers, seed=1
                ),
                "full_then_torch": mmdata.DataLoader(
                    str(store),
                    spec,
                    batch_size=args.batch_size,
                    num_workers=args.workers,
                    seed=1,
                    runtime=mmdata.Runtime(decoder=FullFramesThenTorch()),
                ),
            }
            figures = measure(loaders, args.rounds, args.seconds)
            ratio = paired_ratio(figures["inside_decode"]["rounds"], figures["full_then_torch"]["rounds"])
            cpu_ratio = paired_ratio(
                figures["inside_decode"]["rounds_per_cpu_s"], figures["full_then_torch"]["rounds_per_cpu_s"]
            )
            first = {
                name: next(
                    iter(
                        mmdata.DataLoader(
                            str(store),
                            spec,
                            batch_size=args.batch_size,
                            seed=1,
                            runtime=mmdata.Runtime(decoder=d),
                            num_workers=0,
                        )
                    )
                )
                for name, d in (("inside", "pyav"), ("after", FullFramesThenTorch()))
            }
            difference = (first["inside"]["cam_high"].float() - first["after"]["cam_high"].float()).abs()
            part[f"{access}/{interpolation}"] = {
                **figures,
                "ratio": round(ratio, 2),
                "ratio_per_cpu_s": round(cpu_ratio, 2),
                "mean_abs_difference": round(float(difference.mean()), 3),
            }
            print(
                f"resize access={access:8s} {interpolation:8s} inside decode"
                f" {figures['inside_decode']['samples_per_s']:7.1f} samples/s, full+torch"
                f" {figures['full_then_torch']['samples_per_s']:7.1f}: {ratio:.2f}x ({cpu_ratio:.2f}x per CPU-s)"
                f" (outputs differ by {float(difference.mean()):.2f} levels on average)"
            )
    return part


def mixture_part(folder: Path, args) -> dict:
    raw = folder / "raw-mixture"
    spec = SynthSpec(
        episodes=args.episodes * 3, min_seconds=3.0, max_seconds=10.0, cameras=(CameraSpec("cam_high", 224, 224),)
    )
    folders = write_synthetic_dataset(raw, spec)
    one = folder / "one.wds"
    convert(discover_raw_episodes(raw), one, ConvertOptions(layout="wds", progress=False))
    parts = []
    for number, layout in enumerate(("wds", "zarr", "wds")):
        piece = folder / f"part{number}"
        piece.mkdir()
        for episode in folders[number::3]:
            shutil.copytree(episode, piece / episode.name)
        destination = folder / f"part{number}.{layout}"
        convert(discover_raw_episodes(piece), destination, ConvertOptions(layout=layout, progress=False))
        parts.append(mmdata.Source(str(destination), name=f"part{number}"))
    mixture = mmdata.Mixture(parts)
    loaders = {
        "one_store": mmdata.DataLoader(str(one), MIXTURE_SPEC, batch_size=args.batch_size, num_workers=args.workers),
        "mixture_of_three": mmdata.DataLoader(
            mixture, MIXTURE_SPEC, batch_size=args.batch_size, num_workers=args.workers
        ),
    }
    assert len(loaders["one_store"].samples) == len(loaders["mixture_of_three"].samples)
    figures = measure(loaders, args.rounds, args.seconds)
    cost = 1 - paired_ratio(figures["mixture_of_three"]["rounds"], figures["one_store"]["rounds"])
    cpu_cost = 1 - paired_ratio(
        figures["mixture_of_three"]["rounds_per_cpu_s"], figures["one_store"]["rounds_per_cpu_s"]
    )
    print(
        f"mixture of three {figures['mixture_of_three']['samples_per_s']:7.1f} samples/s, one store"
        f" {figures['one_store']['samples_per_s']:7.1f}: costs {cost:+.1%} ({cpu_cost:+.1%} per CPU-s)"
    )
    return {
        **figures,
        "samples": len(loaders["one_store"].samples),
        "cost": round(cost, 4),
        "cost_per_cpu_s": round(cpu_cost, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per loader per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="cpu", help="suffix of the results file name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mmdata-training-batches-") as folder:
        resize = resize_part(Path(folder), args)
        mixture = mixture_part(Path(folder), args)
    record = {
        "benchmark": "training_batches_bench",
        "machine": machine_name(),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "seconds_per_round": args.seconds,
        "rounds": args.rounds,
        "versions": {"mmdata": mmdata.__version__, "torch": torch.__version__},
        "resize_480x640_to_224x224": resize,
        "mixture_of_three_vs_one_store": mixture,
        "wall_seconds": round(time.time() - started),
        "ratios": {
            **{f"resize_{k}": v["ratio"] for k, v in resize.items()},
            **{f"resize_{k}_per_cpu_s": v["ratio_per_cpu_s"] for k, v in resize.items()},
            "mixture_cost": mixture["cost"],
            "mixture_cost_per_cpu_s": mixture["cost_per_cpu_s"],
        },
        "note": "samples/s are medians over alternating rounds; ratios are medians of per-round ratios",
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"training_batches_{args.tag}.json"
    path.write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    main()
