//! The job-usage ledger: the `jobs` view's sums per job, GPU and closed hour, kept in the
//! `job_ledger` Delta table ([`table`]) so that the view neither recomputes its window functions
//! over every raw sample on each query nor loses a job when retention removes its samples.
//!
//! Each sample's share of the `jobs` sums (seconds, idle seconds, joules, idle joules) depends
//! only on that sample and the previous sample of its GPU (docs/cost.md). So the sums split
//! exactly by the hour the sample falls in:
//!
//! ```text
//! jobs = Σ folded hours (job_ledger, time < W)  +  the same formulas over raw samples at or after W
//! ```
//!
//! where `W` (the watermark) is the end of the folded hours. An hour is folded once it is closed
//! (`SETTLE` after its end, when the store has compacted it and built its rollups), and written
//! as one file that replaces the hour's rows. The first raw sample of each GPU at or after `W`
//! takes its predecessor from the seed (the GPU's last sample before `W`, from the table's GPU
//! rows), so the live part is exact too.
//!
//! Samples that arrive after their hour was folded (an agent's spool drained after an outage)
//! are caught by comparing each folded hour's sample count with the `samples` of its
//! `gpu_metrics_1h` rollup, which the store rebuilds for late data: a mismatch refolds that hour
//! and every later one. Hours whose raw samples retention removed stay in the table (its own
//! retention, five years by default): the view, reports and statements read them as before.
//!
//! The same fold accumulates the job report's parts ([`super::report::parts`]) per job, GPU and
//! hour (the table's `part_*` columns), so a report reads its job's rows
//! ([`JobLedger::job_usage`]) and only the raw samples after `W`.
//!
//! Data flow: [`JobLedger::run`] (`sync.rs`) loads what the table holds at start, folds closed
//! hours (queries `gpu_metrics` one hour at a time through the engine), writes each
//! (`Store::replace_hour`), then the sums of whole days ([`days`]) and the totals of the jobs
//! last seen the day before yesterday ([`totals`]), and publishes a [`Snapshot`] (watermark,
//! seed, the days and the totals' end); a server that does not fold (a query node) reloads it
//! when the tables' files change. [`JobsTable::scan`] plans
//! the view's SQL over the table before `W` and the raw samples after it, in a catalog of its
//! own, so the two always agree.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Float64Builder, RecordBatch, StringArray,
    StringViewBuilder, TimestampNanosecondArray, new_null_array,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::physical_plan::PhysicalExpr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use super::limiter::{self, LIMITERS};
use super::report::parts::{self, GpuUsage, Parts, keep_max};
use super::report::sql::EXTRA;
use super::shares::shares_of;
use super::{
    AdviceConfig, CHARGE_COLUMNS, Charge, CostConfig, JobsConfig, TIME_LIMIT_COLUMN, WorkConfig,
    charge_list_sql, num,
};

/// An hour is folded this long after it ends (the store closes an hour 10 minutes after it ends).
pub const SETTLE: Duration = Duration::from_secs(15 * 60);
/// How often the ledger looks for hours to fold and for late data.
pub const TICK: Duration = Duration::from_secs(30);
/// During the first catch-up, the snapshot is published after this many hours are folded.
const PUBLISH_EVERY: usize = 24;

const HOUR: i64 = 3_600_000_000_000;

/// The raw columns a fold reads, in this order, before the [`CHARGE_COLUMNS`].
const RAW_COLUMNS: &str = "time, host, gpu_uuid, gpu_model, job_id, scheduler, job_user, job_name, gpu_utilization, energy_joules";

/// Index of the first of the [`CHARGE_COLUMNS`] in what a fold reads.
const CHARGE_AT: usize = 10;

/// [`RAW_COLUMNS`] and the [`CHARGE_COLUMNS`].
pub(super) fn raw_columns() -> String {
    format!("{RAW_COLUMNS}{}, job_shares", charge_list_sql())
}

/// Index of `job_shares` in what a fold reads (after the [`CHARGE_COLUMNS`]).
const SHARES_AT: usize = CHARGE_AT + CHARGE_COLUMNS.len();

fn floor_hour(t: i64) -> i64 {
    t.div_euclid(HOUR) * HOUR
}

fn time_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

