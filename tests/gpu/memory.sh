#!/bin/bash
# Where the agent's memory is on a real GPU (driven with the `device` tool).
#
#   bash tests/gpu/memory.sh AGENT_BINARY [SECONDS]
#
# Runs the agent as deployed (1 s interval, every collector on, OTLP/HTTP to a local sink) for
# SECONDS, then prints VmRSS/VmHWM and the resident memory by mapping, for the agent as it is and
# with glibc's malloc limited to one arena (MALLOC_ARENA_MAX=1), and for nvml_floor (NVML alone)
# when it is built beside the agent.
set -u
HERE_GPU="$(cd "$(dirname "$0")" && pwd)"
AGENT="$(realpath "${1:?usage: memory.sh AGENT_BINARY [SECONDS]}")"
SECS="${2:-15}"
W="$(mktemp -d)"
python3 "$HERE_GPU/sink.py" 14318 &
SINK=$!
report() {
  local pid=$1
  grep -E '^(VmRSS|VmHWM|RssAnon|RssFile|RssShmem|Threads)' "/proc/$pid/status" | tr -s ' \t' ' ' | paste -sd ' '
  awk '/^[0-9a-f]+-[0-9a-f]+ / {n = ($6 == "" ? "[anon]" : $6)} /^Rss:/ {r[n] += $2} END {for (k in r) if (r[k] >= 200) printf "  %8d KiB  %s\n", r[k], k}' \
    "/proc/$pid/smaps" | sort -rn | head -12
}
for variant in plain arena1; do
  echo "== agent ($variant)"
  if [[ $variant == arena1 ]]; then export MALLOC_ARENA_MAX=1; fi
  "$AGENT" --interval 1s --endpoint http://127.0.0.1:14318 --job-mapping-dir "$W/none" --source nvml \
    --metrics-addr 127.0.0.1:19400 --buffer-dir "$W/spool" --log-level error &
  PID=$!
  sleep "$SECS"
  curl -s 127.0.0.1:19400/metrics > /dev/null
  sleep 1
  report $PID
  kill $PID; wait $PID 2>/dev/null
  unset MALLOC_ARENA_MAX
done
HERE="$(dirname "$AGENT")"
if [[ -x "$HERE/nvml_floor" ]]; then
  echo "== nvml_floor"
  "$HERE/nvml_floor" 2>&1 | grep -E "rss|VmHWM|Threads"
fi
kill $SINK 2>/dev/null; wait 2>/dev/null
rm -rf "$W"
