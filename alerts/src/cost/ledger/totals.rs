//! The ledger's per-job totals: the `job_ledger_totals` table, one row per job, host and GPU
//! model with the job's whole sums (every column the `jobs` view reads, summed over all its
//! hours; `gpus`, the job's GPUs there; `host_models`, the models it used on that host), in
//! the file of the UTC day the job was last seen. `jobs` reads a finished job's row as it is
//! instead of summing its hours or days again, so a year of jobs is one row per job and host.
//!
//! ```text
//! day X's file = the jobs whose last ledger hour is in X, written once the day after X is
//!                folded (a job seen again after a whole day away is written again later)
//! end (T)      = the start of the oldest ledger day without a current file
//! jobs         = the files before T, less the recent jobs (rows at or after T, raw samples
//!                after the watermark) + the recent jobs summed from the ledger as before
//! ```
//!
//! A file is current while its marker row (no job) matches the ledger: `first_seen` holds the
//! first day its jobs' sums read and `samples` the ledger's raw samples from that day to the
//! end of the day after X. Late samples refold hours and change that count, so the file is
//! written again (the views stop at the first stale day meanwhile). A job written again in a
//! later day's file is removed from the earlier file, so each job has one row per host and
//! model. Once retention has removed the ledger's hours before a file's first day, the file
//! cannot be rebuilt and is kept as it is: a job's cost stays what it was.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringViewArray};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemTable;
use datafusion::execution::context::SessionState;
use datafusion::prelude::SessionContext;
use gpuwatch_store::Store;
use gpuwatch_store::schema::Table;

use super::super::charge_max_sql;
use super::super::limiter;
use super::days::{self, DAY, floor_day};
use super::{DfResult, plain, table};

/// The table's SQL name.
pub(super) const NAME: &str = "job_ledger_totals";
/// The in-memory table of the jobs a statement is about (one `job_id` column).
pub(super) const JOB_LIST: &str = "job_list";
/// Days written in one pass before the views see them.
const DAYS_PER_PASS: usize = 32;

/// A written day's marker: the first day its sums read and the ledger's samples from that day
/// to the end of the day after the file's day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    pub from: i64,
    pub samples: i64,
    /// The file's layout ([`days::FORMAT`]; 0 for a file of an earlier release).
    pub format: i64,
}

/// What the ledger knows of its totals.
#[derive(Debug, Default, Clone)]
pub(super) struct Totals {
    /// The ledger's raw samples per folded hour (its hour rows), every hour it holds.
    pub hours: BTreeMap<i64, i64>,
    /// The written days and their markers.
    pub written: BTreeMap<i64, Marker>,
}

impl Totals {
    /// The ledger's samples in the hours `[from, to)`.
    fn samples(&self, from: i64, to: i64) -> i64 {
        self.hours.range(from..to).map(|(_, n)| *n).sum()
    }

    /// The ledger's days, oldest first.
    fn days(&self) -> BTreeSet<i64> {
        self.hours.keys().map(|&h| floor_day(h)).collect()
    }

    /// Whether day `day`'s file matches the ledger (or can no longer be rebuilt).
    fn current(&self, day: i64) -> bool {
        let Some(m) = self.written.get(&day) else {
            return false;
        };
        let first = self.hours.keys().next().map(|&h| floor_day(h));
        // A file the ledger can no longer rebuild is kept as it is, whatever its layout.
        first.is_none_or(|f| m.from < f)
            || (m.format >= days::FORMAT && self.samples(m.from, day + 2 * DAY) == m.samples)
    }

    /// The end of the totals the views read: the start of the oldest ledger day whose file is
    /// missing or stale (`None` when the ledger holds nothing).
    pub(super) fn end(&self) -> Option<i64> {
        let days = self.days();
        let first = *days.first()?;
        Some(
            days.into_iter()
                .find(|&d| !self.current(d))
                .unwrap_or_else(|| floor_day(*self.hours.keys().last().unwrap_or(&first)) + DAY),
        )
    }

    /// The days to write with the watermark at `w`: stale or missing, the day after them
    /// folded, oldest first.
    pub(super) fn due(&self, w: i64) -> Vec<i64> {
        self.days()
            .into_iter()
            .filter(|&d| d + 2 * DAY <= w && !self.current(d))
            .take(DAYS_PER_PASS)
            .collect()
    }
}

