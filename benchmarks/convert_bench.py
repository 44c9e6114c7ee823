"""Conversion throughput per video codec on the synthetic dataset, per importer, and of a LeRobot dataset
re-encoded against copied (`--video-codec copy`), measured in one run.

Prints episodes/s, frames/s, input MB/s and the output/input size ratio for h264, hevc and
vp9 (raw layout in), then episodes/s and frames/s of the RLDS importer (the TFDS-written fixture,
its record file copied to make more episodes) and of the MCAP importer (ROS 2 logs written with the
test suite's writer: a 30 Hz JPEG camera and 200 Hz joint states), and writes the figures with the
machine named to benchmarks/results/. With `--lerobot DATASET` (a LeRobot v3.0 dataset, as
`benchmarks/lerobot_bench.py` writes: ~/.cache/mmdata-bench/lerobot-data/lerobot-100x6s), it converts that dataset
with the default options and with `--video-codec copy`, alternating, `--rounds` times each, and prints the camera
frames/s of both (medians), their ratio, and each store's size against the dataset's. Run from the repository root.

The conversions' worker processes are spawned, and a spawned process imports the running script again
before its first job: this script therefore imports its measuring code (`convert_figures.py`) only when
run, so that its workers load what the `mmdata` command's load (see mmdata/tools/entry.py).
"""

from __future__ import annotations

if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from convert_figures import main

    main(__doc__)
