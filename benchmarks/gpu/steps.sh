#!/usr/bin/env bash
# Sourced by the GPU run scripts (run_proof.sh, run_spdl.sh), with W (the results folder) and OUT set: `log`
# a line into $W/steps.txt, `pack` the results into $OUT/proof.tar, and `step NAME SECONDS COMMAND...`: one
# step under its own time limit, its output in $W/NAME.log, packed after it so that a timeout loses only it.
log() { echo "[$(date +%T)] $*" | tee -a "$W/steps.txt"; }
pack() { tar cf "$OUT/proof.tar" -C "$W" .; }
step() {
  local name=$1 limit=$2
  shift 2
  log "$name"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  log "$name exited $?"
  tail -n 12 "$W/$name.log"
  pack
}
