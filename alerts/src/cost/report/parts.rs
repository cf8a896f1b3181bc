//! The job report's per-GPU figures as parts that add up: sums, sums weighted by each sample's
//! interval, counts and maxima over samples. The same parts come from two places and merge into
//! one answer:
//!
//! - the job ledger ([`super::super::JobLedger`]), which accumulates them per job, GPU and
//!   closed hour while it folds ([`physical`] gives each sample's values);
//! - the raw samples after the ledger's watermark ([`aggregate_sql`] sums them in SQL).
//!
//! Every figure of the report is then a ratio or a maximum of merged parts ([`Parts::ratio`],
//! [`Parts::mean`], ...), so a report costs the same for a job of one hour or of a month.
//! Each part is one SQL value over the per-sample columns of [`super::super::CostConfig::sample_ctes`]
//! (`limiter`, `idle`, `price`, the `gpu_metrics` columns in [`super::sql`]'s `EXTRA` and
//! [`derived_columns`]), so the two places evaluate the same expression.

use std::sync::{Arc, LazyLock};

use arrow::array::{AsArray, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::DFSchema;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::PhysicalExpr;
use datafusion::prelude::SessionContext;

use super::super::Charge;
use super::super::limiter::{self, LIMITERS};
use super::super::peaks;
use super::sql::{COUNTERS, POWER_CAP_BIT, THROTTLE_BITS, throttle_mask};

/// How a part adds up over samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    /// Σ v.
    Sum,
    /// Σ secs × v, `secs` being the sample's interval (the `jobs` formula's `dt`).
    SecsSum,
    /// Samples where v is read.
    Count,
    /// max v.
    Max,
    /// Bitwise or of v, an integer (which counters were read: [`counted_bit`]).
    BitOr,
}

/// One part: a name, how it adds up, and its SQL value per sample (null: not counted).
#[derive(Debug, Clone)]
pub struct Part {
    /// Column name (`p_<name>` in SQL).
    pub name: String,
    /// How it adds up.
    pub agg: Agg,
    /// SQL over one sample's columns.
    pub value: String,
}

/// The column of the GPU's maximum SM clock (the agent's reading, else the peaks table's),
/// computed once per sample by the queries the parts read ([`derived_columns`]).
const CLOCK_CAP: &str = "sm_clock_cap_mhz";

/// Columns the parts read that are computed from `gpu_metrics` columns, as `, expr AS name`
/// to add to a select list: the peaks table's lookup by model runs once per sample.
pub fn derived_columns() -> String {
    format!(
        ", COALESCE(CAST(sm_clock_max_mhz AS DOUBLE), {}) AS {CLOCK_CAP}",
        peaks::max_clock_sql()
    )
}

/// The SM clock as a share of the GPU's maximum, at most 1; null where either is unknown.
fn clock_share_sql() -> String {
    format!(
        "CASE WHEN sm_clock_mhz > 0 AND {CLOCK_CAP} > 0.0 \
         THEN least(CAST(sm_clock_mhz AS DOUBLE) / {CLOCK_CAP}, 1.0) END"
    )
}

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

struct Builder(Vec<Part>);

impl Builder {
    fn add(&mut self, name: &str, agg: Agg, value: impl Into<String>) {
        self.0.push(Part {
            name: name.to_string(),
            agg,
            value: value.into(),
        });
    }

    /// `name`'s mean: `name_sum` / `name_n`.
    fn mean(&mut self, name: &str, v: &str) {
        self.add(&format!("{name}_sum"), Agg::Sum, v);
        self.add(&format!("{name}_n"), Agg::Count, v);
    }

