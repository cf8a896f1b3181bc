//! `gpuwatch-bench dashboards`: every panel query of `dashboards/*.json`, expanded as Grafana's
//! PostgreSQL data source expands it, timed over the Postgres wire protocol against a day of the
//! simulated fleet (the one `query` loads; its data directory is shared and reused).
//!
//! The expansion and the timing are done by `tests/dashboards/grafana_sql.py bench` (psycopg 3,
//! extended protocol, as Grafana's pgx driver): the same expander the end-to-end test
//! `dashboards::every_panel_answers_on_the_demo_fleet` uses, so the benchmark times the very SQL
//! the test checks. This program loads the fleet, waits until it is persisted and rolled up,
//! runs the script and prints the panels slowest first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Args;

use crate::ingest::sql_json;
use crate::peers::{self, Result, Server, free_port};
use crate::query::{self, QueryArgs};
use crate::send;
use crate::{FleetArgs, parse_duration};

/// Flags of `dashboards`.
#[derive(Args, Debug, Clone)]
pub struct DashboardsArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Simulated history to load; it ends when the load starts.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub history: Duration,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// gpuwatch's data directory; shared with `query` (reused when it holds the same fleet).
    #[arg(long, default_value = "/tmp/gpuwatch-bench/query-data")]
    pub data_dir: PathBuf,
    /// Timed runs per panel query (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Python with psycopg 3 (`pip install 'psycopg[binary]'`).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// The expander and timer.
    #[arg(long, default_value = "tests/dashboards/grafana_sql.py")]
    pub script: PathBuf,
    /// Folder of the dashboard JSON files.
    #[arg(long, default_value = "dashboards")]
    pub dashboards: PathBuf,
    /// Dashboard time ranges to time every panel over (ending at the end of the data).
    #[arg(long = "range", default_values_t = vec!["24h".to_string(), "30d".to_string()])]
    pub ranges: Vec<String>,
    /// Longest wait for the load to be persisted and rolled up.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
}

/// One timed panel query, as the script prints it.
#[derive(serde::Deserialize, Debug)]
struct Timing {
    dashboard: String,
    panel: String,
    #[serde(rename = "ref")]
    ref_id: String,
    range: String,
    median_s: f64,
    max_s: f64,
    rows: u64,
    #[serde(default)]
    error: Option<String>,
}

fn start_server(args: &DashboardsArgs, log: PathBuf) -> Result<(Server, u16)> {
    let port = free_port()?;
    let pg = free_port()?;
    let cmd_args: Vec<String> = vec![
        "serve".into(),
        "--http-addr".into(),
        format!("127.0.0.1:{port}"),
        "--otlp-http-addr".into(),
        format!("127.0.0.1:{}", free_port()?),
        "--otlp-grpc-addr".into(),
        format!("127.0.0.1:{}", free_port()?),
        "--pg-addr".into(),
        format!("127.0.0.1:{pg}"),
        "--data-dir".into(),
        args.data_dir.display().to_string(),
        "--persist-interval".into(),
        "30s".into(),
        "--compaction-interval".into(),
        "5s".into(),
        "--log-level".into(),
        "warn".into(),
    ];
    let server = Server::start(
        "gpuwatch",
        &args.gpuwatch,
        &cmd_args,
        format!("http://127.0.0.1:{port}"),
        "/readyz",
        log,
    )?;
    Ok((server, pg))
}

async fn count(server: &Server, sql: &str) -> Result<u64> {
    Ok(sql_json(&send::client()?, &server.url, sql)
        .await?
        .first()
        .and_then(|r| r.get("n"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0))
}

/// `gpuwatch_jobs_ledger_watermark_seconds` of the server's `/metrics`, in ms (0 if absent).
async fn ledger_watermark_ms(server: &Server) -> Result<i64> {
    let text = send::client()?
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?
        .text()
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch_jobs_ledger_watermark_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |s| (s * 1000.0) as i64))
}

