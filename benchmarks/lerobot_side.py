"""LeRobot's side of `lerobot_bench.py`, run by the interpreter of a virtual environment holding lerobot.

    write ROOT --episodes N --seconds S [--height H --width W]   write a LeRobot v3.0 dataset with lerobot's
                                          own writer (cameras of 224x224 unless given)
    load ROOT --backend B --workers W --seconds S   LeRobotDataset + torch DataLoader throughput (JSON)
    first ROOT --backend B --workers W    from LeRobotDataset(...) to the first batch of its torch DataLoader (JSON)
    sample ROOT --count N --seed S        N random samples: frame identities, state, action, pads (JSON)

Frames carry a 16-bit stripe (see mmdata.synthetic) holding episode * 1000 + frame index, so a
decoded frame says which frame it is on both sides. Prints one JSON object on stdout.
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()  # (the imports below timed apart, for `first`)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402
from process_time import measure  # noqa: E402

from mmdata.synthetic import draw_index_stripe, read_index_stripe, synthetic_frame  # noqa: E402

_IMPORTED = time.perf_counter()

FPS = 30
SIZE = 224
DOF = 14
CAMERAS = ("observation.images.cam_high", "observation.images.cam_wrist")
# The policy window: cam_high at t-0.1 and t, cam_wrist at t, state at t-0.1 and t, 16 actions.
DELTA_TIMESTAMPS = {
    CAMERAS[0]: [-0.1, 0.0],
    CAMERAS[1]: [0.0],
    "observation.state": [-0.1, 0.0],
    "action": [i / FPS for i in range(16)],
}
BATCH = 8


def stripe_value(episode: int, frame: int) -> int:
    return episode * 1000 + frame


def textured(frame: np.ndarray, index: int, texture: np.ndarray) -> np.ndarray:
    """`frame` with a fine noise texture drifting across it (as a camera's scene has): smooth synthetic frames
    encode and decode far cheaper than recordings do."""
    shifted = np.roll(texture, (index, 2 * index), axis=(0, 1))
    return np.clip(frame.astype(np.int16) + shifted, 0, 255).astype(np.uint8)


def write(
    root: Path, episodes: int, seconds: float, height: int = SIZE, width: int = SIZE, texture: bool = False
) -> dict:
    video = {"dtype": "video", "shape": (height, width, 3), "names": ["height", "width", "channels"]}
    features = {
        **{camera: video for camera in CAMERAS},
        "observation.state": {"dtype": "float32", "shape": (DOF,), "names": [f"joint_{i}" for i in range(DOF)]},
        "action": {"dtype": "float32", "shape": (DOF,), "names": [f"joint_{i}" for i in range(DOF)]},
    }
    dataset = LeRobotDataset.create(
        "mmdata/measure", FPS, features, root=root, robot_type="bench", image_writer_threads=4
    )
    frames = int(seconds * FPS)
    noise = np.random.default_rng(1).integers(-24, 25, (height, width, 1), dtype=np.int16)
    base = {(c, i): synthetic_frame(i, c, height, width) for c in range(len(CAMERAS)) for i in range(frames)}
    if texture:
        base = {(c, i): textured(frame, i, noise) for (c, i), frame in base.items()}
    rng = np.random.default_rng(0)
    for episode in range(episodes):
        length = frames - int(rng.integers(0, FPS))
        phase = rng.uniform(0, 2 * np.pi, DOF).astype(np.float32)
        for i in range(length):
            row = {"task": f"task {episode % 3}"}
            for c, camera in enumerate(CAMERAS):
                image = base[(c, i)].copy()
                draw_index_stripe(image, stripe_value(episode, i))
                row[camera] = image
            t = np.float32(i / FPS)
            row["observation.state"] = np.sin(phase + t).astype(np.float32)
            row["action"] = np.sin(phase + t + np.float32(1 / FPS)).astype(np.float32)
            dataset.add_frame(row)
        dataset.save_episode()
    dataset.finalize()
    return {"episodes": episodes, "frames": dataset.meta.total_frames}


def load(root: Path, backend: str, workers: int, seconds: float) -> dict:
    dataset = LeRobotDataset("mmdata/measure", root=root, delta_timestamps=DELTA_TIMESTAMPS, video_backend=backend)

    def batches():
        return iter(torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers))

    return measure(batches, lambda batch: len(batch["index"]), seconds)


def first(root: Path, backend: str, workers: int) -> dict:
    """Seconds from building the dataset to the first batch in hand (the imports done before)."""
    building = time.perf_counter()
    dataset = LeRobotDataset("mmdata/measure", root=root, delta_timestamps=DELTA_TIMESTAMPS, video_backend=backend)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers)
    built = time.perf_counter()
    next(iter(loader))
    done = time.perf_counter()
    return {
        "import_s": _IMPORTED - _STARTED,  # (torch and lerobot; numpy and mmdata's synthetic frames too)
        "construct_s": built - building,
        "iterate_s": done - built,
        "to_first_batch_s": done - building,
    }


def sample(root: Path, count: int, seed: int) -> dict:
    dataset = LeRobotDataset("mmdata/measure", root=root, delta_timestamps=DELTA_TIMESTAMPS, video_backend="pyav")
    picks = np.random.default_rng(seed).choice(len(dataset), size=count, replace=False)
    samples = []
    for index in picks.tolist():
        item = dataset[index]
        entry = {
            "episode_index": int(item["episode_index"]),
            "frame_index": int(item["frame_index"]),
            "state": item["observation.state"].numpy().tolist(),
            "action": item["action"].numpy().tolist(),
            "action_is_pad": item["action_is_pad"].numpy().tolist(),
        }
        for camera in CAMERAS:
            frames = item[camera] if item[camera].dim() == 4 else item[camera][None]  # one offset: [3, H, W]
            pixels = (frames * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
            entry[camera] = [read_index_stripe(frame) for frame in pixels]
        samples.append(entry)
    return {"samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write", "load", "first", "sample"])
    parser.add_argument("root", type=Path)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--height", type=int, default=SIZE)
    parser.add_argument("--width", type=int, default=SIZE)
    parser.add_argument("--texture", action="store_true", help="frames with a drifting noise texture")
    parser.add_argument("--backend", default="torchcodec")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "write":
        result = write(args.root, args.episodes, args.seconds, args.height, args.width, args.texture)
    elif args.command == "load":
        result = load(args.root, args.backend, args.workers, args.seconds)
    elif args.command == "first":
        result = first(args.root, args.backend, args.workers)
    else:
        result = sample(args.root, args.count, args.seed)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
