#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage (see run_decode.sh): DALI's GPU
# decoder on H.264, HEVC and VP9 segments against PyAV on the same bytes.
set -euo pipefail
source "$(dirname "$0")/setup_site.sh"
python3 benchmarks/gpu/check_codecs_gpu.py .gpudata/corpus_codecs.pkl "${OUT:-/tmp}/codecs_gpu.json"
