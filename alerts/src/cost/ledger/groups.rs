//! The `job_groups` view: the `jobs` rows grouped by the UTC days their jobs were last and
//! first seen, user, account, GPU model and limiter (a job on several hosts keeps rows of its
//! own, so that it is counted once, and so do the 20 jobs on one host with the most idle cost
//! of each day, user and GPU model), so that a year's panel sums thousands of groups instead of
//! millions of jobs.
//!
//! ```text
//! day X's groups = the groups of the rows of X's totals file ([`totals`]), made once per
//!                  file (kept in memory, named by its files' paths) by each ledger pass
//! job_groups     = the made groups of the days before the totals' end whose files are the
//!                  ones they were made from and that hold no job seen again (an overlap)
//!                + the `jobs` rows of the other days and of the recent jobs, grouped the
//!                  same way at question time
//! ```
//!
//! Both parts group with one `SELECT` ([`group_select`]) over the rows `jobs` gives, so they
//! agree; a day whose files changed since its groups were made is read as `jobs` reads it
//! until the next pass makes them again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{cast, concat_batches, filter_record_batch};
use arrow::datatypes::{DataType, Int64Type, SchemaRef, TimeUnit};
use datafusion::catalog::MemTable;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::SessionContext;
use gpuwatch_store::Store;
use gpuwatch_store::schema::Table;

use super::super::MEAN_ACTIVITY;
use super::bounds::Ask;
use super::days::{self, floor_day};
use super::view::{LedgerRead, TotalsRead, private_state};
use super::{DfResult, JobLedger, Snapshot, totals};

/// The view's SQL name.
pub const NAME: &str = "job_groups";
/// Days whose groups one statement makes.
const DAYS_PER_STATEMENT: usize = 31;

/// The groups made from one day's totals files.
#[derive(Debug, Clone)]
pub(super) struct Made {
    /// The paths of the day's files the groups were made from, sorted.
    paths: Vec<String>,
    batch: RecordBatch,
}

/// The groups made so far, by day.
pub(super) type MadeDays = BTreeMap<i64, Made>;

/// The jobs on one host that keep a row of their own each day, per user and GPU model: those
/// with the most idle cost (the Cost dashboard's "Most idle cost" ranks the jobs of a range,
/// and a job among a range's first 20 is among the first 20 of its day, user and model).
pub const TOP_IDLE: usize = 20;

/// `job_groups`' `SELECT` over `from`, a relation with the `jobs` view's columns. A job keeps
/// rows of its own (its `job_id`, one per host) where it ran on several hosts or is among the
/// [`TOP_IDLE`] jobs on one host with the most idle cost of its day, user and GPU model
/// (ties by `job_id`, as the panel orders them); the others are grouped (`job_id` null).
pub(super) fn group_select(from: &str) -> String {
    format!(
        r#"SELECT day, first_day, job_user, job_account, gpu_model, limiter, activity_tenth, own AS job_id,
  count(CASE WHEN own IS NULL THEN 1 END) AS jobs,
  CASE WHEN own IS NULL THEN NULL ELSE max(job_name) END AS job_name, sum(gpus) AS gpus,
  sum(gpu_seconds) AS gpu_seconds, sum(idle_gpu_seconds) AS idle_gpu_seconds,
  sum(energy_joules) AS energy_joules, sum(cost_usd) AS cost_usd, sum(idle_cost_usd) AS idle_cost_usd
FROM (
  SELECT j.*, date_trunc('day', last_seen) AS day, date_trunc('day', first_seen) AS first_day,
    {tenth} AS activity_tenth,
    CASE WHEN job_host_count = 1 AND row_number() OVER (
        PARTITION BY date_trunc('day', last_seen), job_user, gpu_model, job_host_count = 1
        ORDER BY idle_cost_usd DESC, job_id) > {TOP_IDLE}
      THEN NULL ELSE job_id END AS own
  FROM ({from}) j
) g GROUP BY day, first_day, job_user, job_account, gpu_model, limiter, activity_tenth, own"#,
        tenth = activity_tenth_sql(MEAN_ACTIVITY),
    )
}

