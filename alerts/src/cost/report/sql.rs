//! The job report's queries over raw samples, at or after the job ledger's watermark (every
//! sample when nothing is folded), in three steps that keep each one small on a store of many
//! GPUs and many days:
//!
//! 1. [`job_gpus_sql`]: the GPUs the job ran on, with its first and last sample on each.
//! 2. [`previous_sample_sql`]: each GPU's sample before the job's first one on it (looked for
//!    in the hour before, then further back for the GPUs not found; before the watermark the
//!    ledger knows it): the sample the `jobs` formula takes the first interval and energy delta
//!    from.
//! 3. [`per_gpu_sql`]: one row per GPU from the `jobs` view's per-sample CTE
//!    ([`CostConfig::sample_ctes`]) over those GPUs from that sample to the job's last, so every
//!    figure is the view's: the `jobs` sums, the limiter's seconds per class and the parts
//!    ([`parts`]) the report's figures are ratios of.
//!
//! "Time-weighted" means each sample counts for its `secs` (the `jobs` formula's `dt`), like the
//! limiter: `Σ secs × v / Σ secs` over the samples where `v` is read.

use super::super::limiter;
use super::super::{AdviceConfig, CostConfig, charge_list_sql, charge_max_sql, sql_str};
use super::parts;

/// NVML clock-event-reason bits the job is never blamed for: SW power cap (0x4).
pub const POWER_CAP_BIT: i64 = 0x4;
/// Bits that slow a GPU for reasons the job cannot control: HW slowdown (0x8), SW thermal
/// slowdown (0x20), HW thermal slowdown (0x40), HW power brake (0x80).
pub const THROTTLE_BITS: [(i64, &str); 4] = [
    (0x8, "HW slowdown"),
    (0x20, "SW thermal slowdown"),
    (0x40, "HW thermal slowdown"),
    (0x80, "HW power brake"),
];

/// Every bit of [`THROTTLE_BITS`].
pub fn throttle_mask() -> i64 {
    THROTTLE_BITS.iter().fold(0, |m, (b, _)| m | b)
}

/// Columns the report reads besides the `jobs` CTE's own.
pub(crate) const EXTRA: &[&str] = &[
    "gpu_index",
    "sm_active",
    "tensor_active",
    "fp16_active",
    "fp32_active",
    "fp64_active",
    "dram_active",
    "memory_used_bytes",
    "memory_total_bytes",
    "clock_event_reasons",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "pcie_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "pcie_link_gen",
    "pcie_link_width",
    "nvlink_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
];

/// Counters whose absence the report names (`missing_counters`), with the SQL that reads them.
pub const COUNTERS: &[(&str, &str)] = &[
    ("gpu_utilization", "gpu_utilization"),
    ("sm_active", "sm_active"),
    ("tensor_active", "tensor_active"),
    ("fp16_active", "fp16_active"),
    ("fp32_active", "fp32_active"),
    ("fp64_active", "fp64_active"),
    ("dram_active", "dram_active"),
    (
        "pcie_bytes_per_second",
        "greatest(pcie_rx_bytes_per_second, pcie_tx_bytes_per_second)",
    ),
    (
        "nvlink_bytes_per_second",
        "greatest(nvlink_rx_bytes_per_second, nvlink_tx_bytes_per_second)",
    ),
    ("sm_clock_mhz", "sm_clock_mhz"),
    ("sm_clock_max_mhz", "sm_clock_max_mhz"),
    ("pcie_link", "pcie_link_gen * pcie_link_width"),
    ("clock_event_reasons", "clock_event_reasons"),
];

/// One GPU of a job and the time span its query reads: from the sample before the job's first
/// on it (or that first sample) to the job's last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpan {
    /// Host.
    pub host: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// First sample of the job on the GPU, ns.
    pub first_ns: i64,
    /// Last sample of the job on the GPU, ns.
    pub last_ns: i64,
    /// The GPU's sample before `first_ns`, if there is one.
    pub previous_ns: Option<i64>,
}

/// `time >= W` for the samples at or after the ledger's watermark `W` (every sample without one).
fn at_or_after(watermark: Option<i64>) -> String {
    watermark.map_or(String::new(), |w| {
        format!(" AND time >= to_timestamp_nanos({w})")
    })
}

/// Step 1: the job's GPUs (those it held, and those it shared with the job they are labelled
/// with), first and last sample on each, at or after `watermark`.
pub fn job_gpus_sql(job_id: &str, watermark: Option<i64>) -> String {
    format!(
        "SELECT host, gpu_uuid, CAST(min(time) AS BIGINT) AS first_ns, CAST(max(time) AS BIGINT) AS last_ns \
         FROM gpu_metrics WHERE (job_id = {} OR (job_shares IS NOT NULL AND strpos(concat(',', job_shares), {}) > 0)){} \
         GROUP BY host, gpu_uuid",
        sql_str(job_id),
        sql_str(&format!(",{job_id}=")),
        at_or_after(watermark)
    )
}

