//! Job reports: how a job used its GPUs and what it cost, in the manner of Princeton's
//! `jobstats` (rules in docs/jobs.md).
//!
//! Data flow: the job's totals are the `jobs` view's rows of the job (its own query, run over the
//! job's GPUs only; one row per host, summed here), so the report's GPU-hours, idle GPU-hours,
//! energy, cost and idle cost are the `jobs` table's.
//! The per-GPU figures come from the same per-sample CTE the view is built on
//! ([`CostConfig::sample_ctes`]), grouped by GPU instead of by host, so the per-GPU seconds add up
//! to the totals. Events come from `gpu_events` inside each GPU's time in the job. [`advise`]
//! turns the figures into notes. The job id is always a quoted SQL literal ([`super::sql_str`]).

use arrow::array::RecordBatch;
use gpuwatch_query::{Error as QueryError, QueryEngine, Result as QueryResult};
use serde::{Deserialize, Serialize};

use super::{CostConfig, sql_str};

/// NVML clock-event-reason bits counted as throttling: SW power cap (0x4), HW slowdown (0x8),
/// SW thermal slowdown (0x20), HW thermal slowdown (0x40), HW power brake (0x80).
pub const THROTTLE_BITS: i64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// The thresholds of the advice rules (docs/jobs.md).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// A GPU idle for at least this share of its time in the job is "idle for most of the job".
    pub idle_gpu_share: f64,
    /// Mean utilisation at or above this ...
    pub busy_utilization: f64,
    /// ... with mean SM activity below this means tiny kernels.
    pub low_sm_active: f64,
    /// Peak memory used below this share of the GPU's memory (on a GPU not idle) is far below
    /// what was held.
    pub low_memory_share: f64,
    /// Throttled in at least this share of the samples.
    pub throttled_share: f64,
    /// Rules about how a job ran need at least this much GPU time (seconds) to speak.
    pub min_gpu_seconds: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            idle_gpu_share: 0.8,
            busy_utilization: 0.5,
            low_sm_active: 0.25,
            low_memory_share: 0.2,
            throttled_share: 0.1,
            min_gpu_seconds: 300.0,
        }
    }
}

/// One GPU of a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// Host name.
    pub host: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU index on the host.
    pub gpu_index: Option<i64>,
    /// GPU model.
    pub gpu_model: Option<String>,
    /// Samples of the job on this GPU.
    pub samples: i64,
    /// First sample of the job on this GPU, ns since the epoch.
    pub first_seen_ns: i64,
    /// Last sample, ns since the epoch.
    pub last_seen_ns: i64,
    /// GPU time held, seconds (the `jobs` formula).
    pub gpu_seconds: f64,
    /// Idle GPU time, seconds.
    pub idle_gpu_seconds: f64,
    /// Idle minutes.
    pub idle_minutes: f64,
    /// Energy, joules.
    pub energy_joules: f64,
    /// Cost, USD.
    pub cost_usd: f64,
    /// Mean `gpu_utilization` (0..1).
    pub mean_utilization: Option<f64>,
    /// Max `gpu_utilization`.
    pub max_utilization: Option<f64>,
    /// Mean `sm_active` (null where the GPU has no GPM).
    pub mean_sm_active: Option<f64>,
    /// Mean `tensor_active`.
    pub mean_tensor_active: Option<f64>,
    /// Mean `dram_active`.
    pub mean_dram_active: Option<f64>,
    /// Peak `memory_used_bytes`.
    pub peak_memory_used_bytes: Option<i64>,
    /// `memory_total_bytes` (the largest seen).
    pub memory_total_bytes: Option<i64>,
    /// Peak memory used / total.
    pub peak_memory_share: Option<f64>,
    /// Share of samples with a throttling bit set in `clock_event_reasons`.
    pub throttled_share: Option<f64>,
    /// Median seconds between samples.
    pub sample_interval_s: Option<f64>,
    /// XID events during the job.
    pub xid_events: i64,
    /// ECC events (single- and double-bit) during the job.
    pub ecc_events: i64,
}

