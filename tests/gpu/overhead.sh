#!/bin/bash
# Agent overhead on a real GPU (driven with the `device` tool; see docs/benchmarks.md).
#
#   bash tests/gpu/overhead.sh AGENT_BINARY OUT_DIR [SECONDS]
#
# While a PyTorch bf16 matmul job keeps GPU 0 busy, measures over the same window, side by side:
#   * gpuwatch-agent as deployed: --interval 1s, every collector on (GPM, processes, events, field
#     values), /metrics served and scraped every 15 s (a usual Prometheus scrape interval), the
#     disk spool on (--buffer-dir), OTLP/HTTP to a local sink that keeps connections alive;
#   * a pynvml loop reading the same counters once a second;
#   * `nvidia-smi --query-gpu=... -l 1`.
# Then, one at a time, variants of the agent that show where its time goes (no /metrics, no
# spool, the older 10 s --slow-interval), what one tick costs phase by phase (the tick_cost
# example, if built beside the agent), and what NVML alone costs (nvml_floor.c, a C program that
# only initialises NVML and reads one GPU).
# CPU time is read from /proc/<pid>/task/*/schedstat (nanoseconds, every thread), RSS as VmHWM.
# Prints a table and PASS/FAIL for the targets (under 1 ms CPU per second per GPU, under 20 MiB,
# at least 10x less CPU than the pynvml loop); exits 1 if a target is missed.
set -u
HERE_GPU="$(cd "$(dirname "$0")" && pwd)"
AGENT="$(realpath "${1:?usage: overhead.sh AGENT_BINARY OUT_DIR [SECONDS]}")"
OUT="${2:?usage: overhead.sh AGENT_BINARY OUT_DIR [SECONDS]}"
SECS="${3:-30}"
mkdir -p "$OUT"
W="$(mktemp -d)"
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
echo "== machine: $NGPU GPU(s)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
"$AGENT" --version
nproc

cat > "$W/nvml_loop.py" <<'PY'
# The agent's counters read with pynvml once a second: the comparison for overhead.
import sys, time, pynvml as n
end = time.time() + float(sys.argv[1])
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
prev = {}
while time.time() < end:
    t0 = time.time()
    for i, h in enumerate(hs):
        for f in (n.nvmlDeviceGetUtilizationRates, n.nvmlDeviceGetMemoryInfo, n.nvmlDeviceGetPowerUsage,
                  n.nvmlDeviceGetTotalEnergyConsumption, n.nvmlDeviceGetCurrentClocksThrottleReasons,
                  n.nvmlDeviceGetComputeRunningProcesses, n.nvmlDeviceGetUUID, n.nvmlDeviceGetName):
            try: f(h)
            except n.NVMLError: pass
        for f, a in ((n.nvmlDeviceGetTemperature, 0), (n.nvmlDeviceGetClockInfo, 1), (n.nvmlDeviceGetClockInfo, 2)):
            try: f(h, a)
            except n.NVMLError: pass
        for err in (0, 1):
            try: n.nvmlDeviceGetTotalEccErrors(h, err, 1)
            except n.NVMLError: pass
        try: n.nvmlDeviceGetFieldValues(h, [82, 143, 145])
        except n.NVMLError: pass
        try: n.nvmlDeviceGetProcessUtilization(h, 0)
        except n.NVMLError: pass
        try:
            s = n.nvmlGpmSampleAlloc(); n.nvmlGpmSampleGet(h, s)
            if i in prev:
                m = n.c_nvmlGpmMetricsGet_t()
                m.version = n.NVML_GPM_METRICS_GET_VERSION
                m.numMetrics = 9
                m.sample1 = prev[i]; m.sample2 = s
                for k, mid in enumerate([1, 2, 5, 10, 11, 12, 13, 60, 61]):
                    m.metrics[k].metricId = mid
                n.nvmlGpmMetricsGet(m)
                n.nvmlGpmSampleFree(prev[i])
            prev[i] = s
        except Exception:
            pass
    time.sleep(max(0.0, 1.0 - (time.time() - t0)))
PY

