//! `gpuwatch-bench job-report`: how long the job report of a 64-GPU, 24-hour job takes on the
//! dashboards benchmark's fleet (1,024 GPUs, a day at 10 s; the first `--job-hosts` hosts run
//! one job on all their GPUs all day). The report is asked for the way a user asks: the real
//! `gpuwatch job ID --format json` against the timing server (process start, HTTP, the report's
//! queries, JSON), and the server's own answer time to `GET /api/v1/jobs/ID`; one warm-up, then
//! `--runs` timed runs of each, median and max.

use std::process::Command;
use std::time::Instant;

use super::{DashboardsArgs, prepare};
use crate::fleet::BIG_JOB_ID;
use crate::peers::{self, Result};
use crate::send;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the benchmark.
pub(crate) async fn run(args: DashboardsArgs) -> Result<()> {
    if args.job_hosts == 0 {
        return Err("--job-hosts 0: the fleet has no multi-host job to report on".into());
    }
    let (timing, loaded) = prepare(&args).await?;
    let url = timing.server.url.clone();
    let job = BIG_JOB_ID.to_string();
    let client = send::client()?;
    let api = format!("{url}/api/v1/jobs/{job}");
    let cli = || {
        Command::new(&args.gpuwatch)
            .args(["job", &job, "--server", &url, "--format", "json"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", args.gpuwatch.display()))
    };
    // The warm-up, checked: the job's GPUs and hours as the fleet made them.
    check_report(
        &cli()?,
        &job,
        (loaded.job_hosts * loaded.gpus_per_host) as i64,
    )?;
    let runs = args.runs.max(1);
    let (mut with_cli, mut server_side) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let out = cli()?;
        if !out.status.success() {
            return Err(format!("gpuwatch job {job} failed during the timed runs"));
        }
        with_cli.push(t.elapsed().as_secs_f64());
        server_side.push(timed_get(&client, &api).await?);
    }
    let (cli_max, api_max) = (
        with_cli.iter().copied().fold(0.0, f64::max),
        server_side.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "\n| what | runs | median (s) | max (s) |\n| --- | ---: | ---: | ---: |\n\
         | `gpuwatch job {job} --format json` (process, HTTP, report) | {runs} | {:.3} | {cli_max:.3} |\n\
         | `GET /api/v1/jobs/{job}` | {runs} | {:.3} | {api_max:.3} |",
        median(&mut with_cli),
        median(&mut server_side)
    );
    println!(
        "\n{} GPUs x {} samples in the fleet; gpuwatch {}",
        loaded.hosts * loaded.gpus_per_host,
        loaded.rounds(),
        args.gpuwatch.display()
    );
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .map_err(|e| format!("GET {url}/metrics: {e}"))?
        .text()
        .await
        .map_err(|e| format!("GET {url}/metrics: {e}"))?;
    let log = peers::parent_dir(&args.data_dir)?.join("dashboards-gpuwatch.log");
    let (hours, ms) = ledger_folds(&std::fs::read_to_string(&log).unwrap_or_default());
    println!(
        "timing server: jobs ledger folded {hours} hours in {:.1} s at start ({} hours held), resident memory {:.0} MiB",
        ms as f64 / 1e3,
        gauge(&metrics, "gpuwatch_jobs_ledger_hours").unwrap_or(f64::NAN),
        gauge(&metrics, "process_resident_memory_bytes").unwrap_or(f64::NAN) / (1u64 << 20) as f64
    );
    Ok(())
}

/// The value of an unlabelled series in a Prometheus text answer.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Hours the jobs ledger folded and the milliseconds it took, summed over the server log's
/// `job-usage ledger: hours folded hours=N elapsed_ms=M` lines.
fn ledger_folds(log: &str) -> (u64, u64) {
    let field = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.parse().ok())
            .unwrap_or(0)
    };
    log.lines()
        .filter(|l| l.contains("hours folded"))
        .fold((0, 0), |(h, ms), l| {
            (h + field(l, "hours="), ms + field(l, "elapsed_ms="))
        })
}

/// Checks the warm-up's report (`want` GPUs, as the fleet made the job) and prints its summary.
fn check_report(out: &std::process::Output, job: &str, want: i64) -> Result<()> {
    if !out.status.success() {
        return Err(format!(
            "gpuwatch job {job}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("gpuwatch job {job}: not JSON: {e}"))?;
    let gpus = report["gpus"].as_i64().unwrap_or(0);
    let hours = report["gpu_hours"].as_f64().unwrap_or(0.0);
    if gpus != want {
        return Err(format!(
            "job {job}: {gpus} GPUs in the report, {want} in the fleet"
        ));
    }
    println!(
        "job {job}: {gpus} GPUs, {hours:.0} GPU-hours ({:.1} h each), limiter {}, {} notes",
        hours / gpus.max(1) as f64,
        report["limiter"],
        report["advice"].as_array().map_or(0, Vec::len)
    );
    Ok(())
}

/// Seconds one `GET api` takes, answer read; an error status fails the run.
async fn timed_get(client: &reqwest::Client, api: &str) -> Result<f64> {
    let t = Instant::now();
    let resp = client
        .get(api)
        .send()
        .await
        .map_err(|e| format!("GET {api}: {e}"))?;
    let status = resp.status();
    resp.bytes()
        .await
        .map_err(|e| format!("GET {api}: reading the answer: {e}"))?;
    let took = t.elapsed().as_secs_f64();
    if !status.is_success() {
        return Err(format!("GET {api}: {status}"));
    }
    Ok(took)
}