/// Every ledger hour's raw samples (its hour rows).
pub(super) async fn ledger_hours(ctx: &SessionContext) -> DfResult<BTreeMap<i64, i64>> {
    days::markers(
        ctx,
        table::NAME,
        "job_id IS NULL AND last_sample_time IS NULL",
    )
    .await
}

/// The written days' markers.
pub(super) async fn markers(ctx: &SessionContext) -> DfResult<BTreeMap<i64, Marker>> {
    let sql = format!(
        "SELECT CAST(time AS BIGINT), CAST(first_seen AS BIGINT), samples, {format} FROM {NAME} \
         WHERE job_id IS NULL",
        format = days::FORMAT_COLUMN
    );
    Ok(days::int_rows(ctx, &sql)
        .await?
        .into_iter()
        .map(|[d, from, samples, format]| {
            (
                d,
                Marker {
                    from,
                    samples,
                    format,
                },
            )
        })
        .collect())
}

/// A one-column (`job_id`) batch of `ids`.
pub(super) fn job_batch<'a>(ids: impl Iterator<Item = &'a str>) -> DfResult<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "job_id",
        DataType::Utf8View,
        false,
    )]));
    let ids: StringViewArray = ids.map(Some).collect();
    Ok(RecordBatch::try_new(
        schema,
        vec![Arc::new(ids) as ArrayRef],
    )?)
}

/// A context over `state`'s ledger tables and `jobs` as [`JOB_LIST`], in a catalog of its own.
async fn with_jobs(state: &SessionState, jobs: RecordBatch) -> DfResult<SessionContext> {
    let list = MemTable::try_new(jobs.schema(), vec![vec![jobs]])?;
    let private = super::view::private_state(
        state,
        &[table::NAME, days::NAME, NAME],
        vec![(JOB_LIST, Arc::new(list))],
    )
    .await?;
    Ok(SessionContext::new_with_state(private))
}

/// The SQL of the totals of the jobs in [`JOB_LIST`] from the ledger's rows in `[from, to)`:
/// the days in `runs` from the daily sums, the other hours (as ranges, which prune files)
/// from the hour rows.
fn sums_sql(from: i64, to: i64, runs: &[(i64, i64)]) -> String {
    let summed = days::summed_columns();
    let charge = super::super::CHARGE_COLUMNS.join(", ");
    let cols = format!(
        "job_id, host, gpu_uuid, gpu_model, scheduler, job_user, job_name, {charge}, first_seen, last_seen, {}",
        summed.join(", ")
    );
    let jobs = format!("job_id IN (SELECT job_id FROM {JOB_LIST})");
    let in_days = days::in_runs_sql(runs);
    let in_hours = days::in_runs_sql(&days::gaps(from, to, runs));
    let sums = days::sums_list(&summed);
    format!(
        "WITH u AS (
  SELECT {cols} FROM {days} WHERE {jobs} AND time >= to_timestamp_nanos({from}) AND time < to_timestamp_nanos({to}) AND {in_days}
  UNION ALL
  SELECT {cols} FROM {hours} WHERE {jobs} AND {in_hours}
), g AS (
  SELECT job_id, host, gpu_model, max(scheduler) AS scheduler, max(job_user) AS job_user,
    max(job_name) AS job_name{charge_max}, min(first_seen) AS first_seen, max(last_seen) AS last_seen{sums},
    count(DISTINCT gpu_uuid) AS gpus
  FROM u GROUP BY job_id, host, gpu_model
), h AS (
  SELECT job_id AS hosts_of, count(DISTINCT host) AS {job_host_count} FROM g GROUP BY job_id
)
SELECT g.*, count(*) OVER (PARTITION BY job_id, host) AS host_models, {limiter} AS {limiter_column}, h.{job_host_count}
FROM g JOIN h ON h.hosts_of = g.job_id",
        days = days::NAME,
        hours = table::NAME,
        charge_max = charge_max_sql(true),
        limiter = limiter::argmax_sql(limiter::seconds_column),
        limiter_column = table::TOTALS_LIMITER,
        job_host_count = table::JOB_HOST_COUNT,
    )
}

/// What writing one day needs from the ledger.
pub(super) struct DayJobs {
    /// The day.
    pub day: i64,
    /// The jobs whose last ledger hour is in the day, and the first hour of the earliest.
    pub jobs: Vec<String>,
    pub first: Option<i64>,
    /// The days whose daily sums are current, as runs.
    pub runs: Vec<(i64, i64)>,
}

