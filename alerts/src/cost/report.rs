//! Job reports: how a job used its GPUs, what limited them, and what it cost, in the manner of
//! Princeton's `jobstats` (rules in docs/jobs.md).
//!
//! Data flow ([`gather`]): each GPU's use of the job comes as mergeable parts ([`parts`]) from
//! the hours the job ledger folded ([`super::ledger`]) plus one query ([`sql`]) over the job's
//! raw samples after them, through the per-sample CTE the `jobs` view is built on
//! ([`CostConfig::sample_ctes`]). Each sample's interval, energy delta, price and class are the
//! view's, so the job's totals (the sums over its GPUs) are the `jobs` table's GPU-hours, idle
//! GPU-hours, energy, cost, idle cost and limiter; with them each GPU's seconds per limiter
//! class ([`super::limiter`]), the figures the notes quote, and its roofline ([`roofline`]).
//! Events come from `gpu_events` inside each GPU's time in the job.
//! [`advise`] turns the figures into notes, with the `[jobs.advice]` thresholds; the work the
//! job counted comes from its counters in `metrics` ([`super::work`]). The job id is
//! always a quoted SQL literal ([`super::sql_str`]).

mod advise;
pub mod charge;
mod gather;
pub mod parts;
pub mod processes;
mod render;
pub mod roofline;
pub mod sql;

use std::collections::{BTreeMap, HashMap};

use arrow::array::RecordBatch;
use gpuwatch_query::{Error as QueryError, QueryEngine, Result as QueryResult};
use serde::{Deserialize, Serialize};

use super::limiter::{self, LIMITERS};
use super::{CostConfig, JobsConfig, WorkConfig, sql_str};
pub use advise::advise;
pub use charge::JobCharge;
#[cfg(test)]
pub(crate) use gather::ledger_of;
pub use parts::GpuUsage;
pub use render::{render_list, render_text};
pub use roofline::{RoofUnit, Roofline};
pub use sql::per_gpu_sql;

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
    /// The part of the cost spent idle, USD.
    #[serde(default)]
    pub idle_cost_usd: f64,
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
    /// Share of samples slowed for a reason the job cannot control (HW slowdown 0x8, SW
    /// thermal 0x20, HW thermal 0x40, HW power brake 0x80); the SW power cap is not counted.
    pub throttled_share: Option<f64>,
    /// Share of samples per throttling reason, by name (those seen only).
    #[serde(default)]
    pub throttle_reasons: BTreeMap<String, f64>,
    /// Share of samples at the SW power cap (0x4): the normal state of a GPU working flat out.
    #[serde(default)]
    pub power_capped_share: Option<f64>,
    /// Mean SM clock of those samples, MHz.
    #[serde(default)]
    pub power_capped_sm_clock_mhz: Option<f64>,
    /// The GPU's maximum SM clock, MHz (the agent's reading, else the peaks table's).
    #[serde(default)]
    pub sm_clock_max_mhz: Option<f64>,
    /// Median seconds between samples.
    pub sample_interval_s: Option<f64>,
    /// XID events during the job.
    pub xid_events: i64,
    /// ECC events (single- and double-bit) during the job.
    pub ecc_events: i64,
    /// What limited the GPU: the class with the most GPU-seconds (docs/jobs.md).
    #[serde(default)]
    pub limiter: Option<String>,
    /// GPU-seconds per limiter class (every class, zeros included).
    #[serde(default)]
    pub limiter_seconds: BTreeMap<String, f64>,
    /// Per class, the time-weighted mean of the figure it is judged by during that class's
    /// seconds: the unit's activity (tensor beyond FP16, FP16, FP32, FP64, DRAM), the busier
    /// PCIe direction in bytes/s (`host_transfer`), the share of time kernels ran (`input`,
    /// `idle`, `unknown`) or how full they kept the SMs (`latency`).
    #[serde(default)]
    pub limiter_figures: BTreeMap<String, f64>,
    /// Time-weighted mean SM activity over the GPU's non-idle samples.
    #[serde(default)]
    pub busy_sm_active: Option<f64>,
    /// Time-weighted mean utilisation over the GPU's non-idle samples.
    #[serde(default)]
    pub busy_utilization: Option<f64>,
    /// Counters no sample of the job on this GPU carries (e.g. `sm_active` on a GPU without
    /// GPM or DCGM profiling: its limiter is then `unknown` or only `idle`/`host_transfer`).
    #[serde(default)]
    pub missing_counters: Vec<String>,
    /// Achieved share of each unit's peak over the job (docs/jobs.md, "Roofline").
    #[serde(default)]
    pub roofline: Roofline,
}

