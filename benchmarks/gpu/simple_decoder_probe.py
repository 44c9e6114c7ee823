"""Does PyNvVideoCodec's own container path scale where `decoder="nvdec"` does not? A measurement for the
next GPU work, not a backend.

usage: python benchmarks/gpu/simple_decoder_probe.py STORE OUT.json

`decoder="nvdec"` feeds packets one Python call each and stopped scaling at 2 sessions (nvdec_check on an
H200: 3,738 delivered frames/s for 16-frame 224x224 clips), while PyNvVideoCodec's `SimpleDecoder` over
whole streams reached 15,306 decoded frames/s with 4 threads (nvdec_curve). This times, on the same 192
clip requests as nvdec_check, a `SimpleDecoder` per thread taking each request's stored segment (the
container demuxed in C++) and its frames by `get_batch_frames_by_index`: once with a new decoder per
segment, once reusing each thread's decoder through `reconfigure_decoder`. Frames are checked by the
frame numbers drawn in them, after the same NV12-to-RGB conversion the backend uses.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybrid_check import clip_requests  # noqa: E402

from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.codecs.nv12 import nv12_to_rgb  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

SECONDS = 2.0


def frames_of(decoder, request):
    import torch

    planes = [torch.from_dlpack(f) for f in decoder.get_batch_frames_by_index(list(request.frames))]
    return torch.stack([plane.reshape(-1, plane.shape[-1]) for plane in planes])


def check(requests) -> bool:
    """The first 8 requests' frames carry the frame numbers PyAV's do."""
    import PyNvVideoCodec as nvc

    for request, reference in zip(requests[:8], PyAvDecoder().decode(requests[:8])):
        decoder = nvc.SimpleDecoder(request.data, use_device_memory=True, output_color_type=nvc.OutputColorType.NATIVE)
        rgb = nv12_to_rgb(frames_of(decoder, request), reference.shape[1]).cpu().numpy()
        if [read_index_stripe(f) for f in rgb] != [read_index_stripe(f) for f in reference]:
            return False
    return True


def run(requests, threads: int, reuse: bool) -> dict:
    import PyNvVideoCodec as nvc
    import torch

    native = nvc.OutputColorType.NATIVE
    counts, errors = [0] * threads, []
    deadline = time.perf_counter() + SECONDS

    def work(slot: int) -> None:
        decoder = None
        try:
            while time.perf_counter() < deadline:
                for request in requests[slot::threads]:
                    if decoder is None or not reuse:
                        decoder = nvc.SimpleDecoder(request.data, use_device_memory=True, output_color_type=native)
                    else:
                        decoder.reconfigure_decoder(request.data)
                    counts[slot] += len(frames_of(decoder, request))
        except Exception as exc:  # recorded in the row
            errors.append(f"{type(exc).__name__}: {exc}"[:300] + "\n" + traceback.format_exc()[-1500:])

    started = time.perf_counter()
    pool = [threading.Thread(target=work, args=(slot,)) for slot in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    torch.cuda.synchronize()
    row = {"threads": threads, "reuse": reuse, "frames_per_s": round(sum(counts) / (time.perf_counter() - started))}
    if errors:
        row["error"] = errors[0]
    print(json.dumps({k: v for k, v in row.items() if k != "error"} | {"error": row.get("error", "")[:200]}))
    return row


def main() -> None:
    store, out = sys.argv[1:3]
    import torch

    requests = clip_requests(store)
    record = {"benchmark": "simple_decoder_probe", "device": torch.cuda.get_device_name(0), "rows": []}
    try:
        record["frames_check"] = check(requests)
    except Exception as exc:
        record["frames_check"] = f"{type(exc).__name__}: {exc}"[:300]
    for reuse in (False, True):
        for threads in (1, 4, 7):
            record["rows"].append(run(requests, threads, reuse))
            Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