    /// `name`'s time-weighted mean where `cond` holds: `Σ secs × v / Σ secs` over the samples
    /// where `v` is read, as `name_num` / `name_den`.
    fn weighted(&mut self, name: &str, v: &str, cond: &str) {
        self.add(
            &format!("{name}_num"),
            Agg::SecsSum,
            format!("CASE WHEN {cond} THEN CAST({v} AS DOUBLE) END"),
        );
        self.add(
            &format!("{name}_den"),
            Agg::SecsSum,
            format!("CASE WHEN {cond} AND ({v}) IS NOT NULL THEN 1.0 END"),
        );
    }
}

fn build() -> Vec<Part> {
    let mut b = Builder(Vec::new());
    b.add("price_secs", Agg::SecsSum, "price");
    b.add(
        "idle_price_secs",
        Agg::SecsSum,
        "CASE WHEN idle THEN price ELSE 0.0 END",
    );
    b.add("gpu_index", Agg::Max, "CAST(gpu_index AS DOUBLE)");
    b.mean("utilization", "gpu_utilization");
    b.add("max_utilization", Agg::Max, "gpu_utilization");
    b.mean("sm_active", "sm_active");
    b.mean("tensor_active", "tensor_active");
    b.mean("dram_active", "dram_active");
    b.add(
        "peak_memory_used_bytes",
        Agg::Max,
        "CAST(memory_used_bytes AS DOUBLE)",
    );
    b.add(
        "memory_total_bytes",
        Agg::Max,
        "CAST(memory_total_bytes AS DOUBLE)",
    );
    for c in LIMITERS {
        b.weighted(
            &format!("figure_{c}"),
            &class_figure(c),
            &format!("limiter = '{c}'"),
        );
    }
    let busy = "limiter <> 'idle'";
    b.weighted("busy_sm_active", "sm_active", busy);
    b.weighted("busy_utilization", "gpu_utilization", busy);
    clocks_and_roofline(&mut b);
    b.0
}

/// The throttling shares, the clocks, the roofline and which counters were read.
fn clocks_and_roofline(b: &mut Builder) {
    let bit = |b: i64| {
        format!(
            "CASE WHEN clock_event_reasons IS NULL THEN NULL WHEN (clock_event_reasons & {b}) <> 0 THEN 1.0 ELSE 0.0 END"
        )
    };
    b.mean("throttled", &bit(throttle_mask()));
    for (r, _) in THROTTLE_BITS {
        b.mean(&format!("reason_{r}"), &bit(r));
    }
    b.mean("power_capped", &bit(POWER_CAP_BIT));
    b.mean(
        "power_capped_clock",
        &format!(
            "CASE WHEN (clock_event_reasons & {POWER_CAP_BIT}) <> 0 THEN CAST(sm_clock_mhz AS DOUBLE) END"
        ),
    );
    b.add("sm_clock_max_mhz", Agg::Max, CLOCK_CAP);
    let clk = format!("COALESCE({}, 1.0)", clock_share_sql());
    for (unit, v) in [
        ("tensor", limiter::tensor_beyond_fp16_sql()),
        ("fp16", "fp16_active"),
        ("fp32", "fp32_active"),
        ("fp64", "fp64_active"),
    ] {
        b.weighted(&format!("roof_{unit}"), &format!("{v} * {clk}"), "true");
    }
    b.weighted("roof_dram", "dram_active", "true");
    let pcie = limiter::pcie_bytes_sql();
    b.weighted(
        "roof_pcie",
        &format!("{pcie} / {}", limiter::link_bytes_sql()),
        "true",
    );
    b.weighted("roof_pcie_bytes", pcie, "true");
    b.weighted(
        "roof_nvlink_bytes",
        "greatest(nvlink_rx_bytes_per_second, nvlink_tx_bytes_per_second)",
        "true",
    );
    let counted: Vec<String> = COUNTERS
        .iter()
        .enumerate()
        .map(|(k, (_, v))| format!("CASE WHEN ({v}) IS NOT NULL THEN {} ELSE 0 END", 1i64 << k))
        .collect();
    b.add("counted", Agg::BitOr, counted.join(" + "));
}