impl GpuReport {
    /// Seconds in classes other than `idle`.
    pub fn busy_seconds(&self) -> f64 {
        self.limiter_seconds
            .iter()
            .filter(|(c, _)| c.as_str() != "idle")
            .map(|(_, s)| s)
            .sum()
    }

    /// The share of the non-idle seconds spent in `class`.
    pub fn busy_share(&self, class: &str) -> f64 {
        share(
            self.limiter_seconds.get(class).copied().unwrap_or(0.0),
            self.busy_seconds(),
        )
    }
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// The rule's id (docs/jobs.md): scripts and alert rules match on it.
    pub rule: String,
    /// The figure that triggered it, in words, e.g. `GPU 3 on n1 idle 97% of its time`.
    pub figure: String,
    /// The cause and what to do.
    pub advice: String,
    /// The GPU the note is about; null for a note about several GPUs (`idle_gpus`).
    #[serde(default)]
    pub host: Option<String>,
    /// Its UUID.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// Its index.
    #[serde(default)]
    pub gpu_index: Option<i64>,
    /// The figure that triggered the rule, in `unit`.
    #[serde(default)]
    pub value: Option<f64>,
    /// The threshold it reached (`[jobs.advice]`), in `unit`.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// `ratio` (0..1) or `events`.
    #[serde(default)]
    pub unit: String,
    /// True for a note that asks nothing of the job (`power_capped`).
    #[serde(default)]
    pub informational: bool,
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
    /// What limited the job: the class with the most GPU-seconds over its GPUs.
    #[serde(default)]
    pub limiter: Option<String>,
    /// GPU-seconds per limiter class over the job's GPUs.
    #[serde(default)]
    pub limiter_seconds: BTreeMap<String, f64>,
    /// Work the job counted (`job.samples`, … docs/cost.md), or null when it reported none.
    #[serde(default)]
    pub work: Option<JobWork>,
    /// Account, partition, QOS, array ids, namespace, pod labels and time limit.
    #[serde(default)]
    pub charge: JobCharge,
    /// Per GPU, by host and index.
    pub per_gpu: Vec<GpuReport>,
    /// XID and ECC events during the job.
    pub events: Vec<JobEvent>,
    /// The job's GPU processes, by host, GPU and pid (at most [`processes::MAX_PROCESSES`]).
    #[serde(default)]
    pub processes: Vec<processes::JobProcess>,
    /// More processes than listed.
    #[serde(default)]
    pub processes_left_out: bool,
    /// Notes (docs/jobs.md).
    pub advice: Vec<Advice>,
}

/// The work a job counted and what it cost per unit (docs/cost.md, "Work done").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobWork {
    /// The counter: `job.samples`, `job.tokens`, `job.steps` or one of `[jobs.work]`.
    pub unit: String,
    /// Units done over the job.
    pub done: f64,
    /// Units per second of the job's wall time (first to last sample).
    pub per_second: Option<f64>,
    /// Units per GPU-hour.
    pub per_gpu_hour: Option<f64>,
    /// The job's cost per million units, USD.
    pub usd_per_million_units: Option<f64>,
}

