"""The default store against LeRobot's on data LeRobot wrote: bytes, fidelity to the source, decode speed.

For each content (`smooth`: mmdata.synthetic's frames, whose flat regions a camera's scenes share; `textured`: the
same with a fine noise texture drifting across them) a LeRobot v3.0 dataset is written by lerobot's own writer
(`lerobot_side.py`, in lerobot_bench.py's virtual environment), then converted with `mmdata convert --from lerobot`
with each of SETTINGS' encoder options (the default now, the default before it; all else the default). Per store:

- `vs_lerobot`: its bytes over the LeRobot dataset's (the whole folders: video, data, metadata);
- `psnr_db`: the store's decoded frames against the LeRobot videos' decoded frames, every frame of every camera,
  both converted to RGB the same way (what converting loses; LeRobot's own encoding of the recording is the same
  on both sides);
- `decode_ms_per_frame`: the process CPU per frame of decoding every segment in order with RGB conversion (PyAV,
  one thread: the decode floor's measure), the median of `--rounds` rounds whose order rotates between stores.

Results go to benchmarks/results/store_size_<tag>.json with the machine named.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import av
import numpy as np
from lerobot_bench import CAMERAS, convert, ensure_venv, folder_bytes, lerobot_run
from machine import machine_name, write_results

import mmdata
from mmdata.codecs.colour import to_rgb
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder
from mmdata.codecs.decoders.requests import ClipRequest

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
# name -> `mmdata convert` options: the encoder settings compared
SETTINGS = {
    "fast-crf20": ["--preset", "fast", "--crf", "20"],  # the default until x264's medium preset at crf 19.5
    "default": [],
    "medium-crf20": ["--preset", "medium", "--crf", "20"],
}


def write_source(python: Path, root: Path, args: argparse.Namespace, texture: bool) -> Path:
    if not (root / "meta" / "info.json").exists():
        print(f"writing {root} with lerobot's writer", flush=True)
        options = ["--episodes", str(args.episodes), "--seconds", str(args.episode_seconds)]
        options += ["--height", str(args.height), "--width", str(args.width)] + (["--texture"] if texture else [])
        lerobot_run(python, "write", str(root), *options)
    return root


def source_frames(source: Path, camera: str) -> np.ndarray:
    """Every frame of `camera` in the LeRobot dataset, its video files in order (episodes follow each other),
    converted to RGB as the store's decoder converts (exactly rounded: FFmpeg's default rounds down)."""
    frames = []
    for video in sorted((source / "videos" / camera).rglob("*.mp4")):
        with av.open(str(video)) as container:
            frames.extend(to_rgb(frame) for frame in container.decode(video=0))
    return np.stack(frames)


def store_frames(store: Path, camera: str) -> np.ndarray:
    """Every frame of `camera` in the store, episode by episode in the source's order."""
    dataset = mmdata.open_dataset(str(store))

    def source_episode(row: int) -> int:
        return dataset.metadata_of(dataset.manifest.row(row))["lerobot_episode_index"]

    order = sorted(range(len(dataset)), key=source_episode)
    return np.concatenate([dataset.read_episode(row, [camera]).streams[camera].values for row in order])


def psnr_db(store: Path, source: Path) -> float:
    """PSNR of the store's frames against the source's, over every frame of every camera."""
    squared, count = 0.0, 0
    for camera in CAMERAS:
        stored, original = store_frames(store, camera), source_frames(source, camera)
        if stored.shape != original.shape:
            raise RuntimeError(f"{store}: {camera} holds {stored.shape} frames, the source {original.shape}")
        difference = stored.astype(np.float64) - original.astype(np.float64)
        squared += float(np.sum(difference * difference))
        count += difference.size
    return round(float(10 * np.log10(255.0**2 / (squared / count))), 2)


def segment_requests(store: Path) -> list[ClipRequest]:
    """Every segment of every camera as a request for all its frames, read into memory."""
    dataset = mmdata.open_dataset(str(store))
    requests = []
    for row in range(len(dataset)):
        for camera in CAMERAS:
            requests.extend(dataset.store.plan_span(row, camera, -np.inf, np.inf).requests)
    return requests


def decode_ms_per_frame(requests: list[ClipRequest], decoder: PyAvDecoder) -> float:
    started, frames = time.process_time(), 0
    for request in requests:
        frames += sum(len(output) for output in decoder.decode([request]))
    return 1000 * (time.process_time() - started) / frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"of {', '.join(SETTINGS)}, comma-separated")
    parser.add_argument("--contents", default="smooth,textured", help="smooth and/or textured, comma-separated")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--episode-seconds", type=float, default=6.0)
    parser.add_argument("--height", type=int, default=224)
    parser.add_argument("--width", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "lerobot-venv")
    parser.add_argument("--lerobot-version", default="0.4.4")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mmdata-bench" / "store-size")
    parser.add_argument("--record", default=None, help="write benchmarks/results/store_size_<RECORD>.json")
    args = parser.parse_args()
    python = ensure_venv(args.venv, args.lerobot_version)
    settings, contents = args.settings.split(","), args.contents.split(",")
    shape = f"{args.episodes}x{args.episode_seconds:g}s-{args.height}x{args.width}"
    report: dict = {"benchmark": "store_size_bench", "machine": machine_name(), "dataset": shape, "contents": {}}
    for content in contents:
        source = write_source(python, args.workdir / f"lerobot-{content}-{shape}", args, content == "textured")
        stores = {}
        for setting in settings:
            stores[setting] = args.workdir / f"store-{content}-{shape}-{setting}.wds"
            convert(TREE, source, stores[setting], "wds", *SETTINGS[setting])
        lerobot_bytes = folder_bytes(source)
        figures = {
            setting: {
                "bytes": folder_bytes(store),
                "vs_lerobot": round(folder_bytes(store) / lerobot_bytes, 3),
                "psnr_db": psnr_db(store, source),
            }
            for setting, store in stores.items()
        }
        requests = {setting: segment_requests(store) for setting, store in stores.items()}
        decoder = PyAvDecoder()
        decoder.decode(requests[settings[0]][:1])
        times: dict[str, list[float]] = {setting: [] for setting in settings}
        for number in range(args.rounds):
            shift = number % len(settings)
            for setting in settings[shift:] + settings[:shift]:
                times[setting].append(decode_ms_per_frame(requests[setting], decoder))
        for setting in settings:
            figures[setting]["decode_ms_per_frame"] = round(statistics.median(times[setting]), 4)
            figures[setting]["decode_ms_per_frame_runs"] = [round(t, 4) for t in times[setting]]
            figures[setting]["options"] = " ".join(SETTINGS[setting]) or "(the default)"
            print(f"{content} {setting}: {figures[setting]}", flush=True)
        report["contents"][content] = {"lerobot_bytes": lerobot_bytes, "stores": figures}
    if args.record:
        write_results(f"store_size_{args.record}", report)


if __name__ == "__main__":
    main()