/// One job's use of one GPU within one hour.
#[derive(Debug, Clone, Default)]
struct Usage {
    scheduler: Option<String>,
    job_user: Option<String>,
    job_name: Option<String>,
    first_seen: i64,
    last_seen: i64,
    secs: f64,
    /// The whole seconds of the samples behind `secs` (more than `secs` where the GPU was
    /// shared: `secs` is the job's share).
    held_secs: f64,
    idle_secs: f64,
    joules: f64,
    idle_joules: f64,
    /// Seconds per limiter class, in [`LIMITERS`] order.
    class_secs: [f64; LIMITERS.len()],
    /// Samples of the job.
    samples: i64,
    /// The median of the intervals above zero and their count (the job report's
    /// `sample_interval_s`); set when the hour's fold ends, from `intervals`.
    interval: (f64, u64),
    /// The intervals above zero, while the hour is folded.
    intervals: Vec<f64>,
    /// The job report's parts ([`parts`]).
    parts: Parts,
    /// The chargeback labels, largest value seen.
    charge: Charge,
}

/// `(job_id, host, gpu_uuid, gpu_model)`.
type UsageKey = (String, Option<String>, Option<String>, Option<String>);
/// `(host, gpu_uuid)`.
type GpuKey = (Option<String>, Option<String>);
/// A GPU's last sample: time and energy counter.
type Last = (i64, Option<f64>);

/// One folded hour.
#[derive(Debug, Default)]
struct HourFold {
    usage: BTreeMap<UsageKey, Usage>,
    /// The last sample of each GPU seen in the hour.
    last: HashMap<GpuKey, Last>,
    /// Raw samples in the hour.
    samples: u64,
}

/// What [`JobsTable`] reads besides the table: the watermark and the seed.
#[derive(Debug)]
pub struct Snapshot {
    /// End of the folded hours; `None` before anything is folded (the view reads every sample).
    pub watermark: Option<i64>,
    seed: RecordBatch,
    /// The days before the watermark whose sums `job_ledger_1d` holds ([`days`]), as runs
    /// `[from, to)`.
    days: Vec<(i64, i64)>,
    /// The days whose spend `job_ledger_spend` holds (what `spend_days` reads), as runs.
    grouped_days: Vec<(i64, i64)>,
    /// What the `jobs` view reads of the per-job totals ([`totals`]); `None` while there are
    /// none.
    totals: Option<TotalsSnap>,
    /// The start of the oldest ledger day whose totals are missing or stale (`None` while the
    /// ledger is empty): every earlier day's are written.
    totals_written: Option<i64>,
}

/// The per-job totals as the `jobs` view reads them.
#[derive(Debug, Clone)]
pub(super) struct TotalsSnap {
    /// The totals' end: the files of the days before it are current.
    pub end: i64,
    /// The jobs with ledger hours at or after `end` (read from the ledger instead).
    pub recent: RecordBatch,
    /// Those of them that also have a row in the totals (seen again after their file was
    /// written, until their new last day is written): the view leaves that row out.
    pub overlap: Vec<String>,
    /// The days of the files holding those rows.
    pub overlap_days: Vec<i64>,
}

/// The [`CHARGE_COLUMNS`] with `gpu_metrics`' types, nullable.
fn charge_fields() -> impl Iterator<Item = Field> {
    CHARGE_COLUMNS.iter().enumerate().map(|(i, c)| {
        let ty = if i == TIME_LIMIT_COLUMN {
            DataType::Int64
        } else {
            DataType::Utf8View
        };
        Field::new(*c, ty, true)
    })
}

/// The raw columns of the seed: the same names and types as `gpu_metrics`' columns.
fn seed_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8View, true);
    let mut fields = vec![
        Field::new("time", time_type(), false),
        s("host"),
        s("gpu_uuid"),
        s("gpu_model"),
        s("job_id"),
        s("scheduler"),
        s("job_user"),
        s("job_name"),
        Field::new("gpu_utilization", DataType::Float64, true),
        Field::new("energy_joules", DataType::Float64, true),
    ];
    fields.extend(charge_fields());
    fields.push(s("job_shares"));
    Arc::new(Schema::new(fields))
}

fn views<'a>(values: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut b = StringViewBuilder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

impl Snapshot {
    /// The start of the oldest ledger day whose jobs' totals are missing or stale: the totals
    /// of every earlier day are written (and `jobs` reads them, once the jobs' hours are
    /// indexed).
    pub fn totals_end(&self) -> Option<i64> {
        self.totals_written
    }

    fn empty() -> Self {
        Self {
            watermark: None,
            seed: RecordBatch::new_empty(seed_schema()),
            days: Vec::new(),
            grouped_days: Vec::new(),
            totals: None,
            totals_written: None,
        }
    }
}

