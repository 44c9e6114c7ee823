#!/usr/bin/env bash
# Sourced by the run_*.sh scripts on the GPU machine, after .gpu/p1..p3 were copied to /root/stage
# by earlier calls (see prepare.sh): unpack DALI and install the stage's wheels and the carried ones
# (.whl: av, xxhash, tqdm, fsspec) into /tmp/site, and put it on PYTHONPATH.
mkdir -p /tmp/site
cat /root/stage/dali.tar.xz.part* | xz -d -T0 | tar x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /root/stage/*.whl .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
