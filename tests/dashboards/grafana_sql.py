#!/usr/bin/env python3
"""Runs the SQL of gpuwatch's Grafana dashboards (dashboards/*.json) the way Grafana runs it.

Grafana's PostgreSQL data source turns a panel's raw SQL into the statement it sends in two
steps, and this script does both the same way:

1. The browser replaces template variables (public/app/features/templating/template_srv.ts with
   the SQL data sources' interpolateVariable, public/app/features/plugins/sql/datasource/
   SqlDatasource.ts): `$var`, `${var}`, `[[var]]`, `${var:format}` and the built-ins
   `$__interval`, `$__interval_ms`, `$__from`, `$__to`, `$__range_s`, `$__range_ms`.
   A multi-value (or include-All) variable's plain form is each value quoted as a SQL
   literal, joined by commas; a single-value variable's plain form is the value with its
   quotes doubled. "All" without a custom all value means every option of the variable; with
   a custom all value (`allValue`) it is that text, inserted raw whatever the format (`text`,
   `percentencode` and `queryparam` excepted), then searched for variables again (scenes'
   CustomAllValue, and templateSrv's "skip formatting of custom all values" before 11).
   A variable whose query returns no rows (scenes' MultiValueVariable.
   getStateUpdateGivenNewOptions, templateSrv's validateVariableSelectionState before 11):
   with include-All it is All, so its custom all value or the empty list (`${v:sqlstring}`
   is then empty text, and `IN (${v:sqlstring})` a syntax error); multi-value without All,
   the empty list; single-value, the empty string.
   `$__interval` is Grafana's `rangeUtil.calculateInterval(range, maxDataPoints, min interval)`:
   the range over the panel's data points, rounded by `roundInterval`, at least the panel's
   `interval`.
2. The server expands the macros (pkg/tsdb/grafana-postgresql-datasource/macros.go, and
   sqleng's Interpolate for `$__interval`, `$__interval_ms`, `$__unixEpochFrom()`,
   `$__unixEpochTo()`), TimescaleDB off. The fill argument of `$__timeGroup` changes only what
   Grafana does with the answer, never the SQL.

The statements then go over the Postgres wire protocol with psycopg 3 in binary mode with
server-side prepared statements (the extended protocol, as Grafana's pgx driver).

Subcommands:
  selftest FIXTURE      expand every `-- grafana:` query of tests/fixtures/grafana_postgres_macros.sql
                        and compare with the SQL the fixture holds (Grafana's own expansion)
  paths --dsn DSN ...   every panel target with a `gpu_metrics_1d` branch answers over each --range
                        as it does with that branch off (from the hourly rollups alone)
  hours --dsn DSN ...   every panel target that reads the hourly rollups over 2 days answers over
                        each --range (ending on an hour) as it does from the 1-minute rollups
  series --dsn DSN ...  every panel target that draws at most N series draws min(N, all) of them
  recent --dsn DSN ...  every variable that reads a recent window first (the job picker) answers
                        as the same query over the whole range at once
  check --dsn DSN ...   run every variable query and panel target over each --range and check
                        the answers (exit 1 with a list of failures); --first-value RANGE and
                        --empty-each RANGE add runs with each multi-value variable at one value
                        and with each variable's query answering no rows; --no-data for a range
                        without data (answers may be empty, but must come)
  bench --dsn DSN ...   time every variable query and panel target; JSON on stdout (--var
                        NAME=VALUE picks a variable's value, as for check)
  list                  print every panel and variable found (what check runs)
"""

import argparse
import datetime as dt
import json
import math
import os
import re
import statistics
import sys
import time

UTC = dt.timezone.utc

# ---------------------------------------------------------------------------------------------
# Time ranges and intervals


def parse_duration(text):
    """Grafana's duration text (`5m`, `1h`, `30d`, `500ms`, `2w`, `1y`) to seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|M|y)?\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    n = float(m.group(1))
    unit = m.group(2) or "s"
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                "M": 2592000, "y": 31536000}[unit]


def round_interval(ms):
    """Grafana's roundInterval (packages/grafana-data/src/datetime/rangeutil.ts)."""
    table = [
        (10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500),
        (1500, 1000), (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000),
        (25000, 20000), (45000, 30000), (90000, 60000), (210000, 120000), (450000, 300000),
        (1050000, 600000), (1800000, 900000), (3600000, 1200000), (5400000, 1800000),
        (9000000, 3600000), (16200000, 7200000), (108000000, 10800000),
        (172800000, 43200000), (604800000, 86400000), (1814400000, 604800000),
        (3628800000, 2592000000),
    ]
    for limit, value in table:
        if ms < limit:
            return value
    return 31536000000


