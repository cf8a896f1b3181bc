#!/bin/bash
# The agent's own CPU cost per second, on any machine (no GPU needed).
#
#   bash tests/agent_cpu.sh AGENT_BINARY[,AGENT_BINARY...] [SECONDS] [AGENT_ARGS...]
#
# Runs the agent with the synthetic source (1 GPU, --interval 1s, /metrics off unless
# AGENT_ARGS say otherwise) sending OTLP/HTTP to a local sink that keeps connections alive, like
# the real server, and prints its CPU time per second of wall time over SECONDS (default 30),
# read from /proc/<pid>/task/*/schedstat (nanoseconds, every thread), after 3 s of start-up.
# Several binaries, comma-separated, run side by side over the same window (each with its own
# sink), so that a comparison on a busy machine sees the same load.
# The synthetic source makes no NVML call: what this measures is the agent's fixed work per
# tick (timer, encoding, gzip, HTTP), the part a real host adds on top of its NVML reads.
# AGENT_ARGS come last and win (e.g. `--interval 100ms` to make a profile denser).
set -u
IFS=, read -r -a AGENTS <<< "${1:?usage: agent_cpu.sh AGENT_BINARY[,AGENT_BINARY...] [SECONDS] [AGENT_ARGS...]}"
SECS="${2:-30}"
shift 2 2>/dev/null || shift $#
W="$(mktemp -d)"
PIDS=()
SINKS=()
for i in "${!AGENTS[@]}"; do
  python3 "$(dirname "$0")/gpu/sink.py" > "$W/port$i" &
  SINKS+=($!)
  for _ in $(seq 50); do [[ -s "$W/port$i" ]] && break; sleep 0.1; done
  # The defaults go through the environment so that the same flags given in AGENT_ARGS win.
  GPUWATCH_SOURCE="${GPUWATCH_SOURCE:-synthetic}" GPUWATCH_SYNTHETIC_GPUS="${GPUWATCH_SYNTHETIC_GPUS:-1}" \
  GPUWATCH_INTERVAL="${GPUWATCH_INTERVAL:-1s}" GPUWATCH_METRICS_ADDR="${GPUWATCH_METRICS_ADDR:-off}" \
  GPUWATCH_LOG_LEVEL="${GPUWATCH_LOG_LEVEL:-error}" \
    "$(realpath "${AGENTS[$i]}")" --endpoint "http://127.0.0.1:$(cat "$W/port$i")" "$@" &
  PIDS+=($!)
done
sleep 3
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'; }
C0=(); for p in "${PIDS[@]}"; do C0+=("$(cpu_ns "$p")"); done; T0=$(date +%s%N)
sleep "$SECS"
C1=(); for p in "${PIDS[@]}"; do C1+=("$(cpu_ns "$p")"); done; T1=$(date +%s%N)
kill "${PIDS[@]}" "${SINKS[@]}" 2> /dev/null
wait "${PIDS[@]}" "${SINKS[@]}" 2> /dev/null
for i in "${!AGENTS[@]}"; do
  awk -v c=$((C1[i] - C0[i])) -v t=$((T1 - T0)) -v name="${AGENTS[$i]}" \
    'BEGIN {printf "%s: CPU %.3f ms/s over %.1f s\n", name, c / (t / 1000), t / 1e9}'
done
rm -rf "$W"
