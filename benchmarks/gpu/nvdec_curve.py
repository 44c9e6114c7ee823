"""The NVDEC limit: decoded frames/s of whole streams (no seeking) by codec, frame size and number of
concurrent decoder sessions, through each GPU backend present, with frames/s = 1 / (a + b x pixels)
fitted per session count (a: the fixed cost of a frame, b: its cost per pixel).

usage:
  python benchmarks/gpu/nvdec_curve.py --prepare CORPUS.pkl        (here: encode the streams with PyAV)
  python benchmarks/gpu/nvdec_curve.py CORPUS.pkl OUT.json         (on the GPU machine)
  python benchmarks/gpu/nvdec_curve.py CORPUS.pkl OUT.json --dry-run-on-cpu   (checks this script:
      DALI's CPU decoder on a VP9 corpus of small frames, 1 and 2 sessions)

Backends: DALI (`DaliDecoder`, one pipeline per session, each decoding the whole stream), and
PyNvVideoCodec when importable (2.x `SimpleDecoder` over the bytes in memory, one per thread).
A backend that fails records its error in its rows; the others still run.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

DRY_RUN = "--dry-run-on-cpu" in sys.argv
RESOLUTIONS = [(1920, 1080), (640, 480), (224, 224), (112, 112)]
SESSIONS = [1, 2, 4, 7, 14]
SECONDS = float(os.environ.get("CURVE_SECONDS", 2.0))  # measuring time per cell


def stream_frames(width: int, height: int) -> int:
    """Frames per stream: about 200 MB of RGB output per decode, from 60 to 300 frames (1080p: 60)."""
    return int(min(300, max(60, 200e6 // (width * height * 3))))


def prepare(path: Path, codecs: list[str], resolutions: list[tuple[int, int]]) -> None:
    """Encode one whole stream per codec and size (key frame every 250 frames, as recorders write)."""
    from mmdata.codecs.video_encode import VideoEncoding, encode_segments
    from mmdata.synthetic import synthetic_frame

    corpus = []
    for codec in codecs:
        for width, height in resolutions:
            count = stream_frames(width, height)
            frames = (synthetic_frame(i, 0, height, width) for i in range(count))
            encoding = VideoEncoding(codec, count, min(250, count))
            ((_, data),) = encode_segments(frames, Fraction(30), width, height, encoding)
            corpus.append({"codec": codec, "width": width, "height": height, "frames": count, "data": data})
            print(f"{codec} {width}x{height}: {count} frames, {len(data) / 1e6:.1f} MB", flush=True)
    path.write_bytes(pickle.dumps(corpus))


def measure_dali(stream: dict, sessions: int) -> float:
    """Frames/s of `sessions` DALI pipelines each decoding the whole stream at once."""
    from mmdata.codecs.decoders import ClipRequest
    from mmdata.codecs.decoders.dali_decoder import DaliDecoder

    decoder = DaliDecoder(device="cpu" if DRY_RUN else "gpu", pipelines=sessions, batch_size=1)
    frames = tuple(range(stream["frames"]))
    requests = [
        ClipRequest(stream["data"], frames, stream["codec"], frame_size=(stream["width"], stream["height"]))
        for _ in range(sessions)
    ]
    decoder.decode(requests)  # builds the pipelines
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < SECONDS:
        outputs = decoder.decode(requests)
        _synchronize(outputs)
        done += sum(len(o) for o in outputs)
    return done / (time.perf_counter() - started)


def measure_pynvvideocodec(stream: dict, sessions: int) -> float:
    """Frames/s of `sessions` threads, each with its own PyNvVideoCodec `SimpleDecoder` (2.x) over the
    stream's bytes in memory, decoding it start to end in batches of 32 (NV12 left on the GPU: NVDEC's
    own work, no colour conversion), again and again."""
    import PyNvVideoCodec as nvc

    counts = [0] * sessions
    errors: list[BaseException] = []
    native = nvc.OutputColorType.NATIVE
    decoders = [
        nvc.SimpleDecoder(stream["data"], use_device_memory=True, output_color_type=native) for _ in range(sessions)
    ]
    deadline = time.perf_counter() + SECONDS

    def run(slot: int) -> None:
        decoder = decoders[slot]
        try:
            while time.perf_counter() < deadline:
                decoder.seek_to_index(0)
                for _ in range(0, len(decoder), 32):
                    counts[slot] += len(decoder.get_batch_frames(32))
        except BaseException as exc:  # recorded in the row, the other backends still run
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - started)


def fit(rows: list[dict]) -> list[dict]:
    """Per backend, codec and session count: frames/s = 1 / (a + b x pixels), least squares on 1 / rate."""
    fits = []
    keys = {(r["backend"], r["codec"], r["sessions"]) for r in rows if "frames_per_s" in r}
    for backend, codec, sessions in sorted(keys):
        cells = [r for r in rows if (r["backend"], r["codec"], r["sessions"]) == (backend, codec, sessions)]
        cells = [r for r in cells if "frames_per_s" in r]
        if len(cells) < 2:
            continue
        pixels = np.array([r["width"] * r["height"] for r in cells], float)
        seconds_per_frame = 1.0 / np.array([r["frames_per_s"] for r in cells])
        b, a = np.polyfit(pixels, seconds_per_frame, 1)
        fits.append(
            {
                "backend": backend,
                "codec": codec,
                "sessions": sessions,
                "a_us_per_frame": round(a * 1e6, 3),
                "b_ns_per_pixel": round(b * 1e9, 6),
                "frames_per_s_at_224x224": round(1 / (a + b * 224 * 224), 1),
            }
        )
    return fits


def _synchronize(outputs) -> None:
    first = next((o for o in outputs if o is not None), None)
    if first is not None and hasattr(first, "device") and getattr(first.device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize()


def _device_name() -> str:
    if DRY_RUN:
        return f"CPU dry run ({platform.processor() or platform.machine()})"
    import torch

    return torch.cuda.get_device_name(0)


def main() -> None:
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--prepare" in sys.argv:
        codecs = ["vp9"] if DRY_RUN else ["h264", "hevc"]
        resolutions = RESOLUTIONS[2:] if DRY_RUN else RESOLUTIONS
        prepare(Path(arguments[0]), codecs, resolutions)
        return
    corpus = pickle.loads(Path(arguments[0]).read_bytes())
    sessions = [1, 2] if DRY_RUN else SESSIONS
    backends = {"dali": measure_dali, "pynvvideocodec": measure_pynvvideocodec}
    rows: list[dict] = []
    for name, measure in backends.items():
        for stream in corpus:
            for count in sessions:
                row = {"backend": name, "codec": stream["codec"], "width": stream["width"]}
                row.update({"height": stream["height"], "sessions": count, "frames": stream["frames"]})
                try:
                    row["frames_per_s"] = round(measure(stream, count), 1)
                except Exception as exc:  # a backend that cannot run is a row, not a stop
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                if "error" in row and name == "pynvvideocodec":
                    break  # the backend cannot run here: one row says why
            if rows[-1].get("error") and name == "pynvvideocodec":
                break
    record = {
        "benchmark": "nvdec_curve",
        "device": _device_name(),
        "seconds_per_cell": SECONDS,
        "rows": rows,
        "fits": fit(rows),
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(arguments[1]).write_text(json.dumps(record, indent=1) + "\n")
    for line in record["fits"]:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
