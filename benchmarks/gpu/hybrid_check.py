"""The hybrid decoder on the GPU: the same frames as PyAV, and how it splits and how fast, against each side alone.

usage: python benchmarks/gpu/hybrid_check.py STORE OUT.json [--dry-run-on-cpu]
(STORE: the carried `.gpudata/loader_store.wds`; the dry run pairs two PyAV decoders to check the script)

For 16-frame clips of every episode's `cam_high`: frames of the hybrid decoder against PyAV's (mean absolute
difference after RGB conversion, and the frame numbers drawn in them), then frames/s of DALI alone, PyAV alone
and the hybrid over repeated batches, with the share it learnt.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import mmdata  # noqa: E402
from mmdata.codecs.decoders import HybridDecoder, make_video_decoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

DRY_RUN = "--dry-run-on-cpu" in sys.argv
CAMERA = "cam_high"


def clip_requests(store: str, clips_per_episode: int = 8) -> list:
    dataset = mmdata.open_dataset(store)
    requests = []
    for episode in range(dataset.schema.num_episodes):
        duration = float(dataset.manifest.row(episode)["duration"])
        for start in np.linspace(0, max(duration - 1, 0), clips_per_episode):
            requests += dataset.plan_frames(episode, CAMERA, start + np.arange(16) / 30).requests
    return requests


def host(frames) -> np.ndarray:
    return frames.cpu().numpy() if hasattr(frames, "cpu") else np.asarray(frames)


def rate(decoder, requests, seconds: float = 3.0) -> float:
    decoder.decode(requests)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        outputs = decoder.decode(requests)
        if not DRY_RUN:
            import torch

            torch.cuda.synchronize()
        done += sum(len(o) for o in outputs)
    return done / (time.perf_counter() - started)


def main() -> None:
    store, out = [a for a in sys.argv[1:] if not a.startswith("--")]
    requests = clip_requests(store)
    reference = PyAvDecoder().decode(requests)
    hybrid = HybridDecoder(PyAvDecoder(), PyAvDecoder()) if DRY_RUN else make_video_decoder("hybrid", ["h264"])
    frames = hybrid.decode(requests)
    differences = [
        float(np.abs(host(a).astype(np.int16) - b.astype(np.int16)).mean()) for a, b in zip(frames, reference)
    ]
    stripes = all(
        [read_index_stripe(f) for f in host(a)] == [read_index_stripe(f) for f in b] for a, b in zip(frames, reference)
    )
    alone = {"pyav": PyAvDecoder()}
    if not DRY_RUN:
        alone["dali"] = make_video_decoder("dali", ["h264"])
    figures = {name: round(rate(decoder, requests), 1) for name, decoder in alone.items()}
    figures["hybrid"] = round(rate(hybrid, requests), 1)
    record = {
        "benchmark": "hybrid_check",
        "device": "CPU dry run" if DRY_RUN else __import__("torch").cuda.get_device_name(0),
        "requests": len(requests),
        "mean_abs_difference_max": round(max(differences), 4),
        "stripes_identical": stripes,
        "frames_per_s": figures,
        "learnt_first_share": round(hybrid.split.first_share, 3),
        "describe": hybrid.describe(),
    }
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
