"""What PyNvVideoCodec does with mmdata's packets on this GPU, recorded before the nvdec checks run, so
that a failing `PyNvSession` can be fixed from one run's output.

usage: python benchmarks/gpu/nvdec_probe.py STORE OUT.json

For the first segment of one episode's `cam_high`: `PyNvSession` as written, then the same packets with
each packet flagged as a whole picture (`VideoPacketFlag.ENDOFPICTURE`, what NVIDIA's low-latency sample
sets), and with the decoder's default latency; per variant the frames that came out (their PTS), the
NV12 shape, the time, or the error with its traceback. Also the module's version and the names the
decoder and a decoded frame offer.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from hybrid_check import CAMERA  # noqa: E402

import mmdata  # noqa: E402
from mmdata.codecs.bitstream import elementary_stream  # noqa: E402
from mmdata.codecs.decoders.nvdec import PyNvSession, _run_packets  # noqa: E402
from mmdata.codecs.decoders.pyav_decoder import probe_segment  # noqa: E402
from mmdata.codecs.packet_index import index_segment  # noqa: E402


def first_segment(store: str):
    dataset = mmdata.open_dataset(store)
    (request, *_) = dataset.plan_frames(0, CAMERA, np.arange(4) / 30).requests
    index = request.packets or index_segment(request.data)
    stream = elementary_stream(request.codec, index.codec_config)
    packets = _run_packets(request.data, index, stream, 0, int(index.frames.max()))
    return replace(request, frame_size=request.frame_size or probe_segment(request)), index, packets


def variant(name: str, request, packets, flag_pictures: bool, low_latency: bool) -> dict:
    import PyNvVideoCodec as nvc
    import torch

    record: dict = {"variant": name}
    try:
        if low_latency:
            decoder = PyNvSession(request.codec, request.frame_size, 0)._decoder
        else:
            decoder = nvc.CreateDecoder(
                gpuid=0,
                codec=nvc.cudaVideoCodec.H264 if request.codec == "h264" else nvc.cudaVideoCodec.HEVC,
                cudacontext=0,
                cudastream=0,
                usedevicememory=True,
                maxwidth=request.frame_size[0],
                maxheight=request.frame_size[1],
                outputColorType=nvc.OutputColorType.NATIVE,
            )
        started = time.perf_counter()
        shown, shapes = [], set()
        for data, pts in [*packets, (b"", 0)]:
            buffer = np.frombuffer(data, np.uint8)
            packet = nvc.PacketData()
            packet.bsl_data, packet.bsl, packet.pts = buffer.ctypes.data, buffer.size, pts
            if flag_pictures and data:
                packet.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
            for frame in decoder.Decode(packet):
                tensor = torch.from_dlpack(frame)
                shown.append(int(frame.getPTS()))
                shapes.add((tuple(tensor.shape), str(tensor.dtype), str(tensor.device)))
                record.setdefault("frame_names", [n for n in dir(frame) if not n.startswith("_")])
        torch.cuda.synchronize()
        record.update(seconds=round(time.perf_counter() - started, 4), shown=shown, shapes=sorted(map(str, shapes)))
        record["decoder_names"] = [n for n in dir(decoder) if not n.startswith("_")]
        if low_latency and not flag_pictures:
            session = PyNvSession(request.codec, request.frame_size, 0)
            record["session_decode"] = [pts for pts, _ in session.decode(packets)]
    except Exception as exc:  # the point of the probe: what failed, and where
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-3000:]
    return record


def main() -> None:
    store, out = sys.argv[1:3]
    import PyNvVideoCodec as nvc

    request, index, packets = first_segment(store)
    record = {
        "benchmark": "nvdec_probe",
        "pynvvideocodec": getattr(nvc, "__version__", "?"),
        "module_names": sorted(n for n in dir(nvc) if not n.startswith("_")),
        "codec": request.codec,
        "frame_size": request.frame_size,
        "packets": len(packets),
        "frames_in_display_order": index.frames.tolist(),
        "variants": [
            variant("as written (low latency)", request, packets, flag_pictures=False, low_latency=True),
            variant("low latency, ENDOFPICTURE", request, packets, flag_pictures=True, low_latency=True),
            variant("default latency", request, packets, flag_pictures=False, low_latency=False),
        ],
    }
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    for line in record["variants"]:
        print({k: v for k, v in line.items() if k not in ("decoder_names", "frame_names")})


if __name__ == "__main__":
    main()