def seconds_to_hms(seconds):
    """Grafana's secondsToHms: the largest unit only (`1m`, `5m`, `1h`, `1d`, `500ms`)."""
    years = math.floor(seconds / 31536000)
    if years:
        return f"{years}y"
    days = math.floor((seconds % 31536000) / 86400)
    if days:
        return f"{days}d"
    hours = math.floor(((seconds % 31536000) % 86400) / 3600)
    if hours:
        return f"{hours}h"
    minutes = math.floor((((seconds % 31536000) % 86400) % 3600) / 60)
    if minutes:
        return f"{minutes}m"
    secs = math.floor((((seconds % 31536000) % 86400) % 3600) % 60)
    if secs:
        return f"{secs}s"
    ms = math.floor(seconds * 1000)
    if ms:
        return f"{ms}ms"
    return "less than a millisecond"


def calculate_interval(from_s, to_s, max_data_points, min_interval):
    """rangeUtil.calculateInterval: (interval text, interval ms)."""
    low = 1
    if min_interval:
        low = parse_duration(min_interval) * 1000
    ms = round_interval((to_s - from_s) * 1000 / max_data_points)
    if low > ms:
        ms = low
    ms = int(ms)
    return seconds_to_hms(ms / 1000), ms


def rfc3339(t):
    """Go's time.RFC3339Nano of a UTC instant: fractional seconds without trailing zeros."""
    whole = math.floor(t)
    frac = round((t - whole) * 1e9)
    if frac >= 1_000_000_000:
        whole, frac = whole + 1, 0
    base = dt.datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        base += "." + f"{frac:09d}".rstrip("0")
    return base + "Z"


def go_float(x):
    """Go's %v of a float64 (shortest repr, no trailing .0)."""
    s = repr(float(x))
    if s.endswith(".0"):
        s = s[:-2]
    return s


# ---------------------------------------------------------------------------------------------
# Step 1: template variables (the browser)

VARIABLE_RE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def quote_literal(value):
    return "'" + str(value).replace("'", "''") + "'"


def format_value(values, fmt, multi):
    """One variable's text. `values` is a list; `multi` says the variable is multi-value or has
    All (then the SQL data sources quote the plain form)."""
    if fmt in (None, ""):
        if multi or len(values) != 1:
            return ",".join(quote_literal(v) for v in values)
        return str(values[0]).replace("'", "''")
    if fmt == "sqlstring":
        return ",".join(quote_literal(v) for v in values)
    if fmt == "csv":
        return ",".join(str(v) for v in values)
    if fmt == "raw":
        return ",".join(str(v) for v in values)
    if fmt == "singlequote":
        return ",".join("'" + str(v).replace("'", "\\'") + "'" for v in values)
    if fmt == "doublequote":
        return ",".join('"' + str(v).replace('"', '\\"') + '"' for v in values)
    if fmt == "pipe":
        return "|".join(str(v) for v in values)
    raise ValueError(f"variable format {fmt!r} is not handled by this expander")


class CustomAll:
    """The All of a variable with a custom all value: the text, unformatted."""

    def __init__(self, text):
        self.text = text


def replace_variables(sql, variables, builtins, depth=0):
    """`variables`: name -> (list of values, multi) or (CustomAll, multi). `builtins`: name ->
    text."""

    def sub(m):
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name in builtins:
            return builtins[name]
        if name in variables:
            values, multi = variables[name]
            if isinstance(values, CustomAll):
                if fmt == "text":
                    return "All"
                if fmt in ("percentencode", "queryparam"):
                    raise ValueError(f"format {fmt!r} of a custom all value is not handled")
                if depth > 5:
                    raise ValueError(f"custom all value of {name} refers to itself")
                return replace_variables(values.text, variables, builtins, depth + 1)
            return format_value(values, fmt, multi)
        # Unknown names (the macros: $__timeFilter, ...) stay for the server.
        return m.group(0)

    return VARIABLE_RE.sub(sub, sql)


# ---------------------------------------------------------------------------------------------
# Step 2: macros (the server)

MACRO_RE = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")


