//! `gpuwatch-bench dashboards`: every panel query of `dashboards/*.json`, expanded as Grafana's
//! PostgreSQL data source expands it, timed over the Postgres wire protocol against a day of a
//! complete simulated fleet: GPU metrics, the jobs' processes, XID and ECC events, prices and
//! budgets, and the alert history the built-in rules record ([`load`] describes the fleet and
//! how it is loaded; its data directory is reused when it holds the same dataset).
//!
//! The expansion and the timing are done by `tests/dashboards/grafana_sql.py bench` (psycopg 3,
//! extended protocol, as Grafana's pgx driver): the same expander the end-to-end test
//! `dashboards::every_panel_answers_on_the_demo_fleet` uses, so the benchmark times the very SQL
//! the test checks. This program loads the fleet, waits until it is persisted and rolled up,
//! checks that every table the panels read has rows in the timed ranges, runs the script with
//! the Job dashboard on a job that has alerts, prints the panels slowest first, and fails when a
//! panel answers no rows.

pub(crate) mod job_report;
mod load;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Args;

use crate::peers::{self, Result, Server};
use crate::query;
use crate::send;
use crate::{FleetArgs, parse_duration};
use load::{Load, count};

/// Flags of `dashboards`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DashboardsArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Simulated history to load; it ends when the load starts.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub history: Duration,
    /// How long the fleet then reports in real time to a server that runs --rules, which
    /// records the alert history.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub live: Duration,
    /// Alert rule files the live server runs (the built-in pack by default).
    #[arg(
        long = "rules",
        default_values = ["deploy/rules/idle.yaml", "deploy/rules/health.yaml", "deploy/rules/jobs.yaml"]
    )]
    pub rules: Vec<PathBuf>,
    /// The agents' --slow-interval: how often per-process SM utilisation is read (null between).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub slow_interval: Duration,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// gpuwatch's data directory, reused when it holds the same dataset (its `bench-load.json`).
    #[arg(long, default_value = "/tmp/gpuwatch-bench/dashboards-data")]
    pub data_dir: PathBuf,
    /// Timed runs per panel query (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[command(flatten)]
    pub panels: PanelArgs,
    /// Dashboard time ranges to time every panel over (ending at the end of the data).
    #[arg(long = "range", default_values_t = vec!["24h".to_string(), "30d".to_string()])]
    pub ranges: Vec<String>,
    /// The first this many hosts run one job on all their GPUs for the whole history (8 hosts
    /// of 8 GPUs: the 64-GPU, 24-hour job `job-report` times).
    #[arg(long, default_value_t = 8)]
    pub job_hosts: usize,
    /// Longest wait for the load to be persisted and rolled up.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
}

