//! The `job_ledger` Delta table: each closed hour the ledger folds is written as one file (one
//! Delta commit replacing the hour's rows), so the `jobs` view, job reports and statements read
//! history from it and a restart folds nothing again (docs/cost.md, "The job ledger").
//!
//! Three kinds of rows share the table, told apart by two columns:
//!
//! | rows | `job_id` | `last_sample_time` | what they hold |
//! | --- | --- | --- | --- |
//! | usage | the job | null | one job's use of one GPU (and model) in the hour: the `jobs` sums, the limiter's seconds, the report's parts (`part_*`) |
//! | GPU | null | set | the GPU's last sample in the hour (time, energy counter): the next hour's seed |
//! | hour | null | null | `samples`: every raw sample of the hour, compared with `gpu_metrics_1h` to catch late data |
//!
//! Every hour the ledger folded has an hour row (with `samples` 0 when it had none), so the
//! hours folded are the hour rows, and the view's watermark is where they stop being
//! contiguous.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, StringBuilder,
    TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, Field};
use datafusion::catalog::TableProvider;
use datafusion::error::Result as DfResult;
use datafusion::prelude::SessionContext;
use gpuwatch_query::engine::StoreTable;
use gpuwatch_store::schema::{Table, time_type};

use super::super::limiter::{self, LIMITERS};
use super::super::report::parts::{self, GpuUsage, Parts};
use super::super::{CHARGE_COLUMNS, Charge, TIME_LIMIT_COLUMN};
use super::{GpuKey, HourFold, Last, UsageKey, plain};

/// The table's SQL name.
pub const NAME: &str = "job_ledger";

/// The text columns after the store's key (`time`, `job_id`, `host`, `gpu_uuid`).
const LABELS: [&str; 4] = ["gpu_model", "scheduler", "job_user", "job_name"];
/// The sums of a usage row, in [`super::Usage`]'s order.
const SUMS: [&str; 5] = [
    "gpu_seconds",
    "held_gpu_seconds",
    "idle_gpu_seconds",
    "energy_joules",
    "idle_energy_joules",
];

fn part_column(name: &str) -> String {
    format!("part_{name}")
}

/// The columns after the store's key, in order.
fn columns() -> Vec<Field> {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let float = |n: &str| Field::new(n, DataType::Float64, true);
    let mut f: Vec<Field> = LABELS.iter().map(|c| text(c)).collect();
    f.extend(CHARGE_COLUMNS.iter().enumerate().map(|(i, c)| {
        if i == TIME_LIMIT_COLUMN {
            Field::new(*c, DataType::Int64, true)
        } else {
            text(c)
        }
    }));
    f.push(Field::new("first_seen", time_type(), true));
    f.push(Field::new("last_seen", time_type(), true));
    f.extend(SUMS.iter().map(|c| float(c)));
    f.extend(LIMITERS.iter().map(|c| float(&limiter::seconds_column(c))));
    f.push(Field::new("samples", DataType::Int64, true));
    f.push(float("interval_median_seconds"));
    f.push(Field::new("interval_count", DataType::Int64, true));
    f.push(Field::new("last_sample_time", time_type(), true));
    f.push(float("last_energy_joules"));
    f.extend(parts::parts().iter().map(|p| float(&part_column(&p.name))));
    f.extend(
        TOTALS_ONLY
            .iter()
            .map(|c| Field::new(*c, DataType::Int64, true)),
    );
    f.push(text(TOTALS_LIMITER));
    f.push(Field::new(JOB_HOST_COUNT, DataType::Int64, true));
    f.push(Field::new(GROUP_JOBS, DataType::Int64, true));
    f
}

/// The columns only `job_ledger_totals` fills ([`super::totals`]), null in the hour and day
/// rows: the job's GPUs on the row's host and model, and the GPU models it used on the host.
pub(super) const TOTALS_ONLY: [&str; 2] = ["gpus", "host_models"];
/// And the class with the most of the row's seconds ([`limiter::argmax_sql`]).
pub(super) const TOTALS_LIMITER: &str = "limiter";
/// And the hosts the job used (every row of a job has the same; added after the others, so
/// older files lack it: [`super::totals::fill_job_host_count`]). Also a column of `jobs`.
pub(super) const JOB_HOST_COUNT: &str = "job_host_count";
/// The jobs of a row of `job_ledger_spend` (one per day, account, user and GPU model,
/// [`super::days`]); null in its marker rows and in the other tables.
pub(super) const GROUP_JOBS: &str = "group_jobs";

