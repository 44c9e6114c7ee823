#!/usr/bin/env bash
# On the GPU machine, in the call that carries .stage/s4 and .gpudata/sizes.pkl (decode_sizes.py --prepare,
# made here); calls 1-3 copied s1-s3 to /root/stage (see stage.sh): nvdec, DALI and PyAV on every host core
# by codec, frame size and request length, the figures behind `auto`'s choice table.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
source "$(dirname "$0")/unpack_stage.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 python3 benchmarks/gpu/decode_sizes.py .gpudata/sizes.pkl "$OUT/decode_sizes.json" 2>&1 \
  | grep -v '^\[WARN\|^$' | tee "$OUT/decode_sizes.log"
