# Records one job trace on GPU 0: starts `workloads.py SHAPE SECONDS` as a Slurm-like job (its
# environment carries SLURM_JOB_ID/USER/NAME, as srun gives it) and reads NVML and GPM through
# pynvml once a second from a few seconds before it starts until a few seconds after it ends.
#
#   python3 record.py SHAPE SECONDS JOB_ID JOB_NAME OUT_DIR [AGENT_METRICS_URL]
#
# Writes OUT_DIR/SHAPE.csv (columns: tests/fixtures/gpu-traces/README.md) and OUT_DIR/SHAPE.json
# (the GPU, driver, link, limits, the workload's own rate line). With AGENT_METRICS_URL, each row
# also carries the agent's readings of the same second from its dcgm-exporter-style /metrics.
import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pynvml as n

GPM_IDS = {
    "gpm_graphics_util": 1, "gpm_sm_util": 2, "gpm_sm_occupancy": 3, "gpm_integer_util": 4,
    "gpm_tensor_util": 5, "gpm_dfma_tensor_util": 6, "gpm_hmma_tensor_util": 7,
    "gpm_imma_tensor_util": 9, "gpm_dram_bw_util": 10, "gpm_fp64_util": 11, "gpm_fp32_util": 12,
    "gpm_fp16_util": 13, "gpm_pcie_tx_mib_s": 20, "gpm_pcie_rx_mib_s": 21,
    "gpm_nvlink_rx_mib_s": 60, "gpm_nvlink_tx_mib_s": 61,
}
AGENT_SERIES = {
    "agent_gpu_util": "DCGM_FI_DEV_GPU_UTIL", "agent_sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "agent_tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "agent_dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "agent_fp16_active": "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "agent_fp32_active": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "agent_fp64_active": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "agent_pcie_rx_bytes": "DCGM_FI_PROF_PCIE_RX_BYTES",
}
BASE = ["time_unix_ns", "gpu_uuid", "gpu_model", "util_gpu_pct", "util_mem_pct", "fb_used_bytes",
        "fb_total_bytes", "power_mw", "energy_mj", "temp_c", "mem_temp_c", "sm_clock_mhz",
        "mem_clock_mhz", "clock_event_reasons", "pcie_tx_kb_s", "pcie_rx_kb_s", "ecc_sbe_volatile",
        "ecc_dbe_volatile", "procs", "proc_used_bytes", "proc_sm_util"]
EXTRA = ["pcie_link_gen", "pcie_link_width", "sm_clock_max_mhz", "power_limit_mw",
         "work_steps", "work_samples", "work_tokens", "agent_job"]
COLUMNS = BASE + list(GPM_IDS) + EXTRA + list(AGENT_SERIES)


def safe(f, *a, default=""):
    try:
        return f(*a)
    except Exception:
        return default


class Gpm:
    def __init__(self, h):
        self.h, self.prev = h, None
        self.ok = hasattr(n, "nvmlGpmSampleAlloc") and safe(n.nvmlGpmQueryDeviceSupport, h, default=None)

    def read(self):
        out = {k: "" for k in GPM_IDS}
        if not self.ok:
            return out
        s = n.nvmlGpmSampleAlloc()
        n.nvmlGpmSampleGet(self.h, s)
        if self.prev is not None:
            m = n.c_nvmlGpmMetricsGet_t()
            m.version = n.NVML_GPM_METRICS_GET_VERSION
            m.numMetrics = len(GPM_IDS)
            m.sample1, m.sample2 = self.prev, s
            for i, mid in enumerate(GPM_IDS.values()):
                m.metrics[i].metricId = mid
            n.nvmlGpmMetricsGet(m)
            for i, name in enumerate(GPM_IDS):
                if m.metrics[i].nvmlReturn == 0:
                    out[name] = round(m.metrics[i].value, 4)
            n.nvmlGpmSampleFree(self.prev)
        self.prev = s
        return out


def agent_readings(url):
    out = {k: "" for k in AGENT_SERIES}
    out["agent_job"] = ""
    if not url:
        return out
    try:
        text = urllib.request.urlopen(url, timeout=0.5).read().decode()
    except Exception:
        return out
    for line in text.splitlines():
        for col, series in AGENT_SERIES.items():
            if line.startswith(series + "{") and 'gpu="0"' in line:
                out[col] = line.rsplit(" ", 1)[1]
                job = re.search(r'hpc_job="([^"]*)"', line)
                if job:
                    out["agent_job"] = job.group(1)
    return out


def read_work(path):
    try:
        _, steps, samples, tokens = open(path).read().split()
        return {"work_steps": steps, "work_samples": samples, "work_tokens": tokens}
    except Exception:
        return {"work_steps": "", "work_samples": "", "work_tokens": ""}