fn gpu_is(s: &GpuSpan) -> String {
    format!(
        "host = {} AND gpu_uuid = {}",
        sql_str(&s.host),
        sql_str(&s.gpu_uuid)
    )
}

/// `gpu_uuid IN (…)` of the spans' GPUs: a hash lookup per row, where a chain of per-GPU
/// conditions would test every GPU.
fn uuids_in(spans: &[GpuSpan]) -> String {
    let mut uuids: Vec<String> = spans.iter().map(|s| sql_str(&s.gpu_uuid)).collect();
    uuids.sort();
    uuids.dedup();
    format!("gpu_uuid IN ({})", uuids.join(", "))
}

/// Step 2: the last sample of each GPU before the job's first on it, at most `lookback_ns`
/// earlier (`None`: any earlier), at or after `watermark`.
pub fn previous_sample_sql(
    spans: &[GpuSpan],
    lookback_ns: Option<i64>,
    watermark: Option<i64>,
) -> String {
    let latest = spans.iter().map(|s| s.first_ns).max().unwrap_or(0);
    let earliest = spans.iter().map(|s| s.first_ns).min().unwrap_or(0);
    let window = lookback_ns.map_or(String::new(), |l| {
        format!(
            " AND time >= to_timestamp_nanos({})",
            earliest.saturating_sub(l)
        )
    });
    let conds: Vec<String> = spans
        .iter()
        .map(|s| {
            let from = lookback_ns.map_or(String::new(), |l| {
                format!(
                    " AND time >= to_timestamp_nanos({})",
                    s.first_ns.saturating_sub(l)
                )
            });
            format!(
                "({} AND time < to_timestamp_nanos({}){from})",
                gpu_is(s),
                s.first_ns
            )
        })
        .collect();
    format!(
        "SELECT host, gpu_uuid, CAST(max(time) AS BIGINT) AS previous_ns FROM gpu_metrics \
         WHERE {} AND time < to_timestamp_nanos({latest}){window}{} AND ({}) GROUP BY host, gpu_uuid",
        uuids_in(spans),
        at_or_after(watermark),
        conds.join(" OR ")
    )
}

/// The rows step 3 reads: the job's GPUs from the earliest sample any of them needs (the one
/// before the job's first) to the job's last. Whole stretches of each GPU, so the window
/// functions see what the `jobs` view sees; samples of other jobs in between are read and left
/// out after the window.
fn span_condition(spans: &[GpuSpan]) -> String {
    let from = spans
        .iter()
        .map(|s| s.previous_ns.unwrap_or(s.first_ns))
        .min()
        .unwrap_or(0);
    let to = spans.iter().map(|s| s.last_ns).max().unwrap_or(0);
    format!(
        "{} AND time >= to_timestamp_nanos({from}) AND time <= to_timestamp_nanos({to})",
        uuids_in(spans)
    )
}

/// Step 3: the job's samples on `spans` at or after `watermark`, one row per GPU and model
/// from the `jobs` view's per-sample CTE: the view's sums, the seconds per limiter class, the
/// sampling interval's median, and every part of [`parts`].
pub fn per_gpu_sql(
    cost: &CostConfig,
    advice: &AdviceConfig,
    job_id: &str,
    spans: &[GpuSpan],
    watermark: Option<i64>,
) -> String {
    let id = sql_str(job_id);
    let mut extra: String = EXTRA.iter().map(|c| format!(", {c}")).collect();
    extra.push_str(&parts::derived_columns());
    extra.push_str(&charge_list_sql());
    let ctes = cost.sample_ctes(
        advice,
        &extra,
        &span_condition(spans),
        &format!("job_id = {id}{}", at_or_after(watermark)),
    );
    format!(
        r#"{ctes}
SELECT host, gpu_uuid, gpu_model,
  max(scheduler) AS scheduler, max(job_user) AS job_user, max(job_name) AS job_name,
  count(*) AS samples, CAST(min(time) AS BIGINT) AS first_seen_ns, CAST(max(time) AS BIGINT) AS last_seen_ns,
  sum(secs) AS gpu_seconds, sum(CASE WHEN idle THEN secs ELSE 0.0 END) AS idle_gpu_seconds,
  sum(joules) AS energy_joules, sum(CASE WHEN idle THEN joules ELSE 0.0 END) AS idle_energy_joules,
  median(CASE WHEN held > 0 THEN held END) AS interval_median, count(CASE WHEN held > 0 THEN 1 END) AS interval_n,
  {classes},
  {parts}{charge}
FROM d GROUP BY host, gpu_uuid, gpu_model"#,
        classes = limiter::class_sums_sql(),
        parts = parts::aggregate_sql(),
        charge = charge_max_sql(true),
    )
}
