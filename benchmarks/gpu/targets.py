"""Issue 39's targets from one proof run: `gpu_targets.json`, a row per target {name, device, measured, target, met}.

usage: python benchmarks/gpu/targets.py RUN_DIR
(RUN_DIR holds what run_spdl.sh wrote: spdl_check.json and bench_*.json; a figure that is missing is a row
with measured null and met false, saying which file it needed)

Where the host's cores are the yardstick, `bench_clips64_pyav.json` (PyAV in 15 workers on the same machine,
same run) is it for clips at 224x224; for 640x480 and 1080p, where no store of that size is carried, PyAV's
whole-stream frames/s on one core (spdl_check's curve) times the machine's cores stands in, and the row says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def load(run: Path, name: str) -> dict | None:
    path = run / name
    return json.loads(path.read_text()) if path.is_file() else None


def figure(record: dict | None, *keys: str) -> float | None:
    for key in keys:
        if record is None:
            return None
        record = record.get(key)
    return record


def row(name: str, device: str, measured: float | None, target: str, met: bool | None, note: str = "") -> dict:
    made = {"name": name, "device": device, "measured": measured, "target": target, "met": bool(met)}
    if note:
        made["note"] = note
    return made


def targets(run: Path) -> list[dict]:
    check = load(run, "spdl_check.json")
    clips = load(run, "bench_clips64_spdl_nvdec.json")
    host = load(run, "bench_clips64_pyav.json")
    hybrid = load(run, "bench_clips64_hybrid_spdl.json")
    policy = load(run, "bench_policy256_spdl_nvdec.json")
    device = (check or {}).get("device") or figure(clips, "machine", "gpu") or "unknown"
    cores = figure(host, "machine", "cpus") or os.cpu_count() or 1
    rows = []

    delivered, stalled = figure(clips, "figures", "frames_per_s"), figure(clips, "figures", "stall_fraction")
    rows.append(
        row(
            "clips 64 x 2 x 16 at 224x224: delivered frames/s, steps stalled",
            device,
            delivered,
            ">= 20480 frames/s and 0% stalled",
            delivered is not None and delivered >= 20480 and stalled == 0,
            f"stalled {stalled}" if clips else "needs bench_clips64_spdl_nvdec.json",
        )
    )
    host_rate = figure(host, "figures", "frames_per_s")
    ratio = round(delivered / host_rate, 3) if delivered and host_rate else None
    rows.append(
        row(
            "clips at 224x224, GPU alone (2 host workers) vs the host's cores (PyAV, 15 workers)",
            device,
            ratio,
            ">= 0.8x",
            ratio is not None and ratio >= 0.8,
            f"spdl-nvdec {delivered}, PyAV {host_rate} frames/s",
        )
    )
    for width, height in ((640, 480), (1920, 1080)):
        cells = [c for c in (check or {}).get("curve", []) if (c["width"], c["height"]) == (width, height)]
        gpu = max((c.get("delivered_per_s", 0) for c in cells if c["codec"] == "h264"), default=None)
        one_core = figure(check, "curve_pyav_one_core", f"h264_{width}x{height}")
        ratio = round(gpu / (one_core * cores), 3) if gpu and one_core else None
        rows.append(
            row(
                f"whole streams at {width}x{height} (H.264), GPU alone vs the host's cores",
                device,
                ratio,
                ">= 2x",
                ratio is not None and ratio >= 2,
                f"spdl-nvdec {gpu} frames/s; host = PyAV on one core ({one_core}) x {cores} cores (estimated)",
            )
        )
    together = figure(hybrid, "figures", "frames_per_s")
    alone = (delivered or 0) + (host_rate or 0)
    ratio = round(together / alone, 3) if together and alone else None
    rows.append(
        row(
            "hybrid (spdl-nvdec + PyAV in the workers) vs GPU alone + host alone, clips at 224x224",
            device,
            ratio,
            ">= 0.9x",
            ratio is not None and ratio >= 0.9,
            f"hybrid {together}, spdl-nvdec {delivered}, PyAV {host_rate} frames/s",
        )
    )
    stalled = figure(policy, "figures", "stall_fraction")
    rows.append(
        row(
            "policy windows, batch 256 x 2 x 2 at 224x224: steps stalled",
            device,
            stalled,
            "0%",
            stalled == 0,
            "" if policy else "needs bench_policy256_spdl_nvdec.json",
        )
    )
    small = [c for c in (check or {}).get("curve", []) if (c["width"], c["height"]) == (224, 224)]
    ceiling = max((c.get("delivered_per_s", 0) for c in small), default=None)
    clip_rates = [v["delivered_per_s"] for k, v in (figure(check, "clips") or {}).items() if k.startswith("spdl_nvdec")]
    best_clips = max(clip_rates, default=None)
    share = round(best_clips / ceiling, 3) if best_clips and ceiling else None
    rows.append(
        row(
            "share of the NVDEC ceiling at 224x224 (clips delivered / whole streams decoded, same path)",
            device,
            share,
            ">= 70%",
            share is not None and share >= 0.7,
            f"clips {best_clips}, whole streams {ceiling} frames/s",
        )
    )
    waste = figure(clips, "figures", "decode_waste")
    met = waste is not None and waste <= 1.1
    rows.append(row("decode waste on the GPU path (clips)", device, waste, "<= 1.1", met))
    return rows


def main() -> None:
    run = Path(sys.argv[1])
    rows = targets(run)
    (run / "gpu_targets.json").write_text(json.dumps(rows, indent=1) + "\n")
    for line in rows:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
