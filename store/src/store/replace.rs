//! Whole hours of a table ingest does not write, replaced by the layer above: the job ledger's
//! closed hours (written again when late samples change them), the rollups' hours the compactor
//! builds again, or history a benchmark or an import builds. Each call is one Delta commit of
//! maintenance: `remove` of the files holding rows of those hours, `add` of one new file per
//! hour (or per day, [`Store::replace_days`]) and, for a file that spans more hours than it
//! loses (a merged day), of a file with its other rows.
//!
//! Such tables have few rows an hour, so maintenance merges each of their closed days into one
//! file ([`Store::merge_days`]): a month of the job ledger is 30 files to open, not 720, and a
//! year of hourly rollups 365, not 8,760. The ledger's daily spend, a few rows a day, is merged
//! a month to a file ([`Store::merge_months`]).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::TimestampNanosecondType;
use deltalake_core::kernel::Action;

use super::maintain::{removes, time_text};
use super::{Store, lock, now_millis};
use crate::compact::{self, HOUR_NANOS, MaintenanceReport};
use crate::delta::{DeltaTables, Kind};
use crate::persist::{self, FileMeta, Written, storage::random_hex};
use crate::schema::Table;
use crate::{Error, Result};

pub(super) const DAY_NANOS: i64 = 24 * HOUR_NANOS;

/// Tables whose closed days maintenance merges into one file each: those with few rows an
/// hour. The 1-minute rollups stay a file an hour (60 rows a GPU an hour).
pub(super) const DAY_FILES: [Table; 3] =
    [Table::JobLedger, Table::GpuMetrics1h, Table::GpuProcesses1h];

/// Tables whose files maintenance merges a UTC month to a file ([`Store::merge_months`]): a few
/// rows a day, read over months and years.
pub(super) const MONTH_FILES: [Table; 1] = [Table::JobLedgerSpend];

/// The start (ns) of the UTC calendar month holding `t` (ns).
fn month_of(t: i64) -> i64 {
    use chrono::{Datelike, TimeZone, Utc};
    let at = Utc.timestamp_nanos(t);
    Utc.with_ymd_and_hms(at.year(), at.month(), 1, 0, 0, 0)
        .single()
        .and_then(|m| m.timestamp_nanos_opt())
        .unwrap_or(t)
}

fn overlaps(f: &FileMeta, hour: i64) -> bool {
    f.has_time_range()
        && f.min_time < (hour + 1).saturating_mul(HOUR_NANOS)
        && f.max_time >= hour.saturating_mul(HOUR_NANOS)
}

/// Whether `f` holds rows outside the hours `hours`.
fn spans_beyond(f: &FileMeta, hours: &[i64]) -> bool {
    let first = compact::window_of(f);
    let last = f.max_time.div_euclid(HOUR_NANOS);
    (first..=last).any(|h| !hours.contains(&h))
}

/// The rows of `batch` outside the hours `hours`.
fn without_hours(batch: &RecordBatch, hours: &[i64]) -> Result<RecordBatch> {
    let times = batch.column(0).as_primitive::<TimestampNanosecondType>();
    let keep: BooleanArray = times
        .values()
        .iter()
        .map(|t| Some(!hours.contains(&t.div_euclid(HOUR_NANOS))))
        .collect();
    Ok(filter_record_batch(batch, &keep)?)
}

impl Store {
    /// Replaces every row of `table` in hour `hour` (hours since the epoch) with `batch`.
    pub fn replace_hour(&self, table: Table, hour: i64, batch: &RecordBatch) -> Result<()> {
        self.replace_hours(table, &[(hour, batch.clone())])
    }

    /// Replaces every row of `table` in each of the `hours` (hours since the epoch, with the
    /// rows of each) in one commit. Only for tables ingest does not write
    /// ([`Table::is_ingested`]); every row must fall in its hour and the batches have the
    /// table's columns in order. On failure nothing written stays.
    pub fn replace_hours(&self, table: Table, hours: &[(i64, RecordBatch)]) -> Result<()> {
        let spans: Vec<(Range<i64>, &RecordBatch)> =
            hours.iter().map(|(h, b)| (*h..*h + 1, b)).collect();
        self.replace_spans(table, &spans, "")
    }

    /// Replaces every row of `table` in each of the `days` (UTC days since the epoch, with the
    /// rows of each) in one commit, a file a day: what [`Store::replace_hours`] and the day
    /// merge of maintenance would leave, written once.
    pub fn replace_days(&self, table: Table, days: &[(i64, RecordBatch)]) -> Result<()> {
        let spans: Vec<(Range<i64>, &RecordBatch)> = days
            .iter()
            .map(|(d, b)| {
                (
                    d.saturating_mul(24)..d.saturating_mul(24).saturating_add(24),
                    b,
                )
            })
            .collect();
        self.replace_spans(table, &spans, "")
    }

