#!/usr/bin/env bash
# Sourced on the GPU machine by run_proof.sh and run_sizes.sh, in the call that carries .stage/s4 after calls
# 1-3 copied s1-s3 to /root/stage (see stage.sh): unpack DALI and install the wheels into /tmp/site.
S=/root/stage
mkdir -p "$S" /tmp/site
echo "[$(date +%T)] unpack"
cp .stage/s*/* "$S/"
cat "$S"/part-* | tar x -C "$S"
cat "$S"/dali.tar.xz.part* | xz -d -T0 | tar x -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$S"/*.whl 2>&1 | tail -3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