/// Writes `d.day`'s file and removes its jobs from earlier files; returns its marker.
pub(super) async fn write(
    state: &SessionState,
    store: &Arc<Store>,
    totals: &Totals,
    d: DayJobs,
) -> DfResult<Marker> {
    let day = d.day;
    let from = floor_day(d.first.unwrap_or(day).min(day));
    let marker = Marker {
        from,
        samples: totals.samples(from, day + 2 * DAY),
        format: days::FORMAT,
    };
    let ctx = with_jobs(state, job_batch(d.jobs.iter().map(String::as_str))?).await?;
    let rows = if d.jobs.is_empty() {
        Vec::new()
    } else {
        ctx.sql(&sums_sql(from, day + DAY, &d.runs))
            .await?
            .collect()
            .await?
    };
    let marker_row = RecordBatch::try_from_iter([
        (
            "samples",
            Arc::new(Int64Array::from(vec![marker.samples])) as ArrayRef,
        ),
        (
            "first_seen",
            Arc::new(Int64Array::from(vec![marker.from])) as ArrayRef,
        ),
        (
            days::FORMAT_COLUMN,
            Arc::new(Int64Array::from(vec![marker.format])) as ArrayRef,
        ),
    ])?;
    let batch = days::day_batch_of(Table::JobLedgerTotals, day, &rows, &marker_row)?;
    replace(store, day, batch).await?;
    if !d.jobs.is_empty() {
        drop_earlier(&ctx, store, from, day).await?;
    }
    Ok(marker)
}

async fn replace(store: &Arc<Store>, day: i64, batch: RecordBatch) -> DfResult<()> {
    let writer = Arc::clone(store);
    tokio::task::spawn_blocking(move || {
        writer.replace_days(Table::JobLedgerTotals, &[(day.div_euclid(DAY), batch)])
    })
    .await
    .map_err(plain)?
    .map_err(plain)
}

/// Gives the days' files written before [`table::JOB_HOST_COUNT`] existed their jobs' host counts,
/// and returns how many it rewrote. A job's rows are all in the file of its last day, so the
/// file alone counts its hosts, and a file that can no longer be rebuilt from the ledger
/// (retention) gains the column too; nothing else in the file changes.
pub(super) async fn fill_job_host_count(
    ctx: &SessionContext,
    store: &Arc<Store>,
) -> DfResult<usize> {
    let hosts = table::JOB_HOST_COUNT;
    let sql = format!(
        "SELECT DISTINCT CAST(time AS BIGINT), 0 AS a, 0 AS b FROM {NAME} \
         WHERE job_id IS NOT NULL AND {hosts} IS NULL"
    );
    let due = days::int_rows(ctx, &sql).await?;
    for &[day, ..] in &due {
        let sql = format!(
            "WITH f AS (
  SELECT * FROM {NAME} WHERE time >= to_timestamp_nanos({day}) AND time < to_timestamp_nanos({end})
), h AS (
  SELECT job_id AS hosts_of, count(DISTINCT host) AS counted FROM f WHERE job_id IS NOT NULL GROUP BY job_id
)
SELECT f.* EXCLUDE ({hosts}), h.counted AS {hosts} FROM f LEFT JOIN h ON h.hosts_of = f.job_id",
            end = day + DAY
        );
        rewrite(ctx, store, day, &sql).await?;
    }
    Ok(due.len())
}

/// Replaces day `day`'s file with the rows of `sql` (the table's columns, by name).
async fn rewrite(ctx: &SessionContext, store: &Arc<Store>, day: i64, sql: &str) -> DfResult<()> {
    let schema = Table::JobLedgerTotals.schema();
    let rows = ctx
        .sql(sql)
        .await?
        .collect()
        .await?
        .iter()
        .map(|b| days::conformed(&schema, day, b))
        .collect::<DfResult<Vec<_>>>()?;
    replace(store, day, concat_batches(&schema, &rows)?).await
}

