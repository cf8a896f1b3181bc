//! `gpuwatch-bench promql`: the same day of the simulated fleet remote-written into gpuwatch and
//! into a real Prometheus (its remote-write receiver, with an out-of-order window wide enough for
//! a day of history), then one range query timed on both, side by side, and their answers
//! compared series by series.
//!
//! The data carry the stale markers a scraping Prometheus would send when a GPU's job changes,
//! so both engines see the same series end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use tokio::sync::mpsc;

use crate::fleet::{Fleet, FleetConfig};
use crate::peers::{self, Result, Server, free_port};
use crate::query::{LoadMarker, MARKER};
use crate::remote_write::{Body, host_request_with_staleness};
use crate::send;
use crate::{FleetArgs, parse_duration};

/// Flags of `promql`.
#[derive(Args, Debug, Clone)]
pub(crate) struct PromqlArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Simulated history to load; it ends when the load starts.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub history: Duration,
    /// The range query's step.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub step: Duration,
    /// The expression timed.
    #[arg(long, default_value = "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)")]
    pub query: String,
    /// Timed runs per engine (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// Extra argument for `gpuwatch serve` (repeatable).
    #[arg(long = "gpuwatch-arg", allow_hyphen_values = true)]
    pub gpuwatch_args: Vec<String>,
    /// The Prometheus binary.
    #[arg(long, default_value = "prometheus")]
    pub prometheus: PathBuf,
    /// Where both servers keep their data (a new directory per run).
    #[arg(long, default_value = "/tmp/gpuwatch-bench")]
    pub work_dir: PathBuf,
    /// Longest wait for gpuwatch to persist the load.
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
    /// The directory of an earlier run (printed at its end) whose load matches these flags:
    /// both servers start on its data and nothing is loaded again.
    #[arg(long)]
    pub reuse: Option<PathBuf>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

fn start_prometheus(args: &PromqlArgs, run_dir: &std::path::Path) -> Result<Server> {
    let data_dir = run_dir.join("prometheus");
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let config = run_dir.join("prometheus.yml");
    // The receiver takes samples older than its head only within the out-of-order window
    // (Prometheus 2.39+).
    std::fs::write(
        &config,
        "global:\n  scrape_interval: 1m\nscrape_configs: []\nstorage:\n  tsdb:\n    out_of_order_time_window: 3d\n",
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let port = free_port()?;
    let cmd_args = vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", data_dir.display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--web.enable-remote-write-receiver".into(),
        "--storage.tsdb.retention.time=30d".into(),
        "--query.timeout=10m".into(),
        "--log.level=warn".into(),
    ];
    Server::start(
        "prometheus",
        &args.prometheus,
        &cmd_args,
        format!("http://127.0.0.1:{port}"),
        "/-/ready",
        run_dir.join("prometheus.log"),
    )
}

/// What this run's flags load.
fn wanted_load(args: &PromqlArgs, start_ms: i64) -> LoadMarker {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    LoadMarker {
        hosts: args.fleet.hosts,
        gpus_per_host: args.fleet.gpus_per_host,
        interval_ms,
        seed: args.fleet.seed,
        start_ms,
        rounds: (args.history.as_millis() as i64 / interval_ms).max(1) as u64,
        samples: 0,
        load_seconds: 0.0,
    }
}

/// The load an earlier run left in `dir`, refused when it is not what these flags load.
fn earlier_load(args: &PromqlArgs, dir: &Path) -> Result<LoadMarker> {
    let path = dir.join(MARKER);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let m: LoadMarker =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let same = m.is_load_of(&args.fleet, args.history);
    if !same {
        return Err(format!(
            "{} holds another load ({m:?}): run with its flags or without --reuse",
            dir.display()
        ));
    }
    Ok(m)
}

