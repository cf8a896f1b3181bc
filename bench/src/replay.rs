//! `gpuwatch-bench replay`: recorded GPU traces sent to a real gpuwatch server as the agent
//! sends them (its own OTLP encoder), as scheduler jobs, time-shifted so the replay ends now
//! (docs/jobs.md, "Replaying a trace").
//!
//! Traces are laid one after another on one timeline (they may share a GPU), each stretched by
//! `--stretch` or to at least `--min-span` (a 70-second trace becomes a job long enough for the
//! rules that need 5 minutes of GPU time), optionally thinned to every Nth reading as a slower
//! agent would read it. While stretched, the energy counter is rebuilt from the power readings so
//! energy and power stay consistent. Each trace's job is `--job-id` or its JSON's `job_id`, else
//! its name. The workload's own counters (`work_samples`, `work_tokens`, `work_steps`) are sent
//! as the job would send them (`job.samples`, … with `job.id`, docs/cost.md). One JSON line per
//! trace tells where it landed.

pub(crate) mod trace;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use gpuwatch_agent::{GpuSample, JobLabels};

use crate::parse_duration;
use trace::Trace;

/// Flags of `replay`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReplayArgs {
    /// Trace files (`SHAPE.csv.gz` or `.csv`, with `SHAPE.json` beside them when there is one),
    /// replayed one after another in the order given.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// The server's HTTP base URL (OTLP/HTTP is posted to `<server>/v1/metrics`).
    #[arg(long, default_value = "http://127.0.0.1:9500")]
    pub server: String,
    /// Bearer token with the `ingest` scope, for a server with `--auth-tokens`.
    #[arg(long, env = "GPUWATCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// `host.name` of the replayed GPUs.
    #[arg(long, default_value = "replay")]
    pub host: String,
    /// The job id of every trace (default: each trace's JSON `job_id`, else its name).
    #[arg(long)]
    pub job_id: Option<String>,
    /// The job's user (default: the JSON's `job_user`, else `replay`).
    #[arg(long)]
    pub job_user: Option<String>,
    /// The job's name (default: the JSON's `job_name`, else the trace's name).
    #[arg(long)]
    pub job_name: Option<String>,
    /// The `scheduler` label.
    #[arg(long, default_value = "slurm")]
    pub scheduler: String,
    /// Each reading holds this many times as long as it did.
    #[arg(long, default_value_t = 1.0)]
    pub stretch: f64,
    /// Stretch each trace so that it spans at least this long (e.g. `6m`).
    #[arg(long, value_parser = parse_duration)]
    pub min_span: Option<Duration>,
    /// Keep every Nth reading of each GPU, GPM activities and link rates averaged over the N
    /// (an agent with an N times longer `--interval`).
    #[arg(long, default_value_t = 1)]
    pub every: usize,
    /// Time between one trace's last reading and the next one's first.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub gap: Duration,
    /// When the replay's last reading lands, Unix seconds (default: now).
    #[arg(long)]
    pub end: Option<f64>,
    /// Readings per OTLP request.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
}

