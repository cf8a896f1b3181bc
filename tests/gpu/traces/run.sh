#!/bin/bash
# Records job traces on a machine with an NVIDIA GPU, PyTorch and pynvml (the `device` tool's
# machines; tests/fixtures/gpu-traces/README.md says how the fixtures were made).
#
#   bash tests/gpu/traces/run.sh OUT_DIR SECONDS AGENT_BINARY|- SHAPE:JOB_ID:JOB_NAME...
#
# Runs the agent (when given) at a 1 s interval with /metrics on, so each row also carries the
# agent's own readings, then records each shape in turn and packs the CSV and JSON files into
# OUT_DIR/traces.tar.gz.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run.sh OUT_DIR SECONDS AGENT|- SHAPE:JOB:NAME...}"
SECS="${2:?seconds per shape}"
AGENT="${3:?agent binary or -}"
shift 3
mkdir -p "$OUT"
W="$(mktemp -d)"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max,power.limit --format=csv
python3 -c 'import torch, pynvml; print("torch", torch.__version__, "nvidia-ml-py", getattr(pynvml, "__version__", "?"))'

AGENT_URL=""
if [ "$AGENT" != "-" ]; then
  "$AGENT" --version
  "$AGENT" --source nvml --interval 1s --slow-interval 1s --metrics-addr 127.0.0.1:9400 \
    --endpoint http://127.0.0.1:9 --buffer-dir "$W/spool" --job-mapping-dir "$W/no-slurm" \
    --log-level warn > "$W/agent.log" 2>&1 &
  AGENT_PID=$!
  AGENT_URL=http://127.0.0.1:9400/metrics
  sleep 2
fi

for spec in "$@"; do
  IFS=: read -r shape job name <<< "$spec"
  python3 "$HERE/record.py" "$shape" "$SECS" "$job" "$name" "$W" "$AGENT_URL" \
    || echo "record $shape failed"
done

if [ -n "$AGENT_URL" ]; then
  kill "$AGENT_PID" 2>/dev/null
  tail -n 20 "$W/agent.log"
  cp "$W/agent.log" "$W/agent-$(date +%s).log"
fi
tar -C "$W" -czf "$OUT/traces-$(date +%s).tar.gz" --exclude spool --exclude no-slurm .
ls -la "$OUT"