/// A GPU event during the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    /// When, RFC 3339.
    pub time: String,
    /// Host.
    pub host: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// `xid`, `ecc_sbe`, `ecc_dbe`, ...
    pub kind: String,
    /// XID number, 0 for ECC.
    pub code: Option<i64>,
    /// Detail text.
    pub detail: Option<String>,
}

/// A note on how the job used its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// The rule's name (docs/jobs.md).
    pub rule: String,
    /// The figure that triggered it, e.g. `GPU 3 on n1 idle 97% of its time`.
    pub figure: String,
    /// What to do.
    pub advice: String,
}

/// A job's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    /// The job id.
    pub job_id: String,
    /// `slurm`, `kubernetes`, `static` or null.
    pub scheduler: Option<String>,
    /// The job's user.
    pub user: Option<String>,
    /// The job's name.
    pub name: Option<String>,
    /// Hosts the job ran on.
    pub hosts: Vec<String>,
    /// GPUs (distinct per host).
    pub gpus: i64,
    /// First sample, RFC 3339.
    pub first_seen: String,
    /// Last sample, RFC 3339.
    pub last_seen: String,
    /// First sample, ns.
    pub first_seen_ns: i64,
    /// Last sample, ns.
    pub last_seen_ns: i64,
    /// `running` when seen within the last two sample intervals, else `ended`.
    pub state: String,
    /// Median seconds between the job's samples.
    pub sample_interval_s: Option<f64>,
    /// GPU seconds (`jobs.gpu_seconds`, summed over hosts).
    pub gpu_seconds: f64,
    /// Idle GPU seconds (`jobs.idle_gpu_seconds`).
    pub idle_gpu_seconds: f64,
    /// GPU-hours.
    pub gpu_hours: f64,
    /// Idle GPU-hours.
    pub idle_gpu_hours: f64,
    /// Idle GPU-hours / GPU-hours (0 when no time).
    pub idle_share: f64,
    /// Energy, joules (`jobs.energy_joules`).
    pub energy_joules: f64,
    /// Energy, kWh.
    pub energy_kwh: f64,
    /// Cost, USD (`jobs.cost_usd`).
    pub cost_usd: f64,
    /// Idle cost, USD (`jobs.idle_cost_usd`).
    pub idle_cost_usd: f64,
    /// Mean utilisation over all the job's samples.
    pub mean_utilization: Option<f64>,
    /// Per GPU, by host and index.
    pub per_gpu: Vec<GpuReport>,
    /// XID and ECC events during the job.
    pub events: Vec<JobEvent>,
    /// Notes (docs/jobs.md).
    pub advice: Vec<Advice>,
}

/// One job in a list (`gpuwatch jobs`, `GET /api/v1/jobs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    /// The job id.
    pub job_id: String,
    /// Scheduler.
    pub scheduler: Option<String>,
    /// User.
    pub user: Option<String>,
    /// Name.
    pub name: Option<String>,
    /// Hosts.
    pub hosts: i64,
    /// GPUs.
    pub gpus: i64,
    /// First sample, RFC 3339.
    pub first_seen: String,
    /// Last sample, RFC 3339.
    pub last_seen: String,
    /// `running` or `ended`.
    pub state: String,
    /// GPU-hours (`jobs`).
    pub gpu_hours: f64,
    /// Idle GPU-hours (`jobs`).
    pub idle_gpu_hours: f64,
    /// Idle share.
    pub idle_share: f64,
    /// Mean GPU utilisation of the job's samples in the listed window.
    pub mean_utilization: Option<f64>,
    /// Mean SM activity of those samples.
    pub mean_sm_active: Option<f64>,
    /// Energy, kWh (`jobs`).
    pub energy_kwh: f64,
    /// Cost, USD (`jobs`).
    pub cost_usd: f64,
    /// Idle cost, USD (`jobs`).
    pub idle_cost_usd: f64,
}

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this user's jobs.
    pub user: Option<String>,
    /// Jobs last seen after this instant (ns since the epoch).
    pub since_ns: i64,
    /// Only running jobs.
    pub running_only: bool,
    /// At most this many (the most recent first).
    pub limit: usize,
}