/// The parts a job's mean activity is made of (`jobs.mean_activity`): `sm_active`'s sum and
/// count, then `gpu_utilization`'s, over the job's samples. The daily sums and the totals
/// keep them summed as the other sums.
pub(super) const ACTIVITY_PARTS: [&str; 4] = [
    "part_sm_active_sum",
    "part_sm_active_n",
    "part_utilization_sum",
    "part_utilization_n",
];

/// The [`ACTIVITY_PARTS`] over a job's raw samples (each part's [`parts`] value, summed or
/// counted as the ledger's fold does).
pub(crate) const SAMPLE_ACTIVITY_PARTS: [&str; 4] = [
    "sum(sm_active)",
    "CAST(count(sm_active) AS DOUBLE)",
    "sum(gpu_utilization)",
    "CAST(count(gpu_utilization) AS DOUBLE)",
];

/// A job's mean activity from its [`ACTIVITY_PARTS`], each taken through `agg` (`sum(c)` over
/// several rows, `c` for one; [`sample_mean_activity_sql`] for raw samples): the mean
/// `sm_active` over the samples that have it, else the mean GPU utilisation (a GPU without GPM
/// counters), null when the job has neither. The one rule of `jobs.mean_activity`, whether the
/// view reads the ledger or samples alone.
pub(crate) fn mean_activity_sql(agg: impl Fn(&str) -> String) -> String {
    let [sm, sm_n, util, util_n] = ACTIVITY_PARTS.map(agg);
    format!("CASE WHEN {sm_n} > 0 THEN {sm} / {sm_n} WHEN {util_n} > 0 THEN {util} / {util_n} END")
}

/// [`mean_activity_sql`] over a job's raw samples ([`SAMPLE_ACTIVITY_PARTS`]).
pub(crate) fn sample_mean_activity_sql() -> String {
    mean_activity_sql(|c| {
        let k = ACTIVITY_PARTS.iter().position(|p| *p == c).unwrap_or(0);
        SAMPLE_ACTIVITY_PARTS[k].to_string()
    })
}

/// Declares the table's columns to the store; runs before the store opens (the server's start,
/// and [`super::JobLedger::new`] for a process that opened none yet).
pub fn declare() -> Result<(), String> {
    gpuwatch_store::schema::declare_job_ledger(columns())
}

/// Registers `ctx`'s `job_ledger`, `job_ledger_1d` and `job_ledger_totals` providers again with the declared
/// columns (an engine built before [`declare`] ran read their schema as the store's key
/// columns alone).
pub(crate) async fn refresh_provider(ctx: &SessionContext) -> DfResult<()> {
    for table in [
        Table::JobLedger,
        Table::JobLedger1d,
        Table::JobLedgerTotals,
        Table::JobLedgerSpend,
    ] {
        let name = table.name();
        let Some(current) = ctx.table_provider(name).await.ok() else {
            continue;
        };
        let Some(t) = (current.as_ref() as &dyn std::any::Any).downcast_ref::<StoreTable>() else {
            continue;
        };
        if t.schema().fields().len() != table.schema().fields().len() {
            ctx.deregister_table(name)?;
            ctx.register_table(name, Arc::new(t.with_current_schema()))?;
        }
    }
    Ok(())
}

fn texts<'a>(values: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

fn times(values: impl Iterator<Item = Option<i64>>) -> ArrayRef {
    Arc::new(TimestampNanosecondArray::from(values.collect::<Vec<_>>()).with_timezone("UTC"))
}

fn floats(values: impl Iterator<Item = Option<f64>>) -> ArrayRef {
    Arc::new(values.collect::<Float64Array>())
}

fn ints(values: impl Iterator<Item = Option<i64>>) -> ArrayRef {
    Arc::new(values.collect::<Int64Array>())
}

