#!/bin/bash
# The agent on a real GPU (driven with the `device` tool; see docs/agent-gpu-test.md).
#
#   bash tests/gpu/run.sh AGENT_BINARY OUT_DIR
#
# Starts a PyTorch bf16 matrix-multiply job with SLURM_JOB_ID/USER/NAME in its environment and
# checks, on GPU 0:
#   * while it runs: the GPU carries the job (from /proc/<pid>/environ of its process),
#     gpu_utilization >= 0.9, tensor_active > 0.5, a process row for the job's pid;
#   * after it ends: gpu_utilization < 0.1, tensor_active < 0.05, no job, no process row;
#   * the agent's readings against pynvml and nvidia-smi read at the same moment, within the
#     tolerances printed;
#   * /metrics: dcgm-exporter names with hpc_job="<job id>" while the job runs;
#   * overhead: CPU time per second and RSS of the agent at a 1 s interval with every collector
#     on, beside a pynvml loop reading the same counters and `nvidia-smi --query-gpu=… -l 1`,
#     all three over the same 40 s.
# Prints PASS/FAIL lines and exits 1 if any check fails. Needs python3 with torch and pynvml.
set -u
HERE_GPU="$(cd "$(dirname "$0")" && pwd)"
AGENT="$(realpath "${1:?usage: run.sh AGENT_BINARY OUT_DIR}")"
OUT="${2:?usage: run.sh AGENT_BINARY OUT_DIR}"
mkdir -p "$OUT"
W="$(mktemp -d)"
JOB=4242
BENCH_S=40
export PYTHONUNBUFFERED=1

echo "== machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
"$AGENT" --version
python3 -c 'import torch, pynvml; print("torch", torch.__version__, "pynvml", getattr(pynvml, "__version__", "?"))'

cat > "$W/nvml_loop.py" <<'PY'
# The same counters as the agent, read with pynvml once a second: the comparison for overhead.
import sys, time, pynvml as n
secs = float(sys.argv[1])
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
fields = [82, 143, 145]  # memory temperature, remapped rows
gpm_prev = None
gpm_ok = hasattr(n, "nvmlGpmSampleAlloc")
end = time.time() + secs
while time.time() < end:
    t0 = time.time()
    for f in (n.nvmlDeviceGetUtilizationRates, n.nvmlDeviceGetMemoryInfo, n.nvmlDeviceGetPowerUsage,
              n.nvmlDeviceGetTotalEnergyConsumption, n.nvmlDeviceGetCurrentClocksThrottleReasons,
              n.nvmlDeviceGetComputeRunningProcesses, n.nvmlDeviceGetUUID, n.nvmlDeviceGetName):
        try: f(h)
        except n.NVMLError: pass
    for args in ((n.nvmlDeviceGetTemperature, 0), (n.nvmlDeviceGetClockInfo, 1), (n.nvmlDeviceGetClockInfo, 2),
                 (n.nvmlDeviceGetPcieThroughput, 0), (n.nvmlDeviceGetPcieThroughput, 1)):
        try: args[0](h, args[1])
        except n.NVMLError: pass
    for err in (0, 1):
        try: n.nvmlDeviceGetTotalEccErrors(h, err, 1)
        except n.NVMLError: pass
    try: n.nvmlDeviceGetFieldValues(h, fields)
    except n.NVMLError: pass
    try: n.nvmlDeviceGetProcessUtilization(h, 0)
    except n.NVMLError: pass
    if gpm_ok:
        try:
            s = n.nvmlGpmSampleAlloc(); n.nvmlGpmSampleGet(h, s)
            if gpm_prev is not None:
                m = n.c_nvmlGpmMetricsGet_t()
                m.version = n.NVML_GPM_METRICS_GET_VERSION
                m.numMetrics = 9
                m.sample1 = gpm_prev; m.sample2 = s
                for i, mid in enumerate([1, 2, 5, 10, 11, 12, 13, 60, 61]):
                    m.metrics[i].metricId = mid
                n.nvmlGpmMetricsGet(m)
                n.nvmlGpmSampleFree(gpm_prev)
            gpm_prev = s
        except Exception as e:
            gpm_ok = False
            print("pynvml loop: gpm unavailable:", e, file=sys.stderr)
    time.sleep(max(0.0, 1.0 - (time.time() - t0)))
