"""The loader a team writes first, as the baseline mmdata is measured against.

Plain `webdataset` over tar shards holding one sample per episode (the recorder's mp4, .npy
low-dim arrays, the wav track), PyAV decoding the whole video for every window, and a padding
collate. `decode_once_per_episode=True` is the obvious first fix (decode an episode once and
cut all its windows from it); it is reported beside the baseline so the comparison is honest.
"""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import torch
import webdataset as wds
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import IterableDataset

AUDIO_WINDOW = (-1.0, 0.0)
LOWDIM_RATE = 50


def write_naive_shards(raw: Path, destination: Path, episodes_per_shard: int = 4) -> list[str]:
    """The raw episodes as WebDataset shards, one sample per episode, written the usual way."""
    destination.mkdir(parents=True, exist_ok=True)
    pattern = str(destination / "naive-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=episodes_per_shard, verbose=0) as sink:
        for folder in sorted(p for p in raw.iterdir() if p.is_dir()):
            sink.write(
                {
                    "__key__": folder.name,
                    "cam_high.mp4": (folder / "cam_high.mp4").read_bytes(),
                    "state.npy": (folder / "state.npy").read_bytes(),
                    "action.npy": (folder / "action.npy").read_bytes(),
                    "audio.wav": (folder / "audio.wav").read_bytes(),
                    "json": (folder / "meta.json").read_bytes(),
                }
            )
    return sorted(str(p) for p in destination.glob("naive-*.tar"))


def decode_whole_video(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as handle:
        samples = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
        return samples.astype(np.float32) / 32768.0, handle.getframerate()


class NaiveWindows(IterableDataset):
    """Windows (2 frames, 2 states, 50 actions, 1 s of audio) at `anchor_fps` anchors per episode."""

    def __init__(self, shards: list[str], anchor_fps: float = 10, seed: int = 0, decode_once_per_episode: bool = False):
        self.shards = shards
        self.anchor_fps = anchor_fps
        self.seed = seed
        self.decode_once_per_episode = decode_once_per_episode

    def __iter__(self) -> Iterator[dict]:
        rng = np.random.default_rng(self.seed)
        for sample in wds.WebDataset(self.shards, shardshuffle=False, empty_check=False):
            state = np.load(io.BytesIO(sample["state.npy"]))
            action = np.load(io.BytesIO(sample["action.npy"]))
            audio, rate = read_wav(sample["audio.wav"])
            fps = 30.0
            frames = decode_whole_video(sample["cam_high.mp4"]) if self.decode_once_per_episode else None
            count = len(frames) if frames is not None else None
            duration = len(state) / LOWDIM_RATE
            anchors = np.arange(int(np.ceil(duration * self.anchor_fps - 1e-9))) / self.anchor_fps
            for anchor in rng.permutation(anchors):
                if not self.decode_once_per_episode:
                    frames = decode_whole_video(sample["cam_high.mp4"])
                    count = len(frames)
                picked = [int(np.clip(round((anchor + o) * fps), 0, count - 1)) for o in (-0.1, 0.0)]
                steps = [int(np.clip(round((anchor + o) * LOWDIM_RATE), 0, len(state) - 1)) for o in (-0.1, 0.0)]
                future = [int(np.clip(round((anchor + i / 50) * LOWDIM_RATE), 0, len(action) - 1)) for i in range(50)]
                first = int(np.ceil((anchor + AUDIO_WINDOW[0]) * rate))
                last = int(np.ceil((anchor + AUDIO_WINDOW[1]) * rate))
                window = audio[max(first, 0) : max(last, 0)]
                yield {
                    "cam_high": torch.from_numpy(frames[picked]),
                    "state": torch.from_numpy(state[steps]),
                    "action": torch.from_numpy(action[future]),
                    "audio": torch.from_numpy(window.copy()),
                    "task": json.loads(sample["json"])["task"],
                }


def pad_collate(samples: list[dict]) -> dict:
    """Stack what has one shape, pad what does not (audio at episode starts), as tutorials do."""
    return {
        "cam_high": torch.stack([s["cam_high"] for s in samples]),
        "state": torch.stack([s["state"] for s in samples]),
        "action": torch.stack([s["action"] for s in samples]),
        "audio": pad_sequence([s["audio"] for s in samples], batch_first=True),
        "task": [s["task"] for s in samples],
    }


def naive_loader(
    shards: list[str], batch_size: int, num_workers: int, decode_once_per_episode: bool = False
) -> torch.utils.data.DataLoader:
    dataset = NaiveWindows(shards, decode_once_per_episode=decode_once_per_episode)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=pad_collate)
