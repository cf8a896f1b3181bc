//! Replay of the write-ahead log at start, and the retirement of segments once their rows are
//! committed.
//!
//! A segment's rows of a table are replayed only when the segment is newer than that table's
//! `txn` version for this writer. Every valid record of a damaged segment is replayed (see
//! `wal/read.rs`); the segment stays in `wal/` until every valid record in it is committed, and
//! then moves to `quarantine/` with a note of what was replayed from it and which byte ranges
//! were skipped, instead of being deleted. Replay persists whenever the replayed rows reach half
//! the buffer cap, so memory stays bounded however large the WAL — except for the rows of a
//! table whose log is damaged (no commit runs on it): those stay in the WAL, and in memory up to
//! half the cap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::Ordering;

use super::{StoreStats, commit_table, now_millis};
use crate::buffer::Buffers;
use crate::clock::Clock;
use crate::delta::DeltaTables;
use crate::persist::Storage;
use crate::quarantine::{self, Note};
use crate::schema::Table;
use crate::wal::{self, SegmentReport, Wal};
use crate::{Error, Result, StoreConfig, startup};

/// A damaged WAL segment: what reading it found and what was replayed from it.
#[derive(Debug, Clone)]
pub(crate) struct WalDamage {
    /// What reading it found.
    pub report: SegmentReport,
    /// Valid frames whose payload could not be decoded (skipped too).
    pub undecodable: u64,
    /// Rows replayed from it, per table (those its tables' commits did not cover yet).
    pub rows: BTreeMap<Table, u64>,
}

impl WalDamage {
    fn note(&self, rel: &str, through: u64, now_millis: i64) -> Note {
        let rows: BTreeMap<&str, u64> = self.rows.iter().map(|(t, n)| (t.name(), *n)).collect();
        let ranges: Vec<[u64; 2]> = self
            .report
            .skipped
            .iter()
            .map(|r| [r.start, r.end])
            .collect();
        Note::new(
            rel,
            now_millis,
            format!(
                "bytes {} of this {}-byte segment held no valid record ({} undecodable records): every valid record was replayed, and is in the tables (committed through WAL segment {through})",
                self.report.ranges_text(),
                self.report.bytes,
                self.undecodable
            ),
            serde_json::json!({
                "format": self.report.format,
                "bytes": self.report.bytes,
                "records_replayed": self.report.records - self.undecodable.min(self.report.records),
                "records_undecodable": self.undecodable,
                "rows_replayed": rows,
                "skipped_ranges": ranges,
                "skipped_bytes": self.report.skipped_bytes(),
                "committed_through_wal_segment": through,
            }),
        )
    }
}

/// What replay leaves: the rows not yet committed, the WAL to append to, the damage found.
pub(super) struct Replayed {
    pub committed: BTreeMap<Table, u64>,
    pub active: Buffers,
    pub wal: Wal,
    pub damage: BTreeMap<u64, WalDamage>,
}

/// Removes the WAL segments of `seqs` (every row in them committed); damaged ones move to the
/// quarantine with their note. A failure only costs disk until the next start, which retries.
pub(crate) fn retire_segments(
    data_dir: &Path,
    seqs: std::ops::RangeInclusive<u64>,
    damage: &mut BTreeMap<u64, WalDamage>,
    now_millis: i64,
    stats: &StoreStats,
) {
    let Ok(segments) = wal::list_segments(&data_dir.join("wal")) else {
        return;
    };
    let through = *seqs.end();
    for (seq, path) in segments.into_iter().filter(|(s, _)| seqs.contains(s)) {
        let Some(d) = damage.remove(&seq) else {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(segment = %path.display(), error = %e, "could not remove a persisted wal segment");
            }
            continue;
        };
        let rel = format!("wal/{}", wal::segment_name(seq));
        match quarantine::move_local(
            data_dir,
            &rel,
            &d.note(&rel, through, now_millis),
            now_millis,
        ) {
            Ok(to) => {
                stats
                    .wal_quarantined_segments
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(segment = %path.display(), quarantined = %to.display(), skipped = %d.report.ranges_text(),
                    "damaged write-ahead log segment moved to quarantine: every valid record in it is committed");
            }
            Err(e) => {
                tracing::warn!(segment = %path.display(), error = %e, "could not move a damaged wal segment to quarantine; retried at the next persist");
                damage.insert(seq, d);
            }
        }
    }
}

/// Everything replay needs.
pub(super) struct Replay<'a> {
    pub config: &'a StoreConfig,
    pub storage: &'a Storage,
    pub clock: &'a dyn Clock,
    pub stats: &'a StoreStats,
}

