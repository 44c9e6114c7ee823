"""The PyNvVideoCodec backend (decoder="nvdec") on the GPU: the same frames as PyAV, and its clip frames/s
by session count against DALI's, in the same run.

usage: python benchmarks/gpu/nvdec_check.py STORE OUT.json [--dry-run-on-cpu]
(STORE: the carried `.gpudata/loader_store.wds`; the dry run stands PyAV in for the hardware sessions, as
tests/test_nvdec.py does, to check the script here)

For 16-frame clips of every episode's `cam_high`: the mean absolute difference against PyAV after RGB
conversion (the issue asks below 1 level) and whether the frame numbers drawn in the frames are identical;
then frames/s with 1, 2, 4, 7 and 14 sessions, and DALI's on the same requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from hybrid_check import DRY_RUN, clip_requests, host, rate  # noqa: E402

from mmdata.codecs.decoders import make_video_decoder  # noqa: E402
from mmdata.codecs.decoders.nvdec import NvdecDecoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402

SESSIONS = (1, 2, 4, 7, 14)


def nvdec(sessions: int) -> NvdecDecoder:
    if DRY_RUN:
        from tests.test_nvdec import PyAvSession

        return NvdecDecoder(sessions=sessions, open_session=PyAvSession)
    return make_video_decoder("nvdec", ["h264"], sessions=sessions)


def main() -> None:
    store, out = [a for a in sys.argv[1:] if not a.startswith("--")]
    requests = clip_requests(store)
    reference = PyAvDecoder().decode(requests)
    decoder = nvdec(7)
    frames = decoder.decode(requests)
    differences = [
        float(np.abs(host(a).astype(np.int16) - b.astype(np.int16)).mean()) for a, b in zip(frames, reference)
    ]
    stripes = all(
        [read_index_stripe(f) for f in host(a)] == [read_index_stripe(f) for f in b] for a, b in zip(frames, reference)
    )
    figures = {f"nvdec_{count}": round(rate(nvdec(count), requests), 1) for count in SESSIONS}
    if not DRY_RUN:
        figures["dali"] = round(rate(make_video_decoder("dali", ["h264"]), requests), 1)
    figures["pyav_one_core"] = round(rate(PyAvDecoder(), requests), 1)
    record = {
        "benchmark": "nvdec_check",
        "device": "CPU dry run" if DRY_RUN else __import__("torch").cuda.get_device_name(0),
        "requests": len(requests),
        "frames_per_request": 16,
        "mean_abs_difference_max": round(max(differences), 4),
        "stripes_identical": stripes,
        "frames_per_s": figures,
        "describe": decoder.describe(),
    }
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
