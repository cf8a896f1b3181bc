//! Maintenance of the tables: retention, compaction and rollups, vacuum (see [`crate::compact`]
//! for the rules). Each step is a Delta commit carrying the `txn` of
//! [`crate::delta::MAINTENANCE_APP`], so a second maintainer on the same tables conflicts at its
//! first commit, writes nothing and retries at its next pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use deltalake_core::kernel::{Action, Transaction};

use super::{Store, lock, now_millis};
use crate::compact::{self, HOUR_NANOS, MaintenanceReport};
use crate::delta::{DeltaTables, Kind, MAINTENANCE_APP, files};
use crate::persist::{self, FileMeta, Written, storage::random_hex};
use crate::schema::Table;
use crate::{Error, Result};

/// What maintenance remembers between passes.
#[derive(Debug, Default)]
pub(super) struct Maintenance {
    /// File count of every closed window that late files reopened, as of the previous pass.
    reopened: Mutex<HashMap<(Table, i64), usize>>,
    /// When the last vacuum ran (ns, the store's clock).
    last_vacuum: Mutex<Option<i64>>,
}

/// What compacting a window wrote.
struct WindowFiles {
    /// The merged raw hour.
    raw: Written,
    /// Per rollup table, in commit order.
    rollups: Vec<RollupFiles>,
}

/// A rollup's hour: its file, then the rest of each merged day (`spanning`) it is part of.
struct RollupFiles {
    table: Table,
    files: Vec<Written>,
    spanning: Vec<FileMeta>,
}

impl WindowFiles {
    /// The files of the rollups from the `landed`-th on, and the raw hour's.
    fn files(&self, landed: usize) -> Vec<Written> {
        self.rollups
            .iter()
            .skip(landed)
            .flat_map(|r| r.files.iter().cloned())
            .chain(std::iter::once(self.raw.clone()))
            .collect()
    }
}

fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

pub(super) fn time_text(nanos: i64) -> String {
    files::timestamp_text(nanos.div_euclid(1000))
}

fn maintenance_txn(now_millis: i64) -> Transaction {
    Transaction::new_with_last_update(MAINTENANCE_APP, now_millis, Some(now_millis))
}

pub(super) fn removes(files: &[FileMeta], data_change: bool, now_millis: i64) -> Vec<Action> {
    files
        .iter()
        .map(|f| {
            Action::Remove(files::remove(
                f.path_in_table(),
                f.bytes,
                f.date(),
                data_change,
                now_millis,
            ))
        })
        .collect()
}

impl Store {
    /// One maintenance pass: retention, then compaction and rollups of the windows that need
    /// it, then (once per grace period) vacuum. Safe to run beside writes, persists, queries
    /// and other servers' appends; a second maintainer's commits fail with
    /// [`Error::DeltaConflict`] and write nothing.
    pub fn maintain(&self) -> Result<MaintenanceReport> {
        self.refresh()?;
        self.maintenance_pass()
    }

    /// A pass on the view of the tables as it is (a maintainer whose view is stale).
    #[cfg(test)]
    pub(crate) fn maintain_without_refresh(&self) -> Result<MaintenanceReport> {
        self.maintenance_pass()
    }