/// The bit of counter `k` of [`COUNTERS`] in the `counted` part.
pub fn counted_bit(k: usize) -> i64 {
    1i64 << k
}

/// Every part, in a fixed order.
pub fn parts() -> &'static [Part] {
    static PARTS: LazyLock<Vec<Part>> = LazyLock::new(build);
    &PARTS
}

fn position(name: &str) -> Option<usize> {
    parts().iter().position(|p| p.name == name)
}

/// Every part's per-sample value as a physical expression over rows of `schema` (which has
/// the columns named in the module docs): the ledger evaluates them on each batch of an hour
/// it folds, after the rows are sorted, so the sort carries only the columns they read.
pub fn physical(ctx: &SessionContext, schema: &DFSchema) -> DfResult<Vec<Arc<dyn PhysicalExpr>>> {
    // Simplified as a query plan's expressions are (`coalesce`, for one, has no physical form).
    let simplifier = ExprSimplifier::new(
        SimplifyContext::builder()
            .with_schema(Arc::new(schema.clone()))
            .with_config_options(Arc::clone(ctx.copied_config().options()))
            .build(),
    );
    parts()
        .iter()
        .map(|p| {
            let e = ctx.parse_sql_expr(&format!("CAST({} AS DOUBLE)", p.value), schema)?;
            let e = simplifier.simplify(simplifier.coerce(e, schema)?)?;
            ctx.create_physical_expr(e, schema)
        })
        .collect()
}

/// The values of `exprs` ([`physical`]) on `batch`, one array per part.
pub fn evaluate(
    exprs: &[Arc<dyn PhysicalExpr>],
    batch: &RecordBatch,
) -> DfResult<Vec<Float64Array>> {
    exprs
        .iter()
        .map(|e| {
            let a = e.evaluate(batch)?.into_array(batch.num_rows())?;
            let a = arrow::compute::cast(&a, &DataType::Float64)?;
            Ok(a.as_primitive::<Float64Type>().clone())
        })
        .collect()
}

