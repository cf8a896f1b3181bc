#!/bin/bash
# Where the agent's CPU goes, thread by thread, on a real GPU (driven with the `device` tool).
#
#   bash tests/gpu/threads.sh AGENT_BINARY [SECONDS] [AGENT_ARGS...]
#
# Runs the agent (1 s interval, every collector on, OTLP/HTTP to a local keep-alive sink) while a
# bf16 matmul keeps GPU 0 busy, and prints each thread's CPU time over the window (schedstat, ns)
# with its name, then a syscall count (strace -c -f) over a second window when strace exists.
set -u
HERE_GPU="$(cd "$(dirname "$0")" && pwd)"
AGENT="$(realpath "${1:?usage: threads.sh AGENT_BINARY [SECONDS] [ARGS...]}")"
SECS="${2:-20}"
shift 2 2>/dev/null || shift $#
W="$(mktemp -d)"
python3 "$HERE_GPU/matmul.py" $((SECS * 3 + 30)) > /dev/null 2>&1 &
JOB=$!
python3 "$HERE_GPU/sink.py" 14318 &
SINK=$!
sleep 4
"$AGENT" --interval 1s --endpoint http://127.0.0.1:14318 --job-mapping-dir "$W/none" --source nvml \
  --log-level error "$@" &
PID=$!
sleep 4
snap() { for t in /proc/"$PID"/task/*; do echo "$(basename "$t") $(tr ' ' _ < "$t/comm") $(awk '{print $1, $3}' "$t/schedstat")"; done; }
snap > "$W/a"; T0=$(date +%s%N)
sleep "$SECS"
snap > "$W/b"; T1=$(date +%s%N)
grep ctxt /proc/$PID/status
echo "== per thread over $(( (T1 - T0) / 1000000 )) ms: tid name cpu_ms_per_s wakeups_per_s"
join <(sort "$W/a") <(sort "$W/b") | awk -v ms=$(( (T1 - T0) / 1000000 )) \
  '{cpu=($6-$3)/ms/1000; wk=($7-$4)*1000/ms; tot+=cpu; printf "%8s %-20s %8.3f %8.1f\n", $1, $2, cpu, wk} END {printf "total %.3f ms/s\n", tot}'
if command -v strace >/dev/null; then
  echo "== syscalls over 10 s (strace -c -f)"
  timeout 10 strace -c -f -p $PID 2>&1 | head -40
else
  echo "(no strace)"
fi
command -v perf >/dev/null && echo "perf present" || echo "(no perf)"
kill $PID $SINK $JOB 2>/dev/null; wait 2>/dev/null
rm -rf "$W"