/// The tenth of `activity` (a job's mean activity, 0 to 1) it is in, as its lower bound: 0.0
/// below 0.1, …, 0.9 from 0.9 (1 too); null when `activity` is. A panel of activity bands
/// whose bounds are tenths sums whole tenths (`jobs` rows put in bands with the same SQL).
pub fn activity_tenth_sql(activity: &str) -> String {
    // `least` and `greatest` skip nulls: the `CASE` keeps a null a null.
    format!(
        "CASE WHEN {activity} IS NOT NULL THEN least(greatest(floor({activity} * 10.0), 0.0), 9.0) / 10.0 END"
    )
}

/// The paths of the totals' files by the UTC day they hold (before `end`), sorted.
fn files_by_day(store: &Store, end: i64) -> BTreeMap<i64, Vec<String>> {
    let mut out: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for f in store.files(Table::JobLedgerTotals).iter() {
        let day = floor_day(f.min_time);
        if f.has_time_range() && day < end {
            out.entry(day).or_default().push(f.path.clone());
        }
    }
    out.values_mut().for_each(|p| p.sort_unstable());
    out
}

/// The day of each row of `batch` (its `day` column, nanoseconds).
fn row_days(batch: &RecordBatch) -> DfResult<Vec<Option<i64>>> {
    let day = batch
        .column_by_name("day")
        .ok_or_else(|| super::plain("no day column"))?;
    let day = cast(day, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
    let day = cast(&day, &DataType::Int64)?;
    let day = day.as_primitive::<Int64Type>();
    Ok((0..day.len())
        .map(|i| (!day.is_null(i)).then(|| day.value(i)))
        .collect())
}

impl JobLedger {
    /// Makes the groups of the totals' days whose files changed (or are new) since theirs were
    /// made, and forgets those of days no longer there. Returns the days made.
    pub(super) async fn make_groups(&self, ctx: &SessionContext, store: &Store) -> DfResult<usize> {
        let Some(end) = self.snapshot().totals.as_ref().map(|t| t.end) else {
            return Ok(0);
        };
        let files = files_by_day(store, end);
        let stale: Vec<i64> = {
            let mut made = self.made();
            made.retain(|d, _| files.contains_key(d));
            files
                .iter()
                .filter(|(d, p)| made.get(d).is_none_or(|m| &m.paths != *p))
                .map(|(d, _)| *d)
                .collect()
        };
        let mut count = 0;
        for chunk in stale.chunks(DAYS_PER_STATEMENT) {
            let made = self.group_days(ctx, end, chunk).await?;
            // Only days whose files did not change while they were grouped.
            let now = files_by_day(store, end);
            let mut kept = self.made();
            for (day, batch) in made {
                if let (Some(before), Some(after)) = (files.get(&day), now.get(&day))
                    && before == after
                {
                    kept.insert(
                        day,
                        Made {
                            paths: after.clone(),
                            batch,
                        },
                    );
                    count += 1;
                }
            }
        }
        Ok(count)
    }

    /// The groups of the totals' files of `days` (before `end`), by day; a day without rows
    /// has an empty batch.
    async fn group_days(
        &self,
        ctx: &SessionContext,
        end: i64,
        days: &[i64],
    ) -> DfResult<Vec<(i64, RecordBatch)>> {
        let read = TotalsRead {
            end,
            days: Some(days::day_runs(days.iter().copied())),
            ..TotalsRead::default()
        };
        let state = private_state(&ctx.state(), &[totals::NAME], Vec::new()).await?;
        let sql = group_select(&self.totals_rows_sql(&read));
        let frame = SessionContext::new_with_state(state).sql(&sql).await?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let all = concat_batches(&schema, &frame.collect().await?)?;
        let at = row_days(&all)?;
        let wanted: BTreeSet<i64> = days.iter().copied().collect();
        if let Some(odd) = at.iter().flatten().find(|d| !wanted.contains(d)) {
            // A file holding jobs last seen on another day: none of these days is made.
            tracing::warn!(
                day = odd,
                "job groups: a totals row outside its file's day; the days are read as jobs reads them"
            );
            return Ok(Vec::new());
        }
        days.iter()
            .map(|&d| {
                let mask: BooleanArray = at.iter().map(|t| Some(*t == Some(d))).collect();
                Ok((d, filter_record_batch(&all, &mask)?))
            })
            .collect()
    }

    /// What a `job_groups` question reads: the groups made for the days it may return (the
    /// view's rows of those days, `read.made`), and the totals' days it reads as `jobs` does
    /// (`read.totals`' days): those without groups made from their current files, and those
    /// holding a job seen again.
    pub(super) fn split_groups(&self, snap: &Snapshot, read: &mut LedgerRead, ask: &Ask) {
        let (Some(t), Some(store)) = (read.totals.as_mut(), self.store.get()) else {
            return;
        };
        let files = files_by_day(store, t.end);
        let low = ask.low.map_or(i64::MIN, floor_day);
        let high = ask.last_high.unwrap_or(i64::MAX);
        let overlap = self.overlap_days(snap, &t.overlap);
        let made = self.made();
        let mut batches = Vec::new();
        let mut fly = Vec::new();
        // `range` refuses a start after its end (a question that can return nothing).
        for (day, paths) in files
            .range(low..=high.max(low))
            .filter(|(d, _)| **d <= high)
        {
            match made.get(day) {
                Some(m) if &m.paths == paths && !overlap.contains(day) => {
                    batches.push(m.batch.clone())
                }
                _ => fly.push(*day),
            }
        }
        t.days = Some(days::day_runs(fly));
        read.made = Some(batches);
    }

    /// The days of the totals' files holding the jobs in `overlap` (seen again after their
    /// file was written): the snapshot's, and those of the live ones from their last hour.
    fn overlap_days(&self, snap: &Snapshot, overlap: &[String]) -> BTreeSet<i64> {
        let spans = self.spans();
        let end = snap.totals.as_ref().map_or(i64::MIN, |t| t.end);
        let mut out: BTreeSet<i64> = snap
            .totals
            .as_ref()
            .map(|t| t.overlap_days.iter().copied().collect())
            .unwrap_or_default();
        out.extend(
            overlap
                .iter()
                .filter_map(|j| spans.last_hour(j))
                .filter(|&l| l < end)
                .map(floor_day),
        );
        out
    }

    fn made(&self) -> std::sync::MutexGuard<'_, MadeDays> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `frame` (the groups of the days read as `jobs` reads them) with the groups made before,
/// cast to its columns; `None` where they cannot be (the question then reads every day).
pub(super) fn with_made(frame: DataFrame, made: &[RecordBatch]) -> DfResult<Option<DataFrame>> {
    if made.is_empty() {
        return Ok(Some(frame));
    }
    let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
    let mut cast_batches = Vec::with_capacity(made.len());
    for b in made.iter().filter(|b| b.num_rows() > 0) {
        let columns: Option<Vec<_>> = schema
            .fields()
            .iter()
            .map(|f| cast(b.column_by_name(f.name())?, f.data_type()).ok())
            .collect();
        let fitted = columns.and_then(|c| RecordBatch::try_new(Arc::clone(&schema), c).ok());
        let Some(fitted) = fitted else {
            tracing::warn!(
                "job groups: made groups do not fit the view; every day is read as jobs reads it"
            );
            return Ok(None);
        };
        cast_batches.push(fitted);
    }
    let table = MemTable::try_new(Arc::clone(&schema), vec![cast_batches])?;
    let (state, plan) = frame.into_parts();
    let made =
        LogicalPlanBuilder::scan("job_groups_made", provider_as_source(Arc::new(table)), None)?
            .build()?;
    let plan = LogicalPlanBuilder::from(made).union(plan)?.build()?;
    Ok(Some(DataFrame::new(state, plan)))
}

#[cfg(test)]
pub(super) fn made_days(ledger: &JobLedger) -> Vec<i64> {
    ledger.made().keys().copied().collect()
}
