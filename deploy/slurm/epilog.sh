#!/bin/bash
# gpuwatch Slurm epilog: remove the job from the GPU mapping written by prolog.sh (see there).
# A GPU file left without jobs is deleted, so the GPU reads as free. Never fails the job.
#
# Job report (off by default): with GPUWATCH_JOB_REPORT=1 the epilog appends `gpuwatch job <id>`
# (GPU use, cost and notes, docs/jobs.md) to the job's output file, the way jobstats users get
# it by mail. Settings come from the environment or from GPUWATCH_SLURM_CONF (default
# /etc/default/gpuwatch-slurm, a root-owned file of KEY=value lines):
#   GPUWATCH_JOB_REPORT=1                       the one switch [0]
#   GPUWATCH_SERVER=http://gpuwatch:9500        where to ask [http://127.0.0.1:9500]
#   GPUWATCH_TOKEN=...                          a query token, if the server has --auth-tokens
#   GPUWATCH_BIN=/usr/local/bin/gpuwatch        the command line [gpuwatch on PATH]
# The report is written as the job's user (runuser), never as root, into the StdOut path that
# `scontrol show job` gives; it gives up after 30 s.
set -u
CONF="${GPUWATCH_SLURM_CONF:-/etc/default/gpuwatch-slurm}"
if [[ -f "$CONF" && ! -L "$CONF" && "$(stat -c %u "$CONF" 2>/dev/null)" == 0 ]]; then
  # shellcheck source=/dev/null
  . "$CONF"
fi
DIR="${GPUWATCH_JOB_MAPPING_DIR:-/run/gpuwatch/jobs}"
JOB="${SLURM_JOB_ID:-}"

log() { echo "gpuwatch epilog: $*" >&2; }

# Appends the job's report to its output file (GPUWATCH_JOB_REPORT=1 only).
report() {
  [[ "${GPUWATCH_JOB_REPORT:-0}" == 1 && -n "$JOB" ]] || return 0
  local user="${SLURM_JOB_USER:-}" out bin
  bin="${GPUWATCH_BIN:-gpuwatch}"
  if [[ -z "$user" ]]; then
    log "job report: SLURM_JOB_USER is not set"
    return 0
  fi
  out="$(scontrol show job -o "$JOB" 2>/dev/null | tr ' ' '\n' | sed -n 's/^StdOut=//p' | head -n 1)"
  if [[ -z "$out" || "$out" != /* ]]; then
    log "job report: no output file for job $JOB"
    return 0
  fi
  local text
  if ! text="$(GPUWATCH_TOKEN="${GPUWATCH_TOKEN:-}" timeout 30 "$bin" job "$JOB" \
      --server "${GPUWATCH_SERVER:-http://127.0.0.1:9500}" 2>&1)"; then
    log "job report for $JOB failed: $text"
    return 0
  fi
  # The inner shell expands "$1" (the path), not this one: SC2016 is intended.
  # shellcheck disable=SC2016
  printf '\n==== gpuwatch job report ====\n%s\n' "$text" \
    | runuser -u "$user" -- sh -c 'cat >> "$1"' sh "$out" \
    || log "job report: cannot append to $out as $user"
  return 0
}

if [[ -z "$JOB" || ! -d "$DIR" ]]; then
  report
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
report
exit 0
