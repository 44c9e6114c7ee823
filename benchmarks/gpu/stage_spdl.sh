#!/usr/bin/env bash
# Here, before the GPU calls of issue 39's proof (run_spdl.sh): the wheels the GPU machine lacks for the SPDL
# path (av, spdl-io, cachetools, google-crc32c) into .stage_spdl/s1, the loader store and the NVDEC curve's
# streams into .stage_spdl/s2, each part under 56 MiB so that it fits one call beside the repository. No DALI.
# Call 1 carries s1 and copies it to /root/stage; call 2 carries s2 and runs run_spdl.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .gpudata
wheel() {  # PACKAGE: a Python 3.12 x86-64 wheel of it in .whl
  ls .whl/"${1//-/_}"-*.whl .whl/"$1"-*.whl >/dev/null 2>&1 || .venv/bin/pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$1"
}
wheel "av==$(.venv/bin/python -c 'import av; print(av.__version__)')"
wheel "spdl-io==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("spdl-io"))')"
wheel cachetools
wheel google-crc32c
source benchmarks/gpu/gpudata.sh
rm -rf .stage_spdl && mkdir -p .stage_spdl/s1 .stage_spdl/s2
cp .whl/av-*.whl .whl/spdl_io-*.whl .whl/cachetools-*.whl .whl/google_crc32c-*.whl .stage_spdl/s1/
tar cf .stage_spdl/s2/gpudata.tar -C .gpudata loader_store.wds curve.pkl
du -sh .stage_spdl/s1 .stage_spdl/s2