/// The work `job_id` counted, priced with the job's GPU-seconds and cost.
async fn job_work(
    engine: &QueryEngine,
    work: &WorkConfig,
    job_id: &str,
    (wall_s, gpu_seconds, cost_usd): (f64, f64, f64),
) -> QueryResult<Option<JobWork>> {
    let sql = format!(
        "WITH {} SELECT work_unit, work FROM w",
        work.work_ctes(&format!("job_id = {}", sql_str(job_id)))
    );
    let Some(r) = rows(engine, &sql).await?.into_iter().next() else {
        return Ok(None);
    };
    let (Some(unit), Some(done)) = (s(&r, "work_unit"), f(&r, "work")) else {
        return Ok(None);
    };
    Ok(Some(JobWork {
        unit,
        done,
        per_second: (wall_s > 0.0).then(|| done / wall_s),
        per_gpu_hour: (gpu_seconds > 0.0).then(|| done / (gpu_seconds / 3600.0)),
        usd_per_million_units: (done > 0.0).then(|| cost_usd / done * 1e6),
    }))
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
    /// The `jobs` limiter of the job's host with the most GPU-seconds.
    #[serde(default)]
    pub limiter: Option<String>,
}

/// One job of a list from its row of [`list_jobs`]'s query.
fn summary_from_row(r: &Row, now_ns: i64) -> JobSummary {
    let gpu_seconds = f(r, "gpu_seconds").unwrap_or_default();
    let idle = f(r, "idle_gpu_seconds").unwrap_or_default();
    let last = i(r, "last_seen_ns").unwrap_or_default();
    // Mean spacing of one GPU's samples in the window.
    let interval = match (i(r, "samples"), i(r, "gpu_count"), i(r, "span_ns")) {
        (Some(n), Some(g), Some(span)) if g > 0 && n / g > 1 => {
            Some(span as f64 / 1e9 / ((n / g) - 1) as f64)
        }
        _ => None,
    };
    JobSummary {
        job_id: s(r, "job_id").unwrap_or_default(),
        scheduler: s(r, "scheduler"),
        user: s(r, "job_user"),
        name: s(r, "job_name"),
        hosts: i(r, "hosts").unwrap_or_default(),
        gpus: i(r, "gpus").unwrap_or_default(),
        first_seen: rfc3339(i(r, "first_seen_ns").unwrap_or_default()),
        last_seen: rfc3339(last),
        state: state(now_ns, last, interval).to_string(),
        gpu_hours: gpu_seconds / 3600.0,
        idle_gpu_hours: idle / 3600.0,
        idle_share: share(idle, gpu_seconds),
        mean_utilization: f(r, "mean_utilization"),
        mean_sm_active: f(r, "mean_sm_active"),
        energy_kwh: f(r, "energy_joules").unwrap_or_default() / 3.6e6,
        cost_usd: f(r, "cost_usd").unwrap_or_default(),
        idle_cost_usd: f(r, "idle_cost_usd").unwrap_or_default(),
        limiter: s(r, "limiter"),
    }
}

/// The most jobs one list answers (`limit`); a wider question pages by time (`since`).
pub const MAX_LIST_LIMIT: usize = 10_000;

/// A page of jobs: the most recent first, and whether more jobs matched than were listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobList {
    /// The jobs listed, at most the filter's `limit`.
    pub jobs: Vec<JobSummary>,
    /// More jobs matched the filter than `limit`.
    pub truncated: bool,
    /// Where the next page starts when `truncated`: the last job's last-seen instant (ns) and
    /// id, for [`ListFilter::until`].
    pub next: Option<(i64, String)>,
}

/// A running job was seen at most this long ago (two sample intervals of an agent sampling every
/// 15 minutes): the list of running jobs reads only this window, however long `since` is.
const RUNNING_WINDOW_NS: i64 = 30 * 60 * 1_000_000_000;

/// Which jobs to list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this user's jobs.
    pub user: Option<String>,
    /// Jobs last seen after this instant (ns since the epoch).
    pub since_ns: i64,
    /// A page after the first: jobs listed after this one, last seen before this instant (ns)
    /// or at it with a larger id — the list's order, most recent first ([`JobList::next`]).
    pub until: Option<(i64, String)>,
    /// Only running jobs.
    pub running_only: bool,
    /// At most this many (the most recent first), 1 to [`MAX_LIST_LIMIT`].
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
    r.get(k)
        .and_then(serde_json::Value::as_f64)
        .filter(|v| v.is_finite())
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

