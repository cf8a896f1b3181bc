//! `gpuwatch-bench history`: a fleet's long history as a real data directory, then the real
//! server started on it and the questions whose cost should depend on what is asked, not on how
//! much is kept, timed: start to ready, the `jobs` view over the whole history, the jobs list of
//! the last 30 days (the API and `gpuwatch jobs --since 30d`), a month's statement, the report
//! of the history's oldest job, the console's fleet page, `count(*)` over the hourly rollups
//! and over the ledger, every dashboard panel over each `--range`, and the server's peak RSS.
//!
//! The data directory ([`build`]) is reused when its `bench-history.json` says it holds the same
//! shape of fleet and history.

mod build;
mod rows;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::parse_duration;
use crate::peers::{self, GpuwatchCmd, Result, Server};

/// Flags of `history`.
#[derive(Args, Debug, Clone)]
pub(crate) struct HistoryArgs {
    /// Hosts.
    #[arg(long, default_value_t = 128)]
    pub hosts: usize,
    /// GPUs per host.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_host: usize,
    /// Days of history: hourly rollups and the job ledger.
    #[arg(long, default_value_t = 30)]
    pub days: u64,
    /// The last this many days also have 1-minute rollups.
    #[arg(long, default_value_t = 30)]
    pub minute_days: u64,
    /// The last this many hours are raw samples (rolled up and folded as any server does).
    #[arg(long, default_value_t = 24)]
    pub raw_hours: u64,
    /// Interval of the raw samples.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub raw_interval: Duration,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// The data directory, reused when it holds the same shape (its `bench-history.json`).
    #[arg(long, default_value = "/tmp/gpuwatch-bench/history-data")]
    pub data_dir: PathBuf,
    /// Timed runs per question (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[command(flatten)]
    pub panels: crate::dashboards::PanelArgs,
    /// Dashboard time ranges every panel is timed over, ending now (none: `--range ''`).
    #[arg(long = "range", default_values_t = ["1h", "24h", "30d", "365d"].map(String::from))]
    pub ranges: Vec<String>,
    /// The server's `--query-timeout`: a question or panel slower than this is reported as
    /// timed out.
    #[arg(long, default_value = "30s")]
    pub query_timeout: String,
    /// Longest wait for the server to fold the raw hours into the ledger and write the jobs'
    /// totals.
    #[arg(long, default_value = "20m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
    /// Build (or bring up to date) the data directory and stop: no server, no timings.
    #[arg(long)]
    pub build_only: bool,
}

impl HistoryArgs {
    /// What makes two data directories the same.
    fn shape(&self) -> String {
        format!(
            "hosts={} gpus_per_host={} days={} minute_days={} raw_hours={} raw_interval={:?} seed={}",
            self.hosts,
            self.gpus_per_host,
            self.days,
            self.minute_days,
            self.raw_hours,
            self.raw_interval,
            self.seed
        )
    }
}

/// `bench-history.json`: what a built data directory holds.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Marker {
    shape: String,
    end_hour_ns: i64,
    /// A job of the history's first hour.
    old_job: String,
    built_s: f64,
}

fn marker_path(data_dir: &Path) -> PathBuf {
    data_dir.join("bench-history.json")
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// The data directory: reused, or built afresh.
fn data(args: &HistoryArgs) -> Result<Marker> {
    let path = marker_path(&args.data_dir);
    if let Some(m) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Marker>(&b).ok())
        .filter(|m| m.shape == args.shape())
    {
        println!(
            "data: reusing {} (built in {:.0} s)",
            args.data_dir.display(),
            m.built_s
        );
        build::daily_rollups(args)?;
        return Ok(m);
    }
    if args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)
            .map_err(|e| format!("{}: {e}", args.data_dir.display()))?;
    }
    peers::parent_dir(&args.data_dir)?;
    let end_hour = now_ns().div_euclid(3_600_000_000_000) * 3_600_000_000_000;
    let marker = build::build(args, end_hour)?;
    let text = serde_json::to_vec_pretty(&marker).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("data: built in {:.0} s", marker.built_s);
    Ok(marker)
}

/// One question: its name and how it is asked.
enum Ask {
    Sql(String),
    Get(String),
    /// The gpuwatch binary with these arguments and `--server`.
    Cli(Vec<String>),
}

/// The console's fleet page query, as `console/assets/app.js` declares it (string literals
/// joined by `+`).
fn console_fleet_sql() -> Result<String> {
    const APP: &str = include_str!("../../console/assets/app.js");
    let missing = || "console/assets/app.js declares no FLEET_SQL".to_string();
    let rest = &APP[APP.find("const FLEET_SQL =").ok_or_else(missing)?..];
    let declared = &rest[..rest.find(";\n").ok_or_else(missing)?];
    Ok(declared.split('"').skip(1).step_by(2).collect())
}