/// Generates the history once and sends every request to both servers; the load is recorded in
/// the run directory for `--reuse`.
async fn load(
    args: &PromqlArgs,
    gw: &Server,
    prom: &Server,
    run_dir: &Path,
) -> Result<(i64, i64, u64)> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    let rounds = wanted_load(args, 0).rounds;
    let end_ms = now_ms().div_euclid(interval_ms) * interval_ms;
    let start_ms = end_ms - rounds as i64 * interval_ms;
    let fleet_args = args.fleet.clone();
    let depth = 4 * args.fleet.concurrency.max(1);
    let (tx_gw, rx_gw) = mpsc::channel::<Arc<Body>>(depth);
    let (tx_prom, rx_prom) = mpsc::channel::<Arc<Body>>(depth);
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
        let mut last_jobs = vec![None; fleet.hosts()];
        let mut first = 0;
        while first < rounds {
            let n = per.min(rounds - first);
            for (h, last) in last_jobs.iter_mut().enumerate() {
                let body = Arc::new(host_request_with_staleness(&mut fleet, h, first, n, last));
                if tx_gw.blocking_send(Arc::clone(&body)).is_err()
                    || tx_prom.blocking_send(body).is_err()
                {
                    return;
                }
            }
            first += n;
        }
    });
    println!(
        "loading {} GPUs x {rounds} samples into gpuwatch and Prometheus...",
        args.fleet.hosts * args.fleet.gpus_per_host
    );
    let t = Instant::now();
    let client = send::client()?;
    let gw_url = format!("{}/api/v1/write", gw.url);
    let prom_url = format!("{}/api/v1/write", prom.url);
    let (a, b) = tokio::join!(
        send::send_stream(&client, &gw_url, rx_gw, args.fleet.concurrency),
        send::send_stream(&client, &prom_url, rx_prom, args.fleet.concurrency),
    );
    let (a, _) = (a?, b?);
    generator
        .join()
        .map_err(|_| "the generator thread panicked".to_string())?;
    println!(
        "loaded {} samples into each in {:.1}s",
        a.samples,
        t.elapsed().as_secs_f64()
    );
    let marker = LoadMarker {
        samples: a.samples,
        load_seconds: t.elapsed().as_secs_f64(),
        ..wanted_load(args, start_ms)
    };
    let path = run_dir.join(MARKER);
    let text = serde_json::to_string(&marker).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((start_ms, end_ms, rounds))
}

/// One timed range query: the wall time (HTTP and JSON parsing included) and the answer.
async fn timed(
    client: &reqwest::Client,
    url: &str,
    params: &[(&str, String)],
) -> Result<(f64, serde_json::Value)> {
    let query: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect();
    let t = Instant::now();
    let resp = client
        .get(format!("{url}/api/v1/query_range?{}", query.join("&")))
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("{url}: answer is not JSON: {e}"))?;
    let secs = t.elapsed().as_secs_f64();
    if !status.is_success() || v["status"] != "success" {
        return Err(format!("{url}: {status}: {v}"));
    }
    Ok((secs, v))
}

/// Percent-escaping of a query-string component.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Series → points, for comparing two answers.
fn points(v: &serde_json::Value) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out = BTreeMap::new();
    for s in v["data"]["result"].as_array().into_iter().flatten() {
        let pts = s["values"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let t = p[0].as_f64().unwrap_or(f64::NAN);
                let x = p[1]
                    .as_str()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(f64::NAN);
                (t, x)
            })
            .collect();
        out.insert(s["metric"].to_string(), pts);
    }
    out
}