type Row = serde_json::Map<String, serde_json::Value>;

fn to_rows(batches: &[RecordBatch]) -> QueryResult<Vec<Row>> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::ArrayWriter::new(&mut buf);
        for b in batches {
            w.write(b)
                .map_err(|e| QueryError::Internal(format!("cannot encode the report: {e}")))?;
        }
        w.finish()
            .map_err(|e| QueryError::Internal(format!("cannot encode the report: {e}")))?;
    }
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&buf)
        .map_err(|e| QueryError::Internal(format!("cannot read the report rows: {e}")))
}

async fn rows(engine: &QueryEngine, sql: &str) -> QueryResult<Vec<Row>> {
    let r = engine.query(sql).await?;
    to_rows(&r.batches)
}

fn f(r: &Row, k: &str) -> Option<f64> {
    r.get(k).and_then(serde_json::Value::as_f64)
}
fn i(r: &Row, k: &str) -> Option<i64> {
    r.get(k).and_then(serde_json::Value::as_i64)
}
fn s(r: &Row, k: &str) -> Option<String> {
    r.get(k).and_then(|v| v.as_str()).map(str::to_owned)
}

/// RFC 3339 with seconds.
pub fn rfc3339(ns: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_nanos(ns)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Running when the last sample is no older than two sample intervals.
pub fn state(now_ns: i64, last_seen_ns: i64, interval_s: Option<f64>) -> &'static str {
    let interval = interval_s.filter(|v| *v > 0.0).unwrap_or(60.0);
    let age = (now_ns - last_seen_ns) as f64 / 1e9;
    if age <= 2.0 * interval {
        "running"
    } else {
        "ended"
    }
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// The per-GPU query of a job (same sample CTE as the `jobs` view).
pub fn per_gpu_sql(cost: &CostConfig, job_id: &str) -> String {
    let id = sql_str(job_id);
    let ctes = cost.sample_ctes(
        ", gpu_index, sm_active, tensor_active, dram_active, memory_used_bytes, memory_total_bytes, clock_event_reasons",
        &format!("gpu_uuid IN (SELECT DISTINCT gpu_uuid FROM gpu_metrics WHERE job_id = {id})"),
        &format!("job_id = {id}"),
    );
    let energy_price = cost.energy_price_sql();
    format!(
        r#"{ctes}
SELECT host, gpu_uuid, max(gpu_index) AS gpu_index, max(gpu_model) AS gpu_model,
  max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name,
  count(*) AS samples, CAST(min(time) AS BIGINT) AS first_seen_ns, CAST(max(time) AS BIGINT) AS last_seen_ns,
  sum(secs) AS gpu_seconds, sum(CASE WHEN idle THEN secs ELSE 0.0 END) AS idle_gpu_seconds,
  sum(joules) AS energy_joules,
  sum(secs * price) / 3600.0 + sum(joules) * {energy_price} AS cost_usd,
  avg(gpu_utilization) AS mean_utilization, max(gpu_utilization) AS max_utilization,
  avg(sm_active) AS mean_sm_active, avg(tensor_active) AS mean_tensor_active, avg(dram_active) AS mean_dram_active,
  max(memory_used_bytes) AS peak_memory_used_bytes, max(memory_total_bytes) AS memory_total_bytes,
  avg(CASE WHEN clock_event_reasons IS NULL THEN NULL WHEN (clock_event_reasons & {THROTTLE_BITS}) <> 0 THEN 1.0 ELSE 0.0 END) AS throttled_share,
  median(CASE WHEN secs > 0 THEN secs END) AS sample_interval_s
FROM d GROUP BY host, gpu_uuid"#
    )
}

/// The job's rows of the `jobs` view, one per host: the view's own query, with its window
/// functions run over the job's GPUs only (whole GPUs, so every figure is the view's; the tests
/// compare with `SELECT ... FROM jobs WHERE job_id = ...`).
pub fn totals_sql(cost: &CostConfig, job_id: &str) -> String {
    let id = sql_str(job_id);
    format!(
        "SELECT job_id, scheduler, job_user, job_name, host, gpus, CAST(first_seen AS BIGINT) AS first_seen_ns, \
         CAST(last_seen AS BIGINT) AS last_seen_ns, gpu_seconds, idle_gpu_seconds, energy_joules, cost_usd, idle_cost_usd \
         FROM ({}) AS j ORDER BY host",
        cost.jobs_sql_where(
            &format!("gpu_uuid IN (SELECT DISTINCT gpu_uuid FROM gpu_metrics WHERE job_id = {id})"),
            &format!("job_id = {id}"),
        )
    )
}

/// The report of `job_id` as of `now_ns`, or `None` for a job with no samples.
pub async fn job_report(
    engine: &QueryEngine,
    cost: &CostConfig,
    job_id: &str,
    now_ns: i64,
) -> QueryResult<Option<JobReport>> {
    let totals = rows(engine, &totals_sql(cost, job_id)).await?;
    if totals.is_empty() {
        return Ok(None);
    }
    let per_gpu_rows = rows(engine, &per_gpu_sql(cost, job_id)).await?;

    let mut hosts: Vec<String> = totals.iter().filter_map(|r| s(r, "host")).collect();
    hosts.dedup();
    let sum = |k: &str| totals.iter().filter_map(|r| f(r, k)).sum::<f64>();
    let gpu_seconds = sum("gpu_seconds");
    let idle_gpu_seconds = sum("idle_gpu_seconds");
    let energy_joules = sum("energy_joules");
    let first_seen_ns = totals
        .iter()
        .filter_map(|r| i(r, "first_seen_ns"))
        .min()
        .unwrap_or_default();
    let last_seen_ns = totals
        .iter()
        .filter_map(|r| i(r, "last_seen_ns"))
        .max()
        .unwrap_or_default();

    let mut per_gpu: Vec<GpuReport> = per_gpu_rows
        .iter()
        .map(|r| {
            let used = i(r, "peak_memory_used_bytes");
            let total = i(r, "memory_total_bytes");
            let idle = f(r, "idle_gpu_seconds").unwrap_or_default();
            GpuReport {
                host: s(r, "host").unwrap_or_default(),
                gpu_uuid: s(r, "gpu_uuid").unwrap_or_default(),
                gpu_index: i(r, "gpu_index"),
                gpu_model: s(r, "gpu_model"),
                samples: i(r, "samples").unwrap_or_default(),
                first_seen_ns: i(r, "first_seen_ns").unwrap_or_default(),
                last_seen_ns: i(r, "last_seen_ns").unwrap_or_default(),
                gpu_seconds: f(r, "gpu_seconds").unwrap_or_default(),
                idle_gpu_seconds: idle,
                idle_minutes: idle / 60.0,
                energy_joules: f(r, "energy_joules").unwrap_or_default(),
                cost_usd: f(r, "cost_usd").unwrap_or_default(),
                mean_utilization: f(r, "mean_utilization"),
                max_utilization: f(r, "max_utilization"),
                mean_sm_active: f(r, "mean_sm_active"),
                mean_tensor_active: f(r, "mean_tensor_active"),
                mean_dram_active: f(r, "mean_dram_active"),
                peak_memory_used_bytes: used,
                memory_total_bytes: total,
                peak_memory_share: match (used, total) {
                    (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
                    _ => None,
                },
                throttled_share: f(r, "throttled_share"),
                sample_interval_s: f(r, "sample_interval_s"),
                xid_events: 0,
                ecc_events: 0,
            }
        })
        .collect();
    let interval = per_gpu
        .iter()
        .filter_map(|g| g.sample_interval_s)
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.max(v)))
        });

    // Events of the job's GPUs from its first sample to one interval after its last.
    let mut events = Vec::new();
    if !per_gpu.is_empty() {
        let slack = (interval.unwrap_or(60.0) * 1e9) as i64;
        let uuids: Vec<String> = per_gpu.iter().map(|g| sql_str(&g.gpu_uuid)).collect();
        let sql = format!(
            "SELECT CAST(time AS BIGINT) AS t, host, gpu_uuid, kind, code, detail FROM gpu_events \
             WHERE gpu_uuid IN ({}) AND time >= to_timestamp_nanos({}) AND time <= to_timestamp_nanos({}) ORDER BY time",
            uuids.join(", "),
            first_seen_ns,
            last_seen_ns.saturating_add(slack)
        );
        for r in rows(engine, &sql).await? {
            let t = i(&r, "t").unwrap_or_default();
            let host = s(&r, "host").unwrap_or_default();
            let uuid = s(&r, "gpu_uuid").unwrap_or_default();
            let kind = s(&r, "kind").unwrap_or_default();
            let Some(g) = per_gpu.iter_mut().find(|g| {
                g.host == host
                    && g.gpu_uuid == uuid
                    && t >= g.first_seen_ns
                    && t <= g.last_seen_ns.saturating_add(slack)
            }) else {
                continue;
            };
            match kind.as_str() {
                "xid" => g.xid_events += 1,
                k if k.starts_with("ecc") => g.ecc_events += 1,
                _ => {}
            }
            events.push(JobEvent {
                time: rfc3339(t),
                host,
                gpu_uuid: uuid,
                kind,
                code: i(&r, "code"),
                detail: s(&r, "detail"),
            });
        }
    }

    let samples: i64 = per_gpu.iter().map(|g| g.samples).sum();
    let mean_utilization = {
        let (mut w, mut n) = (0.0, 0i64);
        for g in &per_gpu {
            if let Some(u) = g.mean_utilization {
                w += u * g.samples as f64;
                n += g.samples;
            }
        }
        (n > 0 && samples > 0).then(|| w / n as f64)
    };
    per_gpu.sort_by(|a, b| {
        (a.host.as_str(), a.gpu_index, a.gpu_uuid.as_str()).cmp(&(
            b.host.as_str(),
            b.gpu_index,
            b.gpu_uuid.as_str(),
        ))
    });
    let mut report = JobReport {
        job_id: job_id.to_string(),
        scheduler: totals.iter().find_map(|r| s(r, "scheduler")),
        user: totals.iter().find_map(|r| s(r, "job_user")),
        name: totals.iter().find_map(|r| s(r, "job_name")),
        hosts,
        gpus: totals.iter().filter_map(|r| i(r, "gpus")).sum(),
        first_seen: rfc3339(first_seen_ns),
        last_seen: rfc3339(last_seen_ns),
        first_seen_ns,
        last_seen_ns,
        state: state(now_ns, last_seen_ns, interval).to_string(),
        sample_interval_s: interval,
        gpu_seconds,
        idle_gpu_seconds,
        gpu_hours: gpu_seconds / 3600.0,
        idle_gpu_hours: idle_gpu_seconds / 3600.0,
        idle_share: share(idle_gpu_seconds, gpu_seconds),
        energy_joules,
        energy_kwh: energy_joules / 3.6e6,
        cost_usd: sum("cost_usd"),
        idle_cost_usd: sum("idle_cost_usd"),
        mean_utilization,
        per_gpu,
        events,
        advice: Vec::new(),
    };
    report.advice = advise(&report, &Thresholds::default());
    Ok(Some(report))
}

