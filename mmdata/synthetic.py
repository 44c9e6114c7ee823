"""A realistic raw dataset to convert: two cameras, audio, proprioception, actions, task text.

Every frame carries its index as a 16-bit stripe of black and white blocks across its top,
so a decoded frame says which frame it is; the audio is a known tone sequence and the
low-dimensional streams are smooth functions of time, so every value can be checked.
"""

from __future__ import annotations

import json
import wave
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

STRIPE_BITS = 16
STRIPE_HEIGHT = 16
TONE_STEP_SECONDS = 0.25
TASKS = (
    "pick up the red cube and place it in the bin",
    "open the drawer",
    "fold the towel in half",
    "insert the peg into the hole",
    "pour water into the cup",
    "hand the screwdriver to the other arm",
)


@dataclass(frozen=True)
class CameraSpec:
    name: str
    width: int
    height: int


@dataclass(frozen=True)
class SynthSpec:
    """Shape of the synthetic dataset; defaults follow a bimanual robot recording."""

    episodes: int = 12
    min_seconds: float = 3.0
    max_seconds: float = 60.0
    fps: int = 30
    cameras: tuple[CameraSpec, ...] = (CameraSpec("cam_high", 224, 224), CameraSpec("cam_wrist", 208, 160))
    audio_rate: int = 16000
    lowdim_rate: int = 50
    dof: int = 14
    lowdim_format: str = "npy"
    seed: int = 0


def episode_seconds(spec: SynthSpec) -> list[float]:
    """Episode lengths spread log-uniformly between min and max, whole frames each."""
    rng = np.random.default_rng(spec.seed)
    low, high = np.log(spec.min_seconds), np.log(spec.max_seconds)
    seconds = np.exp(rng.uniform(low, high, size=spec.episodes))
    if spec.episodes >= 2:
        seconds[0], seconds[-1] = spec.min_seconds, spec.max_seconds
    return [round(s * spec.fps) / spec.fps for s in seconds]


def synthetic_frame(frame_index: int, camera_index: int, height: int, width: int) -> np.ndarray:
    """Frame `frame_index` of a camera: a drifting colour field, a moving disc, the index stripe."""
    t = frame_index / 30.0
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = 0.7 * camera_index
    frame = np.empty((height, width, 3), dtype=np.float32)
    frame[..., 0] = 128 + 60 * np.sin(x / 23.0 + 1.3 * t + phase)
    frame[..., 1] = 128 + 60 * np.cos(y / 31.0 - 0.9 * t)
    frame[..., 2] = 128 + 50 * np.sin((x + y) / 40.0 + 0.5 * t + phase)
    cx = width / 2 + width / 3 * np.sin(0.8 * t + phase)
    cy = height / 2 + height / 4 * np.cos(0.6 * t)
    disc = (x - cx) ** 2 + (y - cy) ** 2 < (min(height, width) / 8) ** 2
    frame[disc] = (230, 200, 40)
    frame = frame.astype(np.uint8)
    draw_index_stripe(frame, frame_index)
    return frame


def draw_index_stripe(frame: np.ndarray, index: int) -> None:
    block = frame.shape[1] // STRIPE_BITS
    for bit in range(STRIPE_BITS):
        value = 255 if (index >> bit) & 1 else 0
        frame[:STRIPE_HEIGHT, bit * block : (bit + 1) * block] = value


def read_index_stripe(frame: np.ndarray) -> int:
    """The frame index drawn by `draw_index_stripe`, read back from a decoded frame."""
    block = frame.shape[1] // STRIPE_BITS
    margin = min(3, block // 4)
    index = 0
    for bit in range(STRIPE_BITS):
        patch = frame[3 : STRIPE_HEIGHT - 3, bit * block + margin : (bit + 1) * block - margin]
        if patch.mean() > 128:
            index |= 1 << bit
    return index


def tone_frequency(seconds: np.ndarray | float) -> np.ndarray:
    """The tone pattern: a new pitch every 0.25 s, cycling through eight."""
    step = np.floor(np.asarray(seconds) / TONE_STEP_SECONDS).astype(np.int64)
    return 300.0 + 100.0 * (step % 8)


def synthetic_audio(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    phase = 2 * np.pi * np.cumsum(tone_frequency(t)) / rate
    return np.round(0.3 * 32767 * np.sin(phase)).astype(np.int16)


def synthetic_lowdim(seconds: float, rate: int, dof: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(state, action) at `rate`: smooth joint trajectories; the action leads the state by 0.1 s."""
    rng = np.random.default_rng(seed)
    frequencies = rng.uniform(0.1, 0.8, size=dof)
    phases = rng.uniform(0, 2 * np.pi, size=dof)
    t = np.arange(int(round(seconds * rate)))[:, None] / rate
    state = np.sin(2 * np.pi * frequencies * t + phases).astype(np.float32)
    action = np.sin(2 * np.pi * frequencies * (t + 0.1) + phases).astype(np.float32)
    return state, action


def write_synthetic_dataset(destination: str | Path, spec: SynthSpec = SynthSpec()) -> list[Path]:
    """Write `spec.episodes` episode folders in the raw layout; returns their paths."""
    root = Path(destination)
    root.mkdir(parents=True, exist_ok=True)
    folders = []
    for index, seconds in enumerate(episode_seconds(spec)):
        folder = root / f"episode_{index:04d}"
        folder.mkdir(exist_ok=True)
        write_synthetic_episode(folder, index, seconds, spec)
        folders.append(folder)
    return folders


def write_synthetic_episode(folder: Path, index: int, seconds: float, spec: SynthSpec) -> None:
    frames = int(round(seconds * spec.fps))
    for camera_index, camera in enumerate(spec.cameras):
        write_video(
            folder / f"{camera.name}.mp4",
            (synthetic_frame(i, camera_index, camera.height, camera.width) for i in range(frames)),
            spec.fps,
            camera.width,
            camera.height,
        )
    write_wav(folder / "audio.wav", synthetic_audio(seconds, spec.audio_rate), spec.audio_rate)
    state, action = synthetic_lowdim(seconds, spec.lowdim_rate, spec.dof, spec.seed * 1000 + index)
    rates = {}
    if spec.lowdim_format == "parquet":
        write_lowdim_parquet(folder / "lowdim.parquet", {"state": state, "action": action}, spec.lowdim_rate)
    else:
        np.save(folder / "state.npy", state)
        np.save(folder / "action.npy", action)
        rates = {"state": spec.lowdim_rate, "action": spec.lowdim_rate}
    meta = {
        "task": TASKS[index % len(TASKS)],
        "rates": rates,
        "metadata": {"robot": "synthetic-bimanual", "operator": f"op{index % 3}", "success": index % 4 != 3},
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))


def write_video(path: Path, frames, fps: int, width: int, height: int, codec: str = "libx264") -> None:
    """A recorder-like source file: high quality, long GOP, one file per camera."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps))
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "10", "preset": "ultrafast"} if codec == "libx264" else {}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode(None))


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    samples = samples.reshape(len(samples), -1)
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(samples.shape[1])
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(samples.astype("<i2").tobytes())


def write_lowdim_parquet(path: Path, streams: dict[str, np.ndarray], rate: float) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    length = len(next(iter(streams.values())))
    columns = {"timestamp": pa.array(np.arange(length) / rate)}
    for name, values in streams.items():
        columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    pq.write_table(pa.table(columns), path)