/// Where a trace landed.
#[derive(Debug, serde::Serialize)]
struct Placed {
    trace: String,
    job_id: String,
    host: String,
    gpus: Vec<String>,
    samples: usize,
    first_ns: i64,
    last_ns: i64,
    stretch: f64,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// The trace's stretch factor: `--stretch`, raised to reach `--min-span`.
fn stretch_of(args: &ReplayArgs, t: &Trace) -> f64 {
    let (lo, hi) = t.span();
    let span_s = (hi - lo) as f64 / 1e9;
    let min = args
        .min_span
        .filter(|_| span_s > 0.0)
        .map_or(0.0, |d| d.as_secs_f64() / span_s);
    args.stretch.max(min)
}

/// The job of a trace.
fn job_of(args: &ReplayArgs, t: &Trace) -> JobLabels {
    JobLabels {
        id: args
            .job_id
            .clone()
            .or_else(|| t.meta.job_id.clone())
            .unwrap_or_else(|| t.name.clone()),
        user: args
            .job_user
            .clone()
            .or_else(|| t.meta.job_user.clone())
            .unwrap_or_else(|| "replay".into()),
        name: args
            .job_name
            .clone()
            .or_else(|| t.meta.job_name.clone())
            .unwrap_or_else(|| t.name.clone()),
        scheduler: args.scheduler.clone(),
        k8s: None,
        extra: Default::default(),
    }
}

/// The samples of one trace placed from `start_ns`, times scaled by `stretch` (to whole µs,
/// the store's precision), energy rebuilt from power when stretched.
fn place(t: &Trace, every: usize, stretch: f64, start_ns: i64, job: &JobLabels) -> Vec<GpuSample> {
    let (lo, _) = t.span();
    let mut out = Vec::new();
    for series in t.gpus.values() {
        let series = trace::every(series, every);
        let mut energy: Option<f64> = None;
        let mut prev: Option<(i64, Option<f64>)> = None;
        for (time, sample) in &series {
            let at =
                (start_ns + ((time - lo) as f64 * stretch).round() as i64).div_euclid(1000) * 1000;
            let mut s = sample.clone();
            s.time_unix_nano = at.max(0) as u64;
            s.job = Some(job.clone());
            if stretch != 1.0 {
                energy = match (energy, prev, s.power_watts) {
                    (None, _, _) => sample.energy_joules.or(Some(0.0)),
                    (Some(e), Some((pt, pw)), Some(w)) => {
                        Some(e + (pw.unwrap_or(w) + w) / 2.0 * (at - pt) as f64 / 1e9)
                    }
                    (e, _, _) => e,
                };
                s.energy_joules = energy;
            }
            prev = Some((at, s.power_watts));
            out.push(s);
        }
    }
    out
}

/// The trace's work counters placed like its samples (from `start_ns`, times scaled by
/// `stretch`), as an OpenTelemetry SDK in the job would send them: cumulative monotonic sums
/// with the job's id as the resource attribute `job.id` (OTLP/JSON).
fn work_body(
    t: &Trace,
    stretch: f64,
    start_ns: i64,
    job: &JobLabels,
    host: &str,
) -> Option<Vec<u8>> {
    let (lo, _) = t.span();
    let metrics: Vec<serde_json::Value> = t
        .work
        .iter()
        .map(|(counter, points)| {
            let points: Vec<serde_json::Value> = points
                .iter()
                .map(|(time, v)| {
                    let at = start_ns + ((time - lo) as f64 * stretch).round() as i64;
                    serde_json::json!({"timeUnixNano": at.max(0).to_string(), "asDouble": v})
                })
                .collect();
            serde_json::json!({"name": counter, "sum": {
                "aggregationTemporality": 2, "isMonotonic": true, "dataPoints": points}})
        })
        .collect();
    if metrics.is_empty() {
        return None;
    }
    let attr = |k: &str, v: &str| serde_json::json!({"key": k, "value": {"stringValue": v}});
    let body = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [
            attr("job.id", &job.id),
            attr("service.instance.id", &format!("{host}:{}", t.name)),
        ]},
        "scopeMetrics": [{"metrics": metrics}]
    }]});
    Some(body.to_string().into_bytes())
}

