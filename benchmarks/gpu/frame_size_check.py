"""On the GPU: DALI refuses segments whose frames are not the size the store declares.

A batch holds a 224x224 segment (as declared), a 448x448 one and a VP9 one in an H.264 stream;
DALI on the GPU, with joined sessions and with one session per request, must decode the first and
skip the others (counted, named), as the CPU backends do (tests/hostile/test_resource_limits.py).

usage: python benchmarks/gpu/frame_size_check.py OUT.json
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from mmdata.codecs.decoders import ClipRequest, SegmentRef, make_video_decoder  # noqa: E402
from mmdata.codecs.video_encode import VideoEncoding, encode_segments  # noqa: E402
from mmdata.synthetic import read_index_stripe, synthetic_frame  # noqa: E402


def segment(size: int, codec: str = "h264") -> bytes:
    frames = [synthetic_frame(i, 0, size, size) for i in range(16)]
    ((_, data),) = encode_segments(frames, Fraction(30), size, size, VideoEncoding(codec, 16, 8))
    return data


def main() -> None:
    declared = (224, 224)
    requests = [
        ClipRequest(segment(224), (3, 9), "h264", SegmentRef("ep0", "cam", 0), 8, declared),
        ClipRequest(segment(448), (3,), "h264", SegmentRef("ep0", "cam", 1), 8, declared),
        ClipRequest(segment(224, "vp9"), (2,), "h264", SegmentRef("ep0", "cam", 2), 8, declared),
        ClipRequest(segment(224), (0, 15), "h264", SegmentRef("ep0", "cam", 3), 8, declared),
    ]
    results = {}
    for joined in (True, False):
        decoder = make_video_decoder("dali", ["h264"], device="cuda", reuse_sessions=joined, pipelines=2)
        outputs = decoder.decode(requests, on_error="skip")
        good = [o for o in outputs if o is not None]
        stripes = [[read_index_stripe(frame) for frame in o.cpu().numpy()] for o in good]
        results["joined" if joined else "per_request"] = {
            "decoded": [o is not None for o in outputs],
            "shapes": [list(o.shape) for o in good],
            "stripes": stripes,
            "skipped": decoder.stats.skipped,
            "why": decoder.stats.skipped_where,
        }
        assert [o is not None for o in outputs] == [True, False, False, True], outputs
        assert stripes == [[3, 9], [0, 15]], stripes
        assert all(tuple(o.shape[1:]) == (224, 224, 3) for o in good)
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    assert np.all([r["skipped"] == 2 for r in results.values()])
    print("frame size check: OK")


if __name__ == "__main__":
    main()