/// Runs the benchmark.
pub async fn run(args: DashboardsArgs) -> Result<()> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    if interval_ms <= 0 {
        return Err("--interval must be positive".into());
    }
    if !args.script.is_file() {
        return Err(format!(
            "{}: not found; run from the repository root or pass --script",
            args.script.display()
        ));
    }
    let parent = args
        .data_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let log = parent.join("dashboards-gpuwatch.log");
    let load_args = QueryArgs {
        fleet: args.fleet.clone(),
        history: args.history,
        gpuwatch: args.gpuwatch.clone(),
        gpuwatch_args: Vec::new(),
        data_dir: args.data_dir.clone(),
        runs: args.runs,
        python: args.python.clone(),
        probes: 0,
        settle_timeout: args.settle_timeout,
        query_node: false,
    };
    let earlier = query::earlier_load(&load_args, interval_ms)?;
    let (server, pg_port) = start_server(&args, log.clone())?;
    let version = peers::version_of(&args.gpuwatch, "--version");
    println!(
        "gpuwatch ({version}), pid {}, data in {}",
        server.pid(),
        args.data_dir.display()
    );
    let marker = query::loaded(&load_args, &server, earlier).await?;

    // Persisted, then rolled up: every closed hour of the day in gpu_metrics_1m and _1h.
    let fleet_rows = (marker.hosts * marker.gpus_per_host) as u64 * marker.rounds;
    let deadline = Instant::now() + args.settle_timeout;
    while query::persisted_rows(&server.url).await < fleet_rows {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {fleet_rows} rows persisted after {:?}; see {}",
                query::persisted_rows(&server.url).await,
                args.settle_timeout,
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let end_ms = marker.start_ms + marker.rounds as i64 * marker.interval_ms;
    // Hours that closed at least 10 minutes before now are rolled up by the compactor.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    let closed_hours = ((now_ms - 600_000).div_euclid(3_600_000)
        - marker.start_ms.div_euclid(3_600_000))
    .clamp(0, (end_ms - marker.start_ms).div_euclid(3_600_000)) as u64;
    loop {
        let h = count(
            &server,
            "SELECT count(DISTINCT time) AS n FROM gpu_metrics_1h",
        )
        .await?;
        let m = count(
            &server,
            "SELECT count(DISTINCT date_trunc('hour', time)) AS n FROM gpu_metrics_1m",
        )
        .await?;
        if h >= closed_hours && m >= closed_hours {
            println!("rollups: {h} hours in gpu_metrics_1h, {m} in gpu_metrics_1m");
            break;
        }
        if Instant::now() > deadline {
            println!(
                "note: only {h} (1h) and {m} (1m) of {closed_hours} closed hours rolled up after {:?}",
                args.settle_timeout
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // The jobs view's ledger folds every hour closed 15 minutes ago (gpuwatch's /metrics says
    // how far it has come); panels over `jobs` are timed once it has.
    let folded_ms = (now_ms - 900_000)
        .div_euclid(3_600_000)
        .min(end_ms.div_euclid(3_600_000))
        * 3_600_000;
    loop {
        let w = ledger_watermark_ms(&server).await?;
        if w >= folded_ms {
            println!("jobs ledger: hours folded up to {}", query::iso(w));
            break;
        }
        if Instant::now() > deadline {
            println!(
                "note: the jobs ledger had folded up to {} of {} after {:?}",
                query::iso(w),
                query::iso(folded_ms),
                args.settle_timeout
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    query::wait_idle(&server, Duration::from_secs(120)).await?;

    let to = query::iso(end_ms);
    let dsn = format!("host=127.0.0.1 port={pg_port} user=bench dbname=gpuwatch sslmode=disable");
    let mut cmd = Command::new(&args.python);
    cmd.arg(&args.script)
        .arg("bench")
        .arg("--dsn")
        .arg(&dsn)
        .arg("--dashboards")
        .arg(&args.dashboards)
        .arg("--to")
        .arg(&to)
        .arg("--runs")
        .arg(args.runs.max(1).to_string());
    for r in &args.ranges {
        cmd.arg("--range").arg(r);
    }
    println!(
        "timing every panel over {} ending {to} ({} runs each, median)...",
        args.ranges.join(" and "),
        args.runs.max(1)
    );
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .map_err(|e| format!("script task: {e}"))?
        .map_err(|e| format!("cannot run {}: {e}", args.python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} bench failed: {}",
            args.script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut timings: Vec<Timing> = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("script output is not the expected JSON: {e}"))?;
    timings.sort_by(|a, b| b.median_s.total_cmp(&a.median_s));
    println!(
        "{} panel queries timed in {:.0}s; {} GPUs x {} samples\n",
        timings.len(),
        t.elapsed().as_secs_f64(),
        marker.hosts * marker.gpus_per_host,
        marker.rounds
    );
    println!("| dashboard | panel | ref | range | median (s) | max (s) | rows |");
    println!("| --- | --- | --- | --- | ---: | ---: | ---: |");
    let mut failed = 0;
    for t in &timings {
        if let Some(e) = &t.error {
            failed += 1;
            println!(
                "| {} | {} | {} | {} | error: {e} | | |",
                t.dashboard, t.panel, t.ref_id, t.range
            );
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {} |",
            t.dashboard, t.panel, t.ref_id, t.range, t.median_s, t.max_s, t.rows
        );
    }
    let over = timings
        .iter()
        .filter(|t| t.error.is_none() && t.median_s >= 1.0)
        .count();
    println!("\npanel queries at or over 1 s (median): {over}; failed: {failed}");
    if failed > 0 {
        return Err(format!("{failed} panel queries failed"));
    }
    Ok(())
}
