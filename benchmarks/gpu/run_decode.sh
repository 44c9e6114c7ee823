#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls (see DEVELOPERS notes
# in docs/architecture.md): unpack DALI, install the carried wheels (.whl: av), run the decode benchmark.
set -euo pipefail
source "$(dirname "$0")/setup_site.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
DECODE_ONLY="${DECODE_ONLY:-}" python3 benchmarks/gpu/decode_gpu.py .gpudata/corpus_h264.pkl "${OUT:-/tmp}/decode_gpu.json" 2>&1 | tee "${OUT:-/tmp}/decode_gpu.log"