def expand_macros(sql, from_s, to_s, interval_text, interval_ms):
    # sqleng.Interpolate runs first.
    sql = sql.replace("$__interval_ms", str(interval_ms))
    sql = sql.replace("$__interval", interval_text)
    sql = sql.replace("$__unixEpochFrom()", str(math.floor(from_s)))
    sql = sql.replace("$__unixEpochTo()", str(math.floor(to_s)))
    f, t = rfc3339(from_s), rfc3339(to_s)

    def args_of(text):
        return [a.strip() for a in text.split(",")] if text.strip() else []

    def group_seconds(args, name):
        if len(args) < 2:
            raise ValueError(f"macro {name} needs time column and interval")
        return parse_duration(args[1].strip("'\""))

    def sub(m):
        name, args = m.group(1), args_of(m.group(2))
        # macros.go: "$__timeGroup" directly followed by a comma is the pre-5.3 spelling of
        # "$__timeGroupAlias" (used in the SELECT list); it gets the alias too.
        if name == "__timeGroup" and m.string[m.end():m.end() + 1] == ",":
            name = "__timeGroupAlias"
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{f}' AND '{t}'"
        if name == "__timeFrom":
            return f"'{f}'"
        if name == "__timeTo":
            return f"'{t}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            s = go_float(group_seconds(args, name))
            out = f"floor(extract(epoch from {args[0]})/{s})*{s}"
            return out + (' AS "time"' if name == "__timeGroupAlias" else "")
        if name == "__unixEpochFilter":
            return f"{args[0]} >= {math.floor(from_s)} AND {args[0]} <= {math.floor(to_s)}"
        if name == "__unixEpochNanoFilter":
            return f"{args[0]} >= {int(from_s * 1e9)} AND {args[0]} <= {int(to_s * 1e9)}"
        if name == "__unixEpochNanoFrom":
            return str(int(from_s * 1e9))
        if name == "__unixEpochNanoTo":
            return str(int(to_s * 1e9))
        if name in ("__unixEpochGroup", "__unixEpochGroupAlias"):
            s = go_float(group_seconds(args, name))
            out = f"floor(({args[0]})/{s})*{s}"
            return out + (' AS "time"' if name == "__unixEpochGroupAlias" else "")
        if name.startswith("__"):
            raise ValueError(f"macro ${name} is not one Grafana's PostgreSQL data source has")
        return m.group(0)

    return MACRO_RE.sub(sub, sql)


def expand(sql, from_s, to_s, variables, max_data_points=1000, min_interval=None):
    interval_text, interval_ms = calculate_interval(from_s, to_s, max_data_points, min_interval)
    builtins = {
        "__interval": interval_text,
        "__interval_ms": str(interval_ms),
        "__from": str(int(from_s * 1000)),
        "__to": str(int(to_s * 1000)),
        "__range_s": str(int(to_s - from_s)),
        "__range_ms": str(int((to_s - from_s) * 1000)),
    }
    return expand_macros(replace_variables(sql, variables, builtins), from_s, to_s,
                         interval_text, interval_ms)


# ---------------------------------------------------------------------------------------------
# Dashboards


def load_dashboards(folder):
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                out.append((name, json.load(f)))
    if not out:
        raise SystemExit(f"no dashboard JSON in {folder}")
    return out


def panels_of(dashboard):
    """Every panel, rows' nested panels included (collapsed rows keep theirs in `panels`)."""
    for p in dashboard.get("panels", []):
        yield p
        for inner in p.get("panels", []) or []:
            yield inner


def query_variables(dashboard):
    return [v for v in dashboard.get("templating", {}).get("list", []) if v.get("type") == "query"]


def variable_sql(v):
    q = v.get("query")
    if isinstance(q, dict):
        q = q.get("rawSql") or q.get("query")
    return q


# ---------------------------------------------------------------------------------------------
# Running

TIMESTAMP_OIDS = {1114, 1184}
NUMERIC_OIDS = {20, 21, 23, 700, 701, 1700}
TEXT_OIDS = {25, 1043, 19, 18}

TIME_PANELS = {"timeseries", "heatmap", "state-timeline", "status-history"}
VALUE_PANELS = {"stat", "gauge", "bargauge", "piechart"}


def connect(dsn):
    import psycopg  # noqa: imported here so that selftest runs without it

    return psycopg.connect(dsn, autocommit=True)


def run_sql(conn, sql):
    """Extended protocol, binary results, server-side prepared (as pgx)."""
    cur = conn.cursor(binary=True)
    cur.execute(sql, prepare=True)
    cols = [(d.name, d.type_code) for d in cur.description or []]
    rows = cur.fetchall() if cur.description else []
    return cols, rows


def grafana_value(v, opts, pinned=None, first=False):
    """The value Grafana gives variable `v` whose query returned `opts`, as (values, multi):
    the picker's default (All when the variable has it, else the first option), `pinned` when
    the user picked it, the first option alone with `first` (a multi-value variable set to one
    value instead of All), and Grafana's rules for no options (module docs)."""
    multi = bool(v.get("multi") or v.get("includeAll"))
    include_all = bool(v.get("includeAll"))
    custom = v.get("allValue") or None
    if pinned is not None:
        return [pinned], multi
    if not opts:
        if include_all:
            return (CustomAll(custom) if custom else []), True
        return ([] if v.get("multi") else [""]), multi
    if first and multi:
        return opts[:1], True
    if include_all:
        return (CustomAll(custom) if custom else opts), True
    return opts[:1], multi


