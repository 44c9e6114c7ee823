"""DALI clip decoding on the GPU: per-request sessions vs joined streams, 1 vs several pipelines,
against PyAV on every host core, all on the same requests. Run by `benchmarks/gpu/run_decode.sh`.

usage: python benchmarks/gpu/decode_gpu.py CORPUS.pkl OUT.json [--dry-run-on-cpu]
(the dry run drives the same code through DALI's CPU decoder on a VP9 corpus, to check the script)
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from decode_workload import SEGMENT_FRAMES, clip_samples, load_or_encode, sparse_samples  # noqa: E402

from mmdata.codecs.decoders.dali_decoder import DaliDecoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

BATCH = int(os.environ.get("DECODE_BATCH", 256))
DEVICE = "cpu" if "--dry-run-on-cpu" in sys.argv else "gpu"
CODEC = "vp9" if DEVICE == "cpu" else "h264"
results: dict = {"rows": []}


def log(message: str) -> None:
    print(message, flush=True)


def batches_of(samples, size=BATCH):
    return [[r for s in samples[i : i + size] for r in s[0]] for i in range(0, len(samples), size)]


def run_gpu(label: str, batches, min_seconds=3.0, max_batches=12, **options) -> dict:
    decoder = DaliDecoder(device=DEVICE, **options)
    prepared = []
    started = time.perf_counter()
    for requests in batches:
        prepared.append(decoder.prepare(requests))
    prepare_seconds = (time.perf_counter() - started) / len(batches)
    decoder.decode_prepared(batches[0], *prepared[0], on_error="raise")  # warm-up: builds the pipelines
    synchronize()
    decoder.stats.__init__()
    delivered, elapsed, done = 0, 0.0, 0
    while elapsed < min_seconds and done < max_batches:
        index = done % len(batches)
        started = time.perf_counter()
        outputs = decoder.decode_prepared(batches[index], *prepared[index], on_error="raise")
        synchronize()
        elapsed += time.perf_counter() - started
        delivered += sum(len(r.frames) for r in batches[index])
        done += 1
    row = {
        "config": label,
        **{k: v for k, v in options.items()},
        "delivered_fps": round(delivered / elapsed),
        "batches": done,
        "decode_waste": round(decoder.stats.decode_waste, 3),
        "host_prepare_ms_per_batch_1core": round(prepare_seconds * 1000, 1),
        "correct": check(batches[index], outputs),
    }
    log(json.dumps(row))
    results["rows"].append(row)
    return row


def synchronize() -> None:
    if DEVICE == "gpu":
        torch.cuda.synchronize()


def check(requests, outputs) -> bool:
    """Every delivered frame carries the index stripe of the frame asked for."""
    for request, frames in list(zip(requests, outputs))[:64]:
        video = int(request.where.episode.rsplit("-", 1)[1])
        base = request.where.segment * SEGMENT_FRAMES
        got = [read_index_stripe(f) for f in np.asarray(frames.cpu() if DEVICE == "gpu" else frames)]
        want = [(base + i + 1000 * video) & 0xFFFF for i in request.frames]
        if got != want:
            log(f"MISMATCH {request.where}: {got} != {want}")
            return False
    return True


def _cpu_work(requests):
    decoder = PyAvDecoder()
    decoder.decode(requests)
    return sum(len(r.frames) for r in requests)


def run_cpu(label: str, batches, processes: int | None = None) -> dict:
    processes = processes or os.cpu_count()
    chunks = [b[i : i + 16] for b in batches for i in range(0, len(b), 16)]
    with Pool(processes) as pool:
        pool.map(_cpu_work, chunks[: processes * 2])
        started = time.perf_counter()
        delivered = sum(pool.map(_cpu_work, chunks))
        elapsed = time.perf_counter() - started
    row = {"config": label, "processes": processes, "delivered_fps": round(delivered / elapsed)}
    log(json.dumps(row))
    results["rows"].append(row)
    return row


def run_pipelined(label: str, batches, workers: int, rounds: int = 3, **options) -> dict:
    options = {"reuse_sessions": True, **options}
    """Joining in `workers` processes (as loader workers would), decoding in the main process."""
    decoder = DaliDecoder(device=DEVICE, **options)
    decoder.decode(batches[0])
    synchronize()
    work = batches * rounds
    with Pool(workers) as pool:
        started = time.perf_counter()
        delivered = 0
        for requests, prepared in zip(work, pool.imap(decoder.prepare, work)):
            decoder.decode_prepared(requests, *prepared, on_error="raise")
            delivered += sum(len(r.frames) for r in requests)
        synchronize()
        elapsed = time.perf_counter() - started
    row = {"config": label, "join_workers": workers, **options, "delivered_fps": round(delivered / elapsed)}
    log(json.dumps(row))
    results["rows"].append(row)
    return row


def main() -> None:
    corpus_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    corpus = load_or_encode(corpus_path)
    results["device"] = torch.cuda.get_device_name(0) if DEVICE == "gpu" else "dry run on CPU"
    results["host"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    results["torch"] = torch.__version__
    import nvidia.dali

    results["dali"] = nvidia.dali.__version__
    small = [v for v in corpus if v.codec == CODEC and v.width == 224]
    large = [v for v in corpus if v.codec == CODEC and v.width == 640]
    count = BATCH * (4 if DEVICE == "gpu" else 1)
    log(f"device {results['device']}; {len(small)} videos 224x224, {len(large)} 640x480")
    clips = {s: batches_of(clip_samples(small, s, count, seed=1)) for s in ("whole", 32, 8, 2)}
    sparse = {gop: batches_of(sparse_samples(small, gop, count, seed=3)) for gop in (2, 8, 32)}
    short = {n: batches_of(clip_samples(small, 2, count, seed=4, length=n)) for n in (4, 8)}
    big = batches_of(clip_samples(large, 8, BATCH * 2, seed=2)) if large else []
    alone = {"reuse_sessions": False, "batch_size": 8, "max_batches": 2}
    configs = [
        (
            "clips224 whole-video, session per request, 1 pipeline",
            run_gpu,
            clips["whole"],
            {"pipelines": 1, **alone},
        ),
        (
            "clips224 segments gop32, session per request, 1 pipeline",
            run_gpu,
            clips[32],
            {"pipelines": 1, **alone},
        ),
        (
            "clips224 segments gop32, session per request, 8 pipelines",
            run_gpu,
            clips[32],
            {"pipelines": 8, **alone},
        ),
        ("clips224 segments gop32, joined, 1 pipeline", run_gpu, clips[32], {"pipelines": 1, "batch_size": 8}),
        ("clips224 segments gop32, joined, 8 pipelines", run_gpu, clips[32], {"pipelines": 8, "batch_size": 4}),
        ("clips224 segments gop8, joined, 8 pipelines x 1", run_gpu, clips[8], {"pipelines": 8, "batch_size": 1}),
        ("clips224 segments gop8, joined, 8 pipelines x 4", run_gpu, clips[8], {"pipelines": 8, "batch_size": 4}),
        ("clips224 segments gop8, joined, 16 pipelines x 2", run_gpu, clips[8], {"pipelines": 16, "batch_size": 2}),
        ("clips224 segments gop2, joined, 8 pipelines x 4", run_gpu, clips[2], {"pipelines": 8, "batch_size": 4}),
        ("clips224 segments gop8, joined, 24 pipelines x 2", run_gpu, clips[8], {"pipelines": 24, "batch_size": 2}),
        ("clips224 segments gop8, joined, 32 pipelines x 1", run_gpu, clips[8], {"pipelines": 32, "batch_size": 1}),
        ("clips224 segments gop2, joined, 16 pipelines x 2", run_gpu, clips[2], {"pipelines": 16, "batch_size": 2}),
        ("clips224 segments gop2, joined, 32 pipelines x 1", run_gpu, clips[2], {"pipelines": 32, "batch_size": 1}),
        (
            "clips224 segments gop2, joined in 14 workers, 32 pipelines x 1, end to end",
            run_pipelined,
            clips[2],
            {"workers": 14, "pipelines": 32, "batch_size": 1},
        ),
        *[
            (
                f"short{n} clips224 segments gop2, joined, 16 pipelines x 2",
                run_gpu,
                short[n],
                {"pipelines": 16, "batch_size": 2},
            )
            for n in (4, 8)
        ],
        *[(f"short{n} clips224 segments gop2, pyav, all host cores", run_cpu, short[n], {}) for n in (4, 8)],
        (
            "clips224 segments gop8, joined in 14 workers, 8 pipelines x 4, end to end",
            run_pipelined,
            clips[8],
            {"workers": 14, "pipelines": 8, "batch_size": 4},
        ),
        ("clips640x480 segments gop8, joined, 8 pipelines x 4", run_gpu, big, {"pipelines": 8, "batch_size": 4}),
        ("clips640x480 segments gop8, pyav, all host cores", run_cpu, big, {}),
        *[
            (
                f"sparse224 2 cams x 2 frames, gop{gop}, joined, 8 pipelines x 4",
                run_gpu,
                sparse[gop],
                {"pipelines": 8, "batch_size": 4},
            )
            for gop in (2, 8, 32)
        ],
        *[
            (f"sparse224 2 cams x 2 frames, gop{gop}, pyav, all host cores", run_cpu, sparse[gop], {})
            for gop in (2, 8, 32)
        ],
        ("clips224 segments gop8, pyav, all host cores", run_cpu, clips[8], {}),
        ("clips224 segments gop32, pyav, all host cores", run_cpu, clips[32], {}),
        ("clips224 whole-video, pyav, all host cores", run_cpu, clips["whole"], {}),
    ]
    only = re.compile(os.environ.get("DECODE_ONLY", ""))
    for label, runner, batches, options in configs:
        if batches and only.search(label):
            if runner is run_gpu:
                options = {"reuse_sessions": True, **options}
            runner(label, batches, **options)
    out_path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