    fn maintenance_pass(&self) -> Result<MaintenanceReport> {
        let mut reopened = lock(&self.maintain.reopened);
        self.check_fenced()?;
        let now = self.clock.now_nanos();
        let mut report = MaintenanceReport::default();
        let done = self
            .expire(now, &mut report)
            .and_then(|()| self.compact(now, &mut reopened, &mut report))
            .and_then(|()| self.merge_days(now, &mut report))
            .and_then(|()| self.merge_months(&mut report))
            .and_then(|()| self.roll_days(now, &mut report))
            .and_then(|()| self.vacuum(now, &mut report));
        if let Err(e) = done {
            if matches!(e, Error::DeltaConflict { .. }) {
                self.stats.delta_conflicts.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        Ok(report)
    }

    /// Commits `actions` to `table` as maintenance and shows the table's new files.
    pub(super) fn maintenance_commit(
        &self,
        tables: &mut DeltaTables,
        table: Table,
        actions: Vec<Action>,
        kind: Kind,
        now: i64,
    ) -> Result<()> {
        tables.commit(
            table,
            actions,
            kind,
            Some(maintenance_txn(now.div_euclid(1_000_000))),
        )?;
        self.stats.delta_commits.fetch_add(1, Ordering::Relaxed);
        let files = tables.files(table);
        lock(&self.state).files.insert(table, files);
        Ok(())
    }

    fn expire(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        let retention = &self.config.retention;
        for table in Table::ALL {
            let Some(keep) = retention.keep_nanos(table) else {
                continue;
            };
            let cutoff = now.saturating_sub(keep);
            // A damaged file is never removed (then vacuumed): it waits for `gpuwatch repair`.
            let doomed: Vec<FileMeta> = self
                .readable_files(table)
                .iter()
                .filter(|f| {
                    // Raw rows go only once their hour is rolled up.
                    let rolled = table.rollups().is_empty() || f.level >= 1;
                    f.has_time_range() && f.max_time < cutoff && rolled
                })
                .cloned()
                .collect();
            if doomed.is_empty() {
                continue;
            }
            let mut tables = lock(&self.tables);
            if let Some(why) = tables.blocked(table) {
                tracing::warn!(table = table.name(), "retention skipped: {why}");
                continue;
            }
            let ms = now.div_euclid(1_000_000);
            self.maintenance_commit(
                &mut tables,
                table,
                removes(&doomed, true, ms),
                Kind::Expire {
                    predicate: format!("time < '{}'", time_text(cutoff)),
                },
                now,
            )?;
            report.files_expired += doomed.len();
            self.stats
                .retention_deleted_files
                .fetch_add(doomed.len() as u64, Ordering::Relaxed);
            tracing::info!(
                table = table.name(),
                files = doomed.len(),
                "retention: files past their table's retention removed"
            );
        }
        Ok(())
    }

    fn compact(
        &self,
        now: i64,
        reopened: &mut HashMap<(Table, i64), usize>,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let cfg = &self.config.compaction;
        let mut windows: BTreeMap<(Table, i64), Vec<FileMeta>> = BTreeMap::new();
        for table in Table::ALL.into_iter().filter(|t| t.is_ingested()) {
            for f in self
                .readable_files(table)
                .iter()
                .filter(|f| f.has_time_range())
            {
                windows
                    .entry((table, compact::window_of(f)))
                    .or_default()
                    .push(f.clone());
            }
        }
        let mut still_reopened = HashMap::new();
        for ((table, hour), files) in windows {
            let end = (hour + 1).saturating_mul(HOUR_NANOS);
            let closed = end.saturating_add(nanos(cfg.close_after)) <= now;
            let full = files.len() >= cfg.max_files_per_window.max(2);
            let needed = if !closed {
                full
            } else if files.iter().any(|f| f.level >= 1) {
                // Late files reopened a closed window: merge it again (rewriting the hour and
                // its rollups) once no new file arrived for a whole pass, so that a backfill
                // streaming into an old hour does not rewrite it at every persist.
                let quiet = reopened.get(&(table, hour)) == Some(&files.len());
                let again = files.len() > 1 && (full || quiet);
                if files.len() > 1 && !again {
                    still_reopened.insert((table, hour), files.len());
                }
                again
            } else {
                true
            };
            if needed {
                self.compact_or_skip(table, hour, &files, closed, now, report)?;
            }
        }
        *reopened = still_reopened;
        Ok(())
    }

    /// Compacts one window. A window that cannot be compacted now (a damaged input, a table
    /// whose log is damaged) is skipped, and every other window goes on; a conflict with
    /// another maintainer ends the pass.
    fn compact_or_skip(
        &self,
        table: Table,
        hour: i64,
        inputs: &[FileMeta],
        closed: bool,
        now: i64,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let mut needs = vec![table];
        if closed {
            needs.extend(table.rollups());
        }
        let step = || self.compact_window(table, hour, inputs, closed, now, report);
        if self.skipped(
            "compaction of the hour",
            (table, hour),
            &needs,
            inputs,
            step,
        )? {
            report.windows_skipped += 1;
        }
        Ok(())
    }

    /// Runs one maintenance `step` over `inputs`, the files of `table`'s window or group
    /// starting at `hour`, which commits to the tables `needs`. Returns whether it was skipped
    /// (with a warning, so that every other window goes on): where one of `needs` has a damaged
    /// log, or where the step failed otherwise (the damaged inputs are then found, and left out
    /// of reads and of later passes). A conflict with another maintainer or a fence ends the
    /// pass.
    pub(super) fn skipped(
        &self,
        what: &str,
        (table, hour): (Table, i64),
        needs: &[Table],
        inputs: &[FileMeta],
        step: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        let blocked = {
            let tables = lock(&self.tables);
            needs.iter().find_map(|t| tables.blocked(*t))
        };
        if let Some(why) = blocked {
            tracing::warn!(table = table.name(), hour, "{what} skipped: {why}");
            return Ok(true);
        }
        match step() {
            Ok(()) => Ok(false),
            Err(e @ Error::DeltaConflict { .. }) | Err(e @ Error::Fenced(_)) => Err(e),
            Err(e) => {
                let damaged = self.find_damaged(table, inputs);
                tracing::warn!(table = table.name(), hour, error = %e, damaged = damaged.len(),
                    "{what} failed; it is retried at the next pass without any damaged file, and every other one goes on");
                Ok(true)
            }
        }
    }

    fn compact_window(
        &self,
        table: Table,
        hour: i64,
        inputs: &[FileMeta],
        closed: bool,
        now: i64,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let written = self.write_window(table, hour, inputs, closed)?;
        let mut tables = lock(&self.tables);
        // Another maintainer (or retention) took an input away: leave the window be.
        let current = tables.files(table);
        if !inputs
            .iter()
            .all(|i| current.iter().any(|f| f.path == i.path))
        {
            drop(tables);
            self.discard(&written.files(0));
            return Ok(());
        }
        let committed = self.commit_window(&mut tables, table, hour, inputs, &written, now);
        drop(tables);
        if let Err((e, landed)) = committed {
            // Files of commits that did not land go; those that landed stay.
            self.discard(&written.files(landed));
            return Err(e);
        }
        report.windows_compacted += 1;
        report.files_merged += inputs.len();
        report.rollup_files += written.rollups.len();
        self.stats.compactions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            table = table.name(),
            hour,
            files = inputs.len(),
            closed,
            "window compacted"
        );
        Ok(())
    }

    /// Writes the window's merged file and, for a closed hour of a table with rollups, its rollups
    /// (with the rest of a merged day a rollup's hour is part of); on failure nothing written
    /// stays.
    fn write_window(
        &self,
        table: Table,
        hour: i64,
        inputs: &[FileMeta],
        closed: bool,
    ) -> Result<WindowFiles> {
        let storage = &self.storage;
        let merged = persist::sort_batch(table, &compact::read_files(storage, table, inputs)?)?;
        let name = format!("c{}", random_hex());
        let ms = now_millis(self.clock.as_ref());
        let level = u8::from(closed);
        let raw = persist::write_file(storage, table, &merged, hour, &name, level, ms)?;
        let mut window = WindowFiles {
            raw,
            rollups: Vec::new(),
        };
        if !closed {
            return Ok(window);
        }
        for &t in table.rollups() {
            let mut files = Vec::new();
            let done = compact::rollup::rollup(&merged, t)
                .and_then(|rows| persist::write_file(storage, t, &rows, hour, &name, level, ms))
                .and_then(|w| {
                    files.push(w);
                    self.keep_the_rest(t, &[hour], ms, &mut files)
                });
            match done {
                Ok(spanning) => window.rollups.push(RollupFiles {
                    table: t,
                    files,
                    spanning,
                }),
                Err(e) => {
                    persist::remove_files(storage, &files);
                    self.discard(&window.files(0));
                    return Err(e);
                }
            }
        }
        Ok(window)
    }

    fn discard(&self, files: &[Written]) {
        persist::remove_files(&self.storage, files);
    }

    /// Commits the window's rollups, then the raw hour's compaction; on failure, the error and
    /// how many rollup commits landed.
    fn commit_window(
        &self,
        tables: &mut DeltaTables,
        table: Table,
        hour: i64,
        inputs: &[FileMeta],
        written: &WindowFiles,
        now: i64,
    ) -> std::result::Result<(), (Error, usize)> {
        let ms = now_millis(self.clock.as_ref());
        // Rollups first: a crash before the raw hour's commit leaves it unmarked, so the next
        // pass builds its rollups again (replacing these), never an hour marked without them.
        for (committed, r) in written.rollups.iter().enumerate() {
            self.commit_hours_locked(tables, r.table, &[hour], &r.spanning, &r.files, ms, now)
                .map_err(|e| (e, committed))?;
        }
        let mut add = written.raw.add.clone();
        add.data_change = false;
        let mut actions = removes(inputs, false, ms);
        actions.push(Action::Add(add));
        self.maintenance_commit(tables, table, actions, Kind::Compact, now)
            .map_err(|e| (e, written.rollups.len()))
    }

    fn vacuum(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        let grace = self.config.compaction.grace;
        {
            let mut last = lock(&self.maintain.last_vacuum);
            if last.is_some_and(|at| now < at.saturating_add(nanos(grace))) {
                return Ok(());
            }
            *last = Some(now);
        }
        let ms = now.div_euclid(1_000_000);
        for table in Table::ALL {
            let mut tables = lock(&self.tables);
            match tables.vacuum(table, grace, ms) {
                Ok(n) => {
                    report.files_deleted += n;
                    self.stats
                        .vacuumed_files
                        .fetch_add(n as u64, Ordering::Relaxed);
                    if n > 0 {
                        let files = tables.files(table);
                        lock(&self.state).files.insert(table, files);
                    }
                }
                Err(e) => {
                    tracing::warn!(table = table.name(), error = %e, "vacuum failed; retried after the next grace period")
                }
            }
        }
        Ok(())
    }
}
