#!/usr/bin/env bash
# Here, after prepare.sh: pack what the GPU machine lacks (the DALI bundle, the av and PyNvVideoCodec wheels,
# the store and curve of .gpudata) into .stage/s1..s4, each under 52 MiB so that one fits a call beside the repository. Calls 1-3
# carry s1, s2, s3 and copy them to /root/stage; call 4 carries s4 and runs run_proof.sh, which unpacks all.
# The PyNvVideoCodec wheel is slimmed first: its FFmpeg sources, samples and CUDA 12 module are not needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/all"
cp .gpu/p*/* "$work/all/"
find .whl -type f -name "*.whl" ! -name "pynvvideocodec-*" -exec cp {} "$work/all/" \;
for wheel in .whl/pynvvideocodec-*.whl; do
  cp "$wheel" "$work/all/"
  zip -q -d "$work/all/$(basename "$wheel")" 'pynvvideocodec-*.data/*' 'samples/*' 'benchmarks/*' \
    'PyNvVideoCodec/PyNvVideoCodec_121*' || true
done
mkdir -p "$work/all/gpudata"
cp -r .gpudata/loader_store.wds .gpudata/curve.pkl "$work/all/gpudata/"  # sizes.pkl travels on its own
rm -rf .stage && mkdir -p .stage
tar cf - -C "$work/all" . | split -b 52M -d -a 1 - "$work/part-"
i=1
for part in "$work"/part-*; do
  mkdir -p ".stage/s$i" && mv "$part" ".stage/s$i/"
  i=$((i + 1))
done
du -sh .stage/s*