def resolve_variables(conn, dashboard, from_s, to_s, errors, where, pinned=None, empty=None,
                      first=False, need_options=True):
    """Runs each query variable in order (a later one may use an earlier one) and gives each
    the value Grafana would (`grafana_value`). `empty` names a variable whose query is taken to
    return no rows (it is not run). Returns (name -> (values, multi), and (name, sql, columns,
    rows) of each variable query that ran)."""
    values = {}
    ran = []
    for v in query_variables(dashboard):
        name = v["name"]
        if name == empty:
            values[name] = grafana_value(v, [])
            continue
        sql = variable_sql(v)
        try:
            text = expand(sql, from_s, to_s, values)
            cols, rows = run_sql(conn, text)
        except Exception as e:  # noqa: reported, not raised
            errors.append(f"{where}: variable {name}: {type(e).__name__}: {e}")
            values[name] = grafana_value(v, [])
            continue
        if not cols:
            errors.append(f"{where}: variable {name}: no columns")
        names = [c[0] for c in cols]
        if "__value" in names:
            opts = [r[names.index("__value")] for r in rows]
        else:
            opts = [r[0] for r in rows]
        opts = [str(o) for o in opts if o is not None]
        if not opts and need_options:
            errors.append(f"{where}: variable {name}: no options on this fleet")
        pin = (pinned or {}).get(name)
        if pin is not None and pin not in opts:
            # A value chosen in the picker: it must be one of the options.
            errors.append(f"{where}: variable {name}: {pin!r} is not among its options")
        values[name] = grafana_value(v, opts, pin, first)
        ran.append((name, text, cols, rows))
    return values, ran


def check_answer(panel, target, cols, rows):
    """What the panel needs from the answer; returns a list of problems."""
    problems = []
    ptype = panel.get("type")
    fmt = target.get("format", "time_series")
    if not cols:
        return ["no columns"]
    if fmt == "time_series" or ptype in TIME_PANELS:
        name, oid = cols[0]
        if name != "time":
            problems.append(f"first column is {name!r}, not 'time'")
        if oid not in TIMESTAMP_OIDS:
            problems.append(f"first column has type oid {oid}, not a timestamp")
        values = [c for c in cols[1:] if c[1] in NUMERIC_OIDS]
        if not values:
            problems.append("no numeric value column")
        for c in cols[1:]:
            if c[1] not in NUMERIC_OIDS and c[1] not in TEXT_OIDS:
                problems.append(f"column {c[0]!r} is neither a number nor a label (oid {c[1]})")
        times = [r[0] for r in rows]
        if any(a > b for a, b in zip(times, times[1:])):
            problems.append("rows are not sorted by time")
    if ptype in VALUE_PANELS:
        if not [c for c in cols if c[1] in NUMERIC_OIDS]:
            problems.append("no numeric column for the value")
    if ptype == "barchart":
        if not [c for c in cols if c[1] in NUMERIC_OIDS]:
            problems.append("no numeric column for the bars")
    if not rows:
        problems.append("no rows")
    elif ptype in VALUE_PANELS and all(
            r[i] is None for r in rows for i, c in enumerate(cols) if c[1] in NUMERIC_OIDS):
        problems.append("every value is null")
    return problems


def targets_of(panel):
    return [t for t in panel.get("targets", []) or [] if t.get("rawSql")]


def parse_range(text, to_s):
    return to_s - parse_duration(text), to_s


def run_panels(conn, fname, dash, values, from_s, to_s, where, errors, need_rows):
    """Runs every panel target of `dash` with the variables' `values`; returns (queries run,
    panels seen). With `need_rows` false an answer may have no rows (or only nulls), but its
    columns must still be what the panel needs."""
    ran = 0
    panels = 0
    for p in panels_of(dash):
        if p.get("type") == "row":
            continue
        panels += 1
        targets = targets_of(p)
        if not targets:
            errors.append(f"{where}: panel {p.get('title')!r} has no SQL target")
            continue
        for t in targets:
            label = f"{where} panel {p.get('title')!r} {t.get('refId')}"
            try:
                sql = expand(t["rawSql"], from_s, to_s, values,
                             p.get("maxDataPoints") or 1000, p.get("interval"))
                cols, rows = run_sql(conn, sql)
            except Exception as e:  # noqa: reported
                errors.append(f"{label}: {type(e).__name__}: {e}")
                continue
            ran += 1
            problems = check_answer(p, t, cols, rows)
            if not need_rows:
                problems = [x for x in problems if x not in ("no rows", "every value is null")]
            if problems:
                errors.append(f"{label}: " + "; ".join(problems))
            else:
                print(f"ok   {label}: {len(rows)} rows, columns "
                      + ", ".join(f"{c[0]}:{c[1]}" for c in cols))
    return ran, panels


