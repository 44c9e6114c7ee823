"""On the GPU: DALI decodes H.264, HEVC and VP9 segments, joined or one session per request,
to the frames PyAV gives on the same bytes (index stripe exact, mean difference below 1).

usage: python benchmarks/gpu/check_codecs_gpu.py CORPUS.pkl OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from decode_workload import clip_samples, load_or_encode  # noqa: E402

from mmdata.codecs.decoders.dali_decoder import DaliDecoder  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import PyAvDecoder  # noqa: E402
from mmdata.synthetic import read_index_stripe  # noqa: E402


def main() -> None:
    corpus = load_or_encode(Path(sys.argv[1]))
    rows = []
    for codec in sorted({v.codec for v in corpus}):
        videos = [v for v in corpus if v.codec == codec]
        requests = [r for sample in clip_samples(videos, 8, 48, seed=5) for r in sample[0]]
        reference = PyAvDecoder().decode(requests)
        for reuse in (True, False):
            row = {"codec": codec, "joined": reuse, "requests": len(requests)}
            try:
                frames = DaliDecoder(device="gpu", pipelines=2, batch_size=4, reuse_sessions=reuse).decode(requests)
                torch.cuda.synchronize()
                cpu = [f.cpu().numpy() for f in frames]
                row["mean_abs_difference_vs_pyav"] = round(
                    float(np.mean([np.abs(a.astype(np.int16) - b).mean() for a, b in zip(cpu, reference)])), 4
                )
                row["stripes_exact"] = all(
                    [read_index_stripe(f) for f in a] == [read_index_stripe(f) for f in b]
                    for a, b in zip(cpu, reference)
                )
            except Exception as exc:  # report any backend failure per codec instead of stopping the check
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(sys.argv[2]).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