/// One row of the hour's file before it becomes columns.
enum Row<'a> {
    Usage(&'a UsageKey, &'a super::Usage),
    Gpu(&'a GpuKey, &'a Last),
    Hour(u64),
}

fn usage<'a>(r: &Row<'a>) -> Option<&'a super::Usage> {
    match r {
        Row::Usage(_, u) => Some(*u),
        _ => None,
    }
}

/// Key column `i` (`job_id`, `host`, `gpu_uuid`) of `r`.
fn key<'a>(r: &Row<'a>, i: usize) -> Option<&'a str> {
    match r {
        Row::Usage(k, _) => [Some(k.0.as_str()), k.1.as_deref(), k.2.as_deref()][i],
        Row::Gpu(k, _) => [None, k.0.as_deref(), k.1.as_deref()][i],
        Row::Hour(_) => None,
    }
}

/// The rows of folded hour `hour`: its usage rows, one row per GPU seen, the hour row.
pub(super) fn hour_batch(hour: i64, fold: &HourFold) -> DfResult<RecordBatch> {
    let mut rows: Vec<Row> = fold.usage.iter().map(|(k, u)| Row::Usage(k, u)).collect();
    let mut gpus: Vec<_> = fold.last.iter().collect();
    gpus.sort_by(|a, b| a.0.cmp(b.0));
    rows.extend(gpus.into_iter().map(|(k, l)| Row::Gpu(k, l)));
    rows.push(Row::Hour(fold.samples));
    let f64s = |f: fn(&super::Usage) -> f64| floats(rows.iter().map(|r| usage(r).map(f)));
    let mut c: Vec<ArrayRef> = vec![times(rows.iter().map(|_| Some(hour)))];
    c.extend((0..3).map(|i| texts(rows.iter().map(|r| key(r, i)))));
    c.push(texts(rows.iter().map(|r| match r {
        Row::Usage(k, _) => k.3.as_deref(),
        _ => None,
    })));
    let label = |f: fn(&super::Usage) -> &Option<String>| {
        texts(rows.iter().map(|r| usage(r).and_then(|u| f(u).as_deref())))
    };
    c.push(label(|u| &u.scheduler));
    c.push(label(|u| &u.job_user));
    c.push(label(|u| &u.job_name));
    for k in 0..CHARGE_COLUMNS.len() {
        c.push(if k == TIME_LIMIT_COLUMN {
            ints(
                rows.iter()
                    .map(|r| usage(r).and_then(|u| u.charge.time_limit)),
            )
        } else {
            texts(
                rows.iter()
                    .map(|r| usage(r).and_then(|u| u.charge.text[k].as_deref())),
            )
        });
    }
    c.push(times(rows.iter().map(|r| usage(r).map(|u| u.first_seen))));
    c.push(times(rows.iter().map(|r| usage(r).map(|u| u.last_seen))));
    c.push(f64s(|u| u.secs));
    c.push(f64s(|u| u.held_secs));
    c.push(f64s(|u| u.idle_secs));
    c.push(f64s(|u| u.joules));
    c.push(f64s(|u| u.idle_joules));
    for k in 0..LIMITERS.len() {
        c.push(floats(
            rows.iter().map(|r| usage(r).map(|u| u.class_secs[k])),
        ));
    }
    c.push(ints(rows.iter().map(|r| match r {
        Row::Usage(_, u) => Some(u.samples),
        Row::Hour(n) => Some(*n as i64),
        Row::Gpu(..) => None,
    })));
    c.push(floats(rows.iter().map(|r| usage(r).map(|u| u.interval.0))));
    c.push(ints(
        rows.iter().map(|r| usage(r).map(|u| u.interval.1 as i64)),
    ));
    let last = |r: &Row<'_>| match r {
        Row::Gpu(_, l) => Some(**l),
        _ => None,
    };
    c.push(times(rows.iter().map(|r| last(r).map(|l| l.0))));
    c.push(floats(rows.iter().map(|r| last(r).and_then(|l| l.1))));
    for k in 0..parts::parts().len() {
        c.push(floats(rows.iter().map(|r| {
            usage(r).map(|u| u.parts.value(k)).filter(|v| !v.is_nan())
        })));
    }
    c.extend(TOTALS_ONLY.iter().map(|_| ints(rows.iter().map(|_| None))));
    c.push(texts(rows.iter().map(|_| None)));
    // `job_host_count` and `group_jobs`.
    c.push(ints(rows.iter().map(|_| None)));
    c.push(ints(rows.iter().map(|_| None)));
    let schema = Table::JobLedger.schema();
    if schema.fields().len() != c.len() {
        return Err(plain(format!(
            "the {NAME} table has {} columns where the ledger writes {}: its columns were not declared before the store opened",
            schema.fields().len(),
            c.len()
        )));
    }
    Ok(RecordBatch::try_new(schema, c)?)
}