def sample(h, gpm, last_proc_ts, work_file, agent_url):
    row = {"time_unix_ns": time.time_ns()}
    u = safe(n.nvmlDeviceGetUtilizationRates, h, default=None)
    mem = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    procs = safe(n.nvmlDeviceGetComputeRunningProcesses, h, default=[])
    util = {}
    for p in safe(n.nvmlDeviceGetProcessUtilization, h, last_proc_ts[0], default=[]):
        util.setdefault(p.pid, []).append(p.smUtil)
        last_proc_ts[0] = max(last_proc_ts[0], p.timeStamp)
    fields = safe(n.nvmlDeviceGetFieldValues, h, [82], default=[])
    mem_temp = fields[0].value.uiVal if fields and fields[0].nvmlReturn == 0 else ""
    row.update({
        "util_gpu_pct": u.gpu if u else "", "util_mem_pct": u.memory if u else "",
        "fb_used_bytes": mem.used, "fb_total_bytes": mem.total,
        "power_mw": safe(n.nvmlDeviceGetPowerUsage, h),
        "energy_mj": safe(n.nvmlDeviceGetTotalEnergyConsumption, h),
        "temp_c": safe(n.nvmlDeviceGetTemperature, h, 0), "mem_temp_c": mem_temp,
        "sm_clock_mhz": safe(n.nvmlDeviceGetClockInfo, h, 1),
        "mem_clock_mhz": safe(n.nvmlDeviceGetClockInfo, h, 2),
        "clock_event_reasons": safe(n.nvmlDeviceGetCurrentClocksEventReasons, h, default=None)
        or safe(n.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        "pcie_tx_kb_s": safe(n.nvmlDeviceGetPcieThroughput, h, 0),
        "pcie_rx_kb_s": safe(n.nvmlDeviceGetPcieThroughput, h, 1),
        "ecc_sbe_volatile": safe(n.nvmlDeviceGetTotalEccErrors, h, 0, 1),
        "ecc_dbe_volatile": safe(n.nvmlDeviceGetTotalEccErrors, h, 1, 1),
        "procs": ";".join(str(p.pid) for p in procs),
        "proc_used_bytes": ";".join(str(p.usedGpuMemory or 0) for p in procs),
        "proc_sm_util": ";".join(f"{pid}:{max(v)}" for pid, v in sorted(util.items())),
        "pcie_link_gen": safe(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_link_width": safe(n.nvmlDeviceGetCurrPcieLinkWidth, h),
        "sm_clock_max_mhz": safe(n.nvmlDeviceGetMaxClockInfo, h, 1),
        "power_limit_mw": safe(n.nvmlDeviceGetEnforcedPowerLimit, h),
    })
    row.update(gpm.read())
    row.update(read_work(work_file))
    row.update(agent_readings(agent_url))
    return row


def main():
    shape, secs, job_id, job_name, out_dir = sys.argv[1:6]
    agent_url = sys.argv[6] if len(sys.argv) > 6 else ""
    secs = float(secs)
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    uuid, model = n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetName(h)
    gpm = Gpm(h)
    work_file = f"/tmp/trace-work-{shape}"
    if os.path.exists(work_file):
        os.remove(work_file)
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURM_JOB_USER="trace", SLURM_JOB_NAME=job_name,
               TRACE_WORK_FILE=work_file, PYTHONUNBUFFERED="1")
    here = os.path.dirname(os.path.abspath(__file__))
    rows, proc, started, ended = [], None, None, []
    last_proc_ts = [0]
    gpm.read()
    t0 = time.time()
    tick = 0
    while True:
        now = time.time()
        if proc is None and now - t0 >= 3:
            started = time.time_ns()
            proc = subprocess.Popen([sys.executable, os.path.join(here, "workloads.py"), shape, str(secs)],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc is not None and proc.poll() is not None:
            if not ended:
                ended.extend([time.time(), time.time_ns()])
            elif now - ended[0] >= 3:
                break
        if now - t0 > secs + 120:
            proc.kill()
            break
        row = sample(h, gpm, last_proc_ts, work_file, agent_url)
        row.update({"gpu_uuid": uuid, "gpu_model": model})
        rows.append(row)
        tick += 1
        time.sleep(max(0.0, t0 + tick - time.time()))
    output = proc.stdout.read() if proc else ""
    with open(os.path.join(out_dir, f"{shape}.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS)
        wr.writeheader()
        for r in rows:
            wr.writerow(r)
    meta = {
        "shape": shape, "job_id": job_id, "job_user": "trace", "job_name": job_name,
        "gpu_uuid": uuid, "gpu_model": model, "driver": n.nvmlSystemGetDriverVersion(),
        "workload_start_unix_ns": started, "workload_end_unix_ns": ended[1] if ended else None,
        "pcie_link_gen_max": safe(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_link_width_max": safe(n.nvmlDeviceGetMaxPcieLinkWidth, h),
        "gpu_pcie_link_gen_max": safe(n.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
        "sm_clock_max_mhz": safe(n.nvmlDeviceGetMaxClockInfo, h, 1),
        "memory_clock_max_mhz": safe(n.nvmlDeviceGetMaxClockInfo, h, 2),
        "power_limit_mw": safe(n.nvmlDeviceGetEnforcedPowerLimit, h),
        "gpm": bool(gpm.ok), "exit_code": proc.returncode if proc else None,
        "workload_output": output.strip().splitlines()[-5:],
    }
    json.dump(meta, open(os.path.join(out_dir, f"{shape}.json"), "w"), indent=1)
    print(f"{shape}: {len(rows)} rows; {meta['workload_output'][-1:]}", flush=True)


if __name__ == "__main__":
    main()
