//! The ledger's daily sums: the `job_ledger_1d` table, one row per job, GPU (and model) and UTC
//! day with the `job_ledger` columns the views read (labels, first and last sample, the `jobs`
//! sums, the limiter's seconds, samples), written once every hour of the day is folded.
//! Questions over many days (`jobs` over a month or a year, `job_days` and the statements over
//! it) then read one row per job and GPU a day instead of one an hour.
//!
//! Each day file also holds a marker row (no job, no last sample) with the day's raw samples as
//! the ledger's hour rows count them. A day's sums are read only while the marker equals the
//! sum of its 24 hour rows: a refolded hour (late samples) changes that count, so until the day
//! is written again (by the server that folds, right after the refold) every server reads the
//! day's hours instead. A day with fewer than 24 folded hours (the ledger's first day, a gap)
//! is never rolled and is always read by the hour.
//!
//! The sums are exact: every column is a sum, a min or a max of the hours' rows, and the views
//! sum, min and max them again per job.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, new_null_array};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use datafusion::prelude::SessionContext;
use gpuwatch_store::Store;
use gpuwatch_store::schema::Table;

use super::super::charge_max_sql;
use super::super::limiter::{self, LIMITERS};
use super::table::GROUP_JOBS;
use super::{DfResult, HOUR, plain, table};

/// The table's SQL name.
pub(super) const NAME: &str = "job_ledger_1d";
/// The daily spend's: the day's rows per account, user and GPU model ([`group_sql`]).
pub(super) const SPEND: &str = "job_ledger_spend";
/// A UTC day, ns.
pub(super) const DAY: i64 = 24 * HOUR;

/// The start of `t`'s UTC day.
pub(super) fn floor_day(t: i64) -> i64 {
    t.div_euclid(DAY) * DAY
}

/// The columns summed from the hours' usage rows.
pub(super) const SUMMED: [&str; 6] = [
    "gpu_seconds",
    "held_gpu_seconds",
    "idle_gpu_seconds",
    "energy_joules",
    "idle_energy_joules",
    "samples",
];

/// The layout of the rows a day or totals file holds, written in its marker row's
/// [`FORMAT_COLUMN`] (an integer column no marker row uses otherwise): 1 since the files keep
/// the parts of the jobs' mean activity ([`table::ACTIVITY_PARTS`]); a file of an earlier
/// release (null there) is written again while the ledger still holds its hours.
pub(super) const FORMAT: i64 = 1;
/// The marker row's column that holds the [`FORMAT`].
pub(super) const FORMAT_COLUMN: &str = "interval_count";

/// What the table holds that still matches the ledger, and the days to roll.
#[derive(Debug, Default, Clone)]
pub(super) struct Days {
    /// Rolled days whose marker equals their hours' samples: day start → samples.
    pub current: BTreeMap<i64, u64>,
    /// Days with all 24 hours folded whose sums or spend are missing or stale.
    pub due: BTreeSet<i64>,
    /// Days whose spend (`job_ledger_spend`) matches their hours, as `current`.
    pub grouped: BTreeMap<i64, u64>,
}

/// The marker rows of `table` (its rows with `condition`): time (a day's or an hour's start)
/// → samples.
pub(super) async fn markers(
    ctx: &SessionContext,
    table: &str,
    condition: &str,
) -> DfResult<BTreeMap<i64, i64>> {
    let sql = format!("SELECT CAST(time AS BIGINT), samples FROM {table} WHERE {condition}");
    Ok(int_rows(ctx, &sql)
        .await?
        .into_iter()
        .map(|[d, s, ..]| (d, s))
        .collect())
}