/// The seed table: each GPU's last sample (time and energy counter), the other raw columns
/// null.
fn seed_batch(last: &[(GpuKey, Last)]) -> DfResult<RecordBatch> {
    let n = last.len();
    let mut energy = Float64Builder::with_capacity(n);
    for (_, (_, e)) in last {
        energy.append_option(*e);
    }
    let times = last.iter().map(|(_, (t, _))| *t).collect::<Vec<_>>();
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampNanosecondArray::from(times).with_timezone("UTC")),
        views(last.iter().map(|(k, _)| k.0.as_deref())),
        views(last.iter().map(|(k, _)| k.1.as_deref())),
    ];
    columns.extend((0..5).map(|_| new_null_array(&DataType::Utf8View, n)));
    columns.push(new_null_array(&DataType::Float64, n));
    columns.push(Arc::new(energy.finish()));
    columns.extend(charge_fields().map(|f| new_null_array(f.data_type(), n)));
    columns.push(new_null_array(&DataType::Utf8View, n));
    Ok(RecordBatch::try_new(seed_schema(), columns)?)
}

/// What the ledger knows of the table, kept current as it folds.
#[derive(Debug, Default)]
struct State {
    /// Whether the table was read since the server started.
    loaded: bool,
    /// The table's files when it was last read (a server that does not fold reloads when they
    /// change).
    files: Vec<String>,
    /// The hour of the oldest raw sample when the state was last computed.
    oldest_raw_hour: Option<i64>,
    /// The folded hours at or after the oldest raw sample's hour, and their raw samples.
    hours: BTreeMap<i64, u64>,
    /// End of the folded hours.
    watermark: Option<i64>,
    /// Each GPU's last sample before the watermark (from the oldest raw sample's hour on).
    seed: HashMap<GpuKey, Last>,
    /// The days rolled into `job_ledger_1d` and those to roll.
    days: days::Days,
    /// The ledger's hours and the days written to `job_ledger_totals`.
    totals: totals::Totals,
    /// The jobs seen at or after the totals' end that also have a row in them, and the days
    /// of the files holding those rows.
    overlap: Vec<String>,
    overlap_days: Vec<i64>,
    /// Whether the totals files of an earlier release were given their jobs' host counts.
    hosts_filled: bool,
}

/// The ledger of one server.
#[derive(Debug)]
pub struct JobLedger {
    cost: CostConfig,
    advice: AdviceConfig,
    work: WorkConfig,
    snapshot: RwLock<Arc<Snapshot>>,
    state: Mutex<State>,
    /// Each job's first and last hour in the table ([`spans`]).
    spans: RwLock<spans::Spans>,
    /// The groups made of each day's totals ([`groups`]).
    made: Mutex<groups::MadeDays>,
    /// The store the ledger's passes read (set by the first).
    store: OnceLock<Arc<gpuwatch_store::Store>>,
}

pub(super) fn plain(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(e.to_string())
}

fn strings(batch: &RecordBatch, i: usize) -> DfResult<StringArray> {
    Ok(cast(batch.column(i), &DataType::Utf8)?
        .as_string::<i32>()
        .clone())
}

fn f64_column(batch: &RecordBatch, i: usize) -> DfResult<Float64Array> {
    Ok(cast(batch.column(i), &DataType::Float64)?
        .as_primitive::<arrow::datatypes::Float64Type>()
        .clone())
}

fn ints(batch: &RecordBatch, i: usize) -> DfResult<arrow::array::Int64Array> {
    Ok(cast(batch.column(i), &DataType::Int64)?
        .as_primitive::<arrow::datatypes::Int64Type>()
        .clone())
}

fn opt(a: &StringArray, i: usize) -> Option<&str> {
    (!a.is_null(i)).then(|| a.value(i))
}

impl JobLedger {
    /// An empty ledger: until [`Self::run`] reads the table and folds hours, the `jobs` view
    /// reads every raw sample.
    pub fn new(cost: CostConfig, jobs: JobsConfig) -> Self {
        Self {
            cost,
            advice: jobs.advice,
            work: jobs.work,
            snapshot: RwLock::new(Arc::new(Snapshot::empty())),
            state: Mutex::new(State::default()),
            spans: RwLock::new(spans::Spans::default()),
            made: Mutex::new(groups::MadeDays::new()),
            store: OnceLock::new(),
        }
    }