/// Posts one OTLP body; repeats it while the server sheds load (429, 503).
async fn post(
    client: &reqwest::Client,
    args: &ReplayArgs,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(), String> {
    let url = format!("{}/v1/metrics", args.server.trim_end_matches('/'));
    loop {
        let mut req = client
            .post(&url)
            .header("Content-Type", content_type)
            .body(body.clone());
        if let Some(t) = &args.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| {
            format!("POST {url}: {e}: is gpuwatch serve running there? set --server")
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        if status.as_u16() == 429 || status.as_u16() == 503 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("POST {url}: {status}: {}", text.trim()));
    }
}

/// Runs `replay`.
pub(crate) async fn run(args: ReplayArgs) -> Result<(), String> {
    if !(args.stretch.is_finite() && args.stretch > 0.0) {
        return Err("--stretch must be a number above 0".into());
    }
    if args.every == 0 || args.batch == 0 {
        return Err("--every and --batch must be at least 1".into());
    }
    let traces: Vec<Trace> = args
        .traces
        .iter()
        .map(|p| trace::read(p))
        .collect::<Result<_, _>>()?;
    let stretches: Vec<f64> = traces.iter().map(|t| stretch_of(&args, t)).collect();
    let spans: Vec<i64> = traces
        .iter()
        .zip(&stretches)
        .map(|(t, s)| {
            let (lo, hi) = t.span();
            ((hi - lo) as f64 * s) as i64
        })
        .collect();
    let gap = args.gap.as_nanos() as i64;
    let total: i64 = spans.iter().sum::<i64>() + gap * (traces.len() as i64 - 1);
    let end = args.end.map_or_else(now_ns, |s| (s * 1e9) as i64);
    let mut start = end - total;
    let client = crate::send::client()?;
    for ((t, stretch), span) in traces.iter().zip(&stretches).zip(&spans) {
        let job = job_of(&args, t);
        let mut samples = place(t, args.every, *stretch, start, &job);
        samples.sort_by_key(|s| s.time_unix_nano);
        let resource = [("host.name".to_string(), args.host.clone())];
        for chunk in samples.chunks(args.batch) {
            let mut body = Vec::new();
            gpuwatch_agent::export::otlp::encode_collection_to(
                &mut body,
                chunk,
                &[],
                &[],
                &resource,
            );
            post(&client, &args, "application/x-protobuf", body).await?;
        }
        if let Some(body) = work_body(t, *stretch, start, &job, &args.host) {
            post(&client, &args, "application/json", body).await?;
        }
        let placed = Placed {
            trace: t.name.clone(),
            job_id: job.id.clone(),
            host: args.host.clone(),
            gpus: t.gpus.keys().cloned().collect(),
            samples: samples.len(),
            first_ns: samples.first().map_or(0, |s| s.time_unix_nano as i64),
            last_ns: samples.last().map_or(0, |s| s.time_unix_nano as i64),
            stretch: *stretch,
        };
        println!(
            "{}",
            serde_json::to_string(&placed).map_err(|e| format!("cannot print the summary: {e}"))?
        );
        start += span + gap;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn trace_with(times_s: &[i64], power: f64) -> Trace {
        let mut series = trace::Series::new();
        for t in times_s {
            let mut s = GpuSample::empty(0, "GPU-a".into(), 0, "m".into());
            s.power_watts = Some(power);
            s.energy_joules = Some(1000.0 + power * *t as f64);
            series.push((t * 1_000_000_000, s));
        }
        Trace {
            name: "t".into(),
            meta: trace::Meta::default(),
            gpus: [("GPU-a".to_string(), series)].into_iter().collect(),
            work: [(
                "job.samples",
                vec![(10_000_000_000, 5.0), (13_000_000_000, 65.0)],
            )]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn work_counters_go_as_the_jobs_cumulative_sums_on_the_stretched_timeline() {
        let t = trace_with(&[10, 11, 12, 13], 100.0);
        let job = JobLabels {
            id: "9210".into(),
            user: "u".into(),
            name: "n".into(),
            scheduler: "slurm".into(),
            k8s: None,
            extra: Default::default(),
        };
        let body = work_body(&t, 2.0, 1_000_000_000_000, &job, "h").expect("work");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let rm = &v["resourceMetrics"][0];
        assert_eq!(
            rm["resource"]["attributes"][0]["value"]["stringValue"],
            "9210"
        );
        let m = &rm["scopeMetrics"][0]["metrics"][0];
        assert_eq!(m["name"], "job.samples");
        assert_eq!(m["sum"]["aggregationTemporality"], 2);
        let p = &m["sum"]["dataPoints"];
        assert_eq!(p[0]["timeUnixNano"], "1000000000000");
        assert_eq!(p[1]["timeUnixNano"], "1006000000000");
        assert_eq!(p[1]["asDouble"], 65.0);
        let mut none = t.clone();
        none.work.clear();
        assert!(work_body(&none, 1.0, 0, &job, "h").is_none());
    }

    #[test]
    fn stretching_scales_time_and_rebuilds_energy_from_power() {
        let t = trace_with(&[10, 11, 12, 13], 100.0);
        let args = Cli::parse_from(["x", "--min-span", "30s", "t.csv"]).args;
        assert_eq!(stretch_of(&args, &t), 10.0);
        let job = job_of(&args, &t);
        assert_eq!((job.id.as_str(), job.user.as_str()), ("t", "replay"));
        let s = place(&t, 1, 10.0, 5_000_000_000, &job);
        let times: Vec<u64> = s.iter().map(|s| s.time_unix_nano).collect();
        assert_eq!(times, [5e9 as u64, 15e9 as u64, 25e9 as u64, 35e9 as u64]);
        let energy: Vec<f64> = s.iter().filter_map(|s| s.energy_joules).collect();
        assert_eq!(
            energy,
            [2000.0, 3000.0, 4000.0, 5000.0],
            "100 W over 10 s steps"
        );
        // Unstretched, the recorded counter is kept.
        let s = place(&t, 1, 1.0, 0, &job);
        assert_eq!(s[3].energy_joules, Some(2300.0));
        assert!(
            s.iter()
                .all(|s| s.job.as_ref().is_some_and(|j| j.scheduler == "slurm"))
        );
    }
}
