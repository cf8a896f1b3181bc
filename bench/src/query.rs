//! `gpuwatch-bench query`: a day of the simulated fleet loaded into gpuwatch, three queries
//! timed through its SQL API and with DuckDB over the same Parquet files, then ingest-to-query
//! freshness.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use tokio::sync::mpsc;

use crate::fleet::{FIELDS, Fleet, FleetConfig};
use crate::ingest::sql_json;
use crate::peers::{self, Result, Server};
use crate::remote_write::{host_request, probe_request};
use crate::send;
use crate::{FleetArgs, parse_duration};

/// Flags of `query`.
#[derive(Args, Debug, Clone)]
pub(crate) struct QueryArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Simulated history to load; it ends when the load starts.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub history: Duration,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// Extra argument for `gpuwatch serve` (repeatable).
    #[arg(long = "gpuwatch-arg", allow_hyphen_values = true)]
    pub gpuwatch_args: Vec<String>,
    /// gpuwatch's data directory. A directory loaded by an earlier run with the same fleet
    /// flags is reused as it is (its `bench-load.json` says what it holds).
    #[arg(long, default_value = "/tmp/gpuwatch-bench/query-data")]
    pub data_dir: PathBuf,
    /// Timed runs per query and engine (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Python with `duckdb` installed (`pip install duckdb pyarrow`).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Freshness probes: writes of a unique value, each polled for through SQL.
    #[arg(long, default_value_t = 20)]
    pub probes: usize,
    /// Longest wait for the load to be persisted.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
    /// Time the queries on a second server started with `--role query` (and the same
    /// `--gpuwatch-arg`s, e.g. `--object-store`) once the load is persisted, instead of on the
    /// server that took the load. DuckDB is left out when the files are in an object store.
    #[arg(long)]
    pub query_node: bool,
}

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
pub(crate) struct LoadMarker {
    pub(crate) hosts: usize,
    pub(crate) gpus_per_host: usize,
    pub(crate) interval_ms: i64,
    pub(crate) seed: u64,
    pub(crate) start_ms: i64,
    pub(crate) rounds: u64,
    pub(crate) samples: u64,
    pub(crate) load_seconds: f64,
}

pub(crate) const MARKER: &str = "bench-load.json";

impl LoadMarker {
    /// Whether this records a load of `fleet` over `history` (wherever it started).
    pub(crate) fn is_load_of(&self, fleet: &crate::FleetArgs, history: Duration) -> bool {
        let interval_ms = fleet.interval.as_millis() as i64;
        self.hosts == fleet.hosts
            && self.gpus_per_host == fleet.gpus_per_host
            && self.interval_ms == interval_ms
            && self.seed == fleet.seed
            && self.rounds == (history.as_millis() as i64 / interval_ms.max(1)).max(1) as u64
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

fn start_server(args: &QueryArgs, log: PathBuf) -> Result<Server> {
    peers::GpuwatchCmd::new(&args.data_dir)?
        .args(peers::FAST_PERSIST)
        .args(&args.gpuwatch_args)
        .start("gpuwatch", &args.gpuwatch, log)
}

/// Rows of `gpu_metrics` in the server's data files.
pub(crate) async fn persisted_rows(url: &str) -> u64 {
    crate::ingest::table_files(url)
        .await
        .map(|files| {
            files
                .iter()
                .filter(|f| f.table_name == "gpu_metrics")
                .map(|f| f.rows)
                .sum()
        })
        .unwrap_or(0)
}

/// What an earlier run loaded into `args.data_dir`, when it is this fleet over this history;
/// otherwise the directory is cleared for a new load.
pub(crate) fn earlier_load(args: &QueryArgs) -> Result<Option<LoadMarker>> {
    let existing: Option<LoadMarker> = std::fs::read_to_string(args.data_dir.join(MARKER))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let reusable = existing
        .as_ref()
        .is_some_and(|m| m.is_load_of(&args.fleet, args.history));
    if !reusable && args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)
            .map_err(|e| format!("{}: {e}", args.data_dir.display()))?;
    }
    Ok(existing.filter(|_| reusable))
}

