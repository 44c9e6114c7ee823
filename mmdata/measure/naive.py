"""The loader a team writes first, as the baseline mmdata is measured against.

A plain `webdataset` pipeline over tar shards with one sample per episode (a whole mp4 per
camera with a recorder's long GOP, `.npy` low-dim arrays with their timestamps, the audio
file), PyAV decoding every camera's whole video for every sample, and a padding collate.
`export_naive_shards` writes those shards from an mmdata store, so both loaders read the same
episodes. `decode_once_per_episode=True` is the obvious first fix (decode an episode once and
cut all its samples from it, in episode order), reported beside it for an honest comparison.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import IterableDataset

from mmdata.codecs.align import nearest_indices, sample_range
from mmdata.codecs.audio import as_float, decode_audio
from mmdata.codecs.lowdim import decode_npy, encode_npy
from mmdata.errors import MissingDependencyError
from mmdata.measure.runner import run_for_seconds
from mmdata.planning.samples import grid_times
from mmdata.planning.specs import Frames, Sequences, Spec, Values
from mmdata.schema import VideoStream
from mmdata.store.dataset import Dataset
from mmdata.store.manifest import Piece

RECORDER_GOP = 250


def _webdataset() -> Any:
    """The `webdataset` library, which the baseline is written with (the `bench` extra, not the core install)."""
    try:
        import webdataset
    except ImportError as exc:
        raise MissingDependencyError(
            "the naive baseline is a webdataset pipeline: pip install 'mmdata[bench]' to run --baseline naive"
        ) from exc
    return webdataset


def export_naive_shards(dataset: Dataset, destination: Path, episodes_per_shard: int = 1) -> list[str]:
    """The store's episodes as naive WebDataset shards (one tar sample per episode); returns their paths."""
    wds = _webdataset()
    destination.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(destination / "naive-%06d.tar"), maxcount=episodes_per_shard, verbose=0) as sink:
        for index in range(len(dataset)):
            row = dataset.manifest.row(index)
            sample: dict[str, Any] = {"__key__": row["key"], "json": json.dumps({"task": row["task"]}).encode()}
            for stream in dataset.schema.streams:
                name = stream.name
                if isinstance(stream, VideoStream):
                    frames = dataset.read_episode(index, [name])[name]
                    sample[f"{name}.mp4"] = encode_whole_video(frames.values, stream.fps)
                    sample[f"{name}.timestamps.npy"] = encode_npy(frames.timestamps)
                elif stream.kind == "lowdim":
                    values = dataset.read_episode(index, [name])[name]
                    sample[f"{name}.npy"] = encode_npy(values.values)
                    sample[f"{name}.timestamps.npy"] = encode_npy(values.timestamps)
                elif stream.kind == "audio":
                    sample[f"{name}.audio"] = dataset.pieces.read_bytes(Piece.from_dict(row[f"{name}/data"]))
                    sample[f"{name}.t_start.npy"] = encode_npy(np.array([row[f"{name}/t_start"]]))
            sink.write(sample)
    return sorted(str(p) for p in destination.glob("naive-*.tar"))