async fn ask(client: &reqwest::Client, server: &Server, a: &Ask, bin: &Path) -> Result<usize> {
    if let Ask::Cli(args) = a {
        let out = tokio::task::block_in_place(|| {
            std::process::Command::new(bin)
                .args(args)
                .args(["--server", &server.url])
                .output()
        })
        .map_err(|e| format!("{}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        return Ok(out.stdout.len());
    }
    let resp = match a {
        Ask::Sql(sql) => {
            client
                .post(format!("{}/api/v1/sql", server.url))
                .header("content-type", "application/json")
                .body(serde_json::json!({ "sql": sql, "format": "json" }).to_string())
                .send()
                .await
        }
        Ask::Get(path) => client.get(format!("{}{path}", server.url)).send().await,
        Ask::Cli(_) => unreachable!("asked above"),
    }
    .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("answer: {e}"))?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    Ok(body.len())
}

/// Median and largest of `runs` timed answers after one warm-up, in seconds, and the answer's
/// size.
async fn time(
    client: &reqwest::Client,
    server: &Server,
    a: &Ask,
    (runs, bin): (usize, &Path),
) -> Result<(f64, f64, usize)> {
    let bytes = ask(client, server, a, bin).await?;
    let mut took = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        ask(client, server, a, bin).await?;
        took.push(t.elapsed().as_secs_f64());
    }
    took.sort_by(f64::total_cmp);
    Ok((took[took.len() / 2], took[took.len() - 1], bytes))
}

/// The server's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The month (`YYYY-MM`) a statement is timed for: the one before the history's end when the
/// history covers it whole, else the month the history ends in.
fn statement_month(end_hour_ns: i64, days: u64) -> String {
    let end = chrono::DateTime::from_timestamp_nanos(end_hour_ns).date_naive();
    let start = end - chrono::Days::new(days);
    let first = end.with_day0(0).unwrap_or(end);
    let before = first.pred_opt().unwrap_or(first);
    let previous = before.with_day0(0).unwrap_or(before);
    if start <= previous {
        before.format("%Y-%m").to_string()
    } else {
        end.format("%Y-%m").to_string()
    }
}

use chrono::Datelike;

