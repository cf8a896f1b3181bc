#!/bin/bash
# gpuwatch Slurm prolog: record which job owns which GPU, for gpuwatch-agent (and
# dcgm-exporter, which reads the same layout with --hpc-job-mapping-dir).
#
# Install: Prolog=/etc/slurm/gpuwatch-prolog.sh in slurm.conf (with Epilog=…epilog.sh), on every
# GPU node. It runs as root (SlurmdUser) with SLURM_JOB_ID, SLURM_JOB_USER and the job's GPUs in
# SLURM_JOB_GPUS (or CUDA_VISIBLE_DEVICES / GPU_DEVICE_ORDINAL), as Slurm's prolog environment
# gives them.
#
# Layout of GPUWATCH_JOB_MAPPING_DIR (default /run/gpuwatch/jobs, the agent's --job-mapping-dir):
#   <gpu index>        one job id per line (several lines when jobs share the GPU)
#   .jobs/<job id>     key=value lines read by gpuwatch-agent (dcgm-exporter skips the hidden
#                      directory): user, name (so an idle allocated GPU still shows who holds
#                      it), and for chargeback account, partition, qos, array_job_id,
#                      array_task_id and time_limit (TimeLimit as `scontrol show job` prints it,
#                      e.g. 1-00:00:00 or UNLIMITED). The prolog environment gives the account,
#                      partition and array ids; QOS, the time limit and the array ids
#                      (again) come from `scontrol -o show job` (left out when scontrol is
#                      missing or slow). The agent ignores empty values and `(null)`, so a later
#                      empty line never blanks an earlier one.
# A MIG site writes `<gpu index>.<gpu instance>` files the same way.
#
# Never fails the job: every problem is logged to stderr (slurmd's log) and the script exits 0.
set -u
DIR="${GPUWATCH_JOB_MAPPING_DIR:-/run/gpuwatch/jobs}"
JOB="${SLURM_JOB_ID:-}"
GPUS="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}"

log() { echo "gpuwatch prolog: $*" >&2; }

if [[ -z "$JOB" ]]; then
  log "SLURM_JOB_ID is not set: nothing to record"
  exit 0
fi
if [[ -z "$GPUS" || "$GPUS" == "NoDevFiles" ]]; then
  exit 0
fi
if ! mkdir -p "$DIR/.jobs" 2>/dev/null; then
  log "cannot create $DIR: check GPUWATCH_JOB_MAPPING_DIR"
  exit 0
fi
chmod 755 "$DIR" "$DIR/.jobs" 2>/dev/null

# QOS and TimeLimit of the job, as `qos=` and `time_limit=` lines, from one `scontrol -o show
# job` (space-separated Key=Value pairs); nothing when scontrol is absent or does not answer.
job_fields() {
  local line
  command -v scontrol >/dev/null 2>&1 || return 0
  line=$(timeout 5 scontrol -o show job "$JOB" 2>/dev/null) || return 0
  local word
  for word in $line; do
    case "$word" in
      QOS=*) printf 'qos=%s\n' "${word#QOS=}" ;;
      TimeLimit=*) printf 'time_limit=%s\n' "${word#TimeLimit=}" ;;
      # Array ids, for a Slurm whose prolog environment lacks SLURM_ARRAY_*.
      ArrayJobId=*) printf 'array_job_id=%s\n' "${word#ArrayJobId=}" ;;
      ArrayTaskId=*) printf 'array_task_id=%s\n' "${word#ArrayTaskId=}" ;;
    esac
  done
}

(
  flock -w 10 9 || { log "cannot lock $DIR/.lock"; exit 0; }
  IFS=',' read -ra gpus <<< "$GPUS"
  for gpu in "${gpus[@]}"; do
    gpu="${gpu// /}"
    if [[ ! "$gpu" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
      log "skipping GPU $gpu: not an index"
      continue
    fi
    file="$DIR/$gpu"
    if [[ -f "$file" ]] && grep -qx -- "$JOB" "$file"; then
      continue
    fi
    # Write a new file and rename it, so a reader never sees half a file.
    { [[ -f "$file" ]] && cat "$file"; echo "$JOB"; } > "$file.tmp.$$" && mv -f "$file.tmp.$$" "$file"
  done
  info="$DIR/.jobs/$JOB"
  {
    printf 'user=%s\nname=%s\n' "${SLURM_JOB_USER:-}" "${SLURM_JOB_NAME:-}"
    printf 'account=%s\npartition=%s\n' "${SLURM_JOB_ACCOUNT:-}" "${SLURM_JOB_PARTITION:-}"
    printf 'array_job_id=%s\narray_task_id=%s\n' "${SLURM_ARRAY_JOB_ID:-}" "${SLURM_ARRAY_TASK_ID:-}"
    job_fields
  } > "$info.tmp.$$" && mv -f "$info.tmp.$$" "$info"
) 9>"$DIR/.lock"
exit 0