def cmd_check(args):
    """Every variable query and panel target over each --range: no error, the columns each panel
    needs, and rows (unless --no-data). --first-value RANGE also runs them with every multi-value
    variable set to its first option instead of All; --empty-each RANGE once per query variable,
    with that variable's query taken to return no rows (as Grafana then sets it)."""
    to_s = parse_time(args.to) if args.to else time.time()
    pinned = dict(v.split("=", 1) for v in (args.var or []))
    need_rows = not args.no_data
    conn = connect(args.dsn)
    errors = []
    ran = 0
    seen_panels = 0
    for fname, dash in load_dashboards(args.dashboards):
        scenarios = [(rng, rng, {}) for rng in args.range]
        for rng in args.first_value or []:
            scenarios.append((rng, f"{rng}, first values", {"first": True}))
        for rng in args.empty_each or []:
            for v in query_variables(dash):
                scenarios.append((rng, f"{rng}, {v['name']} empty", {"empty": v["name"]}))
        for rng, tag, how in scenarios:
            from_s, _ = parse_range(rng, to_s)
            where = f"{fname} [{tag}]"
            # A scenario with an empty variable may leave the variables after it without
            # options and the panels without rows, and one user or model picked may have no
            # rows in a panel: what is checked there is that every query answers, with the
            # columns its panel needs.
            full = need_rows and not how
            values, vars_ran = resolve_variables(
                conn, dash, from_s, to_s, errors, where,
                None if how else pinned, how.get("empty"), how.get("first", False),
                need_options=full)
            for name, text, cols, rows in vars_ran:
                ran += 1
                print(f"ok   {where} variable {name}: {len(rows)} options")
            n, panels = run_panels(conn, fname, dash, values, from_s, to_s, where, errors, full)
            ran += n
            if tag == args.range[0]:
                seen_panels += panels
    print(f"{ran} queries run, {seen_panels} panels, {len(errors)} failures")
    for e in errors:
        print(f"FAIL {e}")
    return 1 if errors else 0


def cmd_bench(args):
    to_s = parse_time(args.to)
    pinned = dict(v.split("=", 1) for v in (args.var or []))
    conn = connect(args.dsn)
    out = []

    def timed(sql):
        run_sql(conn, sql)
        times = []
        rows = 0
        for _ in range(args.runs):
            t = time.perf_counter()
            _, r = run_sql(conn, sql)
            times.append(time.perf_counter() - t)
            rows = len(r)
        return statistics.median(times), max(times), rows

    for fname, dash in load_dashboards(args.dashboards):
        title = dash.get("title", fname)
        for rng in args.range:
            from_s, _ = parse_range(rng, to_s)
            errors = []
            values, vars_ran = resolve_variables(conn, dash, from_s, to_s, errors, fname, pinned)
            for name, text, cols, rows in vars_ran:
                med, mx, n = timed(text)
                out.append({"dashboard": title, "panel": f"variable {name}", "ref": "-",
                            "range": rng, "median_s": med, "max_s": mx, "rows": n})
            for e in errors:
                out.append({"dashboard": title, "panel": "variables", "ref": "-", "range": rng,
                            "median_s": 0, "max_s": 0, "rows": 0, "error": e})
            for p in panels_of(dash):
                for t in targets_of(p):
                    entry = {"dashboard": title, "panel": p.get("title"), "ref": t.get("refId"),
                             "range": rng, "median_s": 0.0, "max_s": 0.0, "rows": 0}
                    try:
                        sql = expand(t["rawSql"], from_s, to_s, values,
                                     p.get("maxDataPoints") or 1000, p.get("interval"))
                        entry["median_s"], entry["max_s"], entry["rows"] = timed(sql)
                    except Exception as e:  # noqa: reported
                        entry["error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
                    out.append(entry)
                    print(f"{entry['median_s']:.3f}s {title} / {p.get('title')} [{rng}]",
                          file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)
    return 0


# The range length (seconds) above which a panel reads whole days from `gpu_metrics_1d`, as
# the dashboards write it.
DAILY_FROM = "2764800"


def hours_only(sql):
    """`sql` with the daily branches off (the daily rows and the hourly rows of the range's
    first and last days) and the hourly branch of shorter ranges reading every hour instead;
    the buckets stay as they are."""
    out = sql.replace(f"> {DAILY_FROM} AND time", "> 99999999999 AND time")
    out = out.replace(f"<= {DAILY_FROM} AND", "<= 99999999999 AND")
    if out == sql:
        raise ValueError("no daily or hourly branch condition written as expected")
    return out


def same_rows(a, b, tol=1e-9, at_least=False):
    """Two answers equal row by row; numbers within `tol`, relative (with `at_least`, each
    number of `a` at least its number in `b`)."""
    if len(a) != len(b):
        return f"{len(a)} rows vs {len(b)}"
    for i, (ra, rb) in enumerate(zip(a, b)):
        for x, y in zip(ra, rb):
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) \
                    and not isinstance(x, bool):
                slack = tol * max(1.0, abs(x), abs(y))
                if (x < y - slack) if at_least else abs(x - y) > slack:
                    return f"row {i}: {ra} vs {rb}"
            elif x != y:
                return f"row {i}: {ra} vs {rb}"
    return None