/// One timed panel query, as the script prints it.
#[derive(serde::Deserialize, Debug)]
pub(crate) struct Timing {
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

/// The machine's load averages (1, 5 and 15 minutes), from `/proc/loadavg`.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// `ms` (since the epoch) as a SQL timestamp constant of the tables' type.
fn sql_time(ms: i64) -> String {
    format!(
        "arrow_cast('{}', 'Timestamp(Nanosecond, Some(\"UTC\"))')",
        query::iso(ms)
    )
}

/// Waits until the data are persisted, every closed hour is rolled up and the jobs ledger has
/// folded the hours it folds: the state a server shows once it has caught up.
async fn settle(args: &DashboardsArgs, server: &Server, load: &Load, log: &Path) -> Result<()> {
    let deadline = Instant::now() + args.settle_timeout;
    while query::persisted_rows(&server.url).await < load.gpu_rows {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} rows persisted after {:?}; see {}",
                query::persisted_rows(&server.url).await,
                load.gpu_rows,
                args.settle_timeout,
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let end_ms = load.end_ms();
    // Hours that closed at least 10 minutes before now are rolled up by the compactor.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    let closed_hours = ((now_ms - 600_000).div_euclid(3_600_000)
        - load.start_ms.div_euclid(3_600_000))
    .clamp(0, (end_ms - load.start_ms).div_euclid(3_600_000)) as u64;
    loop {
        let h = count(
            server,
            "SELECT count(DISTINCT time) AS n FROM gpu_metrics_1h",
        )
        .await?;
        let m = count(
            server,
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
        let w = ledger_watermark_ms(server).await?;
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
    query::wait_idle(server, Duration::from_secs(120)).await
}

/// One line of the table check: a count over the whole table and over each range.
struct TableCount {
    what: &'static str,
    /// SQL with `{WHERE}` where the time condition goes (`AND …` after a `WHERE`).
    sql: &'static str,
    /// Must equal this over the whole table (what was sent), when known.
    expected: Option<u64>,
}

/// The counts [`check_tables`] makes: every table the panels read, with what was sent where the
/// load knows it.
fn table_counts(load: &Load) -> [TableCount; 10] {
    [
        TableCount {
            what: "gpu_metrics",
            sql: "SELECT count(*) AS n FROM gpu_metrics WHERE true {WHERE}",
            expected: Some(load.gpu_rows),
        },
        TableCount {
            what: "gpu_processes",
            sql: "SELECT count(*) AS n FROM gpu_processes WHERE true {WHERE}",
            expected: Some(load.processes),
        },
        TableCount {
            what: "gpu_processes with SM utilisation",
            sql: "SELECT count(*) AS n FROM gpu_processes WHERE sm_utilization IS NOT NULL {WHERE}",
            expected: None,
        },
        TableCount {
            what: "gpu_events, XID",
            sql: "SELECT count(*) AS n FROM gpu_events WHERE kind = 'xid' {WHERE}",
            expected: Some(load.xid_events),
        },
        TableCount {
            what: "gpu_events, ECC",
            sql: "SELECT count(*) AS n FROM gpu_events WHERE kind IN ('ecc_sbe', 'ecc_dbe') {WHERE}",
            expected: Some(load.ecc_events),
        },
        TableCount {
            what: "alerts (transitions)",
            sql: "SELECT count(*) AS n FROM alerts WHERE true {WHERE}",
            expected: None,
        },
        TableCount {
            what: "alerts, to firing",
            sql: "SELECT count(*) AS n FROM alerts WHERE state = 'firing' {WHERE}",
            expected: None,
        },
        TableCount {
            what: "jobs (job × host), last seen",
            sql: "SELECT count(*) AS n FROM jobs WHERE true {WHERE}",
            expected: None,
        },
        TableCount {
            what: "jobs with a cost",
            sql: "SELECT count(*) AS n FROM jobs WHERE cost_usd > 0 {WHERE}",
            expected: None,
        },
        TableCount {
            what: "jobs with an idle cost",
            sql: "SELECT count(*) AS n FROM jobs WHERE idle_cost_usd > 0 {WHERE}",
            expected: None,
        },
    ]
}

/// Counts the rows each table the panels read holds, in total and in each timed range; an
/// error when a range has none or a table does not hold what was sent.
async fn check_tables(server: &Server, load: &Load, ranges: &[String]) -> Result<()> {
    let end_ms = load.end_ms();
    let checks = table_counts(load);
    let mut spans = Vec::new();
    for r in ranges {
        let d = parse_duration(r).map_err(|e| format!("--range {e}"))?;
        spans.push((r.as_str(), end_ms - d.as_millis() as i64));
    }
    print!("\n| table | rows |");
    for (r, _) in &spans {
        print!(" in the {r} range |");
    }
    println!("\n| --- | ---: |{}", " ---: |".repeat(spans.len()));
    let mut problems = Vec::new();
    for c in &checks {
        let column = if c.what.starts_with("jobs") {
            "last_seen"
        } else {
            "time"
        };
        let total = count(server, &c.sql.replace("{WHERE}", "")).await?;
        print!("| {} | {total} |", c.what);
        if let Some(e) = c.expected
            && e != total
        {
            problems.push(format!("{}: {total} rows, {e} sent", c.what));
        }
        for (r, from_ms) in &spans {
            let cond = format!(
                "AND {column} > {} AND {column} <= {}",
                sql_time(*from_ms),
                sql_time(end_ms)
            );
            let n = count(server, &c.sql.replace("{WHERE}", &cond)).await?;
            print!(" {n} |");
            if n == 0 {
                problems.push(format!("{}: no rows in the {r} range", c.what));
            }
        }
        println!();
    }
    let budgets = count(server, "SELECT count(*) AS n FROM budgets").await?;
    println!("| budgets | {budgets} |{}", " |".repeat(spans.len()));
    if budgets == 0 {
        problems.push("budgets: none (the config's [cost] sets a default budget)".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the fleet is not complete: {}",
            problems.join("; ")
        ))
    }
}

/// The job with the most alert transitions up to `end_ms` (the Job dashboard is timed on it, so
/// that its alerts panel has rows).
async fn alerted_job(server: &Server, end_ms: i64) -> Result<String> {
    let sql = format!(
        "SELECT labels['job_id'] AS job_id, count(*) AS n FROM alerts \
         WHERE labels['job_id'] IS NOT NULL AND time <= {} \
         GROUP BY labels['job_id'] ORDER BY n DESC, job_id LIMIT 1",
        sql_time(end_ms)
    );
    let rows = crate::ingest::sql_json(&send::client()?, &server.url, &sql).await?;
    rows.first()
        .and_then(|r| r.get("job_id"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| "no alert names a job: the Job dashboard's alerts would be empty".into())
}

/// Where the panels and their timer are (flags of `dashboards` and `history`).
#[derive(Args, Debug, Clone)]
pub(crate) struct PanelArgs {
    /// Python with psycopg 3 (`pip install 'psycopg[binary]'`).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// The panels' expander and timer.
    #[arg(long, default_value = "tests/dashboards/grafana_sql.py")]
    pub script: PathBuf,
    /// Folder of the dashboard JSON files.
    #[arg(long, default_value = "dashboards")]
    pub dashboards: PathBuf,
}

/// How the panels are timed: where they are, how many runs, over which ranges.
pub(crate) struct Panels<'a> {
    pub at: &'a PanelArgs,
    pub runs: usize,
    pub ranges: &'a [String],
}

impl<'a> Panels<'a> {
    fn of(args: &'a DashboardsArgs) -> Self {
        Self {
            at: &args.panels,
            runs: args.runs,
            ranges: &args.ranges,
        }
    }