PY

cat > "$W/snapshot.py" <<'PY'
# pynvml readings of GPU 0 at this moment, as JSON.
import json, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h); u = n.nvmlDeviceGetUtilizationRates(h)
try:
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    v2 = {"memory_used_v2": m2.used, "memory_reserved_v2": m2.reserved}
except Exception as e:
    v2 = {"memory_v2_error": str(e)}
print(json.dumps({**v2, "memory_used_v1": m.used, "memory_total": m.total, "util": u.gpu,
  "power_mw": n.nvmlDeviceGetPowerUsage(h), "energy_mj": n.nvmlDeviceGetTotalEnergyConsumption(h),
  "temp": n.nvmlDeviceGetTemperature(h, 0), "sm_clock": n.nvmlDeviceGetClockInfo(h, 1),
  "mem_clock": n.nvmlDeviceGetClockInfo(h, 2),
  "pids": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]}))
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

cat > "$W/nvml_cost.py" <<'PY'
# CPU and wall time of each NVML call the agent makes, 20 calls each, on an idle GPU.
import time, pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)
calls = {
  "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
  "memory info v2": lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2),
  "power": lambda: n.nvmlDeviceGetPowerUsage(h),
  "energy": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
  "field value 83 (energy)": lambda: n.nvmlDeviceGetFieldValues(h, [83]),
  "temperature": lambda: n.nvmlDeviceGetTemperature(h, 0),
  "sm clock": lambda: n.nvmlDeviceGetClockInfo(h, 1),
  "clock event reasons": lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h),
  "pcie tx (throughput)": lambda: n.nvmlDeviceGetPcieThroughput(h, 0),
  "ecc corrected": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 1),
  "field values 82,83,143,145": lambda: n.nvmlDeviceGetFieldValues(h, [82, 83, 143, 145]),
  "running compute processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
  "process utilization": lambda: n.nvmlDeviceGetProcessUtilization(h, 0),
  "uuid": lambda: n.nvmlDeviceGetUUID(h),
  "name": lambda: n.nvmlDeviceGetName(h),
}
if hasattr(n, "nvmlGpmSampleAlloc"):
    s = n.nvmlGpmSampleAlloc()
    calls["gpm sample get"] = lambda: n.nvmlGpmSampleGet(h, s)
for name, f in calls.items():
    try:
        f()
    except Exception as e:
        print(f"  {name:28s} error: {e}"); continue
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(20):
        f()
    c1, w1 = time.process_time(), time.perf_counter()
    print(f"  {name:28s} cpu {(c1-c0)/20*1000:7.3f} ms  wall {(w1-w0)/20*1000:7.3f} ms per call")
PY
echo "== cost of each NVML call (pynvml, idle GPU; 'Not Found' = no sample yet)"
python3 "$W/nvml_cost.py"

echo "== the job: PyTorch bf16 matmul with SLURM_JOB_ID=$JOB"
SLURM_JOB_ID=$JOB SLURM_JOB_USER=gpuwatch-test SLURM_JOB_NAME=matmul \
  python3 "$HERE_GPU/matmul.py" 60 > "$W/job.log" 2>&1 &
JOB_PID=$!
echo "job pid $JOB_PID"

# The agent running as in production: every collector, 1 s, /metrics on, spool on disk (the
# endpoint is down: nothing listens on port 9).
"$AGENT" --source nvml --interval 1s --metrics-addr 127.0.0.1:9400 --endpoint http://127.0.0.1:9 \
  --buffer-dir "$W/spool" --job-mapping-dir "$W/no-slurm-here" --log-level error 2> "$W/agent.log" &
