#!/bin/bash
# The agent's own CPU cost per second, on any machine (no GPU needed).
#
#   bash tests/agent_cpu.sh AGENT_BINARY [SECONDS] [AGENT_ARGS...]
#
# Runs the agent with the synthetic source (1 GPU, --interval 1s, /metrics off unless
# AGENT_ARGS say otherwise) sending OTLP/HTTP to a local sink that keeps connections alive, like
# the real server, and prints its CPU time per second of wall time over SECONDS (default 30),
# read from /proc/<pid>/task/*/schedstat (nanoseconds, every thread), after 3 s of start-up.
# The synthetic source makes no NVML call: what this measures is the agent's fixed work per
# tick (timer, encoding, gzip, HTTP), the part a real host adds on top of its NVML reads.
# AGENT_ARGS come last and win (e.g. `--interval 100ms` to make a profile denser).
set -u
AGENT="$(realpath "${1:?usage: agent_cpu.sh AGENT_BINARY [SECONDS] [AGENT_ARGS...]}")"
SECS="${2:-30}"
shift 2 2>/dev/null || shift $#
W="$(mktemp -d)"
cat > "$W/sink.py" <<'PY'
# OTLP/HTTP sink: answers 200 and keeps the connection open. Prints its port.
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import sys
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
python3 "$W/sink.py" > "$W/port" &
SINK=$!
for _ in $(seq 50); do [[ -s "$W/port" ]] && break; sleep 0.1; done
PORT=$(cat "$W/port")
# The defaults go through the environment so that the same flags given in AGENT_ARGS win.
GPUWATCH_SOURCE="${GPUWATCH_SOURCE:-synthetic}" GPUWATCH_SYNTHETIC_GPUS="${GPUWATCH_SYNTHETIC_GPUS:-1}" \
GPUWATCH_INTERVAL="${GPUWATCH_INTERVAL:-1s}" GPUWATCH_METRICS_ADDR="${GPUWATCH_METRICS_ADDR:-off}" \
GPUWATCH_LOG_LEVEL="${GPUWATCH_LOG_LEVEL:-error}" \
  "$AGENT" --endpoint "http://127.0.0.1:$PORT" "$@" &
PID=$!
sleep 3
cpu_ns() { cat /proc/$PID/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'; }
C0=$(cpu_ns); T0=$(date +%s%N)
sleep "$SECS"
C1=$(cpu_ns); T1=$(date +%s%N)
THREADS=$(ls /proc/$PID/task | wc -l)
kill $PID $SINK 2>/dev/null
wait $PID $SINK 2>/dev/null
rm -rf "$W"
awk -v c=$((C1 - C0)) -v t=$((T1 - T0)) -v n="$THREADS" \
  'BEGIN {printf "agent CPU %.3f ms/s over %.1f s (%d threads)\n", c / (t / 1000), t / 1e9, n}'
