//! gpuwatch's benchmark programs (docs/benchmarks.md).
//!
//! - `ingest`: the same simulated dcgm-exporter telemetry sent over Prometheus remote write to
//!   gpuwatch, VictoriaMetrics and Prometheus, one after the other on this machine; prints
//!   samples per second per core of server CPU, bytes per sample on disk once flushed and
//!   compacted, and the ratios.
//! - `query`: a day of the same fleet loaded into gpuwatch; three queries timed through the SQL
//!   API and with DuckDB over the very Parquet files gpuwatch wrote; then ingest-to-query
//!   freshness.
//! - `dashboards`: every panel query of `dashboards/*.json`, expanded as Grafana expands it, timed
//!   over the Postgres wire protocol on the same day of the fleet with its processes, XID and ECC
//!   events, prices and alert history, slowest first.
//! - `job-report`: `gpuwatch job` on a 64-GPU, 24-hour job of the dashboards fleet, timed.
//! - `replay`: recorded GPU traces (tests/fixtures/gpu-traces/) sent to a server as scheduler
//!   jobs with the agent's OTLP encoder, time-shifted to end now, stretched on request.
//! - `history`: a long history of a fleet (hourly rollups and the job ledger for `--days`,
//!   minute rollups, a day of raw samples) written through the store's own writers; the server
//!   started on it and its start-up, jobs view, jobs list, statement, oldest job's report and
//!   counts timed, with its peak RSS.
//! - `promql`: the same day of the fleet remote-written into gpuwatch and Prometheus; a PromQL
//!   range query (`sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)` over 24 h at a 60 s step) timed on
//!   both, side by side, the answers compared.
//!
//! The data come from [`fleet`], a model of H100 GPUs calibrated on a real trace, and
//! [`workload`], the processes and events an agent would report on it.

mod dashboards;
mod fleet;
mod history;
mod ingest;
mod peers;
mod promql;
mod query;
mod remote_write;
mod replay;
mod send;
mod workload;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gpuwatch-bench",
    about = "gpuwatch benchmark programs (docs/benchmarks.md)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Remote-write ingest: gpuwatch vs VictoriaMetrics vs Prometheus.
    Ingest(ingest::IngestArgs),
    /// SQL queries: gpuwatch vs DuckDB on the same Parquet files; ingest-to-query freshness.
    Query(query::QueryArgs),
    /// Grafana dashboards: every panel's SQL over 24 h and 30 d of the fleet, slowest first.
    Dashboards(dashboards::DashboardsArgs),
    /// Recorded GPU traces sent to a server as scheduler jobs, ending now (docs/jobs.md).
    Replay(replay::ReplayArgs),
    /// The job report of a 64-GPU, 24-hour job on the dashboards fleet, timed.
    JobReport(dashboards::DashboardsArgs),
    /// The same day of the fleet in gpuwatch and in Prometheus; one PromQL range query timed on
    /// both and the answers compared.
    Promql(promql::PromqlArgs),
    /// A long history (hourly rollups and the job ledger, minute rollups, a day of raw samples)
    /// built through the store's writers; start-up, jobs, statements, reports and counts timed.
    History(history::HistoryArgs),
}

/// The simulated fleet's shape, shared by both programs.
#[derive(Args, Debug, Clone)]
pub struct FleetArgs {
    /// Hosts (each runs one dcgm-exporter).
    #[arg(long, default_value_t = 128)]
    pub hosts: usize,
    /// GPUs per host.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_host: usize,
    /// Sampling interval.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Seed of the simulation (same seed, same samples).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Scrape rounds per remote-write request (each request holds one host's series).
    #[arg(long, default_value_t = 10)]
    pub rounds_per_request: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
}

/// Parses `500ms`, `10s`, `5m`, `1h`, `2d` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: write a duration like 10s, 5m, 1h, 24h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?}; use ms, s, m, h or d"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?}: not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Ingest(a) => ingest::run(a).await,
            Command::Query(a) => query::run(a).await,
            Command::Dashboards(a) => dashboards::run(a).await,
            Command::Replay(a) => replay::run(a).await,
            Command::JobReport(a) => dashboards::job_report::run(a).await,
            Command::Promql(a) => promql::run(a).await,
            Command::History(a) => history::run(a).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("ten").unwrap_err().contains("duration like"));
        assert!(parse_duration("5y").unwrap_err().contains("unknown unit"));
    }
}