cat > "$W/nvml_cost.py" <<'PY'
# CPU time of the NVML calls the agent makes every second, 50 calls each, GPU busy.
import time, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
n.nvmlGpmSampleGet(h, s1); time.sleep(0.2); n.nvmlGpmSampleGet(h, s2)
def gpm_get():
    m = n.c_nvmlGpmMetricsGet_t(); m.version = n.NVML_GPM_METRICS_GET_VERSION; m.numMetrics = 9
    m.sample1 = s1; m.sample2 = s2
    for k, mid in enumerate([1, 2, 5, 10, 11, 12, 13, 60, 61]):
        m.metrics[k].metricId = mid
    n.nvmlGpmMetricsGet(m)
es = n.nvmlEventSetCreate()
try: n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
except n.NVMLError as e: print("  (no xid events:", e, ")")
def ev():
    try: n.nvmlEventSetWait_v2(es, 0)
    except n.NVMLError: pass
calls = {
  "handle by index": lambda: n.nvmlDeviceGetHandleByIndex(0),
  "field value 82 (memory temp)": lambda: n.nvmlDeviceGetFieldValues(h, [82]),
  "field values 143,145 (remap)": lambda: n.nvmlDeviceGetFieldValues(h, [143, 145]),
  "ecc totals (2 calls)": lambda: (n.nvmlDeviceGetTotalEccErrors(h, 0, 1), n.nvmlDeviceGetTotalEccErrors(h, 1, 1)),
  "running compute processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
  "gpm sample get": lambda: n.nvmlGpmSampleGet(h, s2),
  "gpm metrics get (9)": gpm_get,
  "event set wait(0)": ev,
  "energy": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
  "process utilization": lambda: n.nvmlDeviceGetProcessUtilization(h, 0),
}
for name, f in calls.items():
    try: f()
    except Exception as e:
        print(f"  {name:30s} error: {e}"); continue
    c0 = time.process_time()
    for _ in range(50): f()
    print(f"  {name:30s} cpu {(time.process_time()-c0)/50*1000:7.3f} ms per call")
PY

# Every thread's run time, ns (schedstat's first field), or the process's utime + stime ticks
# if schedstat is missing.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

python3 "$HERE_GPU/matmul.py" $((SECS * 5 + 60)) > "$W/job.log" 2>&1 &
JOB_PID=$!
python3 "$HERE_GPU/sink.py" 14318 &
SINK_PID=$!
sleep 5

# run_agent NAME ARGS...: runs the agent for SECS seconds, scraping /metrics every 15 s when
# it serves it, and prints "NAME cpu_ms_per_s hwm_kib".
run_agent() {
  local name=$1; shift
  "$AGENT" --interval 1s --endpoint http://127.0.0.1:14318 --job-mapping-dir "$W/none" \
    --log-level error "$@" 2> "$W/agent-$name.log" &
  local pid=$!
  sleep 3   # start-up and the first GPM pair are not the steady state
  local c0 t0 c1 t1 i
  c0=$(cpu_ns $pid); t0=$(date +%s%N)
  for i in $(seq "$SECS"); do
    sleep 1
    if (( i % 15 == 0 )) && [[ " $* " == *" --metrics-addr 127.0.0.1:19400 "* ]]; then
      curl -s 127.0.0.1:19400/metrics > "$W/metrics-$name.txt"
    fi
  done
  c1=$(cpu_ns $pid); t1=$(date +%s%N)
  local hwm; hwm=$(hwm_kib $pid)
  if [[ $name == deployed ]]; then
    awk '/^[0-9a-f]+-[0-9a-f]+ / {n = ($6 == "" ? "[anon]" : $6)} /^Rss:/ {r[n] += $2} END {for (k in r) if (r[k] >= 256) printf "  %8d KiB  %s\n", r[k], k}' \
      "/proc/$pid/smaps" | sort -rn | head -10 > "$W/smaps.txt"
    find "/proc/$pid/task" -mindepth 1 -maxdepth 1 | wc -l > "$W/threads.txt"
  fi
  kill $pid; wait $pid 2>/dev/null
  echo "$name $(( (c1 - c0) / ((t1 - t0) / 1000000) )) $hwm" >> "$W/results.txt"
  # (c1-c0) ns / elapsed ms = ns per ms = us per s; printed as ms/s below.
}