/// One job's use of one GPU in an hour, for ledger rows that were not folded from raw samples
/// here: a benchmark's history, an import from another system.
#[derive(Debug, Clone, Default)]
pub struct UsageRow {
    /// The job.
    pub job_id: String,
    /// The GPU's host.
    pub host: String,
    /// The GPU.
    pub gpu_uuid: String,
    /// Its model.
    pub gpu_model: Option<String>,
    /// `slurm`, `kubernetes`, ….
    pub scheduler: Option<String>,
    /// The job's user.
    pub job_user: Option<String>,
    /// The job's name.
    pub job_name: Option<String>,
    /// Chargeback labels by column name (`job_account`, `job_partition`, …; unknown names are
    /// refused).
    pub labels: Vec<(String, String)>,
    /// First and last sample in the hour (ns).
    pub first_seen: i64,
    /// Last sample in the hour (ns).
    pub last_seen: i64,
    /// GPU-seconds.
    pub gpu_seconds: f64,
    /// Idle GPU-seconds.
    pub idle_gpu_seconds: f64,
    /// Joules.
    pub energy_joules: f64,
    /// Idle joules.
    pub idle_energy_joules: f64,
    /// The limiter class of all its seconds (one of [`LIMITERS`]).
    pub limiter: Option<String>,
    /// Samples.
    pub samples: i64,
    /// The median interval between samples (s).
    pub interval_seconds: f64,
    /// The report's parts by name (`price_secs`, `utilization_sum`, …; unknown names are
    /// refused); the others are left uncounted.
    pub parts: Vec<(String, f64)>,
}

/// The rows of hour `hour` (ns, an hour's start) made of `usage`, each GPU's last sample in it
/// (`gpus`: host, UUID, time, energy counter) and its count of raw samples.
pub fn hour_rows(
    hour: i64,
    usage: &[UsageRow],
    gpus: &[(String, String, i64, Option<f64>)],
    samples: u64,
) -> DfResult<RecordBatch> {
    let mut fold = HourFold {
        samples,
        ..HourFold::default()
    };
    for r in usage {
        let u = fold
            .usage
            .entry((
                r.job_id.clone(),
                Some(r.host.clone()),
                Some(r.gpu_uuid.clone()),
                r.gpu_model.clone(),
            ))
            .or_default();
        *u = usage_of(r)?;
    }
    for (host, gpu, t, e) in gpus {
        fold.last
            .insert((Some(host.clone()), Some(gpu.clone())), (*t, *e));
    }
    hour_batch(hour, &fold)
}

fn usage_of(r: &UsageRow) -> DfResult<super::Usage> {
    let mut u = super::Usage {
        scheduler: r.scheduler.clone(),
        job_user: r.job_user.clone(),
        job_name: r.job_name.clone(),
        first_seen: r.first_seen,
        last_seen: r.last_seen,
        secs: r.gpu_seconds,
        held_secs: r.gpu_seconds,
        idle_secs: r.idle_gpu_seconds,
        joules: r.energy_joules,
        idle_joules: r.idle_energy_joules,
        samples: r.samples,
        interval: (r.interval_seconds, r.samples.max(1) as u64 - 1),
        ..super::Usage::default()
    };
    if let Some(c) = &r.limiter {
        let k = LIMITERS
            .iter()
            .position(|l| l == c)
            .ok_or_else(|| plain(format!("no limiter class {c}")))?;
        u.class_secs[k] = r.gpu_seconds;
    }
    for (name, v) in &r.labels {
        let k = CHARGE_COLUMNS
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| plain(format!("no chargeback column {name}")))?;
        if k == TIME_LIMIT_COLUMN {
            u.charge.time_limit = v.parse().ok();
        } else {
            u.charge.text[k] = Some(v.clone());
        }
    }
    for (name, v) in &r.parts {
        if !u.parts.set(name, *v) {
            return Err(plain(format!("no report part {name}")));
        }
    }
    Ok(u)
}

