//! What limits a GPU: one class per sample, decided from the counters of that sample, then
//! weighted by the sample's interval (the `jobs` formula's `dt`). A GPU's limiter is the class
//! with the most GPU-seconds; a job's, the class with the most GPU-seconds over its GPUs
//! (docs/jobs.md, "Limiter", gives each rule with NVIDIA's description of its counter).
//!
//! The decision is one SQL `CASE` over `gpu_metrics` columns ([`sample_class_sql`]), so the
//! `jobs` view, its ledger and the job report classify each sample the same way. In order:
//!
//! 1. `host_transfer`: the busier PCIe direction at or above a share of the link (generation ×
//!    width), or of a fixed rate where the link is unknown, with little SM activity. Before
//!    `idle`: copy engines move data while no kernel runs.
//! 2. `idle`: no kernel ran (`gpu_utilization`, and `sm_active` where read, below the `[cost]`
//!    idle threshold).
//! 3. `unknown`: no SM activity counter (no GPM or DCGM profiling: an A100 read by NVML alone,
//!    a MIG instance), or no pipe or DRAM counter for a busy sample.
//! 4. `latency`: the kernels kept a small share of the SMs busy while they ran.
//! 5. `input`: dense kernels, but they ran a small share of the time.
//! 6. the busiest unit among tensor (beyond what the FP16 pipe explains), FP16, FP32 and FP64
//!    pipes and DRAM (`memory`); `latency` when even that one is nearly idle.

use super::advice::AdviceConfig;

/// Every limiter, in the order ties are broken.
pub const LIMITERS: [&str; 10] = [
    "tensor",
    "fp16",
    "fp32",
    "fp64",
    "memory",
    "host_transfer",
    "input",
    "latency",
    "idle",
    "unknown",
];

/// Bytes per second one PCIe lane carries each way after line coding, by generation (1–6):
/// 2.5 and 5 GT/s with 8b/10b, 8, 16 and 32 GT/s with 128b/130b, 64 GT/s PAM4 with 242/256
/// FLITs.
pub const PCIE_LANE_BYTES: [(i64, f64); 6] = [
    (1, 2.5e9 * 0.8 / 8.0),
    (2, 5e9 * 0.8 / 8.0),
    (3, 8e9 * 128.0 / 130.0 / 8.0),
    (4, 16e9 * 128.0 / 130.0 / 8.0),
    (5, 32e9 * 128.0 / 130.0 / 8.0),
    (6, 64e9 * 242.0 / 256.0 / 8.0),
];

/// A float as a SQL literal.
pub(crate) fn lit(v: f64) -> String {
    format!("CAST({v:?} AS DOUBLE)")
}

/// The link's bandwidth each way, bytes/s (null where generation or width is unknown).
pub fn link_bytes_sql() -> String {
    let mut s = String::from("(CASE pcie_link_gen");
    for (generation, bytes) in PCIE_LANE_BYTES {
        s.push_str(&format!(" WHEN {generation} THEN {}", lit(bytes)));
    }
    s.push_str(" END * CASE WHEN pcie_link_width > 0 THEN CAST(pcie_link_width AS DOUBLE) END)");
    s
}

/// The busier PCIe direction, bytes/s.
pub fn pcie_bytes_sql() -> &'static str {
    "greatest(pcie_rx_bytes_per_second, pcie_tx_bytes_per_second)"
}

/// The share of time kernels ran: utilisation, or SM activity where that is higher (the two
/// are read over different windows; SMs cannot be active with no kernel running).
pub fn duty_sql() -> &'static str {
    "greatest(gpu_utilization, sm_active)"
}

/// The tensor activity the FP16 pipe does not explain: half-precision FMAs outside matrix
/// products count on both counters (61% each in the recorded trace).
pub fn tensor_beyond_fp16_sql() -> &'static str {
    "greatest(COALESCE(tensor_active, 0.0) - COALESCE(fp16_active, 0.0), 0.0)"
}

