//! Whole hours of a table ingest does not write, replaced by the layer above: the job ledger's
//! closed hours (written again when late samples change them), or history a benchmark or an
//! import builds. Each call is one Delta commit of maintenance: `remove` of the hours' files,
//! `add` of one new file per hour.

use std::sync::atomic::Ordering;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::TimestampNanosecondType;
use deltalake_core::kernel::Action;

use super::maintain::{removes, time_text};
use super::{Store, lock, now_millis};
use crate::compact::{self, HOUR_NANOS};
use crate::delta::Kind;
use crate::persist::{self, FileMeta, Written, storage::random_hex};
use crate::schema::Table;
use crate::{Error, Result};

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
        if table.is_ingested() {
            return Err(Error::DeltaSchema(format!(
                "{} is written by ingest, not replaced an hour at a time",
                table.name()
            )));
        }
        if !self.ingests() {
            return Err(Error::ReadOnly);
        }
        self.check_fenced()?;
        let ms = now_millis(self.clock.as_ref());
        let mut written: Vec<(i64, Written)> = Vec::with_capacity(hours.len());
        for (hour, batch) in hours {
            let file = checked(table, *hour, batch).and_then(|sorted| {
                let name = format!("r{}", random_hex());
                persist::write_file(&self.storage, table, &sorted, *hour, &name, 1, ms)
            });
            match file {
                Ok(w) => written.push((*hour, w)),
                Err(e) => {
                    self.forget(&written);
                    return Err(e);
                }
            }
        }
        let committed = self.commit_hours(table, &written, ms);
        if let Err(e) = committed {
            self.forget(&written);
            if matches!(e, Error::DeltaConflict { .. }) {
                self.stats.delta_conflicts.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        Ok(())
    }

    fn forget(&self, written: &[(i64, Written)]) {
        let files: Vec<Written> = written.iter().map(|(_, w)| w.clone()).collect();
        persist::remove_files(&self.storage, &files);
    }

    /// The commit: the hours' current files removed, the new ones added.
    fn commit_hours(&self, table: Table, written: &[(i64, Written)], ms: i64) -> Result<()> {
        let now = self.clock.now_nanos();
        let mut tables = lock(&self.tables);
        if let Some(why) = tables.blocked(table) {
            return Err(Error::LogDamaged(why));
        }
        let replaced: Vec<i64> = written.iter().map(|(h, _)| *h).collect();
        let old: Vec<FileMeta> = tables
            .files(table)
            .iter()
            .filter(|f| f.has_time_range() && replaced.contains(&compact::window_of(f)))
            .cloned()
            .collect();
        let mut actions = removes(&old, true, ms);
        actions.extend(written.iter().map(|(_, w)| Action::Add(w.add.clone())));
        let (first, last) = (
            replaced.iter().min().copied().unwrap_or(0),
            replaced.iter().max().copied().unwrap_or(0),
        );
        let predicate = format!(
            "time >= '{}' AND time < '{}'",
            time_text(first.saturating_mul(HOUR_NANOS)),
            time_text((last + 1).saturating_mul(HOUR_NANOS))
        );
        self.maintenance_commit(
            &mut tables,
            table,
            actions,
            Kind::Replace { predicate },
            now,
        )
    }
}

/// `batch` checked against `table` and `hour`, in microseconds and sorted as the table's files.
fn checked(table: Table, hour: i64, batch: &RecordBatch) -> Result<RecordBatch> {
    let start = hour.saturating_mul(HOUR_NANOS);
    let end = (hour + 1).saturating_mul(HOUR_NANOS);
    let names = |s: &arrow::datatypes::Schema| -> Vec<String> {
        s.fields().iter().map(|f| f.name().clone()).collect()
    };
    if names(&batch.schema()) != names(&table.schema()) {
        return Err(Error::DeltaSchema(format!(
            "rows for {} must have its columns, in order",
            table.name()
        )));
    }
    let batch = crate::buffer::to_micros(batch)?;
    let times = batch
        .column(0)
        .as_primitive_opt::<TimestampNanosecondType>();
    if times.is_none_or(|t| t.values().iter().any(|&t| t < start || t >= end)) {
        return Err(Error::DeltaSchema(format!(
            "rows for hour {} of {} must have their time within the hour",
            time_text(start),
            table.name()
        )));
    }
    persist::sort_batch(table, &batch)
}
