#!/usr/bin/env bash
# Run here (the development machine) before the GPU calls: build the DALI bundle, download the
# wheels the GPU machine lacks, and convert the synthetic store the GPU scripts read.
# Then, on the GPU machine, three calls carry .gpu/p1, .gpu/p2, .gpu/p3 and copy each into
# /root/stage, and a fourth carries .whl and .gpudata (name both in the call's `carry`: `.gpu/`,
# `.whl/` and `.gpudata/` are git-ignored) and runs benchmarks/gpu/run_bench.sh (or run_loader.sh,
# run_curve.sh, frame_size_check.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu/p3 ] || ../shared/tools/gpu-bundle .gpu
mkdir -p .whl .gpudata
ls .whl/av-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl "av==$(.venv/bin/python -c 'import av; print(av.__version__)')"
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  -d .whl xxhash tqdm fsspec
ls .whl/pynvvideocodec-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl pynvvideocodec
[ -f .gpudata/curve.pkl ] || .venv/bin/python benchmarks/gpu/nvdec_curve.py --prepare .gpudata/curve.pkl
if [ ! -f .gpudata/loader_store.wds/dataset.json ]; then
  raw=$(mktemp -d)
  .venv/bin/mmdata synth "$raw/raw" --episodes 16 --min-seconds 20 --max-seconds 20
  .venv/bin/mmdata convert "$raw/raw" .gpudata/loader_store.wds --to wds
  rm -rf "$raw"
fi
du -sh .gpu/p1 .gpu/p2 .gpu/p3 .whl .gpudata/loader_store.wds .gpudata/curve.pkl