/// Runs `sql` and returns its batches.
async fn collect(ctx: &SessionContext, sql: &str) -> DfResult<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

/// The index of column `name` of `b`.
fn index_of(b: &RecordBatch, name: &str) -> DfResult<usize> {
    b.schema()
        .index_of(name)
        .map_err(|_| plain(format!("{NAME}: no column {name}")))
}

fn text_at(b: &RecordBatch, name: &str) -> DfResult<StringArray> {
    super::strings(b, index_of(b, name)?)
}

fn int_at(b: &RecordBatch, name: &str) -> DfResult<Int64Array> {
    super::ints(b, index_of(b, name)?)
}

fn float_at(b: &RecordBatch, name: &str) -> DfResult<Float64Array> {
    super::f64_column(b, index_of(b, name)?)
}

fn opt_i(a: &Int64Array, i: usize) -> Option<i64> {
    (!a.is_null(i)).then(|| a.value(i))
}

fn opt_f(a: &Float64Array, i: usize) -> Option<f64> {
    (!a.is_null(i)).then(|| a.value(i))
}

fn opt_s(a: &StringArray, i: usize) -> Option<String> {
    (!a.is_null(i)).then(|| a.value(i).to_string())
}

/// The hour rows at or after `from`: hour → raw samples folded.
pub(super) async fn hours_from(ctx: &SessionContext, from: i64) -> DfResult<BTreeMap<i64, u64>> {
    let sql = format!(
        "SELECT time, samples FROM {NAME} WHERE time >= to_timestamp_nanos({from}) \
         AND job_id IS NULL AND last_sample_time IS NULL"
    );
    let mut out = BTreeMap::new();
    for b in collect(ctx, &sql).await? {
        let (t, n) = (int_at(&b, "time")?, int_at(&b, "samples")?);
        for i in 0..b.num_rows() {
            if let Some(t) = opt_i(&t, i) {
                out.insert(t, opt_i(&n, i).unwrap_or(0).max(0) as u64);
            }
        }
    }
    Ok(out)
}

/// Each GPU's last sample in the hours in `[from, before)`: the seed of a fold of hour
/// `before` (or of the view's raw samples when `before` is the watermark).
pub(super) async fn seed_between(
    ctx: &SessionContext,
    from: i64,
    before: i64,
) -> DfResult<HashMap<GpuKey, Last>> {
    let sql = format!(
        "SELECT host, gpu_uuid, \
           last_value(last_sample_time ORDER BY time) AS t, \
           last_value(last_energy_joules ORDER BY time) AS e \
         FROM {NAME} WHERE time >= to_timestamp_nanos({from}) AND time < to_timestamp_nanos({before}) \
           AND job_id IS NULL AND last_sample_time IS NOT NULL \
         GROUP BY host, gpu_uuid"
    );
    let mut out = HashMap::new();
    for b in collect(ctx, &sql).await? {
        let (host, gpu) = (text_at(&b, "host")?, text_at(&b, "gpu_uuid")?);
        let (t, e) = (int_at(&b, "t")?, float_at(&b, "e")?);
        for i in 0..b.num_rows() {
            if let Some(t) = opt_i(&t, i) {
                out.insert((opt_s(&host, i), opt_s(&gpu, i)), (t, opt_f(&e, i)));
            }
        }
    }
    Ok(out)
}