/// Counts the XID and ECC events of each GPU inside its time in the job (from its first sample
/// to `slack` ns after its last) and returns them.
async fn job_events(
    engine: &QueryEngine,
    per_gpu: &mut [GpuReport],
    first_seen_ns: i64,
    last_seen_ns: i64,
    slack: i64,
) -> QueryResult<Vec<JobEvent>> {
    let mut events = Vec::new();
    if per_gpu.is_empty() {
        return Ok(events);
    }
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
    Ok(events)
}

/// The samples-weighted mean utilisation of the GPUs.
fn mean_utilization(per_gpu: &[GpuReport]) -> Option<f64> {
    let (mut w, mut n) = (0.0, 0i64);
    for g in per_gpu {
        if let Some(u) = g.mean_utilization {
            w += u * g.samples as f64;
            n += g.samples;
        }
    }
    (n > 0).then(|| w / n as f64)
}

/// GPU-seconds per class summed over the GPUs (every class present).
fn sum_limiter_seconds(per_gpu: &[GpuReport]) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = LIMITERS.iter().map(|c| (c.to_string(), 0.0)).collect();
    for g in per_gpu {
        for (c, v) in &g.limiter_seconds {
            *out.entry(c.clone()).or_default() += v;
        }
    }
    out
}

/// The job's first and last sample over its GPUs (ns) and its longest sample interval.
fn span_of(per_gpu: &[GpuReport]) -> (i64, i64, Option<f64>) {
    let first = per_gpu.iter().map(|g| g.first_seen_ns).min();
    let last = per_gpu.iter().map(|g| g.last_seen_ns).max();
    let interval = per_gpu
        .iter()
        .filter_map(|g| g.sample_interval_s)
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.max(v)))
        });
    (
        first.unwrap_or_default(),
        last.unwrap_or_default(),
        interval,
    )
}

/// The report of `job_id` as of `now_ns`, or `None` for a job with no samples. The totals are
/// the sums of the per-GPU figures, which are the `jobs` view's per sample (docs/jobs.md).
pub async fn job_report(
    engine: &QueryEngine,
    cost: &CostConfig,
    jobs: &JobsConfig,
    job_id: &str,
    now_ns: i64,
) -> QueryResult<Option<JobReport>> {
    let advice = &jobs.advice;
    let usages = gather::job_usage(engine, cost, advice, job_id).await?;
    if usages.is_empty() {
        return Ok(None);
    }
    let mut per_gpu: Vec<GpuReport> = usages.iter().map(|u| gather::gpu_report(u, cost)).collect();
    per_gpu.sort_by(|a, b| {
        (a.host.as_str(), a.gpu_index, a.gpu_uuid.as_str()).cmp(&(
            b.host.as_str(),
            b.gpu_index,
            b.gpu_uuid.as_str(),
        ))
    });
    let (first_seen_ns, last_seen_ns, interval) = span_of(&per_gpu);
    let slack = (interval.unwrap_or(60.0) * 1e9) as i64;
    let events = job_events(engine, &mut per_gpu, first_seen_ns, last_seen_ns, slack).await?;
    let mut hosts: Vec<String> = per_gpu.iter().map(|g| g.host.clone()).collect();
    hosts.dedup();
    let sum = |f: fn(&GpuReport) -> f64| per_gpu.iter().map(f).sum::<f64>();
    let gpu_seconds = sum(|g| g.gpu_seconds);
    let idle_gpu_seconds = sum(|g| g.idle_gpu_seconds);
    let energy_joules = sum(|g| g.energy_joules);
    let labels =
        |k: fn(&GpuUsage) -> &Option<String>| usages.iter().filter_map(|u| k(u).clone()).max();
    let limiter_seconds = sum_limiter_seconds(&per_gpu);
    let cost_usd = sum(|g| g.cost_usd);
    let wall_s = (last_seen_ns - first_seen_ns) as f64 / 1e9;
    let work = job_work(engine, &jobs.work, job_id, (wall_s, gpu_seconds, cost_usd)).await?;
    let (processes, processes_left_out) = processes::job_processes(engine, job_id).await?;
    let mut report = JobReport {
        job_id: job_id.to_string(),
        scheduler: labels(|u| &u.scheduler),
        user: labels(|u| &u.job_user),
        name: labels(|u| &u.job_name),
        hosts,
        gpus: per_gpu.len() as i64,
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
        cost_usd,
        idle_cost_usd: sum(|g| g.idle_cost_usd),
        mean_utilization: mean_utilization(&per_gpu),
        limiter: limiter::argmax(&limiter_seconds),
        limiter_seconds,
        work,
        charge: JobCharge::of(&usages, wall_s),
        per_gpu,
        events,
        processes,
        processes_left_out,
        advice: Vec::new(),
    };
    report.advice = advise(&report, advice);
    Ok(Some(report))
}