    /// Folded hours still backed by raw samples.
    pub fn hours(&self) -> usize {
        self.lock().hours.len()
    }

    /// The end of the folded hours and the job's use of each GPU (and model) in them, merged
    /// over the hours; `None` before any hour is folded.
    pub(crate) async fn job_usage(
        &self,
        ctx: &SessionContext,
        job_id: &str,
    ) -> DfResult<Option<(i64, Vec<GpuUsage>)>> {
        let Some(w) = self.snapshot().watermark else {
            return Ok(None);
        };
        // The job's hours, once the index is read.
        let ask = bounds::Ask {
            jobs: Some(vec![job_id.to_string()]),
            ..bounds::Ask::default()
        };
        let range = self
            .spans_ready()
            .then(|| self.spans().range(&ask, &Default::default(), w));
        let mut merged: BTreeMap<(String, String, Option<String>), GpuUsage> = BTreeMap::new();
        for g in table::job_rows(ctx, job_id, range.flatten(), w).await? {
            let key = (g.host.clone(), g.gpu_uuid.clone(), g.gpu_model.clone());
            match merged.get_mut(&key) {
                Some(m) => m.merge(&g),
                None => {
                    merged.insert(key, g);
                }
            }
        }
        Ok(Some((w, merged.into_values().collect())))
    }

    /// The time of each GPU's last sample before the watermark (GPUs without one are left
    /// out).
    pub(crate) fn last_sample_before_watermark(
        &self,
        gpus: &[(String, String)],
    ) -> HashMap<(String, String), i64> {
        let state = self.lock();
        gpus.iter()
            .filter_map(|(h, g)| {
                let (t, _) = state.seed.get(&(Some(h.clone()), Some(g.clone())))?;
                Some(((h.clone(), g.clone()), *t))
            })
            .collect()
    }