/// The fleet's data on `server`: `earlier` (see [`earlier_load`]), or loaded now and marked
/// for the next run.
pub(crate) async fn loaded(
    args: &QueryArgs,
    server: &Server,
    earlier: Option<LoadMarker>,
) -> Result<LoadMarker> {
    if let Some(m) = earlier {
        println!(
            "reusing the data loaded earlier ({} samples, loaded in {:.0}s)",
            m.samples, m.load_seconds
        );
        return Ok(m);
    }
    let m = load(args, server).await?;
    let text = serde_json::to_string_pretty(&m).map_err(|e| e.to_string())?;
    let marker_path = args.data_dir.join(MARKER);
    std::fs::write(&marker_path, text).map_err(|e| format!("{}: {e}", marker_path.display()))?;
    Ok(m)
}

/// Loads the history through remote write, generating while sending.
pub(crate) async fn load(args: &QueryArgs, server: &Server) -> Result<LoadMarker> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    let rounds = (args.history.as_millis() as i64 / interval_ms).max(1) as u64;
    let end_ms = now_ms().div_euclid(interval_ms) * interval_ms;
    let start_ms = end_ms - rounds as i64 * interval_ms;
    let fleet_args = args.fleet.clone();
    let (tx, rx) = mpsc::channel(4 * args.fleet.concurrency.max(1));
    let generator = std::thread::spawn(move || {
        let mut fleet = Fleet::new(FleetConfig {
            hosts: fleet_args.hosts,
            gpus_per_host: fleet_args.gpus_per_host,
            interval_ms,
            start_ms,
            seed: fleet_args.seed,
            job_hosts: 0,
        });
        let per = fleet_args.rounds_per_request.max(1);
        let mut first = 0;
        while first < rounds {
            let n = per.min(rounds - first);
            for h in 0..fleet.hosts() {
                let body = Arc::new(host_request(&mut fleet, h, first, n));
                if tx.blocking_send(body).is_err() {
                    return;
                }
            }
            first += n;
        }
    });
    println!(
        "loading {} GPUs x {rounds} samples x {} series ({} rows) through remote write...",
        args.fleet.hosts * args.fleet.gpus_per_host,
        FIELDS.len(),
        (args.fleet.hosts * args.fleet.gpus_per_host) as u64 * rounds
    );
    let t = Instant::now();
    let stats = send::send_stream(
        &send::client()?,
        &format!("{}/api/v1/write", server.url),
        rx,
        args.fleet.concurrency,
    )
    .await?;
    generator
        .join()
        .map_err(|_| "the generator thread panicked".to_string())?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "loaded {} samples in {secs:.1}s ({:.0} samples/s wall, generation included; {} retries)",
        stats.samples,
        stats.samples as f64 / secs,
        stats.retries
    );
    Ok(LoadMarker {
        hosts: args.fleet.hosts,
        gpus_per_host: args.fleet.gpus_per_host,
        interval_ms,
        seed: args.fleet.seed,
        start_ms,
        rounds,
        samples: stats.samples,
        load_seconds: secs,
    })
}

/// The three queries, for gpuwatch (DataFusion) and DuckDB. `{T}` is the reference time (the end
/// of the loaded data) as a timestamp, `{T_NS}` as ns since the epoch, `{AGO:<interval>}` (DuckDB)
/// the reference time minus an interval as a `TIMESTAMPTZ` constant: the files' column is
/// microseconds (Delta's `timestamp`), and DuckDB prunes row groups with a constant of its type.
struct Query {
    name: &'static str,
    gpuwatch: &'static str,
    duckdb: &'static str,
}