/// `None` when both answers hold the same series and points (values to a relative 1e-6).
fn difference(a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    let (a, b) = (points(a), points(b));
    if a.keys().ne(b.keys()) {
        return Some(format!("{} series vs {}", a.len(), b.len()));
    }
    for (k, pa) in &a {
        let pb = &b[k];
        if pa.len() != pb.len() {
            return Some(format!("{k}: {} points vs {}", pa.len(), pb.len()));
        }
        for (x, y) in pa.iter().zip(pb) {
            let close = (x.1 - y.1).abs() <= 1e-6 * x.1.abs().max(y.1.abs()) + 1e-9;
            if x.0 != y.0 || !close {
                return Some(format!("{k}: {x:?} vs {y:?}"));
            }
        }
    }
    None
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The range query over `[start_ms, end_ms]` asked of both servers: once to compare the
/// answers (`Some` with the first difference), then `--runs` times each, alternating; prints the
/// medians and their ratio.
async fn time_both(
    args: &PromqlArgs,
    (gw, prom): (&Server, &Server),
    start_ms: i64,
    end_ms: i64,
) -> Result<Option<String>> {
    let step_s = args.step.as_secs_f64();
    let params = vec![
        ("query", args.query.clone()),
        ("start", format!("{:.3}", start_ms as f64 / 1000.0 + step_s)),
        ("end", format!("{:.3}", end_ms as f64 / 1000.0)),
        ("step", format!("{step_s}")),
    ];
    println!(
        "query: {} over {:?} at a {step_s}s step ({} steps)",
        args.query,
        args.history,
        ((end_ms - start_ms) as f64 / 1000.0 / step_s) as u64
    );
    let client = send::client()?;
    let (_, gw_answer) = timed(&client, &gw.url, &params).await?;
    let (_, prom_answer) = timed(&client, &prom.url, &params).await?;
    let agree = difference(&gw_answer, &prom_answer);
    let (mut tg, mut tp) = (Vec::new(), Vec::new());
    for _ in 0..args.runs.max(1) {
        tg.push(timed(&client, &gw.url, &params).await?.0);
        tp.push(timed(&client, &prom.url, &params).await?.0);
    }
    let (mg, mp) = (median(&mut tg), median(&mut tp));
    let series = gw_answer["data"]["result"].as_array().map_or(0, Vec::len);
    println!("series in the answer: {series}");
    println!("gpuwatch   median {mg:.3}s (runs {tg:.3?})");
    println!("Prometheus median {mp:.3}s (runs {tp:.3?})");
    println!("gpuwatch / Prometheus = {:.2}x", mg / mp);
    match &agree {
        None => println!("answers agree: every series and point (relative 1e-6)"),
        Some(d) => println!("ANSWERS DIFFER: {d}"),
    }
    Ok(agree)
}

/// Runs the benchmark.
pub(crate) async fn run(args: PromqlArgs) -> Result<()> {
    if args.fleet.interval.is_zero() || args.step.is_zero() {
        return Err("--interval and --step must be positive".into());
    }
    let run_dir = match &args.reuse {
        Some(dir) => dir.clone(),
        None => args.work_dir.join(format!("promql-{}", std::process::id())),
    };
    std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    let earlier = args
        .reuse
        .as_ref()
        .map(|d| earlier_load(&args, d))
        .transpose()?;
    let mut gw = peers::GpuwatchCmd::new(&run_dir.join("gpuwatch"))?
        .args(peers::FAST_PERSIST)
        .args(&args.gpuwatch_args)
        .start("gpuwatch", &args.gpuwatch, run_dir.join("gpuwatch.log"))?;
    let mut prom = start_prometheus(&args, &run_dir)?;
    println!(
        "gpuwatch {} and Prometheus {}",
        peers::version_of(&args.gpuwatch, "--version"),
        peers::version_of(&args.prometheus, "--version")
            .lines()
            .next()
            .unwrap_or_default()
    );
    let (start_ms, end_ms, rounds) = match &earlier {
        Some(m) => {
            println!(
                "reusing the load of {} ({} samples)",
                run_dir.display(),
                m.samples
            );
            (
                m.start_ms,
                m.start_ms + m.rounds as i64 * m.interval_ms,
                m.rounds,
            )
        }
        None => load(&args, &gw, &prom, &run_dir).await?,
    };
    let expected = (args.fleet.hosts * args.fleet.gpus_per_host) as u64 * rounds;
    let deadline = Instant::now() + args.settle_timeout;
    while crate::query::persisted_rows(&gw.url).await < expected {
        if Instant::now() > deadline {
            return Err(format!("gpuwatch did not persist {expected} rows in time"));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    crate::query::wait_idle(&gw, Duration::from_secs(300)).await?;
    crate::query::wait_idle(&prom, Duration::from_secs(300)).await?;
    let agree = time_both(&args, (&gw, &prom), start_ms, end_ms).await?;
    gw.stop();
    prom.stop();
    println!(
        "data left in {} (time it again with --reuse {0}; remove it when done)",
        run_dir.display()
    );
    match agree {
        None => Ok(()),
        Some(d) => Err(format!("the answers differ: {d}")),
    }
}