AGENT_PID=$!
# A second agent as in normal operation: the endpoint up (a sink answering 200), no spool, no
# /metrics.
python3 "$HERE_GPU/sink.py" 14318 &
SINK_PID=$!
sleep 1
"$AGENT" --source nvml --interval 1s --metrics-addr off --endpoint http://127.0.0.1:14318 \
  --job-mapping-dir "$W/no-slurm-here" --log-level error 2> "$W/agent2.log" &
AGENT2_PID=$!
sleep 9

echo "== overhead: ${BENCH_S} s side by side, while the job runs"
python3 "$W/nvml_loop.py" $BENCH_S 2> "$W/loop.log" &
LOOP_PID=$!
nvidia-smi --query-gpu=utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,temperature.gpu,temperature.memory,clocks.sm,clocks.mem,clocks_event_reasons.active,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,pcie.link.gen.current --format=csv,noheader -l 1 > /dev/null 2> "$W/smi.log" &
SMI_PID=$!
A0=$(cpu_ticks $AGENT_PID); L0=$(cpu_ticks $LOOP_PID); S0=$(cpu_ticks $SMI_PID); B0=$(cpu_ticks $AGENT2_PID)
T0=$(date +%s.%N)

sleep 5
echo "== during the job: agent --once, with pynvml and nvidia-smi read around it"
python3 "$W/snapshot.py" > "$W/before.json"
"$AGENT" --source nvml --once --job-mapping-dir "$W/no-slurm-here" --log-level error > "$OUT/during.json"
python3 "$W/snapshot.py" > "$W/after_once.json"
nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm --format=csv,noheader,nounits > "$W/smi_during.csv"
curl -s 127.0.0.1:9400/metrics > "$OUT/metrics_during.txt"

sleep $((BENCH_S - 8))
T1=$(date +%s.%N)
A1=$(cpu_ticks $AGENT_PID); L1=$(cpu_ticks $LOOP_PID); S1=$(cpu_ticks $SMI_PID); B1=$(cpu_ticks $AGENT2_PID)
ARSS=$(rss_kib $AGENT_PID); LRSS=$(rss_kib $LOOP_PID); SRSS=$(rss_kib $SMI_PID); BRSS=$(rss_kib $AGENT2_PID)
echo "agent (endpoint up, no spool, no /metrics): $(( (B1 - B0) * 10 )) ms CPU over the window, peak RSS $BRSS KiB"
echo "where the agent's resident memory is (smaps, KiB):"
awk '/^[0-9a-f]+-[0-9a-f]+ / {name = ($6 == "" ? "[anon]" : $6)} /^Rss:/ {rss[name] += $2} END {for (n in rss) if (rss[n] >= 256) printf "  %8d  %s\n", rss[n], n}' "/proc/$AGENT_PID/smaps" | sort -rn | head -12
wait $LOOP_PID
if kill -0 $SMI_PID 2>/dev/null; then echo "nvidia-smi -l 1 ran the whole time"; else echo "WARNING: nvidia-smi -l 1 exited early:"; cat "$W/smi.log"; fi
kill $SMI_PID 2>/dev/null
cat "$W/loop.log"

echo "== cost of each NVML call while the job runs"
python3 "$W/nvml_cost.py"

echo "== the job ends"
kill $JOB_PID 2>/dev/null; wait $JOB_PID 2>/dev/null
cat "$W/job.log"
sleep 6
"$AGENT" --source nvml --once --job-mapping-dir "$W/no-slurm-here" --log-level error > "$OUT/after.json"
curl -s 127.0.0.1:9400/metrics > "$OUT/metrics_after.txt"
kill $AGENT_PID $AGENT2_PID $SINK_PID; wait $AGENT_PID $AGENT2_PID $SINK_PID 2>/dev/null
echo "agent log (errors only):"; cat "$W/agent.log"