/// The rows of `sql`'s first four columns as integers (nulls and missing columns as 0), rows
/// with a null first column left out.
pub(super) async fn int_rows(ctx: &SessionContext, sql: &str) -> DfResult<Vec<[i64; 4]>> {
    let mut out = Vec::new();
    for b in ctx.sql(sql).await?.collect().await? {
        let cols: Vec<ArrayRef> = (0..b.num_columns())
            .map(|i| cast(b.column(i), &DataType::Int64))
            .collect::<Result<_, _>>()?;
        let ints: Vec<&Int64Array> = cols
            .iter()
            .map(|c| c.as_any().downcast_ref::<Int64Array>())
            .collect::<Option<_>>()
            .ok_or_else(|| plain("the ledger's days: not integers"))?;
        for i in 0..b.num_rows() {
            let v = |k: usize| {
                ints.get(k)
                    .map_or(0, |a| if a.is_null(i) { 0 } else { a.value(i) })
            };
            if !ints[0].is_null(i) {
                out.push([v(0), v(1), v(2), v(3)]);
            }
        }
    }
    Ok(out)
}

/// Each day of the ledger's hour rows in `[from, to)`: day start → (hours, samples).
async fn ledger_days(
    ctx: &SessionContext,
    from: i64,
    to: i64,
) -> DfResult<BTreeMap<i64, (i64, i64)>> {
    let sql = format!(
        "SELECT CAST(date_trunc('day', time) AS BIGINT), count(*), sum(samples) FROM {} \
         WHERE job_id IS NULL AND last_sample_time IS NULL \
         AND time >= to_timestamp_nanos({from}) AND time < to_timestamp_nanos({to}) GROUP BY 1",
        table::NAME
    );
    Ok(int_rows(ctx, &sql)
        .await?
        .into_iter()
        .map(|[d, n, s, _]| (d, (n, s)))
        .collect())
}

/// Reads which days are rolled and current, and which are due, among the days that end by
/// `end` (the watermark); `hours` is every ledger hour's raw samples.
pub(super) async fn read(
    ctx: &SessionContext,
    end: i64,
    hours: &BTreeMap<i64, i64>,
) -> DfResult<Days> {
    let mut by_day: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (&h, &n) in hours.range(..end) {
        let d = by_day.entry(floor_day(h)).or_default();
        d.0 += 1;
        d.1 += n;
    }
    let hours = by_day;
    let sums = markers(
        ctx,
        NAME,
        &format!("job_id IS NULL AND last_sample_time IS NULL AND {FORMAT_COLUMN} >= {FORMAT}"),
    )
    .await?;
    let spend = markers(ctx, SPEND, &format!("{GROUP_JOBS} IS NULL")).await?;
    let mut days = Days::default();
    for (d, (n, s)) in hours {
        if n != 24 || d + DAY > end {
            continue;
        }
        let samples = s.max(0) as u64;
        if sums.get(&d) == Some(&s) {
            days.current.insert(d, samples);
        }
        // A day file of an earlier release has no spend: the day is rolled again.
        if spend.get(&d) == Some(&s) {
            days.grouped.insert(d, samples);
        }
        if !(days.current.contains_key(&d) && days.grouped.contains_key(&d)) {
            days.due.insert(d);
        }
    }
    Ok(days)
}

/// The columns the daily sums and the totals sum: [`SUMMED`], each limiter's seconds, then
/// the parts of the jobs' mean activity.
pub(super) fn summed_columns() -> Vec<String> {
    SUMMED
        .iter()
        .map(|c| c.to_string())
        .chain(LIMITERS.iter().map(|c| limiter::seconds_column(c)))
        .chain(table::ACTIVITY_PARTS.iter().map(|c| c.to_string()))
        .collect()
}

/// `, sum(c) AS c` for each of `columns`.
pub(super) fn sums_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| format!(", sum({c}) AS {c}"))
        .collect()
}

/// The SQL of a day's rows: the usage rows summed per job, GPU and model.
fn usage_sql(day: i64) -> String {
    let sums = sums_list(&summed_columns());
    format!(
        "SELECT job_id, host, gpu_uuid, gpu_model, max(scheduler) AS scheduler, \
           max(job_user) AS job_user, max(job_name) AS job_name{charge}, \
           min(first_seen) AS first_seen, max(last_seen) AS last_seen{sums} \
         FROM {ledger} WHERE job_id IS NOT NULL AND time >= to_timestamp_nanos({day}) \
           AND time < to_timestamp_nanos({end}) \
         GROUP BY job_id, host, gpu_uuid, gpu_model",
        charge = charge_max_sql(true),
        ledger = table::NAME,
        end = day + DAY,
    )
}