impl Replay<'_> {
    /// Replays the WAL segments the commits do not cover, persisting along the way.
    pub(super) fn run(&self, tables: &mut DeltaTables) -> Result<Replayed> {
        let wal_dir = self.config.data_dir.join("wal");
        let writer = self.storage.writer().id.clone();
        let mut committed = BTreeMap::new();
        for table in Table::ALL {
            committed.insert(table, tables.txn_version(table, &writer)?);
        }
        let mut last_seq = committed.values().copied().max().unwrap_or(0);
        let mut state = State::default();
        let segments = wal::list_segments(&wal_dir)?;
        for (i, (seq, path)) in segments.iter().enumerate() {
            startup::set(format!(
                "replaying the write-ahead log: segment {} of {} ({})",
                i + 1,
                segments.len(),
                path.display()
            ));
            last_seq = last_seq.max(*seq);
            let kept = self.segment(*seq, path, &committed, &mut state)?;
            if kept == 0 {
                // Every row of it is in committed files: it goes, and only it (the rows of
                // earlier segments may be in the buffer alone).
                let now = now_millis(self.clock);
                retire_segments(
                    &self.config.data_dir,
                    *seq..=*seq,
                    &mut state.damage,
                    now,
                    self.stats,
                );
                continue;
            }
            if state.active.bytes() >= (self.config.max_buffer_bytes / 2).max(1) {
                self.persist(tables, &mut committed, &mut state, *seq)?;
            }
        }
        Ok(Replayed {
            committed,
            active: state.active,
            wal: Wal::create(&wal_dir, last_seq + 1)?,
            damage: state.damage,
        })
    }

    /// Replays one segment; returns how many rows it added.
    fn segment(
        &self,
        seq: u64,
        path: &Path,
        committed: &BTreeMap<Table, u64>,
        state: &mut State,
    ) -> Result<usize> {
        let mut rows: BTreeMap<Table, u64> = BTreeMap::new();
        let mut undecodable = 0u64;
        let mut kept = 0;
        let State {
            active, left_out, ..
        } = &mut *state;
        let fresh = |t: Table| seq > committed.get(&t).copied().unwrap_or(0);
        let report = wal::read_segment(path, |payload| {
            let write = match wal::decode_payload(payload) {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(segment = %path.display(), error = %e, "a write-ahead log record with valid checksums cannot be decoded: skipped");
                    undecodable += 1;
                    return Ok(());
                }
            };
            for (t, b) in write.batches.iter().filter(|(t, _)| fresh(*t)) {
                *rows.entry(*t).or_default() += b.num_rows() as u64;
            }
            kept += active.push_where(&write, |t| fresh(t) && !left_out.contains(&t))?;
            if write
                .batches
                .iter()
                .any(|(t, _)| fresh(*t) && left_out.contains(t))
            {
                // Rows kept in the WAL only count as kept: the segment stays.
                kept += 1;
            }
            Ok(())
        })?;
        self.stats
            .replayed_records
            .fetch_add(report.records, Ordering::Relaxed);
        if report.damaged() || undecodable > 0 {
            tracing::warn!(segment = %path.display(), skipped = %report.ranges_text(), skipped_bytes = report.skipped_bytes(),
                records = report.records, undecodable,
                "write-ahead log segment damaged: skipped the byte ranges holding no valid record and replayed every valid record; the segment moves to quarantine once they are committed");
            self.stats
                .wal_damaged_segments
                .fetch_add(1, Ordering::Relaxed);
            self.stats
                .wal_skipped_bytes
                .fetch_add(report.skipped_bytes(), Ordering::Relaxed);
            state.damage.insert(
                seq,
                WalDamage {
                    report,
                    undecodable,
                    rows,
                },
            );
        }
        Ok(kept)
    }

    /// Commits the replayed rows of every table whose log is intact, through segment `seq`.
    fn persist(
        &self,
        tables: &mut DeltaTables,
        committed: &mut BTreeMap<Table, u64>,
        state: &mut State,
        seq: u64,
    ) -> Result<()> {
        let now = now_millis(self.clock);
        let mut held = Buffers::default();
        let names: Vec<Table> = state.active.tables().map(|(t, _)| t).collect();
        for table in names {
            let rows = state.active.take(table);
            let result = commit_table(
                self.storage,
                tables,
                committed,
                table,
                rows.batches(table),
                seq,
                now,
            );
            match result {
                Ok(_) => {}
                Err(Error::LogDamaged(why)) => {
                    tracing::warn!(table = table.name(), "replayed rows held back: {why}");
                    held.prepend(rows);
                }
                Err(e) => return Err(e),
            }
        }
        self.stats.persists.fetch_add(1, Ordering::Relaxed);
        if held.is_empty() {
            retire_segments(
                &self.config.data_dir,
                0..=seq,
                &mut state.damage,
                now,
                self.stats,
            );
            tracing::info!(
                through = seq,
                "replay reached half the buffer cap: persisted"
            );
        } else if held.bytes() >= (self.config.max_buffer_bytes / 2).max(1) {
            let names: BTreeSet<Table> = held.tables().map(|(t, _)| t).collect();
            tracing::error!(tables = ?names.iter().map(|t| t.name()).collect::<Vec<_>>(),
                "rows of tables whose log is damaged fill half the buffer cap: their later rows stay in the write-ahead log only (not visible to queries) until the tables are repaired");
            state.left_out.extend(names);
        }
        state.active = held;
        Ok(())
    }
}

#[derive(Default)]
struct State {
    active: Buffers,
    damage: BTreeMap<u64, WalDamage>,
    /// Tables whose rows are no longer buffered (their log is damaged and they filled half the
    /// buffer cap): their rows stay in the WAL.
    left_out: BTreeSet<Table>,
}