/// The usage rows of `job_id` in the hours `hours` (all when `None`) before `before`, one [`GpuUsage`] each (GPUs without a host or
/// UUID left out, as the report does).
pub(super) async fn job_rows(
    ctx: &SessionContext,
    job_id: &str,
    hours: Option<(i64, i64)>,
    before: i64,
) -> DfResult<Vec<GpuUsage>> {
    let (from, before) = match hours {
        Some((from, to)) => (
            format!(" AND time >= to_timestamp_nanos({from})"),
            to.min(before),
        ),
        None => (String::new(), before),
    };
    let sql = format!(
        "SELECT * FROM {NAME} WHERE job_id = '{}'{from} AND time < to_timestamp_nanos({before})",
        job_id.replace('\'', "''")
    );
    let mut out = Vec::new();
    for b in collect(ctx, &sql).await? {
        out.extend(usages(&b)?);
    }
    Ok(out)
}

/// The [`CHARGE_COLUMNS`] of a batch of usage rows.
struct ChargeColumns {
    /// The text columns (`None` in the time limit's slot).
    text: Vec<Option<StringArray>>,
    limit: Int64Array,
}

impl ChargeColumns {
    fn of(b: &RecordBatch) -> DfResult<Self> {
        let text = CHARGE_COLUMNS
            .iter()
            .enumerate()
            .map(|(k, c)| (k != TIME_LIMIT_COLUMN).then(|| text_at(b, c)).transpose())
            .collect::<DfResult<_>>()?;
        Ok(Self {
            text,
            limit: int_at(b, CHARGE_COLUMNS[TIME_LIMIT_COLUMN])?,
        })
    }

    fn at(&self, i: usize) -> Charge {
        let mut text: [Option<String>; CHARGE_COLUMNS.len()] = Default::default();
        for (slot, column) in text.iter_mut().zip(&self.text) {
            *slot = column.as_ref().and_then(|c| opt_s(c, i));
        }
        Charge {
            text,
            time_limit: opt_i(&self.limit, i),
        }
    }
}

/// The usage rows of `b` as the report takes them.
fn usages(b: &RecordBatch) -> DfResult<Vec<GpuUsage>> {
    let t = |n: &str| text_at(b, n);
    let (host, gpu, model) = (t("host")?, t("gpu_uuid")?, t("gpu_model")?);
    let (scheduler, user, name) = (t("scheduler")?, t("job_user")?, t("job_name")?);
    let charge = ChargeColumns::of(b)?;
    let (first, last, samples) = (
        int_at(b, "first_seen")?,
        int_at(b, "last_seen")?,
        int_at(b, "samples")?,
    );
    let sums: Vec<Float64Array> = SUMS
        .iter()
        .map(|c| float_at(b, c))
        .collect::<DfResult<_>>()?;
    let classes: Vec<Float64Array> = LIMITERS
        .iter()
        .map(|c| float_at(b, &limiter::seconds_column(c)))
        .collect::<DfResult<_>>()?;
    let (median, count) = (
        float_at(b, "interval_median_seconds")?,
        int_at(b, "interval_count")?,
    );
    let part_values: Vec<Float64Array> = parts::parts()
        .iter()
        .map(|p| float_at(b, &part_column(&p.name)))
        .collect::<DfResult<_>>()?;
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let (Some(h), Some(g)) = (opt_s(&host, i), opt_s(&gpu, i)) else {
            continue;
        };
        let sum = |k: usize| opt_f(&sums[k], i).unwrap_or(0.0);
        let mut class_secs = [0.0; LIMITERS.len()];
        for (slot, a) in class_secs.iter_mut().zip(&classes) {
            *slot = opt_f(a, i).unwrap_or(0.0);
        }
        out.push(GpuUsage {
            host: h,
            gpu_uuid: g,
            gpu_model: opt_s(&model, i),
            scheduler: opt_s(&scheduler, i),
            job_user: opt_s(&user, i),
            job_name: opt_s(&name, i),
            samples: opt_i(&samples, i).unwrap_or(0),
            first_ns: opt_i(&first, i).unwrap_or(0),
            last_ns: opt_i(&last, i).unwrap_or(0),
            secs: sum(0),
            idle_secs: sum(2),
            joules: sum(3),
            idle_joules: sum(4),
            class_secs,
            intervals: vec![(
                opt_f(&median, i).unwrap_or(0.0),
                opt_i(&count, i).unwrap_or(0).max(0) as u64,
            )],
            parts: Parts::from_values(part_values.iter().map(|a| opt_f(a, i))),
            charge: charge.at(i),
        });
    }
    Ok(out)
}