/// The spend of a day's `rows` (the daily sums' job rows): one row per account, user and GPU
/// model, with its jobs (`group_jobs`) and their sums, as `job_days` groups them: each job's
/// rows on a host and model first take the labels `job_days` gives them (the largest), then
/// are summed by those. A day read from these rows (`spend_days`) answers as `job_days`
/// grouped the same way.
fn group_sql(rows: &str) -> String {
    let sums = sums_list(&summed_columns());
    format!(
        "WITH j AS (
  SELECT job_id, host, gpu_model, max(job_account) AS job_account, max(job_user) AS job_user,
    min(first_seen) AS first_seen, max(last_seen) AS last_seen{sums}
  FROM {rows} GROUP BY job_id, host, gpu_model
)
SELECT job_account, job_user, gpu_model, count(DISTINCT job_id) AS {GROUP_JOBS},
  min(first_seen) AS first_seen, max(last_seen) AS last_seen{sums}
FROM j GROUP BY job_account, job_user, gpu_model"
    )
}

/// A marker row: `samples` and the [`FORMAT`], every other column null.
fn marker_row(samples: i64) -> DfResult<RecordBatch> {
    Ok(RecordBatch::try_from_iter([
        (
            "samples",
            Arc::new(Int64Array::from(vec![samples])) as ArrayRef,
        ),
        (
            FORMAT_COLUMN,
            Arc::new(Int64Array::from(vec![FORMAT])) as ArrayRef,
        ),
    ])?)
}

/// `batches` (the day's job rows, columns by name) as rows of the table at `day`, plus the
/// marker row.
fn day_batch(day: i64, batches: &[RecordBatch], samples: i64) -> DfResult<RecordBatch> {
    day_batch_of(Table::JobLedger1d, day, batches, &marker_row(samples)?)
}

/// The day's spend rows ([`group_sql`]) of its job rows `batches`, plus the marker row, as
/// rows of `job_ledger_spend` at `day`.
async fn spend_batch(day: i64, batches: &[RecordBatch], samples: i64) -> DfResult<RecordBatch> {
    let mut rows = Vec::new();
    if let Some(first) = batches.first() {
        let ctx = SessionContext::new();
        let table = datafusion::catalog::MemTable::try_new(first.schema(), vec![batches.to_vec()])?;
        ctx.register_table("day_rows", Arc::new(table))?;
        rows = ctx.sql(&group_sql("day_rows")).await?.collect().await?;
    }
    day_batch_of(Table::JobLedgerSpend, day, &rows, &marker_row(samples)?)
}

/// `batches` and `marker` (columns by name) as rows of `table` at `day`.
pub(super) fn day_batch_of(
    table: Table,
    day: i64,
    batches: &[RecordBatch],
    marker: &RecordBatch,
) -> DfResult<RecordBatch> {
    let schema = table.schema();
    let rows = batches
        .iter()
        .chain([marker])
        .map(|b| conformed(&schema, day, b))
        .collect::<DfResult<Vec<_>>>()?;
    Ok(concat_batches(&schema, &rows)?)
}