/// Every part summed over a group of samples with `secs`, `p_0, p_1, …`.
pub fn aggregate_sql() -> String {
    parts()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let v = format!("CAST({} AS DOUBLE)", p.value);
            let e = match p.agg {
                Agg::Sum => format!("sum({v})"),
                Agg::SecsSum => format!("sum(secs * {v})"),
                Agg::Count => format!("CAST(count({v}) AS DOUBLE)"),
                Agg::Max => format!("max({v})"),
                Agg::BitOr => format!("CAST(bit_or(CAST({} AS BIGINT)) AS DOUBLE)", p.value),
            };
            format!("{e} AS p_{i}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One group's parts, in [`parts`] order; NaN where no sample was counted (eight bytes a part:
/// the ledger keeps one set per job, GPU and folded hour).
#[derive(Debug, Clone, PartialEq)]
pub struct Parts(Box<[f64]>);

impl Default for Parts {
    fn default() -> Self {
        Self(vec![f64::NAN; parts().len()].into_boxed_slice())
    }
}

fn combine(agg: Agg, a: f64, b: f64) -> f64 {
    if a.is_nan() {
        return b;
    }
    if b.is_nan() {
        return a;
    }
    match agg {
        Agg::Max => a.max(b),
        Agg::Sum | Agg::SecsSum | Agg::Count => a + b,
        Agg::BitOr => ((a as i64) | (b as i64)) as f64,
    }
}

impl Parts {
    /// Parts from their values in [`parts`] order (`None`: nothing counted).
    pub fn from_values(values: impl Iterator<Item = Option<f64>>) -> Self {
        let mut p = Self::default();
        for (slot, v) in p.0.iter_mut().zip(values) {
            *slot = v.unwrap_or(f64::NAN);
        }
        p
    }

    /// Adds one sample worth `secs` whose values are `values` (in [`parts`] order).
    pub fn add_sample(&mut self, secs: f64, values: impl Iterator<Item = Option<f64>>) {
        for ((slot, part), v) in self.0.iter_mut().zip(parts()).zip(values) {
            let Some(v) = v.filter(|v| !v.is_nan()) else {
                continue;
            };
            let v = match part.agg {
                Agg::Sum | Agg::Max | Agg::BitOr => v,
                Agg::SecsSum => secs * v,
                Agg::Count => 1.0,
            };
            *slot = combine(part.agg, *slot, v);
        }
    }

    /// Adds another group's parts.
    pub fn merge(&mut self, other: &Parts) {
        for ((slot, part), v) in self.0.iter_mut().zip(parts()).zip(other.0.iter()) {
            *slot = combine(part.agg, *slot, *v);
        }
    }

    /// The `k`th part in [`parts`] order (NaN where nothing was counted).
    pub fn value(&self, k: usize) -> f64 {
        self.0.get(k).copied().unwrap_or(f64::NAN)
    }

    /// Sets the part named `name` (false: no such part).
    pub fn set(&mut self, name: &str, v: f64) -> bool {
        match position(name).and_then(|i| self.0.get_mut(i)) {
            Some(slot) => {
                *slot = v;
                true
            }
            None => false,
        }
    }

    /// The part named `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        position(name)
            .and_then(|i| self.0.get(i).copied())
            .filter(|v| !v.is_nan())
    }

    /// `name_num / name_den` ([`Builder::weighted`]), null where nothing was weighed.
    pub fn ratio(&self, name: &str) -> Option<f64> {
        let den = self.get(&format!("{name}_den")).filter(|d| *d > 0.0)?;
        self.get(&format!("{name}_num")).map(|n| n / den)
    }

    /// `name_sum / name_n` ([`Builder::mean`]), null where nothing was read.
    pub fn mean(&self, name: &str) -> Option<f64> {
        let n = self.get(&format!("{name}_n")).filter(|n| *n > 0.0)?;
        self.get(&format!("{name}_sum")).map(|s| s / n)
    }

    /// Whether counter `k` of [`COUNTERS`] was read in any sample.
    pub fn counted(&self, k: usize) -> bool {
        self.get("counted")
            .is_some_and(|c| (c as i64) & counted_bit(k) != 0)
    }
}

/// One job's use of one GPU (and model) over some of its samples: the `jobs` view's sums, the
/// seconds per limiter class, the interval medians and the parts. The ledger gives one per
/// folded GPU, the raw query one per GPU after the watermark; [`GpuUsage::merge`] adds them.
#[derive(Debug, Clone, Default)]
pub struct GpuUsage {
    /// Host.
    pub host: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU model.
    pub gpu_model: Option<String>,
    /// Scheduler (the largest seen).
    pub scheduler: Option<String>,
    /// User.
    pub job_user: Option<String>,
    /// Job name.
    pub job_name: Option<String>,
    /// Samples.
    pub samples: i64,
    /// First sample, ns.
    pub first_ns: i64,
    /// Last sample, ns.
    pub last_ns: i64,
    /// GPU-seconds.
    pub secs: f64,
    /// Idle GPU-seconds.
    pub idle_secs: f64,
    /// Joules.
    pub joules: f64,
    /// Idle joules.
    pub idle_joules: f64,
    /// Seconds per limiter class, in [`LIMITERS`] order.
    pub class_secs: [f64; LIMITERS.len()],
    /// Interval medians and how many intervals each was taken over.
    pub intervals: Vec<(f64, u64)>,
    /// The parts.
    pub parts: Parts,
    /// The job's chargeback labels on the GPU.
    pub charge: Charge,
}

/// Keeps the larger of `slot` and `v` (a label seen with several values keeps the largest, as
/// SQL's `max`).
pub(crate) fn keep_max(slot: &mut Option<String>, v: Option<&str>) {
    if let Some(v) = v
        && slot.as_deref().is_none_or(|s| v > s)
    {
        *slot = Some(v.to_string());
    }
}

impl GpuUsage {
    /// Adds `other`, a use of the same GPU.
    pub fn merge(&mut self, other: &GpuUsage) {
        keep_max(&mut self.gpu_model, other.gpu_model.as_deref());
        keep_max(&mut self.scheduler, other.scheduler.as_deref());
        keep_max(&mut self.job_user, other.job_user.as_deref());
        keep_max(&mut self.job_name, other.job_name.as_deref());
        if self.samples == 0 {
            self.first_ns = other.first_ns;
            self.last_ns = other.last_ns;
        } else if other.samples > 0 {
            self.first_ns = self.first_ns.min(other.first_ns);
            self.last_ns = self.last_ns.max(other.last_ns);
        }
        self.samples += other.samples;
        self.secs += other.secs;
        self.idle_secs += other.idle_secs;
        self.joules += other.joules;
        self.idle_joules += other.idle_joules;
        for (a, b) in self.class_secs.iter_mut().zip(other.class_secs) {
            *a += b;
        }
        self.intervals.extend_from_slice(&other.intervals);
        self.parts.merge(&other.parts);
        self.charge.merge(&other.charge);
    }
}

/// The median of per-group medians, each weighing as many intervals as it was taken over:
/// the median itself wherever a GPU is sampled at a steady rate.
pub fn median_of_medians(groups: &[(f64, u64)]) -> Option<f64> {
    let mut g: Vec<(f64, u64)> = groups.iter().copied().filter(|(_, n)| *n > 0).collect();
    g.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = g.iter().map(|(_, n)| n).sum();
    let mut seen = 0;
    for (m, n) in &g {
        seen += n;
        if seen * 2 >= total {
            return Some(*m);
        }
    }
    None
}

/// The median of `v` (the mean of the two middle values for an even count), as SQL's `median`.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 0 {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sums_merge_as_one_group() {
        let mut names: Vec<&str> = parts().iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate part names");

        let values = |x: f64| parts().iter().map(move |_| Some(x));
        let (mut a, mut b, mut all) = (Parts::default(), Parts::default(), Parts::default());
        a.add_sample(2.0, values(0.5));
        b.add_sample(3.0, values(0.25));
        all.add_sample(2.0, values(0.5));
        all.add_sample(3.0, values(0.25));
        a.merge(&b);
        assert_eq!(a, all);
        assert_eq!(a.get("price_secs"), Some(2.0 * 0.5 + 3.0 * 0.25));
        assert_eq!(a.get("max_utilization"), Some(0.5));
        assert_eq!(a.get("utilization_n"), Some(2.0));
        assert_eq!(a.mean("utilization"), Some(0.375));
        // Numerator and denominator got the same values here: Σ secs × v over Σ secs × v.
        assert_eq!(a.ratio("busy_sm_active"), Some(1.0));
        assert_eq!(a.get("busy_sm_active_den"), Some(2.0 * 0.5 + 3.0 * 0.25));
        assert_eq!(Parts::default().ratio("busy_sm_active"), None);

        let mut c = Parts::default();
        let bits = |b: i64| {
            parts()
                .iter()
                .map(move |p| (p.name == "counted").then_some(b as f64))
        };
        c.add_sample(1.0, bits(counted_bit(0)));
        c.add_sample(1.0, bits(counted_bit(2)));
        assert!(c.counted(0) && c.counted(2) && !c.counted(1));
    }

    #[test]
    fn median_of_steady_medians_is_the_median() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
        assert_eq!(median_of_medians(&[(10.0, 359), (10.0, 360)]), Some(10.0));
        assert_eq!(
            median_of_medians(&[(1.0, 10), (10.0, 100), (60.0, 5)]),
            Some(10.0)
        );
        assert_eq!(median_of_medians(&[]), None);
    }
}
