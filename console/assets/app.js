// gpuwatch console: Fleet, Jobs, Alerts and SQL pages over the server's own APIs.
// Plain browser JavaScript, no build step. Every data call carries the bearer token, if any.
"use strict";

(function () {
  const TOKEN_KEY = "gpuwatch.token";
  const main = document.getElementById("main");
  const statusEl = document.getElementById("status");
  let timer = null;
  let charts = [];

  // ---- helpers -------------------------------------------------------------------------

  function esc(v) {
    return String(v === null || v === undefined ? "" : v)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }
  // A SQL string literal: quotes doubled, so a value can never end the literal.
  function lit(s) { return "'" + String(s).replace(/'/g, "''") + "'"; }
  function pct(v) { return v === null || v === undefined ? "-" : (v * 100).toFixed(0) + "%"; }
  function num(v, d) { return v === null || v === undefined ? "-" : Number(v).toFixed(d); }
  function usd(v) { return v === null || v === undefined ? "-" : "$" + Number(v).toFixed(2); }
  // Work the job reported (job.samples, ... docs/cost.md): done, rate and what a million cost.
  function workCards(w, card) {
    if (!w) { return card("work done", '<span id="job-work" class="muted">not reported</span>', ' title="the job sends no job.samples, job.tokens or job.steps counter (docs/cost.md)"'); }
    const big = function (v) { return v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US", { maximumFractionDigits: 1 }); };
    return card("work done", '<span id="job-work">' + big(w.done) + " " + esc(w.unit) + "</span>") +
      card(w.unit + " per GPU-hour", big(w.per_gpu_hour)) +
      card("USD per million " + w.unit, '<span id="job-usd-per-million">' + (w.usd_per_million_units === null || w.usd_per_million_units === undefined ? "-" : "$" + Number(w.usd_per_million_units).toFixed(4)) + "</span>");
  }
  function gib(b) { return b === null || b === undefined ? "-" : (b / 1073741824).toFixed(1) + " GiB"; }
  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const t = token();
    if (t) h["Authorization"] = "Bearer " + t;
    return h;
  }

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, opts) {
    const o = Object.assign({}, opts || {});
    o.headers = headers(o.headers);
    const resp = await fetch(path, o);
    if (!resp.ok) {
      let msg = resp.statusText;
      try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
      if (resp.status === 401) showLogin("the token was refused: " + msg);
      throw new ApiError(resp.status, msg + " (" + resp.status + ")");
    }
    return resp;
  }
  async function getJson(path) { return (await api(path)).json(); }
  async function sql(q, format) {
    const resp = await api("/api/v1/sql", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sql: q, format: format || "json" }),
    });
    return format && format !== "json" ? resp.blob() : resp.json();
  }
  // RFC 3339 with up to 9 fractional digits -> ms since the epoch.
  function parseTime(s) {
    if (typeof s !== "string") return NaN;
    return Date.parse(s.replace(/(\.\d{3})\d+/, "$1"));
  }
  function setStatus(text) { statusEl.textContent = text; }
  function fail(where, e) {
    if (!where) return; // the page was left while the call ran
    where.innerHTML = '<p class="error">' + esc(e && e.message ? e.message : e) + "</p>";
  }
  function loaded(page) { main.dataset.loaded = page; }

  function table(cols, rows, opts) {
    // cols: [{key, label, num, fmt}], rows: objects. opts.sortable, opts.link(row) -> href.
    const o = opts || {};
    let h = "<table><thead><tr>";
    cols.forEach(function (c, i) {
      h += '<th data-col="' + i + '" class="' + (c.num ? "num " : "") + (o.sortable ? "sortable" : "") + '">' + esc(c.label) + "</th>";
    });
    h += "</tr></thead><tbody>";
    rows.forEach(function (r) {
      const link = o.link ? o.link(r) : null;
      h += link ? '<tr class="link" data-href="' + esc(link) + '">' : "<tr>";
      cols.forEach(function (c) {
        const v = r[c.key];
        h += "<td" + (c.num ? ' class="num"' : c.wrap ? ' class="wrap"' : "") + ">" + (c.fmt ? c.fmt(v, r) : esc(v)) + "</td>";
      });
      h += "</tr>";
    });
    return h + "</tbody></table>";
  }
  function wireTable(el, cols, rows, opts, rerender) {
    el.querySelectorAll("tr.link").forEach(function (tr) {
      tr.addEventListener("click", function () { location.hash = tr.dataset.href; });
    });
    if (!opts || !opts.sortable) return;
    el.querySelectorAll("th.sortable").forEach(function (th) {
      th.addEventListener("click", function () {
        const c = cols[Number(th.dataset.col)];
        const dir = opts.sortKey === c.key && opts.sortDir === 1 ? -1 : 1;
        opts.sortKey = c.key; opts.sortDir = dir;
        rows.sort(function (a, b) {
          const x = a[c.key], y = b[c.key];
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * dir;
        });
        rerender();
      });
    });
  }

  function chart(el, title, xsSec, series, yRange) {
    // series: [{label, values}]
    const palette = ["#2e6fd8", "#2e9d5b", "#d64545", "#e0a12b", "#8b5cf6", "#0ea5a4", "#db2777", "#6b7280"];
    const opts = {
      title: title,
      width: Math.min(900, Math.max(400, el.clientWidth || 900)),
      height: 220,
      scales: yRange ? { y: { range: yRange } } : {},
      series: [{}].concat(series.map(function (s, i) {
        return { label: s.label, stroke: palette[i % palette.length], width: 1.5, spanGaps: false };
      })),
    };
    const data = [xsSec].concat(series.map(function (s) { return s.values; }));
    const div = document.createElement("div");
    div.className = "chart";
    el.appendChild(div);
    charts.push(new uPlot(opts, data, div));
  }

  // ---- pages ---------------------------------------------------------------------------

  const STATES = [
    ["computing", "computing"],
    ["idle", "idle in a job"],
    ["free", "free"],
    ["unhealthy", "unhealthy"],
    ["silent", "silent"],
  ];
  // The latest row of every GPU seen in the last 15 minutes, in one aggregated query.
  const FLEET_SQL = "SELECT host, gpu_uuid, max(gpu_index) AS gpu_index, max(gpu_model) AS gpu_model, " +
    "(CAST(now() AS BIGINT) - CAST(max(time) AS BIGINT)) / 1e9 AS age_s, " +
    "last_value(job_id ORDER BY time) AS job_id, last_value(job_user ORDER BY time) AS job_user, " +
    "last_value(gpu_utilization ORDER BY time) AS util, " +
    "last_value(ecc_dbe_volatile_total ORDER BY time) AS dbe, " +
    "last_value(remapped_rows_failure ORDER BY time) AS remap_failure, " +
    "max(xid_errors_total) - min(xid_errors_total) AS new_xids " +
    "FROM gpu_metrics WHERE time > now() - INTERVAL '15 minutes' GROUP BY host, gpu_uuid";
  const SILENT_AFTER_S = 120;
  const IDLE_BELOW = 0.01;

  function gpuState(g) {
    if (g.age_s > SILENT_AFTER_S) return "silent";
    if ((g.dbe || 0) > 0 || (g.remap_failure || 0) > 0 || (g.new_xids || 0) > 0) return "unhealthy";
    const busy = g.util !== null && g.util !== undefined && g.util >= IDLE_BELOW;
    if (busy) return "computing";
    return g.job_id ? "idle" : "free";
  }

  const fleet = { gpus: [], filters: { host: "", model: "", user: "" } };

  async function pageFleet() {
    main.innerHTML =
      '<h1>Fleet</h1><div class="counts" id="fleet-counts"></div>' +
      '<div class="filters">host <input id="f-host" placeholder="contains" size="14"> ' +
      'model <select id="f-model"><option value="">all</option></select> ' +
      'user <select id="f-user"><option value="">all</option></select> ' +
      '<span class="muted" id="fleet-timing"></span></div><div id="fleet-hosts"></div>' +
      '<p class="muted">A tile is one GPU (latest sample of the last 15 minutes). Computing: utilisation at least 1%; ' +
      "idle in a job: below 1% with a job; free: no job; unhealthy: double-bit ECC errors, a row-remap failure or a new XID; " +
      "silent: no sample for 2 minutes.</p>";
    ["f-host", "f-model", "f-user"].forEach(function (id) {
      document.getElementById(id).addEventListener("input", function (ev) {
        fleet.filters[id.slice(2)] = ev.target.value;
        drawFleet();
      });
    });
    await loadFleet();
    timer = setInterval(function () { loadFleet().catch(function () {}); }, 15000);
  }

  async function loadFleet() {
    const t0 = performance.now();
    let rows;
    try {
      rows = await sql(FLEET_SQL);
    } catch (e) {
      fail(document.getElementById("fleet-hosts"), e);
      loaded("fleet");
      return;
    }
    const t1 = performance.now();
    rows.forEach(function (g) { g.state = gpuState(g); });
    rows.sort(function (a, b) {
      return a.host < b.host ? -1 : a.host > b.host ? 1 : (a.gpu_index || 0) - (b.gpu_index || 0);
    });
    fleet.gpus = rows;
    fillSelect("f-model", rows.map(function (g) { return g.gpu_model; }));
    fillSelect("f-user", rows.map(function (g) { return g.job_user; }));
    drawFleet();
    // Reading a layout property makes the browser lay the tiles out now, so the draw time
    // includes layout, not only building the DOM.
    void document.getElementById("fleet-hosts").offsetHeight;
    const t2 = performance.now();
    const timing = document.getElementById("fleet-timing");
    if (timing) {
      timing.textContent = rows.length + " GPUs: query " + (t1 - t0).toFixed(0) + " ms, draw " + (t2 - t1).toFixed(0) + " ms";
      main.dataset.fetchMs = (t1 - t0).toFixed(1);
      main.dataset.drawMs = (t2 - t1).toFixed(1);
    }
    setStatus("updated " + new Date().toLocaleTimeString());
    loaded("fleet");
  }

  function fillSelect(id, values) {
    const sel = document.getElementById(id);
    if (!sel) return;
    const keep = sel.value;
    const uniq = Array.from(new Set(values.filter(function (v) { return v; }))).sort();
    sel.innerHTML = '<option value="">all</option>' + uniq.map(function (v) {
      return "<option" + (v === keep ? " selected" : "") + ">" + esc(v) + "</option>";
    }).join("");
  }

  function drawFleet() {
    const f = fleet.filters;
    const hostsEl = document.getElementById("fleet-hosts");
    if (!hostsEl) return;
    const counts = { computing: 0, idle: 0, free: 0, unhealthy: 0, silent: 0 };
    const parts = [];
    let host = null;
    let shown = 0;
    for (const g of fleet.gpus) {
      if (f.host && g.host.indexOf(f.host) < 0) continue;
      if (f.model && g.gpu_model !== f.model) continue;
      if (f.user && g.job_user !== f.user) continue;
      if (g.host !== host) {
        if (host !== null) parts.push("</div></div>");
        host = g.host;
        parts.push('<div class="host"><span class="name" title="' + esc(host) + '">' + esc(host) + '</span><div class="tiles">');
      }
      counts[g.state]++;
      shown++;
      const tip = g.host + " GPU " + (g.gpu_index === null ? "?" : g.gpu_index) + " (" + (g.gpu_model || "unknown model") + ")\n" +
        g.state + ", utilisation " + pct(g.util) + "\n" +
        (g.job_id ? "job " + g.job_id + " user " + (g.job_user || "-") : "no job") +
        (g.state === "silent" ? "\nlast sample " + Math.round(g.age_s) + " s ago" : "");
      parts.push('<div class="t s-' + g.state + '" data-job="' + esc(g.job_id || "") + '" title="' + esc(tip) + '"></div>');
    }
    if (host !== null) parts.push("</div></div>");
    hostsEl.innerHTML = parts.join("");
    document.getElementById("fleet-counts").innerHTML =
      '<span class="count" id="count-all"><b>' + shown + "</b> GPUs</span>" +
      STATES.map(function (s) {
        return '<span class="count" id="count-' + s[0] + '"><span class="swatch s-' + s[0] + '"></span>' + esc(s[1]) + " <b>" + counts[s[0]] + "</b></span>";
      }).join("");
  }

  const jobsView = { rows: [], opts: { sortable: true, sortKey: null, sortDir: 1 } };
  const JOB_COLS = [
    { key: "job_id", label: "job" },
    { key: "user", label: "user" },
    { key: "name", label: "name" },
    { key: "state", label: "state" },
    { key: "gpus", label: "GPUs", num: true },
    { key: "gpu_hours", label: "GPU-hours", num: true, fmt: function (v) { return num(v, 2); } },
    { key: "idle_share", label: "idle", num: true, fmt: pct },
    { key: "mean_utilization", label: "efficiency (mean util.)", num: true, fmt: pct },
    { key: "mean_sm_active", label: "SM active", num: true, fmt: pct },
    { key: "energy_kwh", label: "kWh", num: true, fmt: function (v) { return num(v, 2); } },
    { key: "cost_usd", label: "cost", num: true, fmt: usd },
    { key: "idle_cost_usd", label: "idle cost", num: true, fmt: usd },
    { key: "last_seen", label: "last seen" },
    { key: "limiter", label: "limiter" },
  ];

  async function pageJobs() {
    main.innerHTML = '<h1>Jobs</h1><div class="filters">seen within <select id="j-since">' +
      '<option>1h</option><option selected>1d</option><option>7d</option><option>30d</option></select> ' +
      'user <input id="j-user" size="12"> <label><input type="checkbox" id="j-running"> running only</label></div>' +
      '<div id="jobs-table" class="results"></div>';
    ["j-since", "j-user", "j-running"].forEach(function (id) {
      document.getElementById(id).addEventListener("change", function () { loadJobs().catch(function () {}); });
    });
    await loadJobs();
    timer = setInterval(function () { loadJobs().catch(function () {}); }, 30000);
  }

  async function loadJobs() {
    const el = document.getElementById("jobs-table");
    if (!el) return;
    const since = document.getElementById("j-since").value;
    const user = document.getElementById("j-user").value.trim();
    const running = document.getElementById("j-running").checked;
    let q = "/api/v1/jobs?limit=1000&since=" + encodeURIComponent(since);
    if (user) q += "&user=" + encodeURIComponent(user);
    if (running) q += "&running=true";
    try {
      jobsView.rows = await getJson(q);
    } catch (e) {
      fail(el, e);
      loaded("jobs");
      return;
    }
    const render = function () {
      el.innerHTML = jobsView.rows.length
        ? table(JOB_COLS, jobsView.rows, Object.assign({ link: function (r) { return "#/jobs/" + encodeURIComponent(r.job_id); } }, jobsView.opts))
        : '<p class="muted">No job seen in this window.</p>';
      wireTable(el, JOB_COLS, jobsView.rows, jobsView.opts, render);
    };
    render();
    setStatus("updated " + new Date().toLocaleTimeString());
    loaded("jobs");
  }

  async function pageJob(id) {
    main.innerHTML = '<p><a href="#/jobs">&larr; jobs</a></p><div id="job"></div>';
    const el = document.getElementById("job");
    let r;
    try {
      r = await getJson("/api/v1/jobs/" + encodeURIComponent(id));
    } catch (e) {
      fail(el, e);
      loaded("job");
      return;
    }
    const card = function (k, v, extra) { return '<div class="card"' + (extra || "") + '><div class="v">' + v + '</div><div class="k">' + esc(k) + "</div></div>"; };
    let h = "<h1>Job " + esc(r.job_id) + " <span class=\"muted\">" + esc(r.state) + "</span></h1>" +
      '<p class="muted">user ' + esc(r.user || "-") + " &middot; name " + esc(r.name || "-") + " &middot; scheduler " + esc(r.scheduler || "-") +
      " &middot; hosts " + esc(r.hosts.join(", ")) + " &middot; " + esc(r.first_seen) + " &rarr; " + esc(r.last_seen) + "</p>" +
      '<div class="cards">' +
      card("GPUs", esc(r.gpus)) +
      card("GPU-hours", num(r.gpu_hours, 3)) +
      card("idle GPU-hours", num(r.idle_gpu_hours, 3) + " (" + pct(r.idle_share) + ")") +
      card("energy", num(r.energy_kwh, 3) + " kWh") +
      card("cost", '<span id="job-cost" data-usd="' + esc(r.cost_usd) + '">' + usd(r.cost_usd) + "</span>") +
      card("idle cost", '<span id="job-idle-cost" data-usd="' + esc(r.idle_cost_usd) + '">' + usd(r.idle_cost_usd) + "</span>") +
      card("mean utilisation", pct(r.mean_utilization)) +
      card("limiter", '<span id="job-limiter">' + esc(r.limiter || "-") + "</span>",
        ' title="' + esc(limiterWeights(r.limiter_seconds)) + '"') +
      workCards(r.work, card) +
      "</div>";
    h += "<h2>Notes</h2>" + (r.advice.length
      ? '<ul class="advice">' + r.advice.map(function (a) {
        const info = a.informational ? ' <span class="muted">(informational)</span>' : "";
        const limit = (a.value !== null && a.value !== undefined && a.threshold !== null && a.threshold !== undefined)
          ? ' <span class="muted">[' + esc(a.unit === "ratio" ? pct(a.value) + " vs " + pct(a.threshold) : a.value + " vs " + a.threshold) + "]</span>"
          : "";
        return '<li><span class="rule">' + esc(a.rule) + "</span>" + info + " <b>" + esc(a.figure) + "</b>" + limit + ": " + esc(a.advice) + "</li>";
      }).join("") + "</ul>"
      : '<p class="muted">No rule of docs/jobs.md matched.</p>');
    const gcols = [
      { key: "host", label: "host" },
      { key: "gpu_index", label: "GPU", num: true },
      { key: "gpu_model", label: "model" },
      { key: "limiter", label: "limiter" },
      { key: "mean_utilization", label: "util. mean", num: true, fmt: pct },
      { key: "max_utilization", label: "util. max", num: true, fmt: pct },
      { key: "mean_sm_active", label: "SM", num: true, fmt: pct },
      { key: "mean_tensor_active", label: "tensor", num: true, fmt: pct },
      { key: "mean_dram_active", label: "DRAM", num: true, fmt: pct },
      { key: "peak_memory_used_bytes", label: "peak memory", num: true, fmt: function (v, g) { return gib(v) + " / " + gib(g.memory_total_bytes); } },
      { key: "idle_minutes", label: "idle min", num: true, fmt: function (v) { return num(v, 1); } },
      { key: "throttled_share", label: "throttled", num: true, fmt: pct },
      { key: "power_capped_share", label: "power capped", num: true, fmt: pct },
      { key: "xid_events", label: "XID", num: true },
      { key: "ecc_events", label: "ECC", num: true },
      { key: "cost_usd", label: "cost", num: true, fmt: usd },
    ];
    h += "<h2>GPUs</h2>" + table(gcols, r.per_gpu);
    if (r.events.length) {
      h += "<h2>Events</h2>" + table([
        { key: "time", label: "time" }, { key: "host", label: "host" }, { key: "gpu_uuid", label: "GPU" },
        { key: "kind", label: "kind" }, { key: "code", label: "code", num: true }, { key: "detail", label: "detail" },
      ], r.events);
    }
    h += '<h2>Roofline</h2><p class="muted">Each GPU over the job: the busiest pipe\'s share of its peak ' +
      "against arithmetic intensity in units of the ridge point (pipe share / DRAM share); the roof is min(1, x). " +
      "Left of 1 a GPU can at best be memory-bound, right of it compute-bound (docs/jobs.md).</p>" +
      '<div id="job-roofline"></div>' + rooflineTable(r.per_gpu);
    h += '<h2>Activity</h2><div id="job-charts"></div>';
    el.innerHTML = h;
    roofline(r, document.getElementById("job-roofline"));
    await jobCharts(r, document.getElementById("job-charts"));
    loaded("job");
  }

  function limiterWeights(seconds) {
    const s = seconds || {};
    const total = Object.keys(s).reduce(function (a, k) { return a + (s[k] || 0); }, 0);
    if (!total) return "no GPU time";
    return Object.keys(s).filter(function (k) { return s[k] > 0; })
      .sort(function (a, b) { return s[b] - s[a]; })
      .map(function (k) { return k + " " + pct(s[k] / total); }).join(", ");
  }

  const ROOF_UNITS = ["tensor", "fp16", "fp32", "fp64", "dram", "pcie", "nvlink"];

  function rooflineTable(perGpu) {
    const cols = [{ key: "gpu", label: "GPU" }, { key: "model", label: "peaks" }].concat(ROOF_UNITS.map(function (u) {
      return { key: u, label: u, num: true, fmt: pct };
    }));
    const rowsOut = perGpu.map(function (g) {
      const row = { gpu: g.host + " GPU " + (g.gpu_index === null ? g.gpu_uuid : g.gpu_index), model: (g.roofline && g.roofline.model) || "unknown model: shares only" };
      ((g.roofline && g.roofline.units) || []).forEach(function (u) { row[u.unit] = u.share; });
      return row;
    });
    return table(cols, rowsOut);
  }

  // The normalised roofline: x = compute share / DRAM share (log), y = compute share (log).
  function roofline(r, el) {
    const floor = 1e-3;
    const pts = r.per_gpu.map(function (g) {
      const rf = g.roofline || {};
      return { label: g.host + " GPU " + (g.gpu_index === null ? g.gpu_uuid : g.gpu_index) + " (" + (g.limiter || "-") + ")",
        x: rf.intensity, y: rf.compute_share };
    }).filter(function (p) { return p.x > 0 && p.y > 0; });
    el.dataset.points = String(pts.length);
    if (!pts.length) {
      el.innerHTML = '<p class="muted">No GPU of this job has both pipe and DRAM activity counters (GPM or DCGM profiling): no roofline.</p>';
      return;
    }
    const grid = [];
    for (let e = -3; e <= 3.0001; e += 0.1) grid.push(Math.pow(10, e));
    const xs = grid.concat(pts.map(function (p) { return Math.min(1000, Math.max(floor, p.x)); }))
      .sort(function (a, b) { return a - b; })
      .filter(function (x, i, a) { return i === 0 || x !== a[i - 1]; });
    const roof = xs.map(function (x) { return Math.min(1, x); });
    const palette = ["#2e6fd8", "#2e9d5b", "#d64545", "#e0a12b", "#8b5cf6", "#0ea5a4", "#db2777", "#6b7280"];
    const series = [{}, { label: "roof", stroke: "#1d2330", width: 2 }];
    const data = [xs, roof];
    pts.forEach(function (p, i) {
      const px = Math.min(1000, Math.max(floor, p.x));
      data.push(xs.map(function (x) { return x === px ? Math.max(floor, p.y) : null; }));
      series.push({ label: p.label, stroke: palette[i % palette.length], fill: palette[i % palette.length],
        paths: function () { return null; }, points: { show: true, size: 10, fill: palette[i % palette.length], stroke: palette[i % palette.length] } });
    });
    const opts = {
      title: "roofline (normalised): compute share vs intensity / ridge",
      width: Math.min(900, Math.max(400, el.clientWidth || 900)),
      height: 320,
      scales: { x: { time: false, distr: 3 }, y: { distr: 3, range: [floor, 1.5] } },
      axes: [{ label: "arithmetic intensity / ridge point" }, { label: "share of peak" }],
      series: series,
    };
    const div = document.createElement("div");
    div.className = "chart";
    el.appendChild(div);
    charts.push(new uPlot(opts, data, div));
  }

  async function jobCharts(r, el) {
    const spanS = Math.max(1, (parseTime(r.last_seen) - parseTime(r.first_seen)) / 1000);
    const step = Math.max(1, Math.ceil(spanS / 600));
    const q = "SELECT CAST(date_bin(INTERVAL '" + step + " seconds', time) AS BIGINT) / 1000000 AS ms, host, gpu_uuid, " +
      "max(gpu_index) AS gpu_index, avg(gpu_utilization) AS util, avg(sm_active) AS sm, avg(power_watts) AS watts " +
      "FROM gpu_metrics WHERE job_id = " + lit(r.job_id) +
      " AND time >= TIMESTAMP " + lit(r.first_seen) + " - INTERVAL '1 second' AND time <= TIMESTAMP " + lit(r.last_seen) + " + INTERVAL '1 second'" +
      " GROUP BY 1, 2, 3 ORDER BY 1";
    let rows;
    try {
      rows = await sql(q);
    } catch (e) {
      fail(el, e);
      return;
    }
    const xs = Array.from(new Set(rows.map(function (x) { return x.ms; }))).sort(function (a, b) { return a - b; });
    const xi = new Map(xs.map(function (x, i) { return [x, i]; }));
    const gpus = new Map();
    rows.forEach(function (x) {
      const key = x.host + " GPU " + x.gpu_index;
      if (!gpus.has(key)) {
        gpus.set(key, { util: new Array(xs.length).fill(null), sm: new Array(xs.length).fill(null), watts: new Array(xs.length).fill(null) });
      }
      const g = gpus.get(key);
      const i = xi.get(x.ms);
      g.util[i] = x.util; g.sm[i] = x.sm; g.watts[i] = x.watts;
    });
    const xsSec = xs.map(function (x) { return x / 1000; });
    const names = Array.from(gpus.keys()).sort(function (a, b) { return a.localeCompare(b, undefined, { numeric: true }); });
    const mk = function (k) { return names.map(function (n) { return { label: n, values: gpus.get(n)[k] }; }); };
    chart(el, "GPU utilisation (0..1)", xsSec, mk("util"), [0, 1]);
    chart(el, "SM activity (0..1)", xsSec, mk("sm"), [0, 1]);
    chart(el, "power (W)", xsSec, mk("watts"), null);
    el.dataset.series = String(names.length);
  }

  async function pageAlerts() {
    main.innerHTML = '<h1>Alerts</h1><div id="alerts-now"></div>' +
      '<h2>Silences</h2><form id="silence-form" class="inline">' +
      '<input id="s-matchers" size="36" placeholder="alertname=GpuIdleInJob, host=sim-node-01"> for ' +
      '<input id="s-duration" size="5" value="2h"> by <input id="s-by" size="10" placeholder="you"> ' +
      '<input id="s-comment" size="24" placeholder="why"> <button type="submit">Create silence</button></form>' +
      '<p id="silence-error" class="error"></p><div id="silences"></div>' +
      '<h2>History</h2><div id="alerts-history" class="results"></div>';
    document.getElementById("silence-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      createSilence().catch(function () {});
    });
    await Promise.all([loadAlertsNow(), loadSilences(), loadHistory()]);
    loaded("alerts");
    timer = setInterval(function () { Promise.all([loadAlertsNow(), loadSilences()]).catch(function () {}); }, 15000);
  }

  function labelsText(l) {
    if (!l) return "";
    // alertname repeats the rule column.
    if (Array.isArray(l)) return l.filter(function (kv) { return kv.key !== "alertname"; }).map(function (kv) { return kv.key + "=" + kv.value; }).join(", ");
    return Object.keys(l).filter(function (k) { return k !== "alertname"; }).map(function (k) { return k + "=" + l[k]; }).join(", ");
  }

  async function loadAlertsNow() {
    const el = document.getElementById("alerts-now");
    if (!el) return;
    try {
      const a = await getJson("/api/v1/alerts");
      const active = a.alerts.filter(function (x) { return x.state === "firing" || x.state === "pending"; });
      el.innerHTML = active.length ? table([
        { key: "state", label: "state" }, { key: "rule", label: "rule" },
        { key: "labels", label: "labels", wrap: true, fmt: function (v) { return esc(labelsText(v)); } },
        { key: "value", label: "value", num: true, fmt: function (v) { return num(v, 3); } },
        { key: "activeAt", label: "active since" }, { key: "silenced", label: "silenced", fmt: function (v) { return v ? "yes" : ""; } },
        { key: "annotations", label: "summary", fmt: function (v) { return esc(v && v.summary ? v.summary : ""); } },
      ], active) : '<p class="muted">No alert firing or pending.</p>';
      el.dataset.count = String(active.length);
    } catch (e) {
      fail(el, e.status === 403 ? "the Alerts API needs a token with the admin scope" : e);
    }
  }

  async function loadSilences() {
    const el = document.getElementById("silences");
    if (!el) return;
    try {
      const list = await getJson("/api/v1/silences");
      const shown = list.filter(function (s) { return s.status !== "expired"; });
      el.innerHTML = shown.length ? table([
        { key: "id", label: "id" }, { key: "status", label: "status" },
        { key: "matchers", label: "matchers", fmt: function (v) {
          return esc(v.map(function (m) { return m.name + (m.isEqual === false ? "!" : "") + (m.isRegex ? "=~" : "=") + m.value; }).join(", "));
        } },
        { key: "endsAt", label: "ends" }, { key: "createdBy", label: "by" }, { key: "comment", label: "comment" },
        { key: "id", label: "", fmt: function (v) { return '<button type="button" class="expire" data-id="' + esc(v) + '">Expire</button>'; } },
      ], shown) : '<p class="muted">No active silence.</p>';
      el.dataset.count = String(shown.length);
      el.querySelectorAll("button.expire").forEach(function (b) {
        b.addEventListener("click", function () {
          api("/api/v1/silences/" + encodeURIComponent(b.dataset.id), { method: "DELETE" })
            .then(loadSilences)
            .catch(function (e) { document.getElementById("silence-error").textContent = e.message; });
        });
      });
    } catch (e) {
      fail(el, e.status === 403 ? "the silences API needs a token with the admin scope" : e);
    }
  }

  async function createSilence() {
    const errEl = document.getElementById("silence-error");
    errEl.textContent = "";
    const text = document.getElementById("s-matchers").value;
    const matchers = [];
    for (const part of text.split(",")) {
      const p = part.trim();
      if (!p) continue;
      const m = /^([A-Za-z_][A-Za-z0-9_]*)\s*(!=|=~|!~|=)\s*(.*)$/.exec(p);
      if (!m) { errEl.textContent = "matcher " + JSON.stringify(p) + ": write name=value (or !=, =~, !~)"; return; }
      matchers.push({ name: m[1], value: m[3], isRegex: m[2] === "=~" || m[2] === "!~", isEqual: m[2] === "=" || m[2] === "=~" });
    }
    if (!matchers.length) { errEl.textContent = "give at least one matcher, e.g. alertname=GpuIdleInJob"; return; }
    try {
      await api("/api/v1/silences", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
          matchers: matchers,
          duration: document.getElementById("s-duration").value.trim() || "2h",
          createdBy: document.getElementById("s-by").value.trim() || "console",
          comment: document.getElementById("s-comment").value.trim(),
        }),
      });
      await loadSilences();
    } catch (e) {
      errEl.textContent = e.message;
    }
  }

  async function loadHistory() {
    const el = document.getElementById("alerts-history");
    try {
      const rows = await sql("SELECT time, rule, state, labels, value FROM alerts ORDER BY time DESC LIMIT 200");
      el.innerHTML = rows.length ? table([
        { key: "time", label: "time" }, { key: "rule", label: "rule" }, { key: "state", label: "state" },
        { key: "labels", label: "labels", wrap: true, fmt: function (v) { return esc(labelsText(v)); } },
        { key: "value", label: "value", num: true, fmt: function (v) { return num(v, 3); } },
      ], rows) : '<p class="muted">No alert transitions recorded yet.</p>';
    } catch (e) {
      fail(el, e);
    }
  }

  const sqlState = { text: "SELECT time, host, gpu_index, gpu_utilization, power_watts\nFROM gpu_metrics\nWHERE time > now() - INTERVAL '10 minutes'\nORDER BY time DESC\nLIMIT 100" };

  async function pageSql() {
    main.innerHTML = '<h1>SQL</h1><div class="sqlpage"><div><h2>Tables</h2><ul id="sql-tables"></ul></div><div>' +
      '<textarea id="sql-text" spellcheck="false"></textarea>' +
      '<div class="filters"><button id="sql-run" type="button">Run (Ctrl+Enter)</button>' +
      '<button id="sql-csv" type="button">Download CSV</button><button id="sql-parquet" type="button">Download Parquet</button>' +
      '<span class="muted" id="sql-info"></span></div>' +
      '<div id="sql-chart"></div><div id="sql-results" class="results"></div></div></div>';
    const ta = document.getElementById("sql-text");
    ta.value = sqlState.text;
    ta.addEventListener("input", function () { sqlState.text = ta.value; });
    ta.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); runSql().catch(function () {}); }
    });
    document.getElementById("sql-run").addEventListener("click", function () { runSql().catch(function () {}); });
    document.getElementById("sql-csv").addEventListener("click", function () { download("csv").catch(function () {}); });
    document.getElementById("sql-parquet").addEventListener("click", function () { download("parquet").catch(function () {}); });
    try {
      const tables = await sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name");
      const ul = document.getElementById("sql-tables");
      ul.innerHTML = tables.map(function (t) { return '<li><a data-t="' + esc(t.table_name) + '">' + esc(t.table_name) + "</a></li>"; }).join("");
      ul.querySelectorAll("a").forEach(function (a) {
        a.addEventListener("click", function () {
          const t = a.dataset.t;
          const hasTime = t !== "jobs" && t !== "budgets";
          ta.value = sqlState.text = "SELECT * FROM " + t + (hasTime ? " ORDER BY time DESC" : "") + " LIMIT 100";
          runSql().catch(function () {});
        });
      });
    } catch (e) {
      fail(document.getElementById("sql-tables"), e);
    }
    await runSql();
  }

  const TIME_RE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d/;

  async function runSql() {
    const out = document.getElementById("sql-results");
    const chartEl = document.getElementById("sql-chart");
    const info = document.getElementById("sql-info");
    if (!out) return;
    destroyCharts();
    chartEl.innerHTML = "";
    const t0 = performance.now();
    let rows;
    try {
      rows = await sql(sqlState.text);
    } catch (e) {
      fail(out, e);
      info.textContent = "";
      loaded("sql");
      return;
    }
    info.textContent = rows.length + " rows in " + (performance.now() - t0).toFixed(0) + " ms";
    const cols = [];
    rows.forEach(function (r) { Object.keys(r).forEach(function (k) { if (cols.indexOf(k) < 0) cols.push(k); }); });
    const shown = rows.slice(0, 2000);
    out.innerHTML = table(cols.map(function (c) {
      const isNum = shown.some(function (r) { return typeof r[c] === "number"; });
      return { key: c, label: c, num: isNum, fmt: function (v) { return esc(typeof v === "object" && v !== null ? JSON.stringify(v) : v); } };
    }), shown) + (rows.length > shown.length ? '<p class="muted">first ' + shown.length + " rows shown; download for all</p>" : "");
    out.dataset.rows = String(rows.length);
    // A time chart when a column holds times and others hold numbers.
    const timeCol = cols.find(function (c) { return rows.length && rows.every(function (r) { return typeof r[c] === "string" && TIME_RE.test(r[c]); }); });
    const numCols = cols.filter(function (c) { return c !== timeCol && rows.some(function (r) { return typeof r[c] === "number"; }); }).slice(0, 8);
    if (timeCol && numCols.length) {
      const sorted = rows.map(function (r) { return [parseTime(r[timeCol]) / 1000, r]; })
        .filter(function (p) { return !isNaN(p[0]); })
        .sort(function (a, b) { return a[0] - b[0]; });
      chart(chartEl, numCols.join(", ") + " by " + timeCol, sorted.map(function (p) { return p[0]; }),
        numCols.map(function (c) { return { label: c, values: sorted.map(function (p) { return typeof p[1][c] === "number" ? p[1][c] : null; }) }; }), null);
      chartEl.dataset.chart = timeCol;
    }
    loaded("sql");
  }

  async function download(format) {
    const info = document.getElementById("sql-info");
    try {
      const blob = await sql(sqlState.text, format);
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = "gpuwatch-query." + format;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(function () { URL.revokeObjectURL(a.href); }, 10000);
      info.textContent = format + " downloaded (" + blob.size + " bytes)";
    } catch (e) {
      info.textContent = e.message;
    }
  }

  // ---- routing and login ---------------------------------------------------------------

  function destroyCharts() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
  }

  async function route() {
    if (timer) { clearInterval(timer); timer = null; }
    destroyCharts();
    delete main.dataset.loaded;
    const hash = location.hash || "#/fleet";
    const parts = hash.slice(2).split("/");
    const page = parts[0] || "fleet";
    document.querySelectorAll("#nav a").forEach(function (a) {
      a.classList.toggle("active", a.dataset.page === page);
    });
    try {
      if (page === "jobs" && parts.length > 1 && parts[1]) await pageJob(decodeURIComponent(parts.slice(1).join("/")));
      else if (page === "jobs") await pageJobs();
      else if (page === "alerts") await pageAlerts();
      else if (page === "sql") await pageSql();
      else await pageFleet();
    } catch (e) {
      fail(main, e);
    }
  }

  function showLogin(message) {
    if (timer) { clearInterval(timer); timer = null; }
    destroyCharts();
    main.hidden = true;
    main.innerHTML = "";
    document.getElementById("nav").hidden = true;
    document.getElementById("login").hidden = false;
    document.getElementById("login-error").textContent = message || "";
    document.body.dataset.auth = "needed";
  }

  async function start() {
    // One probe tells whether a token is needed (or the stored one is refused).
    let resp;
    try {
      resp = await fetch("/api/v1/sql?q=" + encodeURIComponent("SELECT 1"), { headers: headers() });
    } catch (e) {
      showLogin("cannot reach the server: " + e.message);
      return;
    }
    if (resp.status === 401) {
      showLogin(token() ? "the stored token was refused" : "");
      return;
    }
    document.body.dataset.auth = "ok";
    document.getElementById("login").hidden = true;
    document.getElementById("nav").hidden = false;
    document.getElementById("logout").hidden = !token();
    main.hidden = false;
    await route();
  }

  document.getElementById("login-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    const t = document.getElementById("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    start().catch(function (e) { showLogin(e.message); });
  });
  document.getElementById("logout").addEventListener("click", function () {
    sessionStorage.removeItem(TOKEN_KEY);
    location.hash = "#/fleet";
    start().catch(function (e) { showLogin(e.message); });
  });
  window.addEventListener("hashchange", function () {
    if (document.body.dataset.auth === "ok") route();
  });
  start();
})();