def samples_covered(conn, sql, tables):
    """The samples the rollup branches of `sql` over `tables` (a pattern) read: `samples`
    summed over each branch's WHERE clause (the rest of its FROM line)."""
    parts = [f"(SELECT coalesce(sum(samples), 0) FROM {t} WHERE {w})"
             for t, w in re.findall(rf"FROM ({tables}) WHERE (.*)", sql)]
    if not parts:
        raise ValueError("no rollup branch")
    _, rows = run_sql(conn, "SELECT " + " + ".join(parts))
    return rows[0][0]


def same_samples(conn, sql, other, tables):
    """The rollup branches over `tables` of `sql` and of `other` (its alternative form) cover
    the same samples: none missed, none counted twice (a mean hides either)."""
    split, alone = samples_covered(conn, sql, tables), samples_covered(conn, other, tables)
    if split != alone or not alone:
        return f"the branches cover {split} samples, the other form's {alone}"
    return None


def targets_with(args, conn, errors, pattern):
    """Each panel target whose SQL matches `pattern`, over each --range ending at --to (now by
    default): (where, match, expanded SQL)."""
    to_s = parse_time(args.to) if args.to else time.time()
    for fname, dash in load_dashboards(args.dashboards):
        for rng in args.range:
            from_s, _ = parse_range(rng, to_s)
            values, _ = resolve_variables(conn, dash, from_s, to_s, errors, fname,
                                          dict(v.split("=", 1) for v in (args.var or [])))
            for p in panels_of(dash):
                for t in targets_of(p):
                    m = re.search(pattern, t.get("rawSql", ""))
                    if m:
                        yield (f"{fname} / {p.get('title')} [{rng}]", m,
                               expand(t["rawSql"], from_s, to_s, values,
                                      p.get("maxDataPoints") or 1000, p.get("interval")))


def report(errors, ran, what):
    print(f"{ran} panel queries {what}, {len(errors)} failures")
    for e in errors:
        print(f"FAIL {e}")
    return 1 if errors or ran == 0 else 0


def compare_forms(args, pattern, other_form, tables, other_name):
    """Each panel target whose SQL matches `pattern` answers as `other_form(sql)` does (to 1e-9),
    over each --range, and the rollup branches over `tables` of both cover the same samples;
    each must answer with rows."""
    conn = connect(args.dsn)
    errors = []
    compared = 0
    for where, _, sql in targets_with(args, conn, errors, pattern):
        try:
            other = other_form(sql)
            _, got = run_sql(conn, sql)
            _, want = run_sql(conn, other)
            why = same_samples(conn, sql, other, tables)
        except Exception as e:  # noqa: reported
            errors.append(f"{where}: {type(e).__name__}: {e}")
            continue
        compared += 1
        if why:
            errors.append(f"{where}: {why}")
        # A counter's growth per bucket (energy) from coarser rows also counts what it grew
        # between one finer row's last sample and the next one's first, which the finer rows
        # miss: there the coarser answer is at least the finer one.
        at_least = "max(energy_joules_max) - min(energy_joules_min)" in sql
        why = "no rows" if not got else same_rows(got, want, at_least=at_least)
        if why:
            errors.append(f"{where}: answers differ from the {other_name}: {why}")
    return report(errors, compared, "compared")


def cmd_paths(args):
    """Every panel target that reads the daily rollups answers as it does from the hourly ones
    alone, over each --range."""
    return compare_forms(args, "gpu_metrics_1d", hours_only, "gpu_metrics_1[hd]",
                         "hourly rollups alone")


# The range length (seconds) above which the Fleet and Health panels read the hourly rollups
# instead of the 1-minute ones (in buckets of at least an hour), as the dashboards write it.
HOURLY_FROM = "172800"

# The range's first minute, which the 1-minute branch leaves to raw samples.
FIRST_MINUTE = re.compile(r"(date_trunc\('minute', CAST\('[^']*' AS TIMESTAMP\)\)) "
                          r"\+ INTERVAL '1 minute'")


def minutes_only(sql):
    """`sql` (expanded) with the hourly branch of ranges over HOURLY_FROM off and the 1-minute
    branch reading them instead, the range's first minute from the 1-minute rollups too (raw
    samples may be gone there); the buckets stay as they are."""
    out = sql.replace(f"> {HOURLY_FROM} AND (", "> 99999999999 AND (")
    out = out.replace(f"<= {HOURLY_FROM}", "<= 99999999999")
    out = FIRST_MINUTE.sub(r"\1", out)
    if out == sql:
        raise ValueError("no hourly or 1-minute branch condition written as expected")
    return out


def cmd_hours(args):
    """Every panel target that reads the hourly rollups over HOURLY_FROM answers as it does from
    the 1-minute ones, over each --range (ending on an hour: the hourly rows start on one)."""
    return compare_forms(args, re.escape(f"> {HOURLY_FROM} AND ($__unixEpochTo()"), minutes_only,
                         "gpu_metrics_1[mh]", "1-minute rollups")