    /// What the `jobs` view reads now.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .map(|s| Arc::clone(&s))
            .unwrap_or_else(|p| Arc::clone(&p.into_inner()))
    }

    /// Publishes the state's watermark and seed to the view.
    fn publish(&self, state: &State) -> DfResult<()> {
        let mut seed: Vec<(GpuKey, Last)> =
            state.seed.iter().map(|(k, v)| (k.clone(), *v)).collect();
        seed.sort_by(|a, b| a.0.cmp(&b.0));
        let snap = Arc::new(Snapshot {
            watermark: state.watermark,
            seed: seed_batch(&seed)?,
            days: state
                .watermark
                .map_or_else(Vec::new, |w| days::runs(&state.days.current, w)),
            grouped_days: state
                .watermark
                .map_or_else(Vec::new, |w| days::runs(&state.days.grouped, w)),
            totals: self.totals_view(state)?,
            totals_written: state.totals.end(),
        });
        match self.snapshot.write() {
            Ok(mut s) => *s = snap,
            Err(p) => *p.into_inner() = snap,
        }
        Ok(())
    }

    /// The totals' end and the jobs seen at or after it, once the index of jobs' hours is read
    /// and at least one day is written.
    fn totals_view(&self, state: &State) -> DfResult<Option<TotalsSnap>> {
        let Some(end) = state.totals.end() else {
            return Ok(None);
        };
        let spans = self.spans();
        if !spans.ready() || state.totals.written.range(..end).next().is_none() {
            return Ok(None);
        }
        let recent = totals::job_batch(spans.since(end).into_iter())?;
        Ok(Some(TotalsSnap {
            end,
            recent,
            overlap: state.overlap.clone(),
            overlap_days: state.overlap_days.clone(),
        }))
    }

    fn spans(&self) -> std::sync::RwLockReadGuard<'_, spans::Spans> {
        self.spans.read().unwrap_or_else(|p| p.into_inner())
    }

    fn spans_mut(&self) -> std::sync::RwLockWriteGuard<'_, spans::Spans> {
        self.spans.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the index of the jobs' hours was read whole: questions are bounded from then on.
    pub fn spans_ready(&self) -> bool {
        self.spans().ready()
    }

    /// Jobs the index of the jobs' hours holds.
    pub fn spans_len(&self) -> usize {
        self.spans().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The samples of hour `hour` in the order a fold reads them: [`RAW_COLUMNS`], the [`CHARGE_COLUMNS`], the class,
    /// then what the job report's parts read ([`parts::physical`]).
    fn fold_sql(&self, hour: i64) -> String {
        let mut extra: String = EXTRA.iter().map(|c| format!(", {c}")).collect();
        extra.push_str(&parts::derived_columns());
        format!(
            "SELECT {raw}, {class} AS limiter{extra}, \
             COALESCE(gpu_utilization < {idle}, false) AS idle, {price} AS price FROM gpu_metrics \
             WHERE time >= to_timestamp_nanos({hour}) AND time < to_timestamp_nanos({end}) \
             ORDER BY host, gpu_uuid, time",
            raw = raw_columns(),
            end = hour + HOUR,
            class = self.class_sql(),
            idle = num(self.cost.idle_utilization),
            price = self.cost.price_sql(),
        )
    }

    /// Folds hour `hour` of `gpu_metrics`, seeded by the GPUs' last samples before it.
    async fn fold_hour(
        &self,
        ctx: &SessionContext,
        hour: i64,
        seed: &HashMap<GpuKey, Last>,
    ) -> DfResult<HourFold> {
        let frame = ctx.sql(&self.fold_sql(hour)).await?;
        let exprs = parts::physical(ctx, frame.schema())?;
        let mut stream = frame.execute_stream().await?;
        let gap = i64::try_from(self.cost.max_sample_gap().as_nanos()).unwrap_or(i64::MAX);
        let idle = self.cost.idle_utilization;
        let mut fold = HourFold::default();
        let mut prev: Option<(GpuKey, Last)> = None;
        while let Some(batch) = stream.next().await {
            let b = FoldBatch::of(&batch?, &exprs)?;
            for i in 0..b.rows {
                fold.samples += 1;
                let t = b.time.value(i);
                let e = (!b.energy.is_null(i)).then(|| b.energy.value(i));
                let key = (
                    opt(&b.host, i).map(String::from),
                    opt(&b.gpu, i).map(String::from),
                );
                let before = match prev.take() {
                    Some((k, last)) if k == key => Some(last),
                    _ => seed.get(&key).copied(),
                };
                let (secs, joules) = interval(before, t, e, gap);
                let own = opt(&b.job, i);
                // A GPU shared by several jobs gives each its share (shares::split_sql).
                let jobs = if own.is_some() {
                    shares_of(own, opt(&b.shares, i))
                } else {
                    Vec::new()
                };
                let is_idle = !b.util.is_null(i) && b.util.value(i) < idle;
                for (job_id, share) in jobs {
                    let u = fold
                        .usage
                        .entry((
                            job_id.to_string(),
                            key.0.clone(),
                            key.1.clone(),
                            opt(&b.model, i).map(String::from),
                        ))
                        .or_insert_with(|| Usage {
                            first_seen: t,
                            last_seen: t,
                            ..Usage::default()
                        });
                    if Some(job_id) == own {
                        b.keep_labels(u, i);
                    } else {
                        keep_max(&mut u.scheduler, opt(&b.scheduler, i));
                        b.keep_namespace_of(u, job_id, i);
                    }
                    let part = (secs * share, secs);
                    u.add(t, part, joules * share, opt(&b.class, i), is_idle);
                    u.parts.add_sample(
                        part.0,
                        b.values.iter().map(|c| (!c.is_null(i)).then(|| c.value(i))),
                    );
                }
                fold.last.insert(key.clone(), (t, e));
                prev = Some((key, (t, e)));
            }
        }
        for u in fold.usage.values_mut() {
            u.finish();
        }
        Ok(fold)
    }

    /// The class of a raw sample (`limiter::sample_class_sql` with this ledger's thresholds).
    fn class_sql(&self) -> String {
        limiter::sample_class_sql(&self.advice, self.cost.idle_utilization)
    }
}

/// The columns of one batch of [`JobLedger::fold_sql`]'s answer, and the parts evaluated on it.
struct FoldBatch {
    rows: usize,
    time: arrow::array::Int64Array,
    host: StringArray,
    gpu: StringArray,
    model: StringArray,
    job: StringArray,
    scheduler: StringArray,
    user: StringArray,
    name: StringArray,
    util: Float64Array,
    energy: Float64Array,
    /// The [`CHARGE_COLUMNS`] as text (the time limit's too, unused).
    charge: Vec<StringArray>,
    limit: arrow::array::Int64Array,
    shares: StringArray,
    class: StringArray,
    values: Vec<Float64Array>,
}

