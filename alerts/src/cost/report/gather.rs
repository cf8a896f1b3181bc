//! Where a report's per-GPU figures come from: the hours the job ledger folded, merged, plus
//! the job's raw samples at or after the ledger's watermark (all of them when nothing is
//! folded, or when the engine has no ledger). Both give [`GpuUsage`]s of the same parts, so
//! the report of a month-long job reads about an hour of raw samples.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuwatch_query::{QueryEngine, Result as QueryResult};
use std::any::Any;

use super::parts::{self, GpuUsage, Parts};
use super::roofline;
use super::sql::{self, COUNTERS, GpuSpan, THROTTLE_BITS};
use super::{GpuReport, Row, f, i, rows, s};
use crate::cost::ledger::{JobLedger, JobsTable};
use crate::cost::limiter::{self, LIMITERS};
use crate::cost::{AdviceConfig, CHARGE_COLUMNS, Charge, CostConfig, TIME_LIMIT_COLUMN};

/// How far back [`raw_spans`] first looks for each GPU's sample before the job's first.
const PREVIOUS_LOOKBACK_NS: i64 = 3_600_000_000_000;

/// The ledger behind the engine's `jobs` view, if it has one.
pub(crate) async fn ledger_of(engine: &QueryEngine) -> Option<Arc<JobLedger>> {
    let table = engine.context().table_provider("jobs").await.ok()?;
    (table.as_ref() as &dyn Any)
        .downcast_ref::<JobsTable>()
        .map(|t| Arc::clone(t.ledger()))
}

/// The job's use of each GPU, by host and UUID: the ledger's folded hours plus the raw
/// samples after them. Empty for an unknown job.
pub(super) async fn job_usage(
    engine: &QueryEngine,
    cost: &CostConfig,
    advice: &AdviceConfig,
    job_id: &str,
) -> QueryResult<Vec<GpuUsage>> {
    let ledger = ledger_of(engine).await;
    let folded = match &ledger {
        Some(l) => l
            .job_usage(engine.context(), job_id)
            .await
            .map_err(gpuwatch_query::Error::from)?,
        None => None,
    };
    let watermark = folded.as_ref().map(|(w, _)| *w);
    let mut merged: BTreeMap<(String, String), GpuUsage> = BTreeMap::new();
    let mut add = |u: GpuUsage| {
        merged
            .entry((u.host.clone(), u.gpu_uuid.clone()))
            .and_modify(|m| m.merge(&u))
            .or_insert(u);
    };
    for u in folded.map(|(_, v)| v).unwrap_or_default() {
        add(u);
    }
    let spans = raw_spans(engine, ledger.as_deref(), job_id, watermark).await?;
    if !spans.is_empty() {
        let sql = sql::per_gpu_sql(cost, advice, job_id, &spans, watermark);
        for r in rows(engine, &sql).await? {
            if let Some(u) = usage_from_row(&r) {
                add(u);
            }
        }
    }
    Ok(merged.into_values().collect())
}

/// Steps 1 and 2 of [`sql`] at or after `watermark`: the GPUs with raw samples of the job and
/// the span to read for each, from the GPU's sample before the job's first (looked for in the
/// raw samples, then in the ledger).
async fn raw_spans(
    engine: &QueryEngine,
    ledger: Option<&JobLedger>,
    job_id: &str,
    watermark: Option<i64>,
) -> QueryResult<Vec<GpuSpan>> {
    let mut spans: Vec<GpuSpan> = rows(engine, &sql::job_gpus_sql(job_id, watermark))
        .await?
        .iter()
        .filter_map(|r| {
            Some(GpuSpan {
                host: s(r, "host")?,
                gpu_uuid: s(r, "gpu_uuid")?,
                first_ns: i(r, "first_ns")?,
                last_ns: i(r, "last_ns")?,
                previous_ns: None,
            })
        })
        .collect();
    // The hour before first; then, for the GPUs without a sample there, anything earlier.
    for lookback in [Some(PREVIOUS_LOOKBACK_NS), None] {
        let missing: Vec<GpuSpan> = spans
            .iter()
            .filter(|s| s.previous_ns.is_none())
            .cloned()
            .collect();
        if missing.is_empty() {
            break;
        }
        let sql = sql::previous_sample_sql(&missing, lookback, watermark);
        for r in rows(engine, &sql).await? {
            let (Some(host), Some(uuid)) = (s(&r, "host"), s(&r, "gpu_uuid")) else {
                continue;
            };
            if let Some(span) = spans
                .iter_mut()
                .find(|x| x.host == host && x.gpu_uuid == uuid)
            {
                span.previous_ns = i(&r, "previous_ns");
            }
        }
    }
    // Before the watermark, the ledger knows each GPU's last sample.
    if let (Some(ledger), Some(_)) = (ledger, watermark) {
        let missing: Vec<(String, String)> = spans
            .iter()
            .filter(|s| s.previous_ns.is_none())
            .map(|s| (s.host.clone(), s.gpu_uuid.clone()))
            .collect();
        if !missing.is_empty() {
            let last = ledger.last_sample_before_watermark(&missing);
            for span in spans.iter_mut().filter(|s| s.previous_ns.is_none()) {
                span.previous_ns = last
                    .get(&(span.host.clone(), span.gpu_uuid.clone()))
                    .copied();
            }
        }
    }
    Ok(spans)
}