def cmd_series(args):
    """Every panel target that draws at most N series (its ranking subquery ends
    `NULLS LAST, metric LIMIT N)`, `..., 1 LIMIT N)` or, ranking GPUs by host and index,
    `..., host || '/' || CAST(gpu_index AS VARCHAR) LIMIT N )`) draws min(N, all) of them over
    each --range: the same query without the limit counts all."""
    conn = connect(args.dsn)
    errors = []
    checked = 0
    ranked = r"NULLS LAST, (?:metric|1|host \|\| '/' \|\| CAST\(gpu_index AS VARCHAR\)) LIMIT (\d+)\s*\)"
    for where, m, sql in targets_with(args, conn, errors, ranked):
        unlimited = sql.replace(m.group(0), re.sub(r"LIMIT \d+", "LIMIT 1000000000", m.group(0)))
        try:
            shown = {r[1] for r in run_sql(conn, sql)[1]}
            every = {r[1] for r in run_sql(conn, unlimited)[1]}
        except Exception as e:  # noqa: reported
            errors.append(f"{where}: {type(e).__name__}: {e}")
            continue
        checked += 1
        want = min(int(m.group(1)), len(every))
        print(f"{where}: {len(shown)} of {len(every)} series")
        if len(shown) != want or not shown <= every:
            errors.append(f"{where}: {len(shown)} series drawn, want {want}")
    return report(errors, checked, "checked")


# A variable that reads the last days of the range first and the rest only when they hold fewer
# rows than its limit: `- INTERVAL '7 days'` bounds the window, `n < N` tests it, `LIMIT N`.
RECENT_WINDOW = "INTERVAL '7 days'"


def cmd_recent(args):
    """Each variable that reads a recent window first answers as the same query over the whole
    range at once (the window widened to it), with its own limit and with a limit of 20: on a
    small fleet the first reads the rest of the range, the second the window alone. Prints how
    many rows the window alone gives."""
    conn = connect(args.dsn)
    errors = []
    checked = 0
    to_s = parse_time(args.to) if args.to else time.time()
    for fname, dash in load_dashboards(args.dashboards):
        for rng in args.range:
            from_s, _ = parse_range(rng, to_s)
            values, _ = resolve_variables(conn, dash, from_s, to_s, errors, fname)
            for v in query_variables(dash):
                sql = variable_sql(v) or ""
                m = re.search(r"\bn < (\d+)\b", sql)
                if RECENT_WINDOW not in sql or not m:
                    continue
                for limit in (m.group(1), "20"):
                    q = sql.replace(m.group(0), f"n < {limit}").replace(
                        f"LIMIT {m.group(1)}", f"LIMIT {limit}")
                    whole = q.replace(RECENT_WINDOW, "INTERVAL '100000 days'")
                    window = q.replace(f"n < {limit}", "n < 0")
                    where = f"{fname} / variable {v['name']} [{rng}] limit {limit}"
                    try:
                        got, want, alone = (run_sql(conn, expand(x, from_s, to_s, values))[1]
                                            for x in (q, whole, window))
                    except Exception as e:  # noqa: reported
                        errors.append(f"{where}: {type(e).__name__}: {e}")
                        continue
                    checked += 1
                    print(f"{where}: {len(got)} rows, {len(alone)} from the window alone")
                    if got != want or not got:
                        errors.append(f"{where}: {len(got)} rows, over the whole range at once "
                                      f"{len(want)}, or in another order")
    return report(errors, checked, "checked")


def cmd_list(args):
    for fname, dash in load_dashboards(args.dashboards):
        for v in query_variables(dash):
            print(f"{fname}\tvariable\t{v['name']}")
        for p in panels_of(dash):
            if p.get("type") != "row":
                print(f"{fname}\tpanel\t{p.get('type')}\t{p.get('title')}\t{len(targets_of(p))}")
    return 0


