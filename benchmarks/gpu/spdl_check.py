"""The SPDL backends (issue 39): whole segments per call on threads that hold no interpreter lock.

usage: python benchmarks/gpu/spdl_check.py STORE CURVE.pkl OUT.json [--dry-run-on-cpu]
(STORE: the carried `.gpudata/loader_store.wds`; CURVE.pkl: `nvdec_curve.py --prepare`'s streams. The dry
run stands SPDL's FFmpeg in for NVDEC, as tests/test_spdl_decoder.py does, to check the script here.)

Writes OUT.json after every figure, so that a call cut short keeps what it measured:
- `correctness`: spdl-nvdec's frames of 16-frame clips of every episode against PyAV's (mean and largest
  absolute difference, and whether the frame numbers drawn in the frames agree);
- `clips`: delivered and decoded frames/s of those clips by thread count (1, 2, 4, 7, 14), with PyAV and
  spdl on one host core beside them;
- `curve`: whole streams (every frame: NVDEC's ceiling through this path) by codec, frame size (1080p,
  640x480, 224x224) and thread count, NV12 to RGB included; `curve_pyav_one_core`: PyAV on one host core
  on the same streams (the host's yardstick, see targets.py).
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from hybrid_check import DRY_RUN, clip_requests, host  # noqa: E402

from mmdata.codecs.decoders import ClipRequest, make_video_decoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.codecs.decoders.spdl_decoder import SpdlNvdecDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

THREADS = (1, 2) if DRY_RUN else (1, 2, 4, 7, 14)
CURVE_SIZES = {(224, 224)} if DRY_RUN else {(1920, 1080), (640, 480), (224, 224)}
SECONDS = 0.5 if DRY_RUN else 1.0


def spdl_nvdec(threads: int) -> SpdlNvdecDecoder:
    if DRY_RUN:
        from tests.test_spdl_decoder import cpu_nvdec

        return SpdlNvdecDecoder(threads=threads, decode_segment=cpu_nvdec())
    return make_video_decoder("spdl-nvdec", ["h264", "hevc"], threads=threads)


def rates(decoder, requests: list[ClipRequest]) -> dict[str, float]:
    """Delivered and decoded frames/s over repeated batches (after one to warm up), the GPU synchronised."""
    decoder.decode(requests)
    before = decoder.stats.frames_decoded
    delivered, started = 0, time.perf_counter()
    while time.perf_counter() - started < SECONDS:
        outputs = decoder.decode(requests)
        if not DRY_RUN:
            import torch

            torch.cuda.synchronize()
        delivered += sum(len(o) for o in outputs)
    seconds = time.perf_counter() - started
    decoded = decoder.stats.frames_decoded - before
    return {"delivered_per_s": round(delivered / seconds, 1), "decoded_per_s": round(decoded / seconds, 1)}


def correctness(requests: list[ClipRequest]) -> dict:
    """spdl-nvdec's frames against PyAV's on the same requests."""
    reference = PyAvDecoder().decode(requests)
    decoder = spdl_nvdec(7)
    frames = [host(f) for f in decoder.decode(requests)]
    shapes = [(a.shape, b.shape) for a, b in zip(frames, reference) if a.shape != b.shape]
    if shapes:
        return {"requests": len(requests), "shape_mismatches": len(shapes), "first": str(shapes[0])}
    differences = [np.abs(a.astype(np.int16) - b.astype(np.int16)) for a, b in zip(frames, reference)]
    return {
        "requests": len(requests),
        "mean_abs_difference_max": round(max(float(d.mean()) for d in differences), 4),
        "abs_difference_max": int(max(int(d.max()) for d in differences)),
        "stripes_identical": all(
            [read_index_stripe(f) for f in a] == [read_index_stripe(f) for f in b] for a, b in zip(frames, reference)
        ),
        "describe": decoder.describe(),
    }


def main() -> None:
    store, curve, out = [a for a in sys.argv[1:] if not a.startswith("--")]
    record: dict = {"benchmark": "spdl_check", "device": _device(), "date": time.strftime("%Y-%m-%d")}

    def save() -> None:
        Path(out).write_text(json.dumps(record, indent=1) + "\n")

    requests = clip_requests(store)
    try:
        record["correctness"] = correctness(requests)
    except Exception as exc:  # recorded; the rates still run
        record["correctness"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    save()
    print(json.dumps(record["correctness"]), flush=True)

    clips: dict = {"frames_per_request": 16, "requests": len(requests)}
    record["clips"] = clips
    for name, build in [("pyav_one_core", PyAvDecoder), ("spdl_one_core", lambda: make_video_decoder("spdl"))]:
        clips[name] = rates(build(), requests)
        save()
    for threads in THREADS:
        try:
            clips[f"spdl_nvdec_{threads}"] = rates(spdl_nvdec(threads), requests)
        except Exception as exc:  # recorded; the curve still runs
            clips[f"spdl_nvdec_{threads}"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        save()
        print(json.dumps({threads: clips[f"spdl_nvdec_{threads}"]}), flush=True)

    record["curve"], record["curve_pyav_one_core"] = [], {}
    for stream in pickle.loads(Path(curve).read_bytes()):
        if (stream["width"], stream["height"]) not in CURVE_SIZES:
            continue
        size = (stream["width"], stream["height"])
        whole = ClipRequest(stream["data"], tuple(range(stream["frames"])), stream["codec"], frame_size=size)
        pyav = rates(PyAvDecoder(), [whole])["delivered_per_s"]
        record["curve_pyav_one_core"][f"{stream['codec']}_{size[0]}x{size[1]}"] = pyav
        for threads in THREADS:
            whole = [
                ClipRequest(stream["data"], tuple(range(stream["frames"])), stream["codec"], frame_size=size)
                for _ in range(threads)
            ]
            row = {"codec": stream["codec"], "width": size[0], "height": size[1], "threads": threads}
            try:
                row.update(rates(spdl_nvdec(threads), whole))
            except Exception as exc:  # a cell that cannot run is a row, not a stop
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            record["curve"].append(row)
            save()
            print(json.dumps(row), flush=True)


def _device() -> str:
    if DRY_RUN:
        return "CPU dry run"
    import torch

    return torch.cuda.get_device_name(0)


if __name__ == "__main__":
    main()
