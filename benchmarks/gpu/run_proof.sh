#!/usr/bin/env bash
# On the GPU machine, in the call that carries .stage/s4 (calls 1-3 copied s1-s3 to /root/stage; see
# stage.sh): unpack DALI and the wheels, then issue 30's checks in its order, each under its own time
# limit so that a hang costs one step: the PyNvVideoCodec probe, nvdec_check, the NVDEC curve,
# hybrid_check, then `mmdata bench` at a 100 ms step (64 x 2 cameras x 16-frame clips by backend; policy
# windows at batch 256). Everything lands in /root/proof, packed into $OUT/proof.tar after each step.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
W=/root/proof
S=/root/stage
mkdir -p "$W" "$S" /tmp/site "$OUT"
source "$(dirname "$0")/steps.sh"
source "$(dirname "$0")/unpack_stage.sh"
D="$S/gpudata"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu.txt"
if [ -z "${ONLY_BENCH:-}" ]; then  # ONLY_BENCH=1: the loader figures only (the hardware facts are known)
step nvdec_probe 60 python3 benchmarks/gpu/nvdec_probe.py "$D/loader_store.wds" "$W/nvdec_probe.json"
step nvdec_check 120 python3 benchmarks/gpu/nvdec_check.py "$D/loader_store.wds" "$W/nvdec_check.json"
export CURVE_SECONDS="${CURVE_SECONDS:-0.5}"
step nvdec_curve 170 python3 benchmarks/gpu/nvdec_curve.py "$D/curve.pkl" \
  "$W/nvdec_curve.json"
step hybrid_check 75 python3 benchmarks/gpu/hybrid_check.py "$D/loader_store.wds" "$W/hybrid_check.json"
fi
bench() {  # NAME ARGS...: mmdata bench on the carried store at a 100 ms simulated step
  local name=$1
  shift
  step "bench_$name" 80 python3 -m mmdata bench "$D/loader_store.wds" --device cuda --step-ms 100 \
    --json "$W/bench_$name.json" "$@"
}
bench clips64_nvdec --spec clips --batch-size 64 --decoder nvdec --num-workers 8 --steps 20
bench clips64_dali --spec clips --batch-size 64 --decoder dali --num-workers 8 --steps 20
bench clips64_pyav --spec clips --batch-size 64 --decoder pyav --num-workers 15 --steps 20
bench clips64_hybrid --spec clips --batch-size 64 --decoder hybrid --num-workers 8 --steps 20
bench policy256_auto --spec policy --batch-size 256 --decoder auto --num-workers 15 --steps 30
bench policy256_nvdec --spec policy --batch-size 256 --decoder nvdec --num-workers 8 --steps 30
bench policy256_hybrid --spec policy --batch-size 256 --decoder hybrid --num-workers 8 --steps 30
log "done"
pack
