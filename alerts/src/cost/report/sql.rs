//! The job report's queries, in three steps that keep each one small on a store of many GPUs
//! and many days:
//!
//! 1. [`job_gpus_sql`]: the GPUs the job ran on, with its first and last sample on each.
//! 2. [`previous_sample_sql`]: each GPU's sample before the job's first one on it (looked for
//!    in the hour before, then further back for the GPUs not found): the sample the `jobs`
//!    formula takes the first interval and energy delta from.
//! 3. [`per_gpu_sql`]: one row per GPU from the `jobs` view's per-sample CTE
//!    ([`CostConfig::sample_ctes`]) over those GPUs from that sample to the job's last, so every
//!    figure is the view's: the `jobs` columns, the limiter's seconds per class, the figures the
//!    notes quote and the roofline's time-weighted shares. The job's totals are their sums.
//!
//! "Time-weighted" means each sample counts for its `secs` (the `jobs` formula's `dt`), like the
//! limiter: `Σ secs × v / Σ secs` over the samples where `v` is read.

use super::super::limiter::{self, LIMITERS};
use super::super::{AdviceConfig, CostConfig, peaks, sql_str};

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
const EXTRA: &[&str] = &[
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

/// The figure each class is judged by, per sample: the busiest unit's activity, the PCIe
/// rate, the share of time kernels ran (`input`, `idle`, `unknown`) or how full they kept the
/// SMs (`latency`).
fn class_figure(class: &str) -> String {
    let duty = limiter::duty_sql();
    match class {
        "tensor" => limiter::tensor_beyond_fp16_sql().to_string(),
        "fp16" => "fp16_active".into(),
        "fp32" => "fp32_active".into(),
        "fp64" => "fp64_active".into(),
        "memory" => "dram_active".into(),
        "host_transfer" => limiter::pcie_bytes_sql().to_string(),
        "latency" => format!("sm_active / CASE WHEN {duty} > 0.0 THEN {duty} END"),
        _ => duty.to_string(),
    }
}

/// `Σ secs × v / Σ secs` over the rows where `v` is read and `cond` holds.
fn weighted(v: &str, cond: &str) -> String {
    format!(
        "sum(CASE WHEN {cond} AND ({v}) IS NOT NULL THEN secs * ({v}) END) / \
         NULLIF(sum(CASE WHEN {cond} AND ({v}) IS NOT NULL THEN secs END), 0.0)"
    )
}

/// The SM clock as a share of the GPU's maximum (the agent's reading, else the peaks table's),
/// at most 1; null where either is unknown.
fn clock_share_sql() -> String {
    format!(
        "CASE WHEN sm_clock_mhz > 0 AND COALESCE(CAST(sm_clock_max_mhz AS DOUBLE), {max}) > 0.0 \
         THEN least(CAST(sm_clock_mhz AS DOUBLE) / COALESCE(CAST(sm_clock_max_mhz AS DOUBLE), {max}), 1.0) END",
        max = peaks::max_clock_sql()
    )
}

/// Per GPU: the limiter's seconds and figures, the busy-time means, throttling and the
/// roofline's shares (names as [`super::gpu_from_row`] reads them).
fn limiter_columns() -> String {
    let mut cols = vec![limiter::class_sums_sql()];
    for c in LIMITERS {
        cols.push(format!(
            "{} AS limiter_{c}_figure",
            weighted(&class_figure(c), &format!("limiter = '{c}'"))
        ));
    }
    let busy = "limiter <> 'idle'";
    cols.push(format!("{} AS busy_sm_active", weighted("sm_active", busy)));
    cols.push(format!(
        "{} AS busy_utilization",
        weighted("gpu_utilization", busy)
    ));
    let bit = |b: i64| {
        format!(
            "avg(CASE WHEN clock_event_reasons IS NULL THEN NULL WHEN (clock_event_reasons & {b}) <> 0 THEN 1.0 ELSE 0.0 END)"
        )
    };
    cols.push(format!("{} AS throttled_share", bit(throttle_mask())));
    for (b, _) in THROTTLE_BITS {
        cols.push(format!("{} AS reason_{b}_share", bit(b)));
    }
    cols.push(format!("{} AS power_capped_share", bit(POWER_CAP_BIT)));
    cols.push(format!(
        "avg(CASE WHEN (clock_event_reasons & {POWER_CAP_BIT}) <> 0 THEN CAST(sm_clock_mhz AS DOUBLE) END) AS power_capped_sm_clock_mhz"
    ));
    cols.push(format!(
        "max(COALESCE(CAST(sm_clock_max_mhz AS DOUBLE), {})) AS sm_clock_max_mhz",
        peaks::max_clock_sql()
    ));
    let clk = format!("COALESCE({}, 1.0)", clock_share_sql());
    for (unit, v) in [
        ("tensor", limiter::tensor_beyond_fp16_sql()),
        ("fp16", "fp16_active"),
        ("fp32", "fp32_active"),
        ("fp64", "fp64_active"),
    ] {
        cols.push(format!(
            "{} AS roof_{unit}",
            weighted(&format!("{v} * {clk}"), "true")
        ));
    }
    cols.push(format!("{} AS roof_dram", weighted("dram_active", "true")));
    let pcie = limiter::pcie_bytes_sql();
    cols.push(format!(
        "{} AS roof_pcie",
        weighted(&format!("{pcie} / {}", limiter::link_bytes_sql()), "true")
    ));
    cols.push(format!("{} AS roof_pcie_bytes", weighted(pcie, "true")));
    cols.push(format!(
        "{} AS roof_nvlink_bytes",
        weighted(
            "greatest(nvlink_rx_bytes_per_second, nvlink_tx_bytes_per_second)",
            "true"
        )
    ));
    for (name, v) in COUNTERS {
        cols.push(format!("count({v}) AS counted_{name}"));
    }
    cols.join(",\n  ")
}

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

/// Step 1: the job's GPUs, first and last sample on each.
pub fn job_gpus_sql(job_id: &str) -> String {
    format!(
        "SELECT host, gpu_uuid, CAST(min(time) AS BIGINT) AS first_ns, CAST(max(time) AS BIGINT) AS last_ns \
         FROM gpu_metrics WHERE job_id = {} GROUP BY host, gpu_uuid",
        sql_str(job_id)
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
/// earlier (`None`: any earlier).
pub fn previous_sample_sql(spans: &[GpuSpan], lookback_ns: Option<i64>) -> String {
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
         WHERE {} AND time < to_timestamp_nanos({latest}){window} AND ({}) GROUP BY host, gpu_uuid",
        uuids_in(spans),
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

/// Step 3: the per-GPU query of a job over `spans` (same sample CTE as the `jobs` view).
pub fn per_gpu_sql(
    cost: &CostConfig,
    advice: &AdviceConfig,
    job_id: &str,
    spans: &[GpuSpan],
) -> String {
    let id = sql_str(job_id);
    let extra: String = EXTRA.iter().map(|c| format!(", {c}")).collect();
    let ctes = cost.sample_ctes(
        advice,
        &extra,
        &span_condition(spans),
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
  sum(CASE WHEN idle THEN secs * price ELSE 0.0 END) / 3600.0 + sum(CASE WHEN idle THEN joules ELSE 0.0 END) * {energy_price} AS idle_cost_usd,
  avg(gpu_utilization) AS mean_utilization, max(gpu_utilization) AS max_utilization,
  avg(sm_active) AS mean_sm_active, avg(tensor_active) AS mean_tensor_active, avg(dram_active) AS mean_dram_active,
  max(memory_used_bytes) AS peak_memory_used_bytes, max(memory_total_bytes) AS memory_total_bytes,
  median(CASE WHEN secs > 0 THEN secs END) AS sample_interval_s,
  {limiter}
FROM d GROUP BY host, gpu_uuid"#,
        limiter = limiter_columns(),
    )
}