/// `b`'s rows with the table's columns: `time` is `day`, the columns `b` has are cast to the
/// table's types, the others null.
pub(super) fn conformed(schema: &SchemaRef, day: i64, b: &RecordBatch) -> DfResult<RecordBatch> {
    let n = b.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        columns.push(if f.name() == "time" {
            cast(
                &(Arc::new(Int64Array::from(vec![day; n])) as ArrayRef),
                f.data_type(),
            )?
        } else {
            match b.column_by_name(f.name()) {
                Some(c) => cast(c, f.data_type())?,
                None => new_null_array(f.data_type(), n),
            }
        });
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Writes day `day`'s sums from the ledger's hours; `None` (nothing written) when fewer than
/// 24 of its hours are folded. Returns the day's samples.
pub(super) async fn roll(
    ctx: &SessionContext,
    store: &Arc<Store>,
    day: i64,
) -> DfResult<Option<u64>> {
    let Some(&(hours, samples)) = ledger_days(ctx, day, day + DAY).await?.get(&day) else {
        return Ok(None);
    };
    if hours != 24 {
        return Ok(None);
    }
    let batches = ctx.sql(&usage_sql(day)).await?.collect().await?;
    let sums = day_batch(day, &batches, samples)?;
    let spend = spend_batch(day, &batches, samples).await?;
    let writer = Arc::clone(store);
    tokio::task::spawn_blocking(move || {
        let at = day.div_euclid(DAY);
        // The spend's marker is written last: until it is, the day's spend reads as stale.
        writer.replace_days(Table::JobLedger1d, &[(at, sums)])?;
        writer.replace_days(Table::JobLedgerSpend, &[(at, spend)])
    })
    .await
    .map_err(plain)?
    .map_err(plain)?;
    Ok(Some(samples.max(0) as u64))
}

/// The current days that end by `end`, as runs of consecutive days `[from, to)`.
pub(super) fn runs(current: &BTreeMap<i64, u64>, end: i64) -> Vec<(i64, i64)> {
    day_runs(current.keys().copied().filter(|&d| d + DAY <= end))
}

/// Days (their starts, ascending, no repeats) as runs of consecutive days `[from, to)`.
pub(super) fn day_runs(days: impl IntoIterator<Item = i64>) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for d in days {
        match out.last_mut() {
            Some((_, to)) if *to == d => *to = d + DAY,
            _ => out.push((d, d + DAY)),
        }
    }
    out
}

/// The parts of `[lo, hi)` outside `runs` (sorted, not overlapping), in order.
pub(super) fn gaps(lo: i64, hi: i64, runs: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut at = lo;
    for &(a, b) in runs {
        if at >= hi {
            break;
        }
        if a > at {
            out.push((at, a.min(hi)));
        }
        at = at.max(b);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

/// The SQL condition on `time` of being in one of `runs` (`[from, to)`; a `from` of
/// `i64::MIN` has no lower bound; empty runs are none): `false` for none, a conjunction for
/// one, a parenthesised disjunction for more, so the result may always be joined with `AND`.
pub(super) fn in_runs_sql(runs: &[(i64, i64)]) -> String {
    let any: Vec<String> = runs
        .iter()
        .filter(|(a, b)| a < b)
        .map(|&(a, b)| match a {
            i64::MIN => format!("time < to_timestamp_nanos({b})"),
            a => format!("time >= to_timestamp_nanos({a}) AND time < to_timestamp_nanos({b})"),
        })
        .collect();
    match any.as_slice() {
        [] => "false".into(),
        [one] => one.clone(),
        many => format!("(({}))", many.join(") OR (")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gaps_are_what_the_runs_leave_of_a_range() {
        let runs = [(10, 20), (30, 40)];
        assert_eq!(gaps(0, 50, &runs), [(0, 10), (20, 30), (40, 50)]);
        assert_eq!(gaps(12, 35, &runs), [(20, 30)]);
        assert_eq!(gaps(10, 20, &runs), []);
        assert_eq!(gaps(i64::MIN, 15, &runs), [(i64::MIN, 10)]);
        assert_eq!(gaps(25, 25, &runs), []);
        assert_eq!(gaps(0, 50, &[]), [(0, 50)]);
    }

    #[test]
    fn consecutive_days_make_one_run_and_days_past_the_end_are_left_to_the_hours() {
        let d = |n: i64| n * DAY;
        let current: BTreeMap<i64, u64> = [0, 1, 2, 4, 5, 7].iter().map(|&n| (d(n), 1)).collect();
        assert_eq!(
            runs(&current, d(7)),
            vec![(d(0), d(3)), (d(4), d(6))],
            "day 7 ends after the watermark"
        );
        assert_eq!(runs(&current, d(8)).len(), 3);
        assert_eq!(in_runs_sql(&[]), "false");
        assert!(in_runs_sql(&runs(&current, d(3))).contains(&format!("{}", d(3))));
        assert_eq!(floor_day(d(3) + 5 * HOUR), d(3));
        assert_eq!(floor_day(-1), -DAY);
    }
}
