#!/usr/bin/env bash
# `mmdata bench` on the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls:
# unpack DALI, install the carried wheels (.whl: av, xxhash, tqdm, fsspec), then bench the carried
# store (.gpudata/loader_store.wds: `mmdata synth --episodes 16 --min-seconds 20 --max-seconds 20`,
# `mmdata convert --to wds`, made on the development machine) with a simulated 100 ms step:
#   1. the restated clip target: 16-frame clips of 2 cameras, batches of 64 samples, with DALI in the main
#      process, with DALI and PyAV sharing each batch (hybrid), with PyNvVideoCodec (nvdec), and on the host's
#      CPU cores (PyAV, 15 workers);
#   2. policy windows at batch 256 (decoder auto: the CPU for 2-frame requests; and hybrid);
#   3. sequences (8 s chunks at 10 fps, DALI).
set -euo pipefail
source "$(dirname "$0")/setup_site.sh"
export PYTHONWARNINGS=ignore
OUT="${OUT:-/tmp}"
STORE=.gpudata/loader_store.wds
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {  # one configuration; a failure is reported and the next one still runs
  local name=$1; shift
  python3 -m mmdata bench "$STORE" --device cuda --step-ms 100 --json "$OUT/bench_$name.json" "$@" \
    > "$OUT/bench_$name.log" 2>&1 || echo "bench $name exited with $?" >> "$OUT/bench_$name.log"
  cat "$OUT/bench_$name.log"
}
# the restated targets (issue 18): 64 samples x 2 cameras x 16-frame clips, and policy windows at batch 256
bench clips64_dali --spec clips --batch-size 64 --decoder dali --num-workers 8 --steps 30
bench clips64_hybrid --spec clips --batch-size 64 --decoder hybrid --num-workers 8 --steps 30
bench clips64_nvdec --spec clips --batch-size 64 --decoder nvdec --num-workers 8 --steps 30
bench clips64_pyav --spec clips --batch-size 64 --decoder pyav --num-workers 15 --steps 30
bench policy256_auto --spec policy --batch-size 256 --decoder auto --num-workers 15 --steps 40
bench policy256_hybrid --spec policy --batch-size 256 --decoder hybrid --num-workers 8 --steps 40
bench sequences_dali --spec sequences --decoder dali --num-workers 8 --steps 30
