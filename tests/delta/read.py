"""Reads gpuwatch's Delta tables with three other engines and prints what each sees, as JSON.

    python tests/delta/read.py ROOT [TABLE ...]

ROOT is a data directory (local tables under ROOT/tables/) or s3://bucket/prefix, with the
server's AWS_* variables set for an S3 endpoint other than AWS. For every table it prints, per
reader, the row count, the number of distinct rows by the table's key, the sum of `time` in
whole microseconds, and for gpu_metrics the sum of power_watts and the rows per GPU:

- "deltalake": delta-rs (the `deltalake` package) reads the table into Arrow;
- "polars": `polars.read_delta`;
- "duckdb": DuckDB's `delta_scan` (the `delta` extension, from the `duckdb-ext-delta` package,
  and `httpfs` from `duckdb-ext-httpfs` for S3), pinned to the DuckDB release they are built for.

The e2e tests (tests/e2e/delta.rs) compare these with gpuwatch's own SQL answers. `.ci/run`
installs the readers in target/delta-venv.
"""

import json
import os
import site
import sys

import deltalake
import duckdb
import polars as pl

TABLES = ["gpu_metrics", "gpu_metrics_1m", "gpu_metrics_1h", "metrics", "gpu_processes", "gpu_events", "alerts"]
KEYS = {
    "gpu_metrics": ["host", "gpu_uuid", "time"],
    "gpu_metrics_1m": ["host", "gpu_uuid", "time"],
    "gpu_metrics_1h": ["host", "gpu_uuid", "time"],
    "metrics": ["metric", "time", "value"],
    "gpu_processes": ["host", "gpu_uuid", "pid", "time"],
    "gpu_events": ["host", "gpu_uuid", "kind", "code", "time"],
    "alerts": ["fingerprint", "state", "time"],
}


def s3_options():
    env = os.environ
    opts = {}
    for k in ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"]:
        if k in env:
            opts[k] = env[k]
    return opts


def figures(df, name):
    """The figures of table `name`, from a polars DataFrame."""
    out = {"rows": df.height}
    if df.height == 0:
        out.update({"distinct": 0, "time_us": 0})
        return out
    out["distinct"] = df.select(KEYS[name]).unique().height
    out["time_us"] = int(df.select(pl.col("time").dt.epoch("us").cast(pl.Int64).sum()).item())
    if name == "gpu_metrics":
        out["power_watts"] = round(float(df.select(pl.col("power_watts").sum()).item() or 0.0), 3)
        per_gpu = df.group_by("gpu_uuid").len()
        out["per_gpu"] = {r[0]: r[1] for r in per_gpu.iter_rows()}
    return out


def duckdb_connection(root):
    ext = None
    for sp in site.getsitepackages():
        p = os.path.join(sp, "duckdb_ext", "extensions")
        if os.path.isdir(p):
            ext = p
    if ext is None:
        raise SystemExit("the duckdb-ext-delta package is not installed: run bash .ci/run")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET extension_directory = '{ext}'")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("LOAD delta")
    if root.startswith("s3://"):
        con.execute("LOAD httpfs")
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        use_ssl = not endpoint.startswith("http://")
        host = endpoint.split("://", 1)[-1]
        con.execute(
            "CREATE SECRET gpuwatch (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL ?)",
            [os.environ.get("AWS_ACCESS_KEY_ID", ""), os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
             os.environ.get("AWS_REGION", "us-east-1"), host, use_ssl],
        )
    return con


def main():
    root = sys.argv[1].rstrip("/")
    tables = sys.argv[2:] or TABLES
    remote = root.startswith("s3://")
    opts = s3_options() if remote else None
    con = duckdb_connection(root)
    out = {"deltalake": {}, "polars": {}, "duckdb": {}, "versions": {
        "deltalake": deltalake.__version__, "polars": pl.__version__, "duckdb": duckdb.__version__}}
    for t in tables:
        path = f"{root}/tables/{t}"
        dt = deltalake.DeltaTable(path, storage_options=opts)
        arrow = dt.to_pyarrow_table()
        out["deltalake"][t] = figures(pl.from_arrow(arrow), t)
        out["deltalake"][t]["version"] = dt.version()
        out["polars"][t] = figures(pl.read_delta(path, storage_options=opts), t)
        duck = con.execute(f"SELECT * FROM delta_scan('{path}')").pl()
        out["duckdb"][t] = figures(duck, t)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