python3 - "$OUT" "$W" "$JOB" "$JOB_PID" "$T0" "$T1" "$A0" "$A1" "$L0" "$L1" "$S0" "$S1" "$ARSS" "$LRSS" "$SRSS" <<'PY' | tee "$OUT/checks.txt"
import json, os, sys
out, w, job, job_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t0, t1 = float(sys.argv[5]), float(sys.argv[6])
a0, a1, l0, l1, s0, s1 = map(int, sys.argv[7:13])
arss, lrss, srss = map(int, sys.argv[13:16])
hz = os.sysconf("SC_CLK_TCK")
fails = 0
def check(ok, what):
    global fails
    print(("PASS " if ok else "FAIL ") + what)
    fails += 0 if ok else 1
during = json.load(open(f"{out}/during.json")); after = json.load(open(f"{out}/after.json"))
before = json.load(open(f"{w}/before.json")); after_once = json.load(open(f"{w}/after_once.json"))
g = next(x for x in during["gpus"] if x["gpu_index"] == 0)
ga = next(x for x in after["gpus"] if x["gpu_index"] == 0)
print("during:", json.dumps({k: g[k] for k in ("gpu_utilization", "tensor_active", "sm_active", "dram_active", "power_watts", "sm_clock_mhz", "memory_used_bytes", "clock_event_reasons", "job")}))
print("after: ", json.dumps({k: ga[k] for k in ("gpu_utilization", "tensor_active", "sm_active", "power_watts", "job")}))
job_l = g.get("job") or {}
check(job_l.get("id") == job and job_l.get("user") == "gpuwatch-test" and job_l.get("name") == "matmul",
      f"gpu 0 carries job {job} (gpuwatch-test, matmul) while it runs: {job_l}")
check((g["gpu_utilization"] or 0) >= 0.9, f"gpu_utilization >= 0.9 while it runs: {g['gpu_utilization']}")
check((g["tensor_active"] or 0) > 0.5, f"tensor_active > 0.5 while it runs: {g['tensor_active']}")
procs = [p for p in during["processes"] if p["pid"] == job_pid]
check(len(procs) == 1 and (procs[0]["used_memory_bytes"] or 0) > (256 << 20) and (procs[0].get("job") or {}).get("id") == job,
      f"a process row for pid {job_pid} with its memory and job: {procs}")
if procs:
    print(f"     per-process sm_utilization: {procs[0]['sm_utilization']}")
check(ga["gpu_utilization"] is not None and ga["gpu_utilization"] < 0.1, f"gpu_utilization < 0.1 after: {ga['gpu_utilization']}")
check(ga["tensor_active"] is not None and ga["tensor_active"] < 0.05, f"tensor_active < 0.05 after: {ga['tensor_active']}")
check(ga.get("job") is None, f"no job after: {ga.get('job')}")
check(not [p for p in after["processes"] if p["pid"] == job_pid], "no process row for the job after")
# Against pynvml read just before and just after the agent's second reading.
lo_e, hi_e = before["energy_mj"] / 1000, after_once["energy_mj"] / 1000
check(lo_e <= g["energy_joules"] <= hi_e, f"energy {g['energy_joules']:.1f} J between pynvml's {lo_e:.1f} and {hi_e:.1f}")
# The agent reads nvmlDeviceGetMemoryInfo_v2 (used excludes reserved), pynvml's default is v1.
if "memory_used_v2" in before:
    mem = [before["memory_used_v2"], after_once["memory_used_v2"]]
    check(min(mem) - (64 << 20) <= g["memory_used_bytes"] <= max(mem) + (64 << 20), f"memory used {g['memory_used_bytes']} within 64 MiB of pynvml v2 {mem} (v1, reserved included: {before['memory_used_v1']}, reserved {before['memory_reserved_v2']})")
else:
    check(False, f"pynvml has no v2 memory info to compare with: {before.get('memory_v2_error')}")
