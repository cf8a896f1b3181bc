#!/usr/bin/env python3
"""Loads a large simulated fleet into a running gpuwatch (OTLP/JSON over HTTP), for measuring the
console's Fleet page at scale with `check.py fleet-timing`:

  python3 tests/console/fleet.py --url http://127.0.0.1:9500 --hosts 1250 --gpus 8 --minutes 15 --step 5
  python3 tests/console/check.py --url http://127.0.0.1:9500 --out /tmp/shots fleet-timing

Every GPU gets one sample per `--step` seconds over the last `--minutes` minutes, ending now, with a
job on about 70% of them (a tenth of those idle), so the page draws every state but `silent`.
Hosts are named `fleet-NNNNN` and every point carries gpuwatch.simulated=true.
"""

import argparse
import json
import random
import time
import urllib.request


def post(url, body, token):
    req = urllib.request.Request(url + "/v1/metrics", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--hosts", type=int, default=1250)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--minutes", type=float, default=15)
    p.add_argument("--step", type=float, default=5)
    p.add_argument("--token")
    p.add_argument("--hosts-per-request", type=int, default=25)
    args = p.parse_args()
    rnd = random.Random(1)
    now = time.time_ns()
    steps = max(1, int(args.minutes * 60 / args.step))
    times = [now - int((steps - 1 - i) * args.step * 1e9) for i in range(steps)]
    started = time.time()
    rows = 0
    for first in range(0, args.hosts, args.hosts_per_request):
        resources = []
        for h in range(first, min(args.hosts, first + args.hosts_per_request)):
            host = f"fleet-{h + 1:05d}"
            metrics = {"hw.gpu.utilization": [], "gpu.sm.active": [], "hw.power": []}
            for g in range(args.gpus):
                r = rnd.random()
                job = None if r < 0.3 else str(100000 + h * args.gpus + g)
                busy = job is not None and r > 0.37
                attrs = [
                    {"key": "hw.id", "value": {"stringValue": f"GPU-{h:05d}-{g}"}},
                    {"key": "gpu.index", "value": {"intValue": str(g)}},
                    {"key": "hw.model", "value": {"stringValue": "NVIDIA H100 80GB HBM3"}},
                ]
                if job:
                    attrs += [{"key": "job.id", "value": {"stringValue": job}},
                              {"key": "job.user", "value": {"stringValue": f"user{h % 40}"}}]
                for t in times:
                    util = rnd.uniform(0.6, 1.0) if busy else 0.0
                    for name, v in (("hw.gpu.utilization", util), ("gpu.sm.active", util * 0.8),
                                    ("hw.power", 100 + 500 * util)):
                        metrics[name].append({"timeUnixNano": str(t), "asDouble": v, "attributes": attrs})
                    rows += 1
            resources.append({
                "resource": {"attributes": [
                    {"key": "host.name", "value": {"stringValue": host}},
                    {"key": "gpuwatch.simulated", "value": {"boolValue": True}}]},
                "scopeMetrics": [{"metrics": [{"name": n, "gauge": {"dataPoints": pts}}
                                              for n, pts in metrics.items()]}],
            })
        post(args.url, {"resourceMetrics": resources}, args.token)
    print(f"{args.hosts * args.gpus} GPUs, {rows} rows written in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