fn pct(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn gpu_name(g: &GpuReport) -> String {
    match g.gpu_index {
        Some(i) => format!("GPU {i} on {}", g.host),
        None => format!("GPU {} on {}", g.gpu_uuid, g.host),
    }
}

fn gib(b: i64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The advice rules of docs/jobs.md, applied to a report's figures.
pub fn advise(r: &JobReport, t: &Thresholds) -> Vec<Advice> {
    let mut out = Vec::new();
    let long_enough = |g: &GpuReport| g.gpu_seconds >= t.min_gpu_seconds;

    // idle_gpus: GPUs idle for most of their time in the job.
    let idle: Vec<&GpuReport> = r
        .per_gpu
        .iter()
        .filter(|g| long_enough(g) && share(g.idle_gpu_seconds, g.gpu_seconds) >= t.idle_gpu_share)
        .collect();
    if !idle.is_empty() {
        let names: Vec<String> = idle
            .iter()
            .map(|g| {
                format!(
                    "{} idle {}",
                    gpu_name(g),
                    pct(share(g.idle_gpu_seconds, g.gpu_seconds))
                )
            })
            .collect();
        let advice = if idle.len() == r.per_gpu.len() {
            "the GPUs sat idle most of the job: check that the code runs on the GPU (e.g. the framework sees CUDA), or run it without a GPU".to_string()
        } else {
            format!(
                "request {} GPU{} instead of {}, or make the code use every GPU it asks for",
                r.per_gpu.len() - idle.len(),
                if r.per_gpu.len() - idle.len() == 1 {
                    ""
                } else {
                    "s"
                },
                r.per_gpu.len()
            )
        };
        out.push(Advice {
            rule: "idle_gpus".into(),
            figure: format!(
                "{} of {} GPUs idle for most of the job ({})",
                idle.len(),
                r.per_gpu.len(),
                names.join(", ")
            ),
            advice,
        });
    }

    for g in r.per_gpu.iter().filter(|g| long_enough(g)) {
        let idle_gpu = share(g.idle_gpu_seconds, g.gpu_seconds) >= t.idle_gpu_share;
        // tiny_kernels: busy by utilisation, but the SMs mostly wait.
        if let (Some(u), Some(sm)) = (g.mean_utilization, g.mean_sm_active)
            && u >= t.busy_utilization
            && sm < t.low_sm_active
        {
            out.push(Advice {
                rule: "tiny_kernels".into(),
                figure: format!(
                    "{}: utilisation {} but SM activity {}",
                    gpu_name(g),
                    pct(u),
                    pct(sm)
                ),
                advice: "utilisation over-reports (it counts time with any kernel running): batch more work per kernel (larger batches, fused kernels, CUDA graphs)".into(),
            });
        }
        // low_memory: far less memory used than the GPU holds.
        if let (Some(m), Some(used), Some(total)) = (
            g.peak_memory_share,
            g.peak_memory_used_bytes,
            g.memory_total_bytes,
        ) && !idle_gpu
            && m < t.low_memory_share
        {
            out.push(Advice {
                rule: "low_memory".into(),
                figure: format!(
                    "{}: peak memory {} of {} ({})",
                    gpu_name(g),
                    gib(used),
                    gib(total),
                    pct(m)
                ),
                advice: "the job used a small part of the GPU's memory: a smaller GPU or a MIG slice would do, or raise the batch size".into(),
            });
        }
        // throttled: clocks lowered for power or heat.
        if let Some(th) = g.throttled_share
            && th >= t.throttled_share
        {
            out.push(Advice {
                rule: "throttled".into(),
                figure: format!(
                    "{}: throttled (power cap, power brake or thermal) in {} of samples",
                    gpu_name(g),
                    pct(th)
                ),
                advice: "the GPU ran below its clocks for power or heat: tell the administrators (cooling, power limits); the job ran slower than it could".into(),
            });
        }
    }
    // xid / ecc: hardware or driver errors during the job (no minimum duration).
    for g in &r.per_gpu {
        if g.xid_events > 0 {
            let codes: Vec<String> = r
                .events
                .iter()
                .filter(|e| e.kind == "xid" && e.host == g.host && e.gpu_uuid == g.gpu_uuid)
                .filter_map(|e| e.code.map(|c| c.to_string()))
                .collect();
            out.push(Advice {
                rule: "xid".into(),
                figure: format!(
                    "{}: {} XID event{} (XID {})",
                    gpu_name(g),
                    g.xid_events,
                    if g.xid_events == 1 { "" } else { "s" },
                    codes.join(", ")
                ),
                advice: "a GPU error happened during the job: if it failed or ran slowly, resubmit it and tell the administrators the host and GPU".into(),
            });
        }
        if g.ecc_events > 0 {
            out.push(Advice {
                rule: "ecc".into(),
                figure: format!("{}: {} ECC event{}", gpu_name(g), g.ecc_events, if g.ecc_events == 1 { "" } else { "s" }),
                advice: "memory errors on the GPU during the job: check the job's results and tell the administrators".into(),
            });
        }
    }
    out
}

/// The jobs last seen after `filter.since_ns`, most recent first, with the `jobs` view's figures
/// summed over hosts.
pub async fn list_jobs(
    engine: &QueryEngine,
    filter: &ListFilter,
    now_ns: i64,
) -> QueryResult<Vec<JobSummary>> {
    let user = filter
        .user
        .as_deref()
        .map(|u| format!(" AND job_user = {}", sql_str(u)))
        .unwrap_or_default();
    let since = filter.since_ns;
    let limit = filter.limit.clamp(1, 100_000);
    let sql = format!(
        "WITH j AS (SELECT job_id, max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name, \
           count(DISTINCT host) AS hosts, sum(gpus) AS gpus, CAST(min(first_seen) AS BIGINT) AS first_seen_ns, \
           CAST(max(last_seen) AS BIGINT) AS last_seen_ns, sum(gpu_seconds) AS gpu_seconds, \
           sum(idle_gpu_seconds) AS idle_gpu_seconds, sum(energy_joules) AS energy_joules, sum(cost_usd) AS cost_usd, \
           sum(idle_cost_usd) AS idle_cost_usd \
         FROM jobs WHERE last_seen >= to_timestamp_nanos({since}){user} GROUP BY job_id), \
         m AS (SELECT job_id, avg(gpu_utilization) AS mean_utilization, avg(sm_active) AS mean_sm_active, \
           count(*) AS samples, count(DISTINCT host || ' ' || gpu_uuid) AS gpu_count, \
           CAST(max(time) AS BIGINT) - CAST(min(time) AS BIGINT) AS span_ns \
         FROM gpu_metrics WHERE job_id IS NOT NULL AND time >= to_timestamp_nanos({since}){user} GROUP BY job_id) \
         SELECT j.*, m.mean_utilization, m.mean_sm_active, m.samples, m.gpu_count, m.span_ns \
         FROM j LEFT JOIN m ON j.job_id = m.job_id ORDER BY j.last_seen_ns DESC, j.job_id LIMIT {limit}"
    );
    let mut out = Vec::new();
    for r in rows(engine, &sql).await? {
        let gpu_seconds = f(&r, "gpu_seconds").unwrap_or_default();
        let idle = f(&r, "idle_gpu_seconds").unwrap_or_default();
        let last = i(&r, "last_seen_ns").unwrap_or_default();
        // Mean spacing of one GPU's samples in the window.
        let interval = match (i(&r, "samples"), i(&r, "gpu_count"), i(&r, "span_ns")) {
            (Some(n), Some(g), Some(span)) if g > 0 && n / g > 1 => {
                Some(span as f64 / 1e9 / ((n / g) - 1) as f64)
            }
            _ => None,
        };
        let st = state(now_ns, last, interval);
        if filter.running_only && st != "running" {
            continue;
        }
        out.push(JobSummary {
            job_id: s(&r, "job_id").unwrap_or_default(),
            scheduler: s(&r, "scheduler"),
            user: s(&r, "job_user"),
            name: s(&r, "job_name"),
            hosts: i(&r, "hosts").unwrap_or_default(),
            gpus: i(&r, "gpus").unwrap_or_default(),
            first_seen: rfc3339(i(&r, "first_seen_ns").unwrap_or_default()),
            last_seen: rfc3339(last),
            state: st.to_string(),
            gpu_hours: gpu_seconds / 3600.0,
            idle_gpu_hours: idle / 3600.0,
            idle_share: share(idle, gpu_seconds),
            mean_utilization: f(&r, "mean_utilization"),
            mean_sm_active: f(&r, "mean_sm_active"),
            energy_kwh: f(&r, "energy_joules").unwrap_or_default() / 3.6e6,
            cost_usd: f(&r, "cost_usd").unwrap_or_default(),
            idle_cost_usd: f(&r, "idle_cost_usd").unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The report as text, the way `gpuwatch job` prints it.
pub fn render_text(r: &JobReport) -> String {
    let mut o = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let p = |v: Option<f64>| v.map_or_else(|| "-".to_string(), pct);
    o.push_str(&format!(
        "Job {}  ({})\n  user {}  name {}  scheduler {}\n  hosts {}  GPUs {}\n  first seen {}  last seen {}\n\n",
        r.job_id,
        r.state,
        opt(&r.user),
        opt(&r.name),
        opt(&r.scheduler),
        r.hosts.join(","),
        r.gpus,
        r.first_seen,
        r.last_seen
    ));
    o.push_str(&format!(
        "  GPU-hours {:.3}   idle GPU-hours {:.3} ({})   energy {:.3} kWh\n  cost USD {:.2}   idle cost USD {:.2}   mean utilisation {}\n\n",
        r.gpu_hours,
        r.idle_gpu_hours,
        pct(r.idle_share),
        r.energy_kwh,
        r.cost_usd,
        r.idle_cost_usd,
        p(r.mean_utilization)
    ));
    o.push_str(
        "  host            gpu  util(mean/max)  SM    tensor  DRAM  memory peak/total       idle min  throttled  XID  ECC\n",
    );
    for g in &r.per_gpu {
        let mem = match (g.peak_memory_used_bytes, g.memory_total_bytes) {
            (Some(u), Some(t)) => format!("{} / {}", gib(u), gib(t)),
            (Some(u), None) => gib(u),
            _ => "-".into(),
        };
        o.push_str(&format!(
            "  {:<15} {:>3}  {:>5} / {:<5}   {:>5} {:>6}  {:>5} {:<22} {:>8.1}  {:>9}  {:>3}  {:>3}\n",
            g.host,
            g.gpu_index.map_or_else(|| "-".into(), |i| i.to_string()),
            p(g.mean_utilization),
            p(g.max_utilization),
            p(g.mean_sm_active),
            p(g.mean_tensor_active),
            p(g.mean_dram_active),
            mem,
            g.idle_minutes,
            p(g.throttled_share),
            g.xid_events,
            g.ecc_events
        ));
    }
    if !r.events.is_empty() {
        o.push_str("\n  events:\n");
        for e in &r.events {
            o.push_str(&format!(
                "    {} {} {} {} {}\n",
                e.time,
                e.host,
                e.gpu_uuid,
                e.kind,
                e.detail
                    .clone()
                    .or_else(|| e.code.map(|c| c.to_string()))
                    .unwrap_or_default()
            ));
        }
    }
    o.push('\n');
    if r.advice.is_empty() {
        o.push_str("  notes: none (no rule of docs/jobs.md matched)\n");
    } else {
        o.push_str("  notes:\n");
        for a in &r.advice {
            o.push_str(&format!("  * [{}] {}: {}\n", a.rule, a.figure, a.advice));
        }
    }
    o
}

/// The job list as an aligned table, the way `gpuwatch jobs` prints it.
pub fn render_list(jobs: &[JobSummary]) -> String {
    let mut o = String::from(
        "job_id           user         name                 state    gpus  GPU-h     idle   util  SM     kWh       USD       idle USD  last seen\n",
    );
    let p = |v: Option<f64>| v.map_or_else(|| "-".to_string(), pct);
    let cut = |s: &Option<String>, n: usize| -> String {
        let t = s.clone().unwrap_or_else(|| "-".into());
        t.chars().take(n).collect()
    };
    for j in jobs {
        o.push_str(&format!(
            "{:<16} {:<12} {:<20} {:<8} {:>4}  {:>8.3} {:>5}  {:>5} {:>5}  {:>8.3}  {:>8.2}  {:>8.2}  {}\n",
            j.job_id.chars().take(16).collect::<String>(),
            cut(&j.user, 12),
            cut(&j.name, 20),
            j.state,
            j.gpus,
            j.gpu_hours,
            pct(j.idle_share),
            p(j.mean_utilization),
            p(j.mean_sm_active),
            j.energy_kwh,
            j.cost_usd,
            j.idle_cost_usd,
            j.last_seen
        ));
    }
    o.push_str(&format!(
        "({} job{})\n",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    ));
    o
}

#[cfg(test)]
mod tests;