check(g["memory_total_bytes"] == before["memory_total"], f"memory total {g['memory_total_bytes']} == pynvml {before['memory_total']}")
temps = [before["temp"], after_once["temp"]]
check(min(temps) - 3 <= g["temperature_celsius"] <= max(temps) + 3, f"temperature {g['temperature_celsius']} within 3 C of pynvml {temps}")
pw = [before["power_mw"] / 1000, after_once["power_mw"] / 1000]
check(min(pw) * 0.8 <= g["power_watts"] <= max(pw) * 1.2, f"power {g['power_watts']} W within 20 % of pynvml {pw}")
clk = [before["sm_clock"], after_once["sm_clock"]]
check(min(clk) * 0.9 <= g["sm_clock_mhz"] <= max(clk) * 1.1, f"sm clock {g['sm_clock_mhz']} within 10 % of pynvml {clk}")
smi = [x.strip() for x in open(f"{w}/smi_during.csv").read().split(",")]
print(f"     nvidia-smi memory.used during: {smi[1]} MiB; agent {g['memory_used_bytes'] / 2**20:.0f} MiB")
check(float(smi[0]) >= 90, f"nvidia-smi agrees the GPU is busy: utilization.gpu {smi[0]} %, power {smi[2]} W, sm clock {smi[4]} MHz")
m = open(f"{out}/metrics_during.txt").read()
tensor = [l for l in m.splitlines() if l.startswith("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{") and 'gpu="0"' in l]
check(bool(tensor) and f'hpc_job="{job}"' in tensor[0] and float(tensor[0].rsplit(" ", 1)[1]) > 0.5,
      f"/metrics: {tensor[0] if tensor else 'no DCGM_FI_PROF_PIPE_TENSOR_ACTIVE'}")
# The running agent reads energy every --slow-interval (60 s by default) and integrates power in between.
en = [l for l in m.splitlines() if l.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{") and 'gpu="0"' in l]
if en:
    ej = float(en[0].rsplit(" ", 1)[1]) / 1000
    check(lo_e - 2000 <= ej <= hi_e + 2000, f"running agent's energy {ej:.1f} J (read every --slow-interval, integrated between) within 2 kJ (~3 s at 700 W) of pynvml's {lo_e:.1f}..{hi_e:.1f}")
else:
    check(False, "no DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION in /metrics")
ma = open(f"{out}/metrics_after.txt").read()
util_after = [l for l in ma.splitlines() if l.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'gpu="0"' in l]
check(bool(util_after) and "hpc_job" not in util_after[0], f"/metrics after: {util_after[0] if util_after else 'none'}")
secs = t1 - t0
def per_s(c0, c1): return (c1 - c0) / hz / secs * 1000
a, l, s = per_s(a0, a1), per_s(l0, l1), per_s(s0, s1)
dur = [l for l in m.splitlines() if l.startswith("gpuwatch_agent_collection_duration_seconds ")]
print(f"agent's last collection took {float(dur[0].split()[1])*1000:.1f} ms (wall)" if dur else "no collection duration")
print(f"overhead over {secs:.1f} s, 1 s interval, 1 GPU:")
print(f"  gpuwatch-agent : {a:7.2f} ms CPU/s  peak RSS {arss/1024:6.1f} MiB")
print(f"  pynvml loop    : {l:7.2f} ms CPU/s  peak RSS {lrss/1024:6.1f} MiB  ({l/a if a else float('inf'):.1f}x the agent's CPU)")
print(f"  nvidia-smi -l 1: {s:7.2f} ms CPU/s  peak RSS {srss/1024:6.1f} MiB  ({s/a if a else float('inf'):.1f}x the agent's CPU)")
print(f"  (clock tick {1000/hz:.0f} ms: figures below ~{1000/hz/secs:.2f} ms/s are at the resolution limit)")
check(arss < 20 * 1024, f"agent peak RSS under 20 MiB: {arss/1024:.1f} MiB")
check(a < 1.0, f"agent under 1 ms CPU per second per GPU: {a:.2f}")
print("RESULT:", "all checks passed" if fails == 0 else f"{fails} check(s) failed")
sys.exit(1 if fails else 0)
PY
rc=${PIPESTATUS[0]}
rm -rf "$W"
exit "$rc"
