#!/usr/bin/env bash
# Run here (the development machine) before the GPU calls: build the DALI bundle, download the wheels the GPU
# machine lacks (av, pynvvideocodec, cachetools, google-crc32c), convert the synthetic store the GPU scripts read, encode the NVDEC curve's
# and decode_sizes.py's corpora, and pack it all into .stage/s1..s4 (stage.sh). Then, on the GPU machine, three
# calls carry .stage/s1, s2, s3 and copy each into /root/stage, and a fourth carries .stage/s4 and runs
# benchmarks/gpu/run_proof.sh (or run_sizes.sh, carrying .gpudata/sizes.pkl too). See README.md here.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu/p3 ] || ../shared/tools/gpu-bundle .gpu
mkdir -p .whl .gpudata
ls .whl/av-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl "av==$(.venv/bin/python -c 'import av; print(av.__version__)')"
ls .whl/pynvvideocodec-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl pynvvideocodec
for package in cachetools google-crc32c; do  # mmdata's own dependencies that the GPU machine lacks
  ls .whl/"${package//-/_}"-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "$package"
done
source benchmarks/gpu/gpudata.sh
[ -f .gpudata/sizes.pkl ] || .venv/bin/python benchmarks/gpu/decode_sizes.py --prepare .gpudata/sizes.pkl
benchmarks/gpu/stage.sh
du -sh .gpudata/loader_store.wds .gpudata/curve.pkl .gpudata/sizes.pkl
