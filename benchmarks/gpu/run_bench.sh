#!/usr/bin/env bash
# `mmdata bench` on the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls:
# unpack DALI, install the carried wheels (.whl: av, xxhash, tqdm, fsspec), then bench the carried
# store (.gpudata/loader_store.wds: `mmdata synth --episodes 16 --min-seconds 20 --max-seconds 20`,
# `mmdata convert --to wds`, made on the development machine) with a simulated 100 ms step:
#   1. the codecs/bench target: 16-frame clips of 2 cameras, batches of 256 samples, DALI in the main process;
#   2. the same on the host's CPU cores (PyAV in 15 workers);
#   3. the loader issue's policy windows (decoder auto: the CPU for 2-frame requests);
#   4. sequences (8 s chunks at 10 fps, DALI).
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
bench clips_dali --spec clips --batch-size 256 --decoder dali --num-workers 8 --steps 30
bench clips_pyav --spec clips --batch-size 256 --decoder pyav --num-workers 15 --steps 30
bench policy_auto --spec policy --decoder auto --num-workers 15 --steps 40
bench sequences_dali --spec sequences --decoder dali --num-workers 8 --steps 30