const QUERIES: &[Query] = &[
    Query {
        name: "idle-GPU rule (deploy/rules/idle.yaml)",
        gpuwatch: "WITH w AS (
  SELECT host, gpu_uuid, gpu_index, job_id,
    max(job_user) AS job_user, max(job_name) AS job_name,
    min(time) AS job_first, max(time) AS last_sample,
    max(CASE WHEN gpu_utilization >= 0.01 OR memory_utilization >= 0.05 THEN time END) AS last_busy
  FROM gpu_metrics
  WHERE time > {T} - interval '3 hours' AND job_id IS NOT NULL
  GROUP BY host, gpu_uuid, gpu_index, job_id
)
SELECT host, gpu_uuid, CAST(gpu_index AS VARCHAR) AS gpu_index, job_id, job_user, job_name,
  CASE WHEN coalesce(last_busy, job_first) < {T} - interval '2 hours'
    THEN 'critical' ELSE 'warning' END AS severity,
  round(CAST({T_NS} - CAST(coalesce(last_busy, job_first) AS BIGINT) AS DOUBLE) / 6e10) AS value
FROM w
WHERE last_sample > {T} - interval '2 minutes'
  AND job_first < {T} - interval '5 minutes'
  AND coalesce(last_busy, job_first) < {T} - interval '30 minutes'
ORDER BY host, gpu_uuid",
        duckdb: "WITH w AS (
  SELECT host, gpu_uuid, gpu_index, job_id,
    max(job_user) AS job_user, max(job_name) AS job_name,
    min(time) AS job_first, max(time) AS last_sample,
    max(CASE WHEN gpu_utilization >= 0.01 OR memory_utilization >= 0.05 THEN time END) AS last_busy
  FROM gpu_metrics
  WHERE time > {AGO:3 hours} AND job_id IS NOT NULL
  GROUP BY host, gpu_uuid, gpu_index, job_id
)
SELECT host, gpu_uuid, CAST(gpu_index AS VARCHAR) AS gpu_index, job_id, job_user, job_name,
  CASE WHEN coalesce(last_busy, job_first) < {AGO:2 hours}
    THEN 'critical' ELSE 'warning' END AS severity,
  round(CAST({T_NS} - epoch_ns(coalesce(last_busy, job_first)) AS DOUBLE) / 6e10) AS value
FROM w
WHERE last_sample > {AGO:2 minutes}
  AND job_first < {AGO:5 minutes}
  AND coalesce(last_busy, job_first) < {AGO:30 minutes}
ORDER BY host, gpu_uuid",
    },
    Query {
        name: "GPU-hours per job, 24 h",
        gpuwatch: "WITH spans AS (
  SELECT job_id, host, gpu_uuid,
    (CAST(max(time) AS BIGINT) - CAST(min(time) AS BIGINT)) / 3.6e12 AS gpu_hours
  FROM gpu_metrics
  WHERE time > {T} - INTERVAL '24 hours' AND job_id IS NOT NULL
  GROUP BY job_id, host, gpu_uuid
)
SELECT job_id, round(sum(gpu_hours), 3) AS gpu_hours, count(*) AS gpus
FROM spans GROUP BY job_id ORDER BY gpu_hours DESC, job_id",
        duckdb: "WITH spans AS (
  SELECT job_id, host, gpu_uuid,
    (epoch_ns(max(time)) - epoch_ns(min(time))) / 3.6e12 AS gpu_hours
  FROM gpu_metrics
  WHERE time > {AGO:24 hours} AND job_id IS NOT NULL
  GROUP BY job_id, host, gpu_uuid
)
SELECT job_id, round(sum(gpu_hours), 3) AS gpu_hours, count(*) AS gpus
FROM spans GROUP BY job_id ORDER BY gpu_hours DESC, job_id",
    },
    Query {
        name: "dashboard: 5-min avg utilisation per host, 24 h",
        gpuwatch: "SELECT date_bin(INTERVAL '5 minutes', time) AS bucket, host, avg(gpu_utilization) AS utilization
FROM gpu_metrics WHERE time > {T} - INTERVAL '24 hours'
GROUP BY 1, host ORDER BY 1, host",
        duckdb: "SELECT time_bucket(INTERVAL '5 minutes', CAST(time AS TIMESTAMPTZ)) AS bucket, host, avg(gpu_utilization) AS utilization
FROM gpu_metrics WHERE time > {AGO:24 hours}
GROUP BY 1, host ORDER BY 1, host",
    },
];

pub(crate) fn iso(ms: i64) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86400);
    let sod = secs.rem_euclid(86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60,
        ms.rem_euclid(1000)
    )
}

