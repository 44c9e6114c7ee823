#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage (see run_decode.sh): DALI's GPU
# decoder on H.264, HEVC and VP9 segments against PyAV on the same bytes.
set -euo pipefail
mkdir -p /tmp/site
cat /root/stage/dali.tar.xz.part* | xz -d -T0 | tar x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stage/*.whl .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 benchmarks/gpu/check_codecs_gpu.py .gpudata/corpus_codecs.pkl "${OUT:-/tmp}/codecs_gpu.json"
