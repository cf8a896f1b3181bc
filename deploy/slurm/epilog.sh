#!/bin/bash
# gpuwatch Slurm epilog: remove the job from the GPU mapping written by prolog.sh (see there).
# A GPU file left without jobs is deleted, so the GPU reads as free. Never fails the job.
set -u
DIR="${GPUWATCH_JOB_MAPPING_DIR:-/run/gpuwatch/jobs}"
JOB="${SLURM_JOB_ID:-}"

log() { echo "gpuwatch epilog: $*" >&2; }

if [[ -z "$JOB" || ! -d "$DIR" ]]; then
  exit 0
fi
(
  flock -w 10 9 || { log "cannot lock $DIR/.lock"; exit 0; }
  # Every GPU file, not only the job's GPUs: the epilog's GPU list can differ from the
  # prolog's (requeue, node reboot), and a stale id would mislabel the GPU.
  for file in "$DIR"/*; do
    name="${file##*/}"
    [[ -f "$file" && "$name" =~ ^[0-9]+(\.[0-9]+)?$ ]] || continue
    grep -qx -- "$JOB" "$file" || continue
    grep -vx -- "$JOB" "$file" > "$file.tmp.$$"
    if [[ -s "$file.tmp.$$" ]]; then
      mv -f "$file.tmp.$$" "$file"
    else
      rm -f "$file.tmp.$$" "$file"
    fi
  done
  rm -f "$DIR/.jobs/$JOB"
) 9>"$DIR/.lock"
exit 0