/// Waits until the ledger has folded every closed raw hour and written the totals of every
/// day before yesterday; returns how long it took.
async fn settle(server: &Server, limit: Duration) -> Result<f64> {
    let began = Instant::now();
    let want = (now_ns() - 15 * 60_000_000_000).div_euclid(3_600_000_000_000) * 3_600;
    // A day's totals are written once the day after it is folded.
    let day = 86_400;
    let totals_want = (want.div_euclid(day) - 1) * day;
    loop {
        let (_, text) = peers::blocking_get(&format!("{}/metrics", server.url))?;
        let gauge = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0) as i64
        };
        let w = gauge("gpuwatch_jobs_ledger_watermark_seconds");
        let totals = gauge("gpuwatch_jobs_ledger_totals_end_seconds");
        if w >= want && totals >= totals_want {
            return Ok(began.elapsed().as_secs_f64());
        }
        if began.elapsed() > limit {
            return Err(format!(
                "the ledger folded up to {w} s of {want} s and wrote totals up to {totals} s of {totals_want} s in {limit:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The questions timed, asked of a history ending at `marker`'s hour; `month` is the
/// statement's.
fn questions(marker: &Marker, month: &str) -> Result<Vec<(&'static str, Ask)>> {
    Ok(vec![
        (
            "jobs view, every job's cost",
            Ask::Sql("SELECT job_id, sum(cost_usd) AS usd FROM jobs GROUP BY job_id".into()),
        ),
        (
            "jobs list, last 24 hours",
            Ask::Get("/api/v1/jobs?since=24h&limit=1000".into()),
        ),
        (
            "jobs list, last 30 days",
            Ask::Get("/api/v1/jobs?since=30d&limit=1000".into()),
        ),
        (
            "gpuwatch jobs --since 30d",
            Ask::Cli(vec!["jobs".into(), "--since".into(), "30d".into()]),
        ),
        ("console fleet page", Ask::Sql(console_fleet_sql()?)),
        (
            "statement by account, one month",
            Ask::Get(format!("/api/v1/cost?by=account&month={month}&format=json")),
        ),
        (
            "job report, the oldest job",
            Ask::Get(format!("/api/v1/jobs/{}", marker.old_job)),
        ),
        (
            "count(*) of gpu_metrics_1h",
            Ask::Sql("SELECT count(*) AS n FROM gpu_metrics_1h".into()),
        ),
        (
            "count(*) of job_ledger",
            Ask::Sql("SELECT count(*) AS n FROM job_ledger".into()),
        ),
        (
            "the last hour of raw samples, per GPU",
            Ask::Sql(format!(
                "SELECT host, gpu_uuid, max(time) AS t, avg(gpu_utilization) AS u FROM gpu_metrics \
                 WHERE time >= to_timestamp_nanos({}) GROUP BY host, gpu_uuid",
                marker.end_hour_ns - 3_600_000_000_000
            )),
        ),
    ])
}

/// The job the Job dashboard is timed on: the one with the most raw samples in the history's
/// last hour (read from the samples: the `jobs` view is one of the questions timed).
async fn recent_job(client: &reqwest::Client, server: &Server, end_hour_ns: i64) -> Result<String> {
    let sql = format!(
        "SELECT job_id, count(*) AS n FROM gpu_metrics WHERE time >= to_timestamp_nanos({}) \
         AND job_id IS NOT NULL GROUP BY job_id ORDER BY n DESC, job_id LIMIT 1",
        end_hour_ns - 3_600_000_000_000
    );
    let rows = crate::ingest::sql_json(client, &server.url, &sql).await?;
    rows.first()
        .and_then(|r| r.get("job_id"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "no job in the history's last hour".into())
}

/// Every panel over every `--range`, ending now; printed slowest first.
async fn time_panels(
    args: &HistoryArgs,
    client: &reqwest::Client,
    server: &Server,
    pg: u16,
    marker: &Marker,
) -> Result<()> {
    let ranges: Vec<String> = args
        .ranges
        .iter()
        .filter(|r| !r.is_empty())
        .cloned()
        .collect();
    if ranges.is_empty() {
        return Ok(());
    }
    let job = recent_job(client, server, marker.end_hour_ns).await?;
    let to = crate::query::iso(now_ns() / 1_000_000);
    println!(
        "\nevery panel over {} ending {to}, the Job dashboard on job {job}:",
        ranges.join(", ")
    );
    let panels = crate::dashboards::Panels {
        at: &args.panels,
        runs: args.runs,
        ranges: &ranges,
    };
    let mut timings = tokio::task::block_in_place(|| panels.time(pg, &to, &job))?;
    let (failed, _) = crate::dashboards::print_timings(&mut timings);
    if !failed.is_empty() {
        return Err(format!("panel queries failed: {}", failed.join(", ")));
    }
    Ok(())
}

pub(crate) async fn run(args: HistoryArgs) -> Result<()> {
    let marker = tokio::task::block_in_place(|| data(&args))?;
    if args.build_only {
        return Ok(());
    }
    let parent = peers::parent_dir(&args.data_dir)?;
    let config = parent.join("history-gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[cost]\ndefault_gpu_hour_usd = {}\nkwh_usd = 0.12\n",
            build::GPU_HOUR_USD
        ),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let cmd = GpuwatchCmd::new(&args.data_dir)?.args([
        "--config",
        &config.display().to_string(),
        "--query-timeout",
        &args.query_timeout,
    ]);
    let started = Instant::now();
    let mut server = cmd.start(
        "gpuwatch",
        &args.gpuwatch,
        parent.join("history-gpuwatch.log"),
    )?;
    let ready_s = started.elapsed().as_secs_f64();
    let fold_s = settle(&server, args.settle_timeout).await?;
    let month = statement_month(marker.end_hour_ns, args.days);
    let questions = questions(&marker, &month)?;
    let client = crate::send::client()?;
    println!(
        "history: {} GPUs, {} days (1-minute rollups {} days, raw {} h); month {month}",
        args.hosts * args.gpus_per_host,
        args.days,
        args.minute_days,
        args.raw_hours
    );
    println!(
        "start to ready: {ready_s:.2} s; raw hours folded and jobs' totals written by the ledger after {fold_s:.1} s"
    );
    println!(
        "{:<40} {:>10} {:>10} {:>12}",
        "question", "median_s", "max_s", "bytes"
    );
    for (name, a) in &questions {
        match time(&client, &server, a, (args.runs, &args.gpuwatch)).await {
            Ok((median, max, bytes)) => {
                println!("{name:<40} {median:>10.3} {max:>10.3} {bytes:>12}")
            }
            Err(e) => println!("{name:<40} error: {e}"),
        }
    }
    let panels = time_panels(&args, &client, &server, cmd.pg, &marker).await;
    if let Some(rss) = peak_rss(server.pid()) {
        println!("peak RSS: {:.0} MiB", rss as f64 / 1_048_576.0);
    }
    server.terminate(Duration::from_secs(60))?;
    panels
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_console_fleet_query_is_read_from_the_console() {
        let sql = super::console_fleet_sql().expect("declared");
        assert!(sql.starts_with("SELECT host, gpu_uuid,"), "{sql}");
        assert!(sql.ends_with("GROUP BY host, gpu_uuid"), "{sql}");
        assert!(!sql.contains('"') && !sql.contains(" + "), "{sql}");
    }
}
