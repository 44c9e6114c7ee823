"""On the GPU: mmdata.DataLoader with DALI decoding in the main process, against the CPU loader.

1. Correctness: the GPU loader (device cuda, decoder dali) and the CPU loader (pyav in workers)
   with the same seed give the same samples in the same batches; every decoded frame carries the
   index stripe of the frame nearest its requested time, frames differ by less than 1 level on
   average, and every non-video tensor is identical.
2. Throughput: 16-frame clips (stride 2) of 2 cameras and 2-frame policy windows, batches of
   `--batch-size` samples, DALI in the main process (workers read and join segments) against
   PyAV in `--cpu-workers` worker processes on the same host.

usage: python benchmarks/gpu/loader_gpu.py STORE OUT.json [--device cpu --decoder pyav] (dry run)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mmdata  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

CLIP_OFFSETS = [-(15 - i) * 2 / 30 for i in range(16)]


def specs() -> dict[str, mmdata.Windows]:
    return {
        "clips_16x2cams": mmdata.Windows(
            anchor_fps=5,
            streams={
                "cam_high": mmdata.Frames(offsets=CLIP_OFFSETS),
                "cam_wrist": mmdata.Frames(offsets=CLIP_OFFSETS),
                "state": mmdata.Values(offsets=[0.0]),
                "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
            },
        ),
        "policy_2x2cams": mmdata.Windows(
            anchor_fps=10,
            streams={
                "cam_high": mmdata.Frames(offsets=[-0.1, 0.0]),
                "cam_wrist": mmdata.Frames(offsets=[-0.1, 0.0]),
                "state": mmdata.Values(offsets=[-0.1, 0.0]),
                "action": mmdata.Values(offsets=[i / 50 for i in range(50)]),
            },
        ),
    }


def check_correctness(store: str, device: str, decoder: str, batches_to_check: int) -> dict:
    spec = specs()["clips_16x2cams"]
    gpu = mmdata.DataLoader(
        store,
        spec,
        batch_size=32,
        num_workers=4,
        seed=1,
        runtime=mmdata.Runtime(device=device, decoder=decoder, decode_in="main"),
    )
    cpu = mmdata.DataLoader(store, spec, batch_size=32, num_workers=4, seed=1, runtime=mmdata.Runtime(decoder="pyav"))
    differences, stripes_wrong, frames, batches = [], 0, 0, 0
    for a, b in zip(gpu, cpu):
        batches += 1
        if batches > batches_to_check:
            break
        assert torch.equal(a["sample_index"].cpu(), b["sample_index"]), "different samples in a batch"
        for key in ("state", "action", "state_is_pad", "action_is_pad", "cam_high_is_pad", "cam_wrist_is_pad"):
            assert torch.equal(a[key].cpu(), b[key]), f"{key} differs"
        for camera in ("cam_high", "cam_wrist"):
            assert a[camera].device.type == torch.device(device).type
            on_host = a[camera].cpu().numpy()
            differences.append(float(np.abs(on_host.astype(np.int16) - b[camera].numpy()).mean()))
            times = a["time"].cpu().numpy()[:, None] + np.asarray(CLIP_OFFSETS)[None, :]
            expected = np.clip(np.round(times * 30), 0, None).astype(int)
            for row in range(len(on_host)):
                for column in range(on_host.shape[1]):
                    frames += 1
                    if b[f"{camera}_is_pad"][row, column]:
                        continue
                    stripes_wrong += read_index_stripe(on_host[row, column]) != expected[row, column]
    return {
        "batches": min(batches, batches_to_check),
        "frames_checked": frames,
        "stripes_wrong": int(stripes_wrong),
        "mean_abs_difference_vs_pyav": round(float(np.mean(differences)), 4),
        "max_batch_mean_abs_difference": round(float(np.max(differences)), 4),
        "gpu_decoder": gpu.decoder.describe(),
    }


def measure(loader, seconds: float) -> dict:
    iterator = iter(loader)
    next(iterator)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    samples = batches = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for batch in iterator:
            samples += len(batch["sample_index"])
            batches += 1
            if time.perf_counter() - started > seconds:
                break
        iterator = iter(loader)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    return {
        "batches": batches,
        "samples_per_s": round(samples / elapsed, 1),
        "worker_stage_seconds": stats["worker_stage_seconds"],
        "main_stage_seconds": stats["main_stage_seconds"],
        "data_wait_seconds": stats["data_wait_seconds"],
        "decoder": stats["decoder"],
        "main_process_decode": stats.get("main_process_decode"),
        "peak_rss_mb_per_worker": {k: round(v / 2**20) for k, v in stats["peak_rss_bytes_per_worker"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("output")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--decoder", default="dali")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--gpu-workers", type=int, default=8)
    parser.add_argument("--cpu-workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--check-batches", type=int, default=12)
    args = parser.parse_args()

    record = {"machine": f"{platform.node()}: {os.cpu_count()} cores", "torch": torch.__version__}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name(0)
    record["correctness"] = check_correctness(args.store, args.device, args.decoder, args.check_batches)
    print(json.dumps(record["correctness"]), flush=True)
    throughput = {}
    for name, spec in specs().items():
        frames_per_sample = sum(len(s.offsets) for s in spec.streams.values() if isinstance(s, mmdata.Frames))
        for label, options in (
            (
                f"{args.decoder}_main_process",
                dict(device=args.device, decoder=args.decoder, num_workers=args.gpu_workers, decode_in="main"),
            ),
            ("pyav_workers", dict(decoder="pyav", num_workers=args.cpu_workers)),
        ):
            loader = mmdata.DataLoader(args.store, spec, batch_size=args.batch_size, seed=2, **options)
            row = measure(loader, args.seconds)
            row["frames_per_s"] = round(row["samples_per_s"] * frames_per_sample, 1)
            throughput[f"{name}/{label}"] = row
            print(name, label, row["samples_per_s"], "samples/s", row["frames_per_s"], "frames/s", flush=True)
            Path(args.output).write_text(json.dumps({**record, "throughput": throughput}, indent=1) + "\n")
    record["throughput"] = throughput
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