    /// Replaces every row of `table` in the hours of each span with its rows, one file a span
    /// (its name ends with `tag`).
    pub(super) fn replace_spans(
        &self,
        table: Table,
        spans: &[(Range<i64>, &RecordBatch)],
        tag: &str,
    ) -> Result<()> {
        if table.is_ingested() {
            return Err(Error::BadRows(format!(
                "{} is written by ingest, not replaced an hour at a time",
                table.name()
            )));
        }
        if !self.ingests() {
            return Err(Error::ReadOnly);
        }
        self.check_fenced()?;
        let replaced: Vec<i64> = spans.iter().flat_map(|(r, _)| r.clone()).collect();
        let ms = now_millis(self.clock.as_ref());
        let mut written: Vec<Written> = Vec::with_capacity(spans.len());
        let done = self
            .keep_the_rest(table, &replaced, ms, &mut written)
            .and_then(|spanning| {
                for (hours, batch) in spans {
                    let sorted = checked(table, hours, batch)?;
                    let prefix = if hours.end - hours.start > 1 {
                        'd'
                    } else {
                        'r'
                    };
                    let name = format!("{prefix}{}{tag}", random_hex());
                    written.push(persist::write_file(
                        &self.storage,
                        table,
                        &sorted,
                        hours.start,
                        &name,
                        1,
                        ms,
                    )?);
                }
                self.commit_hours(table, &replaced, &spanning, &written, ms)
            });
        if let Err(e) = done {
            persist::remove_files(&self.storage, &written);
            if matches!(e, Error::DeltaConflict { .. }) {
                self.stats.delta_conflicts.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The files that hold rows of the `replaced` hours and of others (a merged day), each
    /// written again without the replaced hours (into `written`); returns them.
    pub(super) fn keep_the_rest(
        &self,
        table: Table,
        replaced: &[i64],
        ms: i64,
        written: &mut Vec<Written>,
    ) -> Result<Vec<FileMeta>> {
        let spanning: Vec<FileMeta> = self
            .readable_files(table)
            .into_iter()
            .filter(|f| replaced.iter().any(|h| overlaps(f, *h)) && spans_beyond(f, replaced))
            .collect();
        for f in &spanning {
            let rest = without_hours(
                &compact::read_files(&self.storage, table, std::slice::from_ref(f))?,
                replaced,
            )?;
            if rest.num_rows() > 0 {
                let name = format!("r{}", random_hex());
                let hour = compact::window_of(f);
                written.push(persist::write_file(
                    &self.storage,
                    table,
                    &rest,
                    hour,
                    &name,
                    1,
                    ms,
                )?);
            }
        }
        Ok(spanning)
    }

    /// The commit: the files holding rows of the hours removed, the new ones added. A file
    /// `spanning` read before is no longer in the table: [`Error::Changed`].
    fn commit_hours(
        &self,
        table: Table,
        replaced: &[i64],
        spanning: &[FileMeta],
        written: &[Written],
        ms: i64,
    ) -> Result<()> {
        let now = self.clock.now_nanos();
        let mut tables = lock(&self.tables);
        self.commit_hours_locked(&mut tables, table, replaced, spanning, written, ms, now)
    }

    /// [`Store::commit_hours`] under the tables' lock, held by the caller.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_hours_locked(
        &self,
        tables: &mut DeltaTables,
        table: Table,
        replaced: &[i64],
        spanning: &[FileMeta],
        written: &[Written],
        ms: i64,
        now: i64,
    ) -> Result<()> {
        if let Some(why) = tables.blocked(table) {
            return Err(Error::LogDamaged(why));
        }
        let current = tables.files(table);
        let old: Vec<FileMeta> = current
            .iter()
            .filter(|f| replaced.iter().any(|h| overlaps(f, *h)))
            .cloned()
            .collect();
        let changed = old
            .iter()
            .any(|f| spans_beyond(f, replaced) && !spanning.iter().any(|s| s.path == f.path));
        if changed
            || !spanning
                .iter()
                .all(|s| current.iter().any(|f| f.path == s.path))
        {
            return Err(Error::Changed { table });
        }
        let mut actions = removes(&old, true, ms);
        actions.extend(written.iter().map(|w| Action::Add(w.add.clone())));
        let (first, last) = (
            replaced.iter().min().copied().unwrap_or(0),
            replaced.iter().max().copied().unwrap_or(0),
        );
        let predicate = format!(
            "time >= '{}' AND time < '{}'",
            time_text(first.saturating_mul(HOUR_NANOS)),
            time_text((last + 1).saturating_mul(HOUR_NANOS))
        );
        self.maintenance_commit(tables, table, actions, Kind::Replace { predicate }, now)
    }

    /// Merges the files of each UTC day of the [`DAY_FILES`] tables that ended an hour ago or
    /// more into one file (`dataChange=false`). A day whose files changed meanwhile is left for
    /// the next pass.
    pub(super) fn merge_days(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        for table in DAY_FILES {
            let days = self.closed_days(table, now).into_iter();
            self.merge_each(table, days.map(|(day, files)| (day * 24, files)), report)?;
        }
        Ok(())
    }

    /// Merges each group of `table`'s files (the hour its file is named for, its files) that
    /// holds two or more into one file. A group whose files changed meanwhile is left for the
    /// next pass; one that cannot be merged now (a damaged file, a table whose log is damaged)
    /// is skipped with a warning, as compaction skips a window, and every other group goes on;
    /// a conflict with another maintainer ends the pass.
    fn merge_each(
        &self,
        table: Table,
        groups: impl IntoIterator<Item = (i64, Vec<FileMeta>)>,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        for (first_hour, files) in groups {
            if files.len() < 2 {
                continue;
            }
            let mut merged = false;
            let step = || match self.merge_files(table, first_hour, &files) {
                Ok(()) => {
                    merged = true;
                    Ok(())
                }
                Err(Error::Changed { .. }) => Ok(()),
                Err(e) => Err(e),
            };
            if self.skipped(
                "merging the files",
                (table, first_hour),
                &[table],
                &files,
                step,
            )? {
                report.windows_skipped += 1;
            } else if merged {
                report.files_merged += files.len();
                report.windows_compacted += 1;
            }
        }
        Ok(())
    }

    /// The files of `table` by UTC day, for each day that ended an hour ago or more and whose
    /// files all lie within it.
    pub(super) fn closed_days(&self, table: Table, now: i64) -> BTreeMap<i64, Vec<FileMeta>> {
        let mut days: BTreeMap<i64, Vec<FileMeta>> = BTreeMap::new();
        for f in self
            .readable_files(table)
            .into_iter()
            .filter(|f| f.has_time_range())
        {
            days.entry(f.min_time.div_euclid(DAY_NANOS))
                .or_default()
                .push(f);
        }
        days.retain(|day, files| {
            let end = (day + 1).saturating_mul(DAY_NANOS);
            files.iter().all(|f| f.max_time < end) && end.saturating_add(HOUR_NANOS) <= now
        });
        days
    }

    /// Merges the files of each UTC calendar month of the [`MONTH_FILES`] tables into one file
    /// (`dataChange=false`), the month in progress too: a year of their days is 12 files to
    /// open, not 365. A day written again later (into a file of its own, with the rest of its
    /// month's file kept beside it) is merged back at the next pass.
    pub(super) fn merge_months(&self, report: &mut MaintenanceReport) -> Result<()> {
        for table in MONTH_FILES {
            let mut months: BTreeMap<i64, Vec<FileMeta>> = BTreeMap::new();
            for f in self
                .readable_files(table)
                .into_iter()
                .filter(|f| f.has_time_range())
            {
                months.entry(month_of(f.min_time)).or_default().push(f);
            }
            // Only months whose files all lie within them.
            months.retain(|start, files| {
                let end = month_of(start.saturating_add(32 * DAY_NANOS));
                files.iter().all(|f| f.max_time < end)
            });
            let months = months.into_iter();
            self.merge_each(
                table,
                months.map(|(s, f)| (s.div_euclid(HOUR_NANOS), f)),
                report,
            )?;
        }
        Ok(())
    }

    /// Replaces `inputs` with one file of their rows, named for the hour `first_hour`.
    fn merge_files(&self, table: Table, first_hour: i64, inputs: &[FileMeta]) -> Result<()> {
        let merged =
            persist::sort_batch(table, &compact::read_files(&self.storage, table, inputs)?)?;
        let ms = now_millis(self.clock.as_ref());
        let name = format!("d{}", random_hex());
        let w = persist::write_file(&self.storage, table, &merged, first_hour, &name, 1, ms)?;
        let now = self.clock.now_nanos();
        let done = {
            let mut tables = lock(&self.tables);
            let current = tables.files(table);
            if !inputs
                .iter()
                .all(|i| current.iter().any(|f| f.path == i.path))
            {
                Err(Error::Changed { table })
            } else {
                let mut add = w.add.clone();
                add.data_change = false;
                let mut actions = removes(inputs, false, ms);
                actions.push(Action::Add(add));
                self.maintenance_commit(&mut tables, table, actions, Kind::Compact, now)
            }
        };
        if done.is_err() {
            persist::remove_files(&self.storage, std::slice::from_ref(&w));
        }
        done
    }
}

/// `batch` checked against `table` and the `hours` it replaces, in microseconds and sorted as
/// the table's files.
fn checked(table: Table, hours: &Range<i64>, batch: &RecordBatch) -> Result<RecordBatch> {
    let start = hours.start.saturating_mul(HOUR_NANOS);
    let end = hours.end.saturating_mul(HOUR_NANOS);
    let names = |s: &arrow::datatypes::Schema| -> Vec<String> {
        s.fields().iter().map(|f| f.name().clone()).collect()
    };
    if names(&batch.schema()) != names(&table.schema()) {
        return Err(Error::BadRows(format!(
            "rows for {} must have its columns, in order",
            table.name()
        )));
    }
    let batch = crate::buffer::to_micros(batch)?;
    let times = batch
        .column(0)
        .as_primitive_opt::<TimestampNanosecondType>();
    if times.is_none_or(|t| t.values().iter().any(|&t| t < start || t >= end)) {
        return Err(Error::BadRows(format!(
            "rows for {} from {} must have their time within the {}",
            table.name(),
            time_text(start),
            if hours.end - hours.start > 1 {
                "day"
            } else {
                "hour"
            }
        )));
    }
    persist::sort_batch(table, &batch)
}