/// The class of one sample: a SQL expression over the columns of `gpu_metrics`, `idle` below
/// `idle_utilization` (the `[cost]` threshold).
pub fn sample_class_sql(a: &AdviceConfig, idle_utilization: f64) -> String {
    let pcie = pcie_bytes_sql();
    let link = link_bytes_sql();
    let duty = duty_sql();
    let tensor = tensor_beyond_fp16_sql();
    let units = [
        ("tensor", tensor.to_string()),
        ("fp16", "COALESCE(fp16_active, 0.0)".to_string()),
        ("fp32", "COALESCE(fp32_active, 0.0)".to_string()),
        ("fp64", "COALESCE(fp64_active, 0.0)".to_string()),
    ];
    let top = format!(
        "greatest({}, COALESCE(dram_active, 0.0))",
        units
            .iter()
            .map(|(_, e)| e.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut busiest = String::new();
    for (name, e) in &units {
        busiest.push_str(&format!(" WHEN {top} = {e} THEN '{name}'"));
    }
    format!(
        "CASE \
         WHEN COALESCE(CASE WHEN {link} IS NOT NULL THEN {pcie} >= {share} * {link} ELSE {pcie} >= {floor} END, false) \
           AND (sm_active IS NULL OR sm_active < {ht_sm}) THEN 'host_transfer' \
         WHEN {duty} IS NULL THEN 'unknown' \
         WHEN {duty} < {idle} THEN 'idle' \
         WHEN sm_active IS NULL THEN 'unknown' \
         WHEN sm_active < {fill} * {duty} THEN 'latency' \
         WHEN {duty} < {input} THEN 'input' \
         WHEN tensor_active IS NULL AND fp16_active IS NULL AND fp32_active IS NULL AND fp64_active IS NULL \
           AND dram_active IS NULL THEN 'unknown' \
         WHEN {top} < {min_unit} THEN 'latency'{busiest} \
         ELSE 'memory' END",
        share = lit(a.host_transfer_link_share),
        floor = lit(a.host_transfer_bytes_per_second),
        ht_sm = lit(a.host_transfer_max_sm_active),
        idle = lit(idle_utilization),
        fill = lit(a.latency_sm_fill),
        input = lit(a.input_duty),
        min_unit = lit(a.min_unit_activity),
    )
}

/// The column holding a class's seconds in the `jobs` view's inner queries.
pub fn seconds_column(class: &str) -> String {
    format!("limiter_{class}_seconds")
}

/// `sum(CASE WHEN limiter = '<class>' THEN secs ELSE 0.0 END) AS limiter_<class>_seconds, …`
/// over a CTE with `limiter` and `secs`.
pub fn class_sums_sql() -> String {
    LIMITERS
        .iter()
        .map(|c| {
            format!(
                "sum(CASE WHEN limiter = '{c}' THEN secs ELSE 0.0 END) AS {}",
                seconds_column(c)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `sum(limiter_<class>_seconds) AS limiter_<class>_seconds, …`.
pub fn resum_sql() -> String {
    LIMITERS
        .iter()
        .map(|c| format!("sum({0}) AS {0}", seconds_column(c)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The class with the most seconds among `limiter_<class>_seconds` expressions made by
/// `seconds(class)` (ties go to the first in [`LIMITERS`]), null when none has any.
pub fn argmax_sql(seconds: impl Fn(&str) -> String) -> String {
    let all: Vec<String> = LIMITERS.iter().map(|c| seconds(c)).collect();
    let top = format!("greatest({})", all.join(", "));
    let mut s = format!("CASE WHEN {top} > 0.0 THEN CASE");
    for (c, e) in LIMITERS.iter().zip(&all) {
        s.push_str(&format!(" WHEN {e} = {top} THEN '{c}'"));
    }
    s.push_str(" END END");
    s
}

/// The class with the most seconds in `seconds` (ties to the first in [`LIMITERS`]), `None`
/// when none has any.
pub fn argmax(seconds: &std::collections::BTreeMap<String, f64>) -> Option<String> {
    let mut best: Option<(&str, f64)> = None;
    for c in LIMITERS {
        let v = seconds.get(c).copied().unwrap_or(0.0);
        if v > 0.0 && best.is_none_or(|(_, b)| v > b) {
            best = Some((c, v));
        }
    }
    best.map(|(c, _)| c.to_string())
}

#[cfg(test)]
mod tests;