def encode_whole_video(frames: np.ndarray, fps: float) -> bytes:
    """One H.264 mp4 of all frames with a recorder's key-frame interval."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"crf": "18", "preset": "ultrafast", "g": str(RECORDER_GOP)}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def decode_whole_video(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data), mode="r") as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


class NaiveSamples(IterableDataset):
    """The spec's samples read the naive way: per episode from webdataset, every video decoded whole."""

    def __init__(self, shards: list[str], spec: Spec, seed: int = 0, decode_once_per_episode: bool = False):
        self.shards = shards
        self.spec = spec
        self.seed = seed
        self.decode_once_per_episode = decode_once_per_episode

    def __iter__(self) -> Iterator[dict[str, Any]]:
        wds = _webdataset()
        rng = np.random.default_rng(self.seed)
        for episode in wds.WebDataset(self.shards, shardshuffle=False, empty_check=False):
            decoded: dict[str, np.ndarray] = {}
            duration = max(float(decode_npy(episode[k])[-1]) for k in episode if k.endswith("timestamps.npy"))
            for t0, t1 in rng.permutation(np.asarray(self._spans(duration))):
                if not self.decode_once_per_episode:
                    decoded = {}
                yield {
                    name: self._read(episode, name, stream, t0, t1, decoded)
                    for name, stream in self.spec.streams.items()
                }

    def _spans(self, duration: float) -> list[tuple[float, float]]:
        if isinstance(self.spec, Sequences):
            step = self.spec.max_seconds or duration
            return [(t, min(t + step, duration)) for t in np.arange(0.0, duration, step)]
        anchors = np.arange(int(np.ceil(duration * self.spec.anchor_fps))) / self.spec.anchor_fps
        return [(t, t) for t in anchors]

    def _times(self, name: str, stream: Frames | Values, t0: float, t1: float) -> np.ndarray:
        if isinstance(self.spec, Sequences):
            return grid_times(t0, t1, self.spec.rate_of(name))
        return t0 + np.asarray(stream.offsets)

    def _read(self, episode: dict, name: str, stream, t0: float, t1: float, decoded: dict) -> torch.Tensor:
        """One stream of one sample; `decoded` holds what was decoded for this episode (reset per
        sample unless decoding once per episode)."""
        if name not in decoded:
            decoded[name] = self._decode(episode, name, stream)
        if isinstance(stream, (Frames, Values)):
            timestamps, values = decoded[name]
            return torch.from_numpy(values[nearest_indices(timestamps, self._times(name, stream, t0, t1))])
        samples, rate, t_start = decoded[name]
        low, high = (t0 + stream.window[0], t0 + stream.window[1]) if not isinstance(self.spec, Sequences) else (t0, t1)
        first, last = sample_range(t_start, rate, low, high)
        return torch.from_numpy(samples[max(first, 0) : max(last, 0)].copy())

    @staticmethod
    def _decode(episode: dict, name: str, stream) -> tuple:
        if isinstance(stream, Frames):
            return decode_npy(episode[f"{name}.timestamps.npy"]), decode_whole_video(episode[f"{name}.mp4"])
        if isinstance(stream, Values):
            return decode_npy(episode[f"{name}.timestamps.npy"]), decode_npy(episode[f"{name}.npy"])
        clip, _ = decode_audio(episode[f"{name}.audio"])
        return as_float(clip.samples), clip.sample_rate, float(decode_npy(episode[f"{name}.t_start.npy"])[0])


def pad_collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every stream padded to the longest sample and stacked, as tutorials do (with each sample's length)."""
    batch = {name: pad_sequence([s[name] for s in samples], batch_first=True) for name in samples[0]}
    batch.update({f"{name}_lengths": torch.tensor([len(s[name]) for s in samples]) for name in samples[0]})
    return batch


def naive_loader(
    shards: list[str], spec: Spec, batch_size: int, num_workers: int, decode_once_per_episode: bool = False
) -> torch.utils.data.DataLoader:
    """A torch DataLoader over `NaiveSamples` (workers split the shards, as webdataset does)."""
    dataset = NaiveSamples(shards, spec, decode_once_per_episode=decode_once_per_episode)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=pad_collate)


def run_naive(
    loader: torch.utils.data.DataLoader, spec: Spec, seconds: float, warmup: int = 1, step=None
) -> dict[str, Any]:
    """Samples/s and frames/s of a naive loader for about `seconds` after `warmup` batches, epoch after
    epoch, calling `step()` (the simulated training step) after every batch when given."""
    cameras = [name for name, stream in spec.streams.items() if isinstance(stream, Frames)]

    def count(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        samples = len(next(iter(batch.values())))
        return samples, sum(int(batch[f"{name}_lengths"].sum()) for name in cameras)

    return run_for_seconds(loader, seconds, count, warmup, step)
