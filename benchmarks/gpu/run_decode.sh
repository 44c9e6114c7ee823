#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls (see DEVELOPERS notes
# in docs/architecture.md): unpack DALI, install the carried wheels (.whl: av), run the decode benchmark.
set -euo pipefail
mkdir -p /tmp/site
cat /root/stage/dali.tar.xz.part* | xz -d -T0 | tar x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stage/*.whl .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
DECODE_ONLY="${DECODE_ONLY:-}" python3 benchmarks/gpu/decode_gpu.py .gpudata/corpus_h264.pkl "${OUT:-/tmp}/decode_gpu.json" 2>&1 | tee "${OUT:-/tmp}/decode_gpu.log"
