#!/usr/bin/env python3
"""Drives headless Chromium over the DevTools protocol against a running gpuwatch and checks the
web console's pages. Exit 0 when every check passes; any JavaScript exception or console error
fails the run. Screenshots go to --out.

  check.py --url http://127.0.0.1:9500 --out DIR pages        # Fleet, Jobs, a job, Alerts, SQL
  check.py --url ... --out DIR job --job ID --expect-cost USD  # the job page's cost
  check.py --url ... --out DIR auth --token T                  # token asked; nothing without it
  check.py --url ... --out DIR fleet-timing                    # prints the fleet load/draw ms

Needs Debian's `chromium` and the `websockets` package (PyPI).
"""

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import websockets

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-debugging-port=0", "--window-size=1400,900",
]


class Failure(Exception):
    pass


def api(url, path, token=None, body=None):
    """GET (or POST JSON) one of the server's APIs; returns (status, parsed JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status = e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def sql(url, q, token=None):
    status, rows = api(url, "/api/v1/sql", token, {"sql": q, "format": "json"})
    if status != 200:
        raise Failure(f"sql {q!r}: {status} {rows}")
    return rows


class Browser:
    def __init__(self, ignore_network_errors=False):
        self.ignore_network_errors = ignore_network_errors
        self.errors = []
        self.next_id = 0
        self.pending = {}
        self.events = []

    async def start(self):
        exe = shutil.which("chromium") or "/usr/bin/chromium"
        self.profile = tempfile.mkdtemp(prefix="gpuwatch-chromium-")
        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_ARGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 60
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise Failure("chromium did not start (is the `chromium` package installed?)")
            await asyncio.sleep(0.1)
        port = open(port_file).read().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
        self.ws = await websockets.connect(pages[0]["webSocketDebuggerUrl"], max_size=64 << 20)
        self.reader = asyncio.create_task(self.read())
        for domain in ("Runtime", "Log", "Page"):
            await self.call(f"{domain}.enable")
        await self.call("Emulation.setDeviceMetricsOverride",
                        width=1400, height=900, deviceScaleFactor=1, mobile=False)

    async def read(self):
        async for message in self.ws:
            m = json.loads(message)
            if "id" in m and m["id"] in self.pending:
                self.pending.pop(m["id"]).set_result(m)
                continue
            method = m.get("method")
            p = m.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                self.errors.append("exception: " + d.get("exception", {}).get("description", d.get("text", "")))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                e = p["entry"]
                if not (self.ignore_network_errors and e.get("source") == "network"):
                    self.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}")

    async def call(self, method, **params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = fut
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        m = await asyncio.wait_for(fut, 120)
        if "error" in m:
            raise Failure(f"{method}: {m['error']}")
        return m.get("result", {})

    async def eval(self, expr):
        r = await self.call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise Failure(f"evaluating {expr!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def goto(self, url):
        await self.call("Page.navigate", url=url)

    async def wait(self, expr, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if await self.eval(expr):
                    return
            except Failure:
                pass
            await asyncio.sleep(0.2)
        raise Failure(f"timed out after {timeout}s waiting for {what} ({expr})")

    async def screenshot(self, path):
        r = await self.call("Page.captureScreenshot", format="png")
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))
        print(f"screenshot: {path}")

    def check_errors(self):
        if self.errors:
            raise Failure("javascript errors:\n  " + "\n  ".join(self.errors))

    async def close(self):
        try:
            await self.ws.close()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


async def loaded(b, page, timeout=60):
    await b.wait(f"document.getElementById('main').dataset.loaded === '{page}'", f"the {page} page", timeout)


async def pages(b, args):
    url = args.url
    await b.goto(url + "/#/fleet")
    await loaded(b, "fleet")
    tiles = await b.eval("document.querySelectorAll('#fleet-hosts .t').length")
    gpus = sql(url, "SELECT count(*) AS n FROM (SELECT DISTINCT host, gpu_uuid FROM gpu_metrics "
                    "WHERE time > now() - INTERVAL '15 minutes')")[0]["n"]
    if tiles != gpus or tiles == 0:
        raise Failure(f"fleet: {tiles} tiles, but {gpus} GPUs reported in the last 15 minutes")
    counted = await b.eval("Number(document.querySelector('#count-all b').textContent)")
    states = await b.eval("['computing','idle','free','unhealthy','silent'].map(s => "
                          "Number(document.querySelector('#count-' + s + ' b').textContent))")
    if counted != gpus or sum(states) != gpus:
        raise Failure(f"fleet counts: all={counted} per state={states}, want {gpus}")
    hover = await b.eval("document.querySelector('#fleet-hosts .t[data-job]:not([data-job=\"\"])')?.title || ''")
    if "job " not in hover or "user " not in hover:
        raise Failure(f"fleet: a tile of a GPU in a job shows no job and user on hover: {hover!r}")
    # Filter by the first host: only its tiles remain.
    host = await b.eval("document.querySelector('#fleet-hosts .host .name').textContent")
    await b.eval(f"(() => {{ const i = document.getElementById('f-host'); i.value = {json.dumps(host)}; "
                 "i.dispatchEvent(new Event('input')); })()")
    per_host = sql(url, "SELECT count(DISTINCT gpu_uuid) AS n FROM gpu_metrics WHERE time > now() - INTERVAL '15 minutes' "
                        f"AND host = '{host}'")[0]["n"]
    shown = await b.eval("document.querySelectorAll('#fleet-hosts .t').length")
    if shown != per_host:
        raise Failure(f"fleet filter host={host}: {shown} tiles, want {per_host}")
    await b.eval("(() => { const i = document.getElementById('f-host'); i.value = ''; i.dispatchEvent(new Event('input')); })()")
    await b.screenshot(os.path.join(args.out, "fleet.png"))
    print(f"fleet: {tiles} tiles = {gpus} GPUs; states {states}")

    await b.goto(url + "/#/jobs")
    await loaded(b, "jobs")
    rows = await b.eval("document.querySelectorAll('#jobs-table tbody tr').length")
    if rows == 0:
        raise Failure("jobs: no row")
    # Sorting by cost puts the most expensive job first after two clicks (descending).
    await b.eval("document.querySelectorAll('#jobs-table th')[10].click()")
    await b.eval("document.querySelectorAll('#jobs-table th')[10].click()")
    first = await b.eval("document.querySelector('#jobs-table tbody tr td').textContent")
    await b.screenshot(os.path.join(args.out, "jobs.png"))
    print(f"jobs: {rows} rows; most expensive {first}")

    await b.eval("document.querySelector('#jobs-table tbody tr.link').click()")
    await loaded(b, "job")
    series = await b.eval("document.getElementById('job-charts').dataset.series")
    canvases = await b.eval("document.querySelectorAll('#job-charts canvas').length")
    if not series or int(series) < 1 or canvases < 3:
        raise Failure(f"job page: charts missing (series={series}, canvases={canvases})")
    # The limiter and the roofline: the simulated GPUs have GPM, so each is a point.
    limiter = await b.eval("document.getElementById('job-limiter')?.textContent || ''")
    if limiter not in ("tensor", "fp16", "fp32", "fp64", "memory", "host_transfer", "input", "latency", "idle", "unknown"):
        raise Failure(f"job page: limiter {limiter!r} is not a limiter word")
    points = await b.eval("document.getElementById('job-roofline').dataset.points")
    roof = await b.eval("document.querySelectorAll('#job-roofline canvas').length")
    if not points or int(points) < 1 or roof < 1:
        raise Failure(f"job page: roofline missing (points={points}, canvases={roof})")
    await b.screenshot(os.path.join(args.out, "job.png"))
    print(f"job {first}: {series} GPU series charted; limiter {limiter}; {points} GPUs on the roofline")

    await b.goto(url + "/#/alerts")
    await loaded(b, "alerts")
    await b.eval("document.getElementById('s-matchers').value = 'alertname=GpuIdleInJob, host=console-test'")
    await b.eval("document.getElementById('s-comment').value = 'console e2e'")
    await b.eval("document.querySelector('#silence-form button').click()")
    await b.wait("document.getElementById('silences').dataset.count === '1'", "the new silence listed")
    _, listed = api(url, "/api/v1/silences")
    active = [s for s in listed if s["status"] == "active" and s["comment"] == "console e2e"]
    if len(active) != 1:
        raise Failure(f"alerts: silence not created through the API: {listed}")
    await b.screenshot(os.path.join(args.out, "alerts.png"))
    await b.eval("document.querySelector('#silences button.expire').click()")
    await b.wait("document.getElementById('silences').dataset.count === undefined || "
                 "document.getElementById('silences').dataset.count === '0'", "the silence expired")
    _, listed = api(url, "/api/v1/silences")
    if any(s["status"] == "active" for s in listed):
        raise Failure(f"alerts: silence still active after Expire: {listed}")
    print("alerts: silence created and expired")

    await b.goto(url + "/#/sql")
    await loaded(b, "sql")
    await b.wait("document.querySelectorAll('#sql-tables li').length >= 6", "the table list")
    tables = await b.eval("Array.from(document.querySelectorAll('#sql-tables li')).map(l => l.textContent)")
    for t in ("gpu_metrics", "jobs", "alerts", "gpu_events"):
        if t not in tables:
            raise Failure(f"sql: table {t} not listed: {tables}")
    q = "SELECT time, gpu_utilization, power_watts FROM gpu_metrics ORDER BY time DESC LIMIT 50"
    await b.eval(f"(() => {{ const t = document.getElementById('sql-text'); t.value = {json.dumps(q)}; "
                 "t.dispatchEvent(new Event('input')); document.getElementById('main').dataset.loaded = ''; "
                 "document.getElementById('sql-run').click(); })()")
    await loaded(b, "sql")
    n = await b.eval("Number(document.getElementById('sql-results').dataset.rows)")
    chart = await b.eval("document.getElementById('sql-chart').dataset.chart || ''")
    if n != 50 or chart != "time" or await b.eval("document.querySelectorAll('#sql-chart canvas').length") < 1:
        raise Failure(f"sql: {n} rows, chart over {chart!r}")
    await b.screenshot(os.path.join(args.out, "sql.png"))
    # A wrong statement shows the server's error, not an exception (its 400 is expected).
    b.check_errors()
    b.ignore_network_errors = True
    await b.eval("(() => { const t = document.getElementById('sql-text'); t.value = 'SELECT nope FROM gpu_metrics'; "
                 "t.dispatchEvent(new Event('input')); document.getElementById('sql-run').click(); })()")
    await b.wait("document.querySelector('#sql-results .error') !== null", "the SQL error shown")
    print(f"sql: {n} rows, time chart drawn")


async def job(b, args):
    await b.goto(args.url + "/#/jobs/" + urllib.parse.quote(args.job, safe=""))
    await loaded(b, "job")
    got = await b.eval("Number(document.getElementById('job-cost').dataset.usd)")
    shown = await b.eval("document.getElementById('job-cost').textContent")
    want = float(args.expect_cost)
    if abs(got - want) > 1e-9 * max(1.0, abs(want)) or shown != f"${want:.2f}":
        raise Failure(f"job {args.job}: page shows cost {got} ({shown}), the jobs table says {want}")
    await b.screenshot(os.path.join(args.out, "job-frozen.png"))
    print(f"job {args.job}: cost {shown} = jobs table {want}")


async def auth(b, args):
    url = args.url
    status, body = api(url, "/api/v1/sql", None, {"sql": "SELECT 1 AS one"})
    if status != 401:
        raise Failure(f"auth: the SQL API answered {status} without a token: {body}")
    await b.goto(url + "/#/fleet")
    await b.wait("document.body.dataset.auth === 'needed'", "the token form")
    hidden = await b.eval("document.getElementById('main').hidden && document.getElementById('main').children.length === 0 "
                          "&& document.getElementById('nav').hidden && !document.getElementById('login').hidden")
    tiles = await b.eval("document.querySelectorAll('.t').length")
    if not hidden or tiles:
        raise Failure(f"auth: something is shown without a token (hidden={hidden}, tiles={tiles})")
    await b.screenshot(os.path.join(args.out, "auth-needed.png"))
    # A wrong token is refused and still nothing is shown.
    await b.eval("document.getElementById('token').value = 'wrong-token-0123456789'; "
                 "document.querySelector('#login-form button').click()")
    await b.wait("document.getElementById('login-error').textContent.includes('refused')", "the refusal")
    await b.eval(f"document.getElementById('token').value = {json.dumps(args.token)}; "
                 "document.querySelector('#login-form button').click()")
    await loaded(b, "fleet")
    tiles = await b.eval("document.querySelectorAll('#fleet-hosts .t').length")
    if tiles == 0:
        raise Failure("auth: no tile with the token")
    print(f"auth: nothing without a token; {tiles} tiles with it")


async def fleet_timing(b, args):
    runs = []
    for _ in range(args.repeat):
        await b.goto("about:blank")
        t0 = time.time()
        await b.goto(args.url + "/#/fleet")
        await loaded(b, "fleet", timeout=300)
        total = (time.time() - t0) * 1000
        tiles = await b.eval("document.querySelectorAll('#fleet-hosts .t').length")
        if not await b.eval("document.getElementById('main').dataset.fetchMs"):
            raise Failure("fleet: no data: " + await b.eval("document.getElementById('main').innerText"))
        fetch_ms = float(await b.eval("document.getElementById('main').dataset.fetchMs"))
        draw_ms = float(await b.eval("document.getElementById('main').dataset.drawMs"))
        runs.append((tiles, fetch_ms, draw_ms, total))
        print(f"fleet: {tiles} tiles, query {fetch_ms:.0f} ms, draw {draw_ms:.0f} ms, page load to drawn {total:.0f} ms")
    await b.screenshot(os.path.join(args.out, "fleet-timing.png"))


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--job")
    p.add_argument("--expect-cost")
    p.add_argument("--token")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("mode", choices=["pages", "job", "auth", "fleet-timing"])
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    b = Browser(ignore_network_errors=args.mode == "auth")
    await b.start()
    try:
        await {"pages": pages, "job": job, "auth": auth, "fleet-timing": fleet_timing}[args.mode](b, args)
        await asyncio.sleep(0.5)
        b.check_errors()
    except Failure as e:
        try:
            await b.screenshot(os.path.join(args.out, f"failed-{args.mode}.png"))
        except Exception:
            pass
        print(f"FAIL: {e}", file=sys.stderr)
        if b.errors:
            print("javascript errors:\n  " + "\n  ".join(b.errors), file=sys.stderr)
        return 1
    finally:
        await b.close()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