    /// Runs the script's `bench` over the Postgres wire port and reads its timings, the Job
    /// dashboard on `job`, every range ending at `to`.
    pub(crate) fn time(&self, pg_port: u16, to: &str, job: &str) -> Result<Vec<Timing>> {
        if !self.at.script.is_file() {
            return Err(format!(
                "{}: not found; run from the repository root or pass --script",
                self.at.script.display()
            ));
        }
        let dsn =
            format!("host=127.0.0.1 port={pg_port} user=bench dbname=gpuwatch sslmode=disable");
        let mut cmd = Command::new(&self.at.python);
        cmd.arg(&self.at.script)
            .arg("bench")
            .arg("--dsn")
            .arg(&dsn)
            .arg("--dashboards")
            .arg(&self.at.dashboards)
            .arg("--to")
            .arg(to)
            .arg("--runs")
            .arg(self.runs.max(1).to_string())
            .arg("--var")
            .arg(format!("job_id={job}"));
        for r in self.ranges {
            cmd.arg("--range").arg(r);
        }
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.at.python.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} bench failed: {}",
                self.at.script.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("script output is not the expected JSON: {e}"))
    }
}

/// Prints the timings slowest first as a Markdown table, and the count at or over 1 s; returns
/// the panels that failed and those that answered no rows.
pub(crate) fn print_timings(timings: &mut [Timing]) -> (Vec<String>, Vec<String>) {
    timings.sort_by(|a, b| b.median_s.total_cmp(&a.median_s));
    println!("| dashboard | panel | ref | range | median (s) | max (s) | rows |");
    println!("| --- | --- | --- | --- | ---: | ---: | ---: |");
    let mut failed = Vec::new();
    let mut empty = Vec::new();
    for t in timings.iter() {
        let name = format!("{} / {} [{}] ({})", t.dashboard, t.panel, t.ref_id, t.range);
        if let Some(e) = &t.error {
            println!(
                "| {} | {} | {} | {} | error: {e} | | |",
                t.dashboard, t.panel, t.ref_id, t.range
            );
            failed.push(name);
            continue;
        }
        if t.rows == 0 {
            empty.push(name);
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
    println!(
        "\npanel queries at or over 1 s (median): {over}; failed: {}; without rows: {}",
        failed.len(),
        empty.len()
    );
    (failed, empty)
}

/// The loaded fleet (loaded now, or reused from an earlier run) and a timing server on it that
/// has caught up: data persisted, hours rolled up, the jobs ledger folded.
pub(crate) async fn prepare(args: &DashboardsArgs) -> Result<(load::Started, Load)> {
    let wanted = load::wanted(args)?;
    let parent = peers::parent_dir(&args.data_dir)?;
    let config = parent.join("dashboards-gpuwatch.toml");
    std::fs::write(&config, load::CONFIG).map_err(|e| format!("{}: {e}", config.display()))?;
    let version = peers::version_of(&args.gpuwatch, "--version");
    println!("gpuwatch ({version}); data in {}", args.data_dir.display());
    let loaded = match load::earlier(&args.data_dir, &wanted)? {
        Some(m) => {
            println!(
                "reusing the data loaded earlier ({} samples, {} processes, {} XID and {} ECC events; loaded in {:.0}s, then {:.0}s live)",
                m.samples, m.processes, m.xid_events, m.ecc_events, m.load_seconds, m.live_seconds
            );
            m
        }
        None => load::load(args, &wanted, &config, &parent).await?,
    };

    let log = parent.join("dashboards-gpuwatch.log");
    let timing = load::start_server(args, "gpuwatch", log.clone(), &config, &[])?;
    println!(
        "timing server: pid {}, the prices of {}, no rules",
        timing.server.pid(),
        config.display()
    );
    settle(args, &timing.server, &loaded, &log).await?;
    Ok((timing, loaded))
}

/// Runs the benchmark.
pub(crate) async fn run(args: DashboardsArgs) -> Result<()> {
    let (timing, loaded) = prepare(&args).await?;
    let end_ms = loaded.end_ms();
    check_tables(&timing.server, &loaded, &args.ranges).await?;
    let job = alerted_job(&timing.server, end_ms).await?;

    let to = query::iso(end_ms);
    println!(
        "\ntiming every panel over {} ending {to} ({} runs each, median), the Job dashboard on job {job}...",
        args.ranges.join(" and "),
        args.runs.max(1)
    );
    let before = load_average();
    let t = Instant::now();
    let mut timings = {
        let args = args.clone();
        let pg = timing.pg_port;
        let (to, job) = (to.clone(), job.clone());
        tokio::task::spawn_blocking(move || Panels::of(&args).time(pg, &to, &job))
            .await
            .map_err(|e| format!("script task: {e}"))??
    };
    let after = load_average();
    println!(
        "{} panel queries timed in {:.0}s; {} GPUs x {} samples; load average {before} before, {after} after\n",
        timings.len(),
        t.elapsed().as_secs_f64(),
        loaded.hosts * loaded.gpus_per_host,
        loaded.rounds()
    );
    let (failed, empty) = print_timings(&mut timings);
    if !failed.is_empty() {
        return Err(format!("panel queries failed: {}", failed.join(", ")));
    }
    if !empty.is_empty() {
        return Err(format!(
            "panel queries answered no rows on a fleet that has data for each: {}",
            empty.join(", ")
        ));
    }
    Ok(())
}