/// Those of `jobs` (first hour of the earliest: `first`) with a row in the files before `end`,
/// and the days of the files holding those rows.
pub(super) async fn overlap(
    state: &SessionState,
    jobs: Vec<String>,
    first: Option<i64>,
    end: i64,
) -> DfResult<(Vec<String>, Vec<i64>)> {
    let Some(first) = first.filter(|_| !jobs.is_empty()) else {
        return Ok(Default::default());
    };
    let ctx = with_jobs(state, job_batch(jobs.iter().map(String::as_str))?).await?;
    let sql = format!(
        "SELECT DISTINCT job_id, CAST(time AS BIGINT) FROM {NAME} WHERE job_id IN (SELECT job_id FROM {JOB_LIST}) \
         AND time >= to_timestamp_nanos({from}) AND time < to_timestamp_nanos({end})",
        from = floor_day(first)
    );
    let (mut out, mut days) = (Vec::new(), Vec::new());
    for b in ctx.sql(&sql).await?.collect().await? {
        out.extend(super::strings(&b, 0)?.iter().flatten().map(str::to_string));
        days.extend(super::ints(&b, 1)?.iter().flatten().map(floor_day));
    }
    out.sort_unstable();
    out.dedup();
    days.sort_unstable();
    days.dedup();
    Ok((out, days))
}

/// Removes the jobs of [`JOB_LIST`] from the files of the days in `[from, day)`: they were
/// written there before being seen again.
async fn drop_earlier(
    ctx: &SessionContext,
    store: &Arc<Store>,
    from: i64,
    day: i64,
) -> DfResult<()> {
    let sql = format!(
        "SELECT DISTINCT CAST(time AS BIGINT), 0 AS a, 0 AS b FROM {NAME} WHERE job_id IN (SELECT job_id FROM {JOB_LIST}) \
         AND time >= to_timestamp_nanos({from}) AND time < to_timestamp_nanos({day})"
    );
    for [earlier, ..] in days::int_rows(ctx, &sql).await? {
        let keep = format!(
            "SELECT * FROM {NAME} WHERE time >= to_timestamp_nanos({earlier}) \
             AND time < to_timestamp_nanos({end}) \
             AND (job_id IS NULL OR job_id NOT IN (SELECT job_id FROM {JOB_LIST}))",
            end = earlier + DAY
        );
        rewrite(ctx, store, earlier, &keep).await?;
        tracing::debug!(
            day = earlier,
            "job ledger: jobs seen again removed from an earlier day's totals"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::HOUR;
    use super::*;

    fn totals(hours: &[(i64, i64)], written: &[(i64, i64, i64)]) -> Totals {
        Totals {
            hours: hours.iter().copied().collect(),
            written: written
                .iter()
                .map(|&(d, from, samples)| {
                    let format = days::FORMAT;
                    (
                        d,
                        Marker {
                            from,
                            samples,
                            format,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn the_views_stop_at_the_first_day_whose_file_no_longer_matches_the_ledger() {
        let d = |n: i64| n * DAY;
        let hours = [(d(0), 5), (d(1) + HOUR, 7), (d(2), 1), (d(3), 2)];
        let t = totals(&hours, &[]);
        assert_eq!(t.end(), Some(d(0)), "nothing written");
        assert_eq!(
            t.due(d(3)),
            vec![d(0), d(1)],
            "a day waits for the day after it"
        );
        let t = totals(&hours, &[(d(0), d(0), 12), (d(1), d(0), 13)]);
        assert_eq!(t.end(), Some(d(2)));
        assert_eq!(t.due(d(4)), vec![d(2)]);
        // Late samples in day 1 change what day 0's file read: both are written again.
        let mut late = t.clone();
        late.hours.insert(d(1) + 2 * HOUR, 4);
        assert_eq!(late.end(), Some(d(0)));
        assert_eq!(late.due(d(4)), vec![d(0), d(1), d(2)]);
        // Retention removed day 0 of the ledger: day 1's file read it and is kept as it is.
        let mut kept = t.clone();
        kept.hours.remove(&d(0));
        kept.hours.insert(d(1) + 2 * HOUR, 4);
        assert_eq!(kept.end(), Some(d(2)));
        assert_eq!(totals(&[], &[]).end(), None);
        // A file of an earlier layout is written again while the ledger can rebuild it, and
        // kept as it is once it cannot.
        let mut old = t.clone();
        old.written.get_mut(&d(1)).expect("day 1").format = 0;
        assert_eq!(old.end(), Some(d(1)));
        assert_eq!(old.due(d(4)), vec![d(1), d(2)]);
        old.hours.remove(&d(0));
        assert_eq!(old.end(), Some(d(2)));
    }
}
