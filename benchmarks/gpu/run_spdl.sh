#!/usr/bin/env bash
# On the GPU machine, issue 39's proof in one call of about 4 minutes (the call that carries .stage_spdl/s2;
# call 1 carried .stage_spdl/s1 and copied it to /root/stage). Each step runs under its own time limit and the
# results are packed into $OUT/proof.tar after each, so that a timeout loses only the last: spdl_check.py
# (frames against PyAV, clips by thread count, the whole-stream curve), then `mmdata bench` at a 100 ms step
# (64 x 2 x 16-frame clips with spdl-nvdec and 2 workers, the same with PyAV in 15 workers and with the hybrid of
# both in 14 workers, policy windows at batch 256 with spdl-nvdec), then targets.py's gpu_targets.json.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
W=/root/proof
S=/root/stage
D="$S/gpudata"
mkdir -p "$W" "$S" "$D" /tmp/site "$OUT"
source "$(dirname "$0")/steps.sh"
log "unpack"
tar xf .stage_spdl/s2/gpudata.tar -C "$D"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$S"/*.whl 2>&1 | tail -3
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu.txt"
python3 -m mmdata.codecs.decoders.link_spdl 2>&1 | tail -2 | tee -a "$W/steps.txt"
step spdl_check 110 python3 benchmarks/gpu/spdl_check.py "$D/loader_store.wds" "$D/curve.pkl" "$W/spdl_check.json"
bench() {  # NAME ARGS...: mmdata bench on the carried store at a 100 ms simulated step
  local name=$1
  shift
  step "bench_$name" 50 python3 -m mmdata bench "$D/loader_store.wds" --device cuda --step-ms 100 \
    --json "$W/bench_$name.json" "$@"
}
bench clips64_spdl_nvdec --spec clips --batch-size 64 --decoder spdl-nvdec --num-workers 2 --steps 15
bench clips64_pyav --spec clips --batch-size 64 --decoder pyav --num-workers 15 --steps 15
bench clips64_hybrid_spdl --spec clips --batch-size 64 --decoder hybrid --hybrid-gpu spdl-nvdec --num-workers 14 \
  --steps 15
bench policy256_spdl_nvdec --spec policy --batch-size 256 --decoder spdl-nvdec --num-workers 2 --steps 20
python3 benchmarks/gpu/targets.py "$W" > "$W/targets.log" 2>&1
log "done"
pack
