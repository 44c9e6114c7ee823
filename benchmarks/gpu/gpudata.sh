#!/usr/bin/env bash
# Sourced here (the development machine) by prepare.sh and stage_spdl.sh: the NVDEC curve's streams
# (.gpudata/curve.pkl) and the synthetic store the loader benchmarks read (.gpudata/loader_store.wds), each
# made only when missing.
mkdir -p .gpudata
[ -f .gpudata/curve.pkl ] || .venv/bin/python benchmarks/gpu/nvdec_curve.py --prepare .gpudata/curve.pkl
if [ ! -f .gpudata/loader_store.wds/dataset.json ]; then
  raw=$(mktemp -d)
  .venv/bin/mmdata synth "$raw/raw" --episodes 16 --min-seconds 20 --max-seconds 20
  .venv/bin/mmdata convert "$raw/raw" .gpudata/loader_store.wds --to wds
  rm -rf "$raw"
fi
