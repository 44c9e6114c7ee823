#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls (see prepare.sh):
# unpack DALI, install the carried wheels (.whl: av, pynvvideocodec, ...), and measure the NVDEC curve
# (benchmarks/gpu/nvdec_curve.py) on the corpus prepare.sh encoded into .gpudata/curve.pkl; then check the
# hybrid decoder against PyAV and time it against each side alone (benchmarks/gpu/hybrid_check.py); and the
# PyNvVideoCodec backend (decoder="nvdec") the same way, by session count, against DALI (nvdec_check.py).
set -euo pipefail
source "$(dirname "$0")/setup_site.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
CURVE_SECONDS="${CURVE_SECONDS:-1.5}" python3 benchmarks/gpu/nvdec_curve.py .gpudata/curve.pkl \
  "${OUT:-/tmp}/nvdec_curve.json" 2>&1 | tee "${OUT:-/tmp}/nvdec_curve.log"
python3 benchmarks/gpu/hybrid_check.py .gpudata/loader_store.wds "${OUT:-/tmp}/hybrid_check.json" 2>&1 \
  | tee "${OUT:-/tmp}/hybrid_check.log"
python3 benchmarks/gpu/nvdec_check.py .gpudata/loader_store.wds "${OUT:-/tmp}/nvdec_check.json" 2>&1 \
  | tee "${OUT:-/tmp}/nvdec_check.log"