/// Replaces each `{AGO:<interval>}` with `CAST(<t> - INTERVAL '<interval>' AS TIMESTAMPTZ)`.
fn duck_ago(sql: &str, t: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(i) = rest.find("{AGO:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 5..];
        let Some(j) = after.find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        out.push_str(&format!(
            "CAST({t} - INTERVAL '{}' AS TIMESTAMPTZ)",
            &after[..j]
        ));
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

const DUCKDB_SCRIPT: &str = r#"
import json, sys, time
import duckdb
runs, given = int(sys.argv[1]), json.loads(sys.stdin.read())
files, queries = given["files"], given["queries"]
con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
con.execute("CREATE VIEW gpu_metrics AS SELECT * FROM read_parquet(%s)" % json.dumps(files).replace('"', "'"))
out = {"version": duckdb.__version__, "files": len(files), "threads": con.execute("SELECT current_setting('threads')").fetchall()[0][0], "results": []}
for q in queries:
    rows = con.sql(q).to_arrow_table()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        rows = con.sql(q).to_arrow_table()
        times.append(time.perf_counter() - t)
    out["results"].append({"times": times, "rows": rows.num_rows})
print(json.dumps(out))
"#;

#[derive(serde::Deserialize)]
struct DuckResult {
    times: Vec<f64>,
    rows: usize,
}

#[derive(serde::Deserialize)]
struct DuckOut {
    version: String,
    files: usize,
    threads: serde_json::Value,
    results: Vec<DuckResult>,
}

fn run_duckdb(args: &QueryArgs, files: &[String], queries: &[String]) -> Result<DuckOut> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(&args.python)
        .arg("-c")
        .arg(DUCKDB_SCRIPT)
        .arg(args.runs.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", args.python.display()))?;
    let input = serde_json::json!({ "files": files, "queries": queries }).to_string();
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("duckdb script stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("duckdb script: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the DuckDB script failed ({}): {}; install it with `pip install duckdb pyarrow`",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("duckdb script output: {e}"))
}

/// Runs the benchmark.
pub(crate) async fn run(args: QueryArgs) -> Result<()> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    if interval_ms <= 0 {
        return Err("--interval must be positive".into());
    }
    let parent = peers::parent_dir(&args.data_dir)?;
    let log = parent.join("query-gpuwatch.log");
    let earlier = earlier_load(&args)?;
    let mut server = start_server(&args, log.clone())?;
    let version = peers::version_of(&args.gpuwatch, "--version");
    println!(
        "gpuwatch ({version}), pid {}, data in {}",
        server.pid(),
        args.data_dir.display()
    );
    let marker = loaded(&args, &server, earlier).await?;
    let rows = wait_persisted(&args, &server, &marker, &log).await?;
    // Let compaction of the closed hours finish so that both engines read the same files, and
    // wait until the server is idle (its start replays the WAL, persists and compacts): queries
    // timed while it works in the background would measure that work too.
    tokio::time::sleep(Duration::from_secs(12)).await;
    wait_idle(&server, Duration::from_secs(120)).await?;
    let query_node = if args.query_node {
        Some(start_query_node(&args, &parent, rows).await?)
    } else {
        None
    };
    let timed: &Server = query_node.as_ref().unwrap_or(&server);
    let files: Vec<crate::ingest::TableFile> = crate::ingest::table_files(&timed.url)
        .await?
        .into_iter()
        .filter(|f| f.table_name == "gpu_metrics")
        .collect();
    let parquet_bytes: u64 = files.iter().map(|f| f.bytes).sum();
    println!(
        "{} rows in {} gpu_metrics Parquet files, {:.1} MB",
        files.iter().map(|f| f.rows).sum::<u64>(),
        files.len(),
        parquet_bytes as f64 / 1e6
    );
    let (gw_queries, duck_queries) = queries_at(&marker);
    let gw_results = time_gpuwatch(&timed.url, &gw_queries, args.runs).await?;
    if files.iter().any(|f| f.location.contains("://")) {
        print_gpuwatch_only(args.query_node, &gw_results);
    } else {
        compare_with_duckdb(&args, &files, &duck_queries, &gw_results).await?;
    }
    if let Some(mut q) = query_node {
        q.stop();
    }

    freshness(&args, &server).await?;
    server.stop();
    Ok(())
}

/// Waits until every row is in Parquet (DuckDB reads only the files): the fleet's, and the
/// freshness probes of earlier runs, which the server replays from its WAL at its start.
/// Returns how many rows that is.
async fn wait_persisted(
    args: &QueryArgs,
    server: &Server,
    marker: &LoadMarker,
    log: &Path,
) -> Result<u64> {
    let fleet_rows = (marker.hosts * marker.gpus_per_host) as u64 * marker.rounds;
    let held = sql_json(
        &send::client()?,
        &server.url,
        "SELECT count(*) AS n FROM gpu_metrics",
    )
    .await?
    .first()
    .and_then(|r| r.get("n"))
    .and_then(serde_json::Value::as_u64)
    .unwrap_or(0);
    let rows = fleet_rows.max(held);
    let deadline = Instant::now() + args.settle_timeout;
    while persisted_rows(&server.url).await < rows {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {rows} rows persisted after {:?}; see {}",
                persisted_rows(&server.url).await,
                args.settle_timeout,
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(rows)
}

/// The queries of both engines at the reference time: the end of the data, so every run sees
/// the same rows.
fn queries_at(marker: &LoadMarker) -> (Vec<String>, Vec<String>) {
    let t_ms = marker.start_ms + marker.rounds as i64 * marker.interval_ms;
    let t_iso = iso(t_ms);
    let t_ns = (t_ms as i128 * 1_000_000).to_string();
    let gw_t = format!("arrow_cast('{t_iso}', 'Timestamp(Nanosecond, Some(\"UTC\"))')");
    let duck_t = format!(
        "TIMESTAMPTZ '{}'",
        t_iso.replace('T', " ").replace('Z', "+00")
    );
    let gw_queries = QUERIES
        .iter()
        .map(|q| q.gpuwatch.replace("{T_NS}", &t_ns).replace("{T}", &gw_t))
        .collect();
    let duck_queries = QUERIES
        .iter()
        .map(|q| duck_ago(&q.duckdb.replace("{T_NS}", &t_ns), &duck_t))
        .collect();
    (gw_queries, duck_queries)
}

/// Each query once to warm up, then `runs` timed runs: the median seconds and the rows.
async fn time_gpuwatch(url: &str, queries: &[String], runs: usize) -> Result<Vec<(f64, usize)>> {
    // One client for every query: its connection stays open between them.
    let client = send::client()?;
    let mut results = Vec::new();
    for (q, sql) in QUERIES.iter().zip(queries) {
        let warm = sql_json(&client, url, sql).await?;
        let mut times = Vec::new();
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            let r = sql_json(&client, url, sql).await?;
            times.push(t.elapsed().as_secs_f64());
            if r.len() != warm.len() {
                return Err(format!("{}: {} rows then {}", q.name, warm.len(), r.len()));
            }
        }
        results.push((median(&mut times), warm.len()));
    }
    Ok(results)
}

/// gpuwatch's times alone, when its files are in an object store DuckDB is not given.
fn print_gpuwatch_only(query_node: bool, gw_results: &[(f64, usize)]) {
    println!(
        "\n{} (files in an object store; DuckDB is compared on local disk only)",
        if query_node { "query node" } else { "gpuwatch" }
    );
    println!("\n| query | gpuwatch median (s) | rows |");
    println!("| --- | ---: | ---: |");
    for (q, (gw, gw_rows)) in QUERIES.iter().zip(gw_results) {
        println!("| {} | {gw:.3} | {gw_rows} |", q.name);
    }
}

/// Times the same queries with DuckDB over the same files and prints both side by side.
async fn compare_with_duckdb(
    args: &QueryArgs,
    files: &[crate::ingest::TableFile],
    duck_queries: &[String],
    gw_results: &[(f64, usize)],
) -> Result<()> {
    let duck_files: Vec<String> = files.iter().map(|f| f.location.clone()).collect();
    let duck = tokio::task::spawn_blocking({
        let args = args.clone();
        let duck_queries = duck_queries.to_vec();
        move || run_duckdb(&args, &duck_files, &duck_queries)
    })
    .await
    .map_err(|e| format!("duckdb task: {e}"))??;
    println!(
        "DuckDB {} ({} threads) over the same {} files",
        duck.version, duck.threads, duck.files
    );
    println!(
        "\n| query | gpuwatch median (s) | DuckDB median (s) | gpuwatch/DuckDB | rows (gpuwatch / DuckDB) |"
    );
    println!("| --- | ---: | ---: | ---: | --- |");
    for ((q, (gw, gw_rows)), d) in QUERIES.iter().zip(gw_results).zip(&duck.results) {
        let mut dt = d.times.clone();
        let dm = median(&mut dt);
        println!(
            "| {} | {gw:.3} | {dm:.3} | {:.2}x | {gw_rows} / {} |",
            q.name,
            gw / dm,
            d.rows
        );
        if *gw_rows != d.rows {
            println!(
                "warning: the engines disagree on the row count of {}",
                q.name
            );
        }
    }
    Ok(())
}

/// Starts `gpuwatch serve --role query` beside the loaded server, on its data directory and
/// with the same extra arguments (so it reads the same tables, local or in an object store; a
/// query node writes nothing there), and waits until it sees all `rows`.
async fn start_query_node(args: &QueryArgs, parent: &Path, rows: u64) -> Result<Server> {
    let node = peers::GpuwatchCmd::new(&args.data_dir)?
        .args(["--role", "query"])
        .args(&args.gpuwatch_args)
        .start(
            "gpuwatch (query node)",
            &args.gpuwatch,
            parent.join("query-node.log"),
        )?;
    let deadline = Instant::now() + args.settle_timeout;
    while persisted_rows(&node.url).await < rows {
        if Instant::now() > deadline {
            return Err("the query node did not see every row".into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "query node (--role query) pid {}, sees every row",
        node.pid()
    );
    Ok(node)
}

/// Writes `probes` samples with unique values and polls SQL until each appears.
async fn freshness(args: &QueryArgs, server: &Server) -> Result<()> {
    let client = send::client()?;
    let write_url = format!("{}/api/v1/write", server.url);
    let retries = AtomicU64::new(0);
    let uuid = "GPU-fe5f0000-0000-0000-0000-000000000001";
    let mut visible = Vec::new();
    let mut acked = Vec::new();
    for i in 0..args.probes {
        let value = 100.0 + i as f64 + (now_ms() % 1000) as f64 / 1000.0;
        let t_ms = now_ms();
        let body = probe_request("freshness-probe", uuid, t_ms, value);
        let since = iso(t_ms - 60_000);
        let sql = format!(
            "SELECT count(*) AS n FROM gpu_metrics WHERE time > arrow_cast('{since}', 'Timestamp(Nanosecond, Some(\"UTC\"))') \
             AND gpu_uuid = '{uuid}' AND power_watts = {value}"
        );
        let t = Instant::now();
        send::post(&client, &write_url, body, &retries).await?;
        acked.push(t.elapsed().as_secs_f64());
        loop {
            let r = sql_json(&client, &server.url, &sql).await?;
            let n = r
                .first()
                .and_then(|row| row.get("n"))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            if n > 0 {
                visible.push(t.elapsed().as_secs_f64());
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(format!("probe {i} not visible after 30s"));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    visible.sort_by(|a, b| a.total_cmp(b));
    acked.sort_by(|a, b| a.total_cmp(b));
    let ms = |x: f64| x * 1000.0;
    println!(
        "\nfreshness over {} probes (write sent → first query that sees it, including the write): min {:.1} ms, median {:.1} ms, p90 {:.1} ms, max {:.1} ms (target < 1000 ms); write acknowledged after median {:.1} ms",
        visible.len(),
        ms(percentile(&visible, 0.0)),
        ms(percentile(&visible, 0.5)),
        ms(percentile(&visible, 0.9)),
        ms(percentile(&visible, 1.0)),
        ms(percentile(&acked, 0.5)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duckdb_constants_are_microsecond_timestamps() {
        assert_eq!(
            duck_ago("a > {AGO:3 hours} AND b", "T"),
            "a > CAST(T - INTERVAL '3 hours' AS TIMESTAMPTZ) AND b"
        );
        assert_eq!(duck_ago("no marker", "T"), "no marker");
    }

    #[test]
    fn iso_formats_utc() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_795_331_484_576), "2026-11-22T07:11:24.576Z");
    }
}

/// Waits until `server` uses under 2% of a core over two seconds (at most `timeout`).
pub(crate) async fn wait_idle(server: &Server, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut before = server.cpu_seconds()?;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = server.cpu_seconds()?;
        if now - before < 0.04 {
            return Ok(());
        }
        if Instant::now() > deadline {
            println!(
                "note: the server was still busy ({:.0}% of a core) after {timeout:?}",
                (now - before) / 2.0 * 100.0
            );
            return Ok(());
        }
        before = now;
    }
}