impl FoldBatch {
    fn of(batch: &RecordBatch, exprs: &[Arc<dyn PhysicalExpr>]) -> DfResult<Self> {
        let ints = |i: usize| ints(batch, i);
        Ok(FoldBatch {
            rows: batch.num_rows(),
            time: ints(0)?,
            host: strings(batch, 1)?,
            gpu: strings(batch, 2)?,
            model: strings(batch, 3)?,
            job: strings(batch, 4)?,
            scheduler: strings(batch, 5)?,
            user: strings(batch, 6)?,
            name: strings(batch, 7)?,
            util: f64_column(batch, 8)?,
            energy: f64_column(batch, 9)?,
            charge: (0..CHARGE_COLUMNS.len())
                .map(|k| strings(batch, CHARGE_AT + k))
                .collect::<DfResult<Vec<_>>>()?,
            limit: ints(CHARGE_AT + TIME_LIMIT_COLUMN)?,
            shares: strings(batch, SHARES_AT)?,
            class: strings(batch, SHARES_AT + 1)?,
            values: parts::evaluate(exprs, batch)?,
        })
    }

    /// For a job sharing the GPU of row `i` that is not the row's own: on Kubernetes, the
    /// namespace its id `<namespace>/<pod>` gives (as shares::split_sql).
    fn keep_namespace_of(&self, u: &mut Usage, job_id: &str, i: usize) {
        let namespace = CHARGE_COLUMNS.iter().position(|c| *c == "k8s_namespace");
        if let Some(k) = namespace.filter(|_| opt(&self.scheduler, i) == Some("kubernetes")) {
            let ns = job_id.split('/').next().unwrap_or_default();
            keep_max(&mut u.charge.text[k], Some(ns));
        }
    }

    /// Keeps the largest of each label of row `i` in `u`.
    fn keep_labels(&self, u: &mut Usage, i: usize) {
        keep_max(&mut u.scheduler, opt(&self.scheduler, i));
        keep_max(&mut u.job_user, opt(&self.user, i));
        keep_max(&mut u.job_name, opt(&self.name, i));
        let text = u.charge.text.iter_mut().zip(&self.charge).enumerate();
        for (_, (slot, column)) in text.filter(|(k, _)| *k != TIME_LIMIT_COLUMN) {
            keep_max(slot, opt(column, i));
        }
        if !self.limit.is_null(i) {
            u.charge.time_limit = u.charge.time_limit.max(Some(self.limit.value(i)));
        }
    }
}

/// The GPU-seconds (capped at `gap`) and joules from the previous sample `before` to this one,
/// at `t` with energy counter `e` (a counter that went back restarted: its value is the energy).
fn interval(before: Option<Last>, t: i64, e: Option<f64>, gap: i64) -> (f64, f64) {
    let Some((pt, pe)) = before else {
        return (0.0, 0.0);
    };
    let dt = t.saturating_sub(pt);
    let secs = if dt <= 0 {
        0.0
    } else {
        dt.min(gap) as f64 / 1e9
    };
    let joules = match (e, pe) {
        (Some(e), Some(pe)) if e - pe < 0.0 => e,
        (Some(e), Some(pe)) => e - pe,
        _ => 0.0,
    };
    (secs, joules)
}

impl Usage {
    /// Ends the hour: keeps the median of its intervals, drops the intervals.
    fn finish(&mut self) {
        let n = self.intervals.len() as u64;
        self.interval = (parts::median(&mut self.intervals).unwrap_or(0.0), n);
        self.intervals = Vec::new();
    }

    /// Adds one sample at `t` worth `secs` and `joules` of the job (its share of the `held`
    /// seconds of a shared GPU), of limiter class `class`.
    fn add(
        &mut self,
        t: i64,
        (secs, held): (f64, f64),
        joules: f64,
        class: Option<&str>,
        idle: bool,
    ) {
        self.first_seen = self.first_seen.min(t);
        self.last_seen = self.last_seen.max(t);
        self.secs += secs;
        self.held_secs += held;
        self.joules += joules;
        self.samples += 1;
        if held > 0.0 {
            self.intervals.push(held);
        }
        if let Some(k) = class.and_then(|c| LIMITERS.iter().position(|l| *l == c)) {
            self.class_secs[k] += secs;
        }
        if idle {
            self.idle_secs += secs;
            self.idle_joules += joules;
        }
    }
}

mod bounds;
mod days;
pub mod groups;
mod spans;
mod sync;
pub mod table;
mod totals;
mod view;
pub use view::{JobsTable, View};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_days;
#[cfg(test)]
mod tests_groups;
#[cfg(test)]
mod tests_totals;