/// One GPU (and model) of [`sql::per_gpu_sql`]'s answer.
fn usage_from_row(r: &Row) -> Option<GpuUsage> {
    let mut class_secs = [0.0; LIMITERS.len()];
    for (slot, c) in class_secs.iter_mut().zip(LIMITERS) {
        *slot = f(r, &limiter::seconds_column(c)).unwrap_or_default();
    }
    let intervals = match (f(r, "interval_median"), i(r, "interval_n")) {
        (Some(m), Some(n)) if n > 0 => vec![(m, n as u64)],
        _ => Vec::new(),
    };
    Some(GpuUsage {
        host: s(r, "host")?,
        gpu_uuid: s(r, "gpu_uuid")?,
        gpu_model: s(r, "gpu_model"),
        scheduler: s(r, "scheduler"),
        job_user: s(r, "job_user"),
        job_name: s(r, "job_name"),
        samples: i(r, "samples").unwrap_or_default(),
        first_ns: i(r, "first_seen_ns")?,
        last_ns: i(r, "last_seen_ns")?,
        secs: f(r, "gpu_seconds").unwrap_or_default(),
        idle_secs: f(r, "idle_gpu_seconds").unwrap_or_default(),
        joules: f(r, "energy_joules").unwrap_or_default(),
        idle_joules: f(r, "idle_energy_joules").unwrap_or_default(),
        class_secs,
        intervals,
        parts: Parts::from_values((0..parts::parts().len()).map(|k| f(r, &format!("p_{k}")))),
        charge: Charge {
            text: std::array::from_fn(|k| {
                (k != TIME_LIMIT_COLUMN)
                    .then(|| s(r, CHARGE_COLUMNS[k]))
                    .flatten()
            }),
            time_limit: i(r, CHARGE_COLUMNS[TIME_LIMIT_COLUMN]),
        },
    })
}

/// The roofline's measured shares of a GPU's parts.
fn measured(p: &Parts) -> roofline::Measured {
    roofline::Measured {
        tensor: p.ratio("roof_tensor"),
        fp16: p.ratio("roof_fp16"),
        fp32: p.ratio("roof_fp32"),
        fp64: p.ratio("roof_fp64"),
        dram: p.ratio("roof_dram"),
        pcie_share: p.ratio("roof_pcie"),
        pcie_bytes: p.ratio("roof_pcie_bytes"),
        nvlink_bytes: p.ratio("roof_nvlink_bytes"),
    }
}

/// One GPU of the report from its use.
pub(super) fn gpu_report(u: &GpuUsage, cost: &CostConfig) -> GpuReport {
    let p = &u.parts;
    let as_i64 = |name: &str| p.get(name).map(|v| v as i64);
    let used = as_i64("peak_memory_used_bytes");
    let total = as_i64("memory_total_bytes");
    let limiter_seconds: BTreeMap<String, f64> = LIMITERS
        .iter()
        .zip(u.class_secs)
        .map(|(c, v)| (c.to_string(), v))
        .collect();
    let limiter_figures = LIMITERS
        .iter()
        .filter_map(|c| p.ratio(&format!("figure_{c}")).map(|v| (c.to_string(), v)))
        .collect();
    let throttle_reasons = THROTTLE_BITS
        .iter()
        .filter_map(|(b, name)| {
            p.mean(&format!("reason_{b}"))
                .filter(|v| *v > 0.0)
                .map(|v| (name.to_string(), v))
        })
        .collect();
    let missing_counters = COUNTERS
        .iter()
        .enumerate()
        .filter(|(k, _)| !p.counted(*k))
        .map(|(_, (name, _))| name.to_string())
        .collect();
    let energy = cost.energy_price();
    let price_secs = p.get("price_secs").unwrap_or_default();
    let idle_price_secs = p.get("idle_price_secs").unwrap_or_default();
    GpuReport {
        host: u.host.clone(),
        gpu_uuid: u.gpu_uuid.clone(),
        gpu_index: as_i64("gpu_index"),
        samples: u.samples,
        first_seen_ns: u.first_ns,
        last_seen_ns: u.last_ns,
        gpu_seconds: u.secs,
        idle_gpu_seconds: u.idle_secs,
        idle_minutes: u.idle_secs / 60.0,
        energy_joules: u.joules,
        cost_usd: price_secs / 3600.0 + u.joules * energy,
        idle_cost_usd: idle_price_secs / 3600.0 + u.idle_joules * energy,
        mean_utilization: p.mean("utilization"),
        max_utilization: p.get("max_utilization"),
        mean_sm_active: p.mean("sm_active"),
        mean_tensor_active: p.mean("tensor_active"),
        mean_dram_active: p.mean("dram_active"),
        peak_memory_used_bytes: used,
        memory_total_bytes: total,
        peak_memory_share: match (used, total) {
            (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
            _ => None,
        },
        throttled_share: p.mean("throttled"),
        throttle_reasons,
        power_capped_share: p.mean("power_capped"),
        power_capped_sm_clock_mhz: p.mean("power_capped_clock"),
        sm_clock_max_mhz: p.get("sm_clock_max_mhz"),
        sample_interval_s: parts::median_of_medians(&u.intervals),
        xid_events: 0,
        ecc_events: 0,
        limiter: limiter::argmax(&limiter_seconds),
        limiter_seconds,
        limiter_figures,
        busy_sm_active: p.ratio("busy_sm_active"),
        busy_utilization: p.ratio("busy_utilization"),
        missing_counters,
        roofline: roofline::build(u.gpu_model.as_deref(), &measured(p)),
        gpu_model: u.gpu_model.clone(),
    }
}
