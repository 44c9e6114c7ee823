"""Draw the NVDEC curve (`nvdec_curve.py`'s JSON): decoded frames/s against frame size, one line per backend,
codec and session count, with the 1 / (a + b x pixels) fits dashed.

usage: python benchmarks/gpu/plot_curve.py CURVE.json OUT.png   (needs matplotlib: pip install 'mmdata[bench]')
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    source, out = sys.argv[1:3]
    record = json.loads(Path(source).read_text())
    rows = [r for r in record["rows"] if "frames_per_s" in r]
    fits = {(f["backend"], f["codec"], f["sessions"]): f for f in record["fits"]}
    figure, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    pixels = np.geomspace(112 * 112, 1920 * 1080, 50)
    for axis, backend in zip(axes, ("pynvvideocodec", "dali")):
        for codec, marker in (("h264", "o"), ("hevc", "s")):
            for sessions in sorted({r["sessions"] for r in rows}):
                cells = sorted(
                    (r["width"] * r["height"], r["frames_per_s"])
                    for r in rows
                    if (r["backend"], r["codec"], r["sessions"]) == (backend, codec, sessions)
                )
                if not cells:
                    continue
                line = axis.plot(*zip(*cells), marker=marker, label=f"{codec}, {sessions} session(s)")[0]
                fit = fits.get((backend, codec, sessions))
                if fit and fit["a_us_per_frame"] > 0 and fit["b_ns_per_pixel"] > 0:
                    model = 1 / (fit["a_us_per_frame"] * 1e-6 + fit["b_ns_per_pixel"] * 1e-9 * pixels)
                    axis.plot(pixels, model, linestyle="--", color=line.get_color(), alpha=0.5)
        axis.set(xscale="log", yscale="log", xlabel="pixels per frame", title=f"{backend}: whole streams")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("decoded frames/s")
    figure.suptitle(f"NVDEC curve on {record['device']} ({record['date']}; dashed: 1 / (a + b x pixels))")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    print(f"written {out}")


if __name__ == "__main__":
    main()