def cmd_selftest(args):
    """Each fixture case: its `-- grafana:` text, expanded here, must equal the SQL Grafana sent."""
    text = open(args.fixture).read()
    cases = []
    cur = None
    for line in text.splitlines():
        if line.startswith("-- case: "):
            cur = {"name": line[9:].strip(), "grafana": None, "expect": None, "sql": []}
        elif cur is not None and line.startswith("-- grafana: "):
            cur["grafana"] = line[12:]
        elif cur is not None and line.startswith("-- expect: "):
            cur["expect"] = line[11:].split()
        elif line.strip() == ";" and cur is not None:
            cases.append(cur)
            cur = None
        elif line.startswith("--"):
            continue
        elif cur is not None:
            cur["sql"].append(line)
    failures = 0
    for c in cases:
        if not c["grafana"]:
            print(f"FAIL {c['name']}: no -- grafana: line")
            failures += 1
            continue
        # The fixture's range: the FROM and TO of its expectation.
        from_s, to_s = float(c["expect"][1]), float(c["expect"][2])
        got = expand(c["grafana"], from_s, to_s, {})
        want = "\n".join(c["sql"]).strip()
        if got.strip() != want:
            print(f"FAIL {c['name']}:\n  got  {got}\n  want {want}")
            failures += 1
        else:
            print(f"ok   {c['name']}")
    # Variables and intervals: Grafana's documented behaviour.
    checks = [
        (replace_variables("h IN (${h:sqlstring})", {"h": (["a", "b'c"], True)}, {}),
         "h IN ('a','b''c')"),
        (replace_variables("h IN ($h)", {"h": (["a", "b"], True)}, {}), "h IN ('a','b')"),
        (replace_variables("j = '$j'", {"j": (["x'y"], False)}, {}), "j = 'x''y'"),
        (replace_variables("[[j]] ${j} ${j:csv}", {"j": (["1", "2"], True)}, {}),
         "'1','2' '1','2' 1,2"),
        (replace_variables("$__timeFilter(time)", {}, {}), "$__timeFilter(time)"),
        # No options: include-All gives All, so the custom all value or nothing at all.
        (replace_variables("h IN (${h:sqlstring})",
                           {"h": grafana_value({"multi": True, "includeAll": True}, [])}, {}),
         "h IN ()"),
        (replace_variables("h IN (${h:sqlstring}) ${h:text}", {"h": grafana_value(
            {"multi": True, "includeAll": True, "allValue": "'*'"}, [])}, {}), "h IN ('*') All"),
        (replace_variables("${h:sqlstring}|${j:sqlstring}|'$j'", {
            "h": grafana_value({"multi": True}, []), "j": grafana_value({}, [])}, {}), "|''|''"),
        # A custom all value is raw, and searched for variables again.
        (replace_variables("x IN ($h)", {
            "h": grafana_value({"includeAll": True, "allValue": "SELECT '$j'"}, ["a", "b"]),
            "j": (["q'"], False)}, {}), "x IN (SELECT 'q''')"),
        (replace_variables("x IN ($h)", {"h": grafana_value({"includeAll": True}, ["a", "b"])},
                           {}), "x IN ('a','b')"),
        (replace_variables("x IN ($h)", {"h": grafana_value(
            {"multi": True, "includeAll": True}, ["a", "b"], first=True)}, {}), "x IN ('a')"),
        (calculate_interval(0, 86400, 1000, None), ("1m", 60000)),
        (calculate_interval(0, 3600, 1000, None), ("5s", 5000)),
        (calculate_interval(0, 30 * 86400, 1000, None), ("20m", 1200000)),
        (calculate_interval(0, 3600, 1000, "1m"), ("1m", 60000)),
        (expand("$__timeGroupAlias(time, $__interval, 0)", 0, 86400, {}),
         'floor(extract(epoch from time)/60)*60 AS "time"'),
        (expand("$__unixEpochFilter(t) $__unixEpochFrom() $__interval_ms", 10.5, 20.5, {}),
         "t >= 10 AND t <= 20 10 10"),
    ]
    for got, want in checks:
        if got != want:
            print(f"FAIL expected {want!r}, got {got!r}")
            failures += 1
    print(f"{len(cases)} fixture cases, {len(checks)} variable and interval checks, {failures} failures")
    return 1 if failures or len(cases) < 10 else 0


def parse_time(text):
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("selftest")
    s.add_argument("fixture")
    for name in ("check", "bench", "paths", "hours", "series", "recent"):
        s = sub.add_parser(name)
        s.add_argument("--dsn", required=True)
        s.add_argument("--dashboards", default="dashboards")
        s.add_argument("--to", help="end of the range (ISO 8601 or unix seconds; default now)")
        s.add_argument("--range", action="append", default=None,
                       help="range length ending at --to (repeatable), e.g. 1h, 24h, 30d")
        s.add_argument("--var", action="append",
                       help="NAME=VALUE: pick VALUE for variable NAME, as in the picker (repeatable)")
        if name == "check":
            s.add_argument("--first-value", action="append",
                           help="range to run again with each multi-value variable at its first option")
            s.add_argument("--empty-each", action="append",
                           help="range to run again once per query variable, that variable's query empty")
            s.add_argument("--no-data", action="store_true",
                           help="the range holds no data: answers may be empty, variables without options")
        elif name == "bench":
            s.add_argument("--runs", type=int, default=3)
    s = sub.add_parser("list")
    s.add_argument("--dashboards", default="dashboards")
    args = ap.parse_args()
    if getattr(args, "range", None) is None and args.cmd in ("check", "bench", "paths", "hours",
                                                             "series", "recent"):
        args.range = ["6h"]
    return {"selftest": cmd_selftest, "check": cmd_check, "bench": cmd_bench,
            "paths": cmd_paths, "hours": cmd_hours, "series": cmd_series, "recent": cmd_recent,
            "list": cmd_list}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