echo "== side by side for ${SECS} s: the agent as deployed, a pynvml loop, nvidia-smi -l 1"
python3 "$W/nvml_loop.py" $((SECS + 30)) &
LOOP_PID=$!
nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,temperature.gpu,temperature.memory,clocks.sm,clocks.mem,clocks_event_reasons.active,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total --format=csv,noheader -l 1 > /dev/null &
SMI_PID=$!
sleep 3
L0=$(cpu_ns $LOOP_PID); S0=$(cpu_ns $SMI_PID); T0=$(date +%s%N)
run_agent deployed --source nvml --metrics-addr 127.0.0.1:19400 --buffer-dir "$W/spool"
L1=$(cpu_ns $LOOP_PID); S1=$(cpu_ns $SMI_PID); T1=$(date +%s%N)
echo "pynvml $(( (L1 - L0) / ((T1 - T0) / 1000000) )) $(hwm_kib $LOOP_PID)" >> "$W/results.txt"
echo "nvidia-smi $(( (S1 - S0) / ((T1 - T0) / 1000000) )) $(hwm_kib $SMI_PID)" >> "$W/results.txt"
kill $SMI_PID; wait $LOOP_PID $SMI_PID 2>/dev/null

echo "== variants, one at a time"
run_agent no-spool --source nvml --metrics-addr off
run_agent slow-10s --source nvml --metrics-addr off --slow-interval 10s

HERE="$(dirname "$AGENT")"
if [[ -x "$HERE/tick_cost" ]]; then
  echo "== one tick, phase by phase (tick_cost example)"
  "$HERE/tick_cost" 31
fi
if [[ -x "$HERE/nvml_floor" ]]; then
  echo "== NVML alone (nvml_floor.c)"
  "$HERE/nvml_floor"
fi

echo "== NVML calls while the job runs (pynvml)"
python3 "$W/nvml_cost.py"
kill $JOB_PID $SINK_PID 2>/dev/null; wait $JOB_PID $SINK_PID 2>/dev/null

echo "== where the deployed agent's memory is ($(cat "$W/threads.txt") threads)"
cat "$W/smaps.txt"
grep -h '^gpuwatch_agent_collection' "$W/metrics-deployed.txt" 2>/dev/null | head -5
echo "== agent errors"; cat "$W"/agent-*.log | sort | uniq -c | head -20

python3 - "$W/results.txt" "$NGPU" <<'PY' | tee "$OUT/overhead.txt"
import sys
rows = {l.split()[0]: (int(l.split()[1]) / 1000, int(l.split()[2]) / 1024) for l in open(sys.argv[1])}
ngpu = int(sys.argv[2])
print(f"{'process':12s} {'CPU ms/s':>9s} {'per GPU':>8s} {'peak RSS MiB':>13s}")
for k, (cpu, rss) in rows.items():
    print(f"{k:12s} {cpu:9.3f} {cpu / ngpu:8.3f} {rss:13.1f}")
a, rss = rows["deployed"]
fails = 0
def check(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what); fails += 0 if ok else 1
check(a / ngpu < 1.0, f"agent under 1 ms CPU per second per GPU: {a / ngpu:.3f}")
check(rss < 20, f"agent peak RSS under 20 MiB: {rss:.1f}")
check(rows["pynvml"][0] >= 10 * a, f"pynvml loop / agent CPU: {rows['pynvml'][0] / a:.1f}x (target 10x)")
print(f"     nvidia-smi -l 1 / agent CPU: {rows['nvidia-smi'][0] / a:.2f}x (it reads neither GPM, energy, processes nor events)")
print("RESULT:", "all targets met" if fails == 0 else f"{fails} target(s) missed")
sys.exit(1 if fails else 0)
PY
rc=${PIPESTATUS[0]}
rm -rf "$W"
exit "$rc"