/// The jobs last seen after `filter.since_ns` (for running jobs, within the last
/// [`RUNNING_WINDOW_NS`] too), most recent first, with the `jobs` view's figures summed over
/// hosts; at most `filter.limit` of them (clamped to 1..=[`MAX_LIST_LIMIT`]), with `truncated`
/// set when more matched.
pub async fn list_jobs(
    engine: &QueryEngine,
    filter: &ListFilter,
    now_ns: i64,
) -> QueryResult<JobList> {
    let user = filter
        .user
        .as_deref()
        .map(|u| format!(" AND job_user = {}", sql_str(u)))
        .unwrap_or_default();
    let since = if filter.running_only {
        filter
            .since_ns
            .max(now_ns.saturating_sub(RUNNING_WINDOW_NS))
    } else {
        filter.since_ns
    };
    let limit = filter.limit.clamp(1, MAX_LIST_LIMIT);
    // One row more than asked tells whether the list was cut; running jobs are picked after the
    // query (their state needs their sample interval), inside the short running window.
    let fetch = if filter.running_only {
        MAX_LIST_LIMIT + 1
    } else {
        limit + 1
    };
    let watermark = match gather::ledger_of(engine).await {
        Some(l) => l.snapshot().watermark,
        None => None,
    };
    // `jobs` has one row per job and host, so `count(host)` counts the hosts (a DISTINCT beside
    // the ordered `first_value` doubles the aggregate's time).
    // A later page: jobs after the cursor in the list's order (on the job's sums: a filter on
    // its rows would change a job's last-seen instant, and with it its place in the order).
    let page = match &filter.until {
        Some((t, id)) => format!(
            " HAVING max(last_seen) < to_timestamp_nanos({t}) \
             OR (max(last_seen) = to_timestamp_nanos({t}) AND job_id > {})",
            sql_str(id)
        ),
        None => String::new(),
    };
    let sql = format!(
        "SELECT job_id, max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name, \
           count(host) AS hosts, sum(gpus) AS gpus, CAST(min(first_seen) AS BIGINT) AS first_seen_ns, \
           CAST(max(last_seen) AS BIGINT) AS last_seen_ns, sum(gpu_seconds) AS gpu_seconds, \
           sum(idle_gpu_seconds) AS idle_gpu_seconds, sum(energy_joules) AS energy_joules, sum(cost_usd) AS cost_usd, \
           sum(idle_cost_usd) AS idle_cost_usd, first_value(limiter ORDER BY gpu_seconds DESC) AS limiter \
         FROM jobs WHERE last_seen >= to_timestamp_nanos({since}){user} GROUP BY job_id{page} \
         ORDER BY last_seen_ns DESC, job_id LIMIT {fetch}"
    );
    let mut listed = rows(engine, &sql).await?;
    with_means(engine, &mut listed, since, &user, watermark).await?;
    let mut out = Vec::new();
    for r in listed {
        let job = summary_from_row(&r, now_ns);
        if !filter.running_only || job.state == "running" {
            out.push((i(&r, "last_seen_ns").unwrap_or_default(), job));
        }
    }
    let truncated = out.len() > limit;
    out.truncate(limit);
    let next = match out.last() {
        Some((t, job)) if truncated => Some((*t, job.job_id.clone())),
        _ => None,
    };
    Ok(JobList {
        jobs: out.into_iter().map(|(_, j)| j).collect(),
        truncated,
        next,
    })
}

