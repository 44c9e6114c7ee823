"""Which backend decodes fastest, by codec, frame size and request length: the measurements `auto`'s choice
table (`mmdata/codecs/decoders/select.py`) is derived from.

usage:
  python benchmarks/gpu/decode_sizes.py --prepare CORPUS.pkl      (here: encode the corpus)
  python benchmarks/gpu/decode_sizes.py CORPUS.pkl OUT.json       (on the GPU machine)
  python benchmarks/gpu/decode_sizes.py CORPUS.pkl OUT.json --dry-run-on-cpu   (checks the script here)

On the same requests (batches of 64 samples from segments of 32 frames with a key frame every 8, the store's
default): 16-frame clips at stride 2, and policy windows (2 frames of 2 cameras), at 224x224, 640x480 and
1920x1080, H.264 and HEVC, decoded by `decoder="nvdec"` (7 sessions), `decoder="dali"`, and PyAV in one
process per host core. Delivered frames/s; every cell also checks the frame numbers drawn in the frames.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from decode_workload import SEGMENT_FRAMES, clip_samples, load_or_encode, sparse_samples  # noqa: E402

from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

DRY_RUN = "--dry-run-on-cpu" in sys.argv
SIZES = [(224, 224), (640, 480), (1920, 1080)]
CODECS = ["h264", "hevc"]
GOP = 8
BATCH = 64
SECONDS = float(os.environ.get("SIZES_SECONDS", 1.0))
CORPUS = {"codecs": CODECS, "resolutions": SIZES, "videos": 2, "seconds": 4.0, "gops": [GOP]}


def log(message: str) -> None:
    print(message, flush=True)


def correct(requests, outputs) -> bool:
    """Every delivered frame carries the index stripe of the frame asked for (the first 32 requests)."""
    for request, frames in list(zip(requests, outputs))[:32]:
        video = int(request.where.episode.rsplit("-", 1)[1])
        base = request.where.segment * SEGMENT_FRAMES
        host = frames.cpu().numpy() if hasattr(frames, "cpu") else np.asarray(frames)
        if [read_index_stripe(f) for f in host] != [(base + i + 1000 * video) & 0xFFFF for i in request.frames]:
            return False
    return True


def timed(decode, batches) -> tuple[float, bool]:
    """Delivered frames/s over whole batches for at least SECONDS, after a warm-up batch; and its check."""
    outputs = decode(batches[0])
    ok = correct(batches[0], outputs)
    delivered, elapsed, done = 0, 0.0, 0
    while elapsed < SECONDS or done < 2:
        requests = batches[done % len(batches)]
        started = time.perf_counter()
        outputs = decode(requests)
        if not DRY_RUN:
            import torch

            torch.cuda.synchronize()
        elapsed += time.perf_counter() - started
        delivered += sum(len(r.frames) for r in requests)
        done += 1
    return delivered / elapsed, ok


def _host_decode(requests) -> int:
    PyAvDecoder().decode(requests)
    return sum(len(r.frames) for r in requests)


def host_cores(pool, processes: int, batches) -> float:
    """PyAV in `processes` processes, the batches cut in chunks of 8 requests."""
    chunks = [b[i : i + 8] for b in batches for i in range(0, len(b), 8)]
    pool.map(_host_decode, chunks[:processes])
    started = time.perf_counter()
    delivered = 0
    while time.perf_counter() - started < SECONDS:
        delivered += sum(pool.map(_host_decode, chunks))
    return delivered / (time.perf_counter() - started)


def gpu_decoders() -> dict:
    from mmdata.codecs.decoders import make_video_decoder

    if DRY_RUN:
        from mmdata.codecs.decoders.nvdec import NvdecDecoder
        from tests.test_nvdec import PyAvSession

        return {"nvdec": NvdecDecoder(sessions=2, open_session=PyAvSession)}
    return {"nvdec": make_video_decoder("nvdec", CODECS), "dali": make_video_decoder("dali", CODECS)}


def main() -> None:
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--prepare" in sys.argv:
        load_or_encode(Path(arguments[0]), **CORPUS)
        return
    corpus = load_or_encode(Path(arguments[0]))
    processes = 2 if DRY_RUN else os.cpu_count()
    decoders = gpu_decoders()
    rows = []
    with Pool(processes) as pool:
        for codec in CODECS:
            for width, height in SIZES[:1] if DRY_RUN else SIZES:
                videos = [v for v in corpus if (v.codec, v.width, v.height) == (codec, width, height)]
                for pattern, samples in (
                    ("clip16", clip_samples(videos, GOP, BATCH * 2, seed=1)),
                    ("window2x2", sparse_samples(videos, GOP, BATCH * 2, seed=2)),
                ):
                    batches = [[r for s in samples[i : i + BATCH] for r in s[0]] for i in (0, BATCH)]
                    row = {"codec": codec, "width": width, "height": height, "pattern": pattern}
                    for name, decoder in decoders.items():
                        try:
                            rate, ok = timed(decoder.decode, batches)
                            row[name] = round(rate)
                            row[f"{name}_correct"] = ok
                        except Exception as exc:  # a backend that refuses a cell is a figure too
                            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row[f"pyav_{processes}_processes"] = round(host_cores(pool, processes, batches))
                    rows.append(row)
                    log(json.dumps(row))
    record = {
        "benchmark": "decode_sizes",
        "device": "CPU dry run" if DRY_RUN else __import__("torch").cuda.get_device_name(0),
        "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "batch_samples": BATCH,
        "gop": GOP,
        "seconds_per_cell": SECONDS,
        "rows": rows,
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(arguments[1]).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
