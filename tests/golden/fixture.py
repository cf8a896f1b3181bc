#!/usr/bin/env python3
"""Writes fixture.jsonl: the fixed data the golden SQL tests load (one OTLP/JSON export request
per line, all times on 2026-01-05, a Monday). Run it only to change the data; then regenerate
the expected outputs (README.md)."""

import json
import os

T0 = 1767571200 * 10**9  # 2026-01-05T00:00:00Z
MIN = 60 * 10**9


def s(k, v):
    return {"key": k, "value": {"stringValue": v}}


def i(k, v):
    return {"key": k, "value": {"intValue": str(v)}}


def gauge(name, points):
    return {"name": name, "gauge": {"dataPoints": points}}


def counter(name, points):
    return {"name": name, "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": points}}


def point(t, value, attrs):
    key = "asInt" if isinstance(value, int) else "asDouble"
    v = str(value) if isinstance(value, int) else value
    return {"timeUnixNano": str(t), key: v, "attributes": attrs}


# Per GPU: host, uuid, index, job (id, user, name) or None, and per-sample values.
GPUS = [
    ("node-1", "GPU-a", 0, ("j1", "alice", "train")),
    ("node-1", "GPU-b", 1, ("j2", "bob", "notebook")),
    ("node-2", "GPU-c", 0, ("j3", "carol", "etl")),
    ("node-2", "GPU-d", 1, None),
]

# Samples every minute from 00:30 to 00:59; GPU-c misses 00:40 to 00:49 (its agent was down and
# restarted, so its xid counter restarts from 0).
MINUTES = list(range(30, 60))
TIMES = [T0 + m * MIN for m in MINUTES]
UTIL = {"GPU-a": 0.9, "GPU-b": 0.0, "GPU-c": 0.5, "GPU-d": 0.0}
SM = {"GPU-a": 0.8, "GPU-b": 0.01, "GPU-c": 0.2, "GPU-d": 0.0}


def energy(uuid, m):
    """energy_joules at minute m: power x time; GPU-a's driver reloads at 00:43 (restarts at 500)."""
    watts = 100.0 + 500.0 * UTIL[uuid]
    if uuid == "GPU-c" and 40 <= m < 50:
        return None
    if uuid == "GPU-a" and m >= 43:
        return 500.0 + watts * 60 * (m - 43)
    return 1000.0 + watts * 60 * (m - 30)


def xid(uuid, m):
    if uuid != "GPU-c":
        return 0
    if 40 <= m < 50:
        return None
    # One xid at 00:30 and one at 00:35; after the restart one at 00:50 and one at 00:55.
    return 1 + int(m >= 35) if m < 40 else 1 + int(m >= 55)


ENERGY = {g[1]: [energy(g[1], m) for m in MINUTES] for g in GPUS}
XID = {u: [xid(u, m) for m in MINUTES] for u in ENERGY}
EVENTS = [
    # (time, host, uuid, index, kind, code, detail)
    (T0 + 30 * MIN, "node-2", "GPU-c", 0, "xid", 79, "xid 79"),
    (T0 + 35 * MIN, "node-2", "GPU-c", 0, "xid", 48, "xid 48"),
    (T0 + 35 * MIN, "node-1", "GPU-a", 0, "ecc_sbe", 0, "single-bit ecc"),
    (T0 + 50 * MIN, "node-2", "GPU-c", 0, "xid", 13, "xid 13"),
    (T0 + 55 * MIN, "node-2", "GPU-c", 0, "xid", 31, "xid 31"),
]
# Processes: (uuid, pid, name, memory bytes, sm) while their job runs.
PROCS = [
    ("GPU-a", 4242, "python3", 40 << 30, 0.75),
    ("GPU-c", 777, "spark", 8 << 30, 0.2),
]


def requests():
    for host in ("node-1", "node-2"):
        for n, t in enumerate(TIMES):
            metrics = {}
            for (h, uuid, index, job) in GPUS:
                if h != host or ENERGY[uuid][n] is None:
                    continue
                attrs = [s("hw.id", uuid), i("gpu.index", index), s("hw.model", "NVIDIA H100 80GB HBM3")]
                if job:
                    attrs += [s("job.id", job[0]), s("job.user", job[1]), s("job.name", job[2]),
                              s("job.scheduler", "slurm")]
                for name, v, kind in (
                    ("hw.gpu.utilization", UTIL[uuid], gauge),
                    ("gpu.sm.active", SM[uuid], gauge),
                    ("hw.power", 100.0 + 500.0 * UTIL[uuid], gauge),
                    ("hw.energy", ENERGY[uuid][n], counter),
                    ("gpu.xid.errors", XID[uuid][n], counter),
                ):
                    metrics.setdefault(name, (kind, []))[1].append(point(t, v, attrs))
                for (pu, pid, pname, mem, sm) in PROCS:
                    if pu != uuid:
                        continue
                    pattrs = [s("hw.id", uuid), i("gpu.index", index), i("process.pid", pid),
                              s("process.executable.name", pname), s("job.id", job[0]),
                              s("job.user", job[1])]
                    metrics.setdefault("gpu.process.memory.usage", (gauge, []))[1].append(point(t, mem, pattrs))
                    metrics.setdefault("gpu.process.sm.utilization", (gauge, []))[1].append(point(t, sm, pattrs))
            for (et, eh, uuid, index, kind, code, detail) in EVENTS:
                if eh == host and t <= et < t + MIN:
                    attrs = [s("hw.id", uuid), i("gpu.index", index), s("gpu.event.kind", kind),
                             s("gpu.event.detail", detail)]
                    metrics.setdefault("gpu.event", (gauge, []))[1].append(point(et, code, attrs))
            yield {"resourceMetrics": [{
                "resource": {"attributes": [s("host.name", host)]},
                "scopeMetrics": [{"scope": {"name": "golden"},
                                  "metrics": [kind(name, pts) for name, (kind, pts) in metrics.items()]}],
            }]}


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "fixture.jsonl"), "w") as f:
        for r in requests():
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