/// Adds to each listed job (`listed`, rows of [`list_jobs`]) its mean utilisation and SM
/// activity, samples, GPUs and span since `since`: from the job ledger's rows before
/// `watermark` (the report's parts: sums and counts) and the raw samples after it, so that a
/// list over a month reads ledger rows, not a month of raw samples; only the listed jobs' rows,
/// from the hour of the earliest first sample among them.
async fn with_means(
    engine: &QueryEngine,
    listed: &mut [Row],
    since: i64,
    user: &str,
    watermark: Option<i64>,
) -> QueryResult<()> {
    let ids: Vec<String> = listed
        .iter()
        .filter_map(|r| s(r, "job_id").map(|j| sql_str(&j)))
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let first = listed
        .iter()
        .filter_map(|r| i(r, "first_seen_ns"))
        .min()
        .unwrap_or(since)
        .max(since);
    let sql = list_means_sql(
        first,
        &format!("{user} AND job_id IN ({})", ids.join(", ")),
        watermark,
    );
    let mut means: HashMap<String, Row> = HashMap::new();
    for m in rows(engine, &sql).await? {
        if let Some(id) = s(&m, "job_id") {
            means.insert(id, m);
        }
    }
    for r in listed.iter_mut() {
        if let Some(m) = s(r, "job_id").and_then(|id| means.remove(&id)) {
            r.extend(m.into_iter().filter(|(k, _)| k != "job_id"));
        }
    }
    Ok(())
}

/// The means [`with_means`] adds, per job, of the rows seen since `since` that match `filter`
/// (` AND …`).
fn list_means_sql(since: i64, filter: &str, watermark: Option<i64>) -> String {
    let (ledger, raw_from) = match watermark {
        Some(w) => (
            format!(
                "SELECT job_id, part_utilization_sum AS u_sum, part_utilization_n AS u_n, \
                   part_sm_active_sum AS s_sum, part_sm_active_n AS s_n, samples AS n, \
                   host || ' ' || gpu_uuid AS g, CAST(first_seen AS BIGINT) AS t0, CAST(last_seen AS BIGINT) AS t1 \
                 FROM job_ledger WHERE time >= to_timestamp_nanos({hour}) AND time < to_timestamp_nanos({w}) \
                   AND last_seen >= to_timestamp_nanos({since}){filter} UNION ALL ",
                // A row's `time` is its hour's start: rows seen since `since` are from its hour on.
                hour = since.div_euclid(3_600_000_000_000) * 3_600_000_000_000,
            ),
            since.max(w),
        ),
        None => (String::new(), since),
    };
    format!(
        "SELECT job_id, sum(u_sum) / CASE WHEN sum(u_n) > 0 THEN sum(u_n) END AS mean_utilization, \
           sum(s_sum) / CASE WHEN sum(s_n) > 0 THEN sum(s_n) END AS mean_sm_active, \
           CAST(sum(n) AS BIGINT) AS samples, count(DISTINCT g) AS gpu_count, max(t1) - min(t0) AS span_ns FROM ( \
         {ledger}SELECT job_id, gpu_utilization AS u_sum, CASE WHEN gpu_utilization IS NULL THEN 0.0 ELSE 1.0 END AS u_n, \
           sm_active AS s_sum, CASE WHEN sm_active IS NULL THEN 0.0 ELSE 1.0 END AS s_n, 1 AS n, \
           host || ' ' || gpu_uuid AS g, CAST(time AS BIGINT) AS t0, CAST(time AS BIGINT) AS t1 \
         FROM gpu_metrics WHERE job_id IS NOT NULL AND time >= to_timestamp_nanos({raw_from}){filter}) x \
         GROUP BY job_id"
    )
}

#[cfg(test)]
mod tests;
