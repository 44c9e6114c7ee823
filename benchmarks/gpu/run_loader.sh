#!/usr/bin/env bash
# On the GPU machine, after .gpu/p1..p3 were copied to /root/stage by earlier calls: unpack DALI,
# install the carried wheels (.whl: av, xxhash, tqdm, fsspec), run the loader check and benchmark
# on the carried store (.gpudata/loader_store.wds, made by `mmdata synth --episodes 16
# --min-seconds 20 --max-seconds 20` and `mmdata convert --to wds`).
set -euo pipefail
source "$(dirname "$0")/setup_site.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 benchmarks/gpu/loader_gpu.py .gpudata/loader_store.wds "${OUT:-/tmp}/loader_gpu.json" "$@" 2>&1 \
  | grep -v -e "UserWarning" -e "check_worker_number_rationality" | tee "${OUT:-/tmp}/loader_gpu.log"
