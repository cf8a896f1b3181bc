//! The store: WAL, buffer and Parquet files tied together.
//!
//! A write is appended to the WAL (and fsynced) and added to the buffer under one lock, so the
//! buffer and the WAL always hold the same writes. A persist rotates the WAL, freezes the buffer,
//! writes the frozen batches as Parquet, records the files and the last covered WAL segment in the
//! catalog, then drops the frozen batches and the covered segments. Queries see the active buffer,
//! the frozen one and the catalog's files; the frozen batches are swapped for their files in one
//! step, so a query never sees a row twice or misses one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::array::RecordBatch;

use crate::buffer::Buffers;
use crate::clock::Clock;
use crate::ingest::WriteBatch;
use crate::persist::{self, Catalog, FileMeta};
use crate::schema::Table;
use crate::wal::{self, Wal};
use crate::{Error, Result};

/// How the store is set up.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the WAL, the catalog and the Parquet files live.
    pub data_dir: PathBuf,
    /// Fsync every WAL append before acknowledging it (`--wal-sync always`).
    pub wal_sync: bool,
}

/// Counters the server exposes on `/metrics`.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Writes acknowledged.
    pub writes: AtomicU64,
    /// Rows acknowledged, all tables.
    pub rows: AtomicU64,
    /// WAL bytes appended.
    pub wal_bytes: AtomicU64,
    /// Persists completed.
    pub persists: AtomicU64,
    /// Persists failed.
    pub persist_failures: AtomicU64,
    /// Rows written to Parquet.
    pub persisted_rows: AtomicU64,
    /// WAL records replayed at start.
    pub replayed_records: AtomicU64,
}

/// What the query side reads: a consistent view of one table.
#[derive(Debug, Clone, Default)]
pub struct TableSnapshot {
    /// Buffered batches (not yet in any file).
    pub batches: Vec<RecordBatch>,
    /// Persisted files, with absolute paths.
    pub files: Vec<(PathBuf, FileMeta)>,
}

/// The narrow read interface the query engine uses.
pub trait ReadStore: Send + Sync + std::fmt::Debug {
    /// A consistent view of `table` now.
    fn snapshot(&self, table: Table) -> TableSnapshot;
}

#[derive(Debug)]
struct State {
    wal: Wal,
    active: Buffers,
    frozen: Option<Buffers>,
    catalog: Catalog,
}

/// What one persist did.
#[derive(Debug, Clone, Default)]
pub struct PersistReport {
    /// Files written.
    pub files: Vec<FileMeta>,
    /// Rows written.
    pub rows: u64,
    /// Last WAL segment now covered by files.
    pub wal_persisted_through: u64,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    persist_lock: Mutex<()>,
    stats: StoreStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every step is all-or-nothing).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    /// Opens the store: loads the catalog, removes leftovers of an interrupted persist, replays
    /// the WAL segments the catalog does not cover, and starts a new segment.
    pub fn open(config: StoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let started = Instant::now();
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let catalog = Catalog::load(dir)?;
        persist::remove_orphans(dir, &catalog)?;
        let wal_dir = dir.join("wal");
        let stats = StoreStats::default();
        let mut active = Buffers::default();
        let mut last_seq = catalog.wal_persisted_through;
        for (seq, path) in wal::list_segments(&wal_dir)? {
            last_seq = last_seq.max(seq);
            if seq <= catalog.wal_persisted_through {
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                continue;
            }
            let report = wal::read_segment(&path, |payload| {
                let write = wal::decode_payload(payload)?;
                active.push(&write)
            })?;
            stats
                .replayed_records
                .fetch_add(report.records, Ordering::Relaxed);
            if report.torn_bytes > 0 {
                tracing::warn!(segment = %path.display(), records = report.records, torn_bytes = report.torn_bytes,
                    "write-ahead log segment ends in a torn or corrupt record; kept every whole record before it");
            }
        }
        let wal = Wal::create(&wal_dir, last_seq + 1, config.wal_sync)?;
        tracing::info!(
            data_dir = %dir.display(),
            files = catalog.files.len(),
            replayed_records = stats.replayed_records.load(Ordering::Relaxed),
            replayed_rows = active.rows(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "store opened"
        );
        Ok(Self {
            config,
            clock,
            state: Mutex::new(State {
                wal,
                active,
                frozen: None,
                catalog,
            }),
            persist_lock: Mutex::new(()),
            stats,
        })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The injected clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Rows and bytes buffered in memory (active and frozen).
    pub fn buffered(&self) -> (usize, usize) {
        let s = lock(&self.state);
        let frozen = s
            .frozen
            .as_ref()
            .map(|f| (f.rows(), f.bytes()))
            .unwrap_or_default();
        (s.active.rows() + frozen.0, s.active.bytes() + frozen.1)
    }

    /// Number of persisted files.
    pub fn file_count(&self) -> usize {
        lock(&self.state).catalog.files.len()
    }

    /// Makes a write durable (WAL, fsynced) and visible to queries. When this returns `Ok`, the
    /// write survives a crash of the process.
    pub fn write(&self, write: &WriteBatch) -> Result<()> {
        if write.is_empty() {
            return Ok(());
        }
        let payload = wal::encode_payload(write)?;
        let mut s = lock(&self.state);
        s.wal.append(&payload)?;
        s.active.push(write)?;
        drop(s);
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rows
            .fetch_add(write.rows() as u64, Ordering::Relaxed);
        self.stats
            .wal_bytes
            .fetch_add(payload.len() as u64 + 8, Ordering::Relaxed);
        Ok(())
    }

    /// Writes everything buffered to Parquet and truncates the WAL. Returns `None` when there was
    /// nothing to persist.
    pub fn persist(&self) -> Result<Option<PersistReport>> {
        let _one_at_a_time = lock(&self.persist_lock);
        let (frozen, through) = {
            let mut s = lock(&self.state);
            if s.active.is_empty() {
                return Ok(None);
            }
            let through = s.wal.rotate()?;
            let frozen = std::mem::take(&mut s.active);
            s.frozen = Some(frozen.clone());
            (frozen, through)
        };
        match self.write_frozen(&frozen, through) {
            Ok(report) => {
                self.stats.persists.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .persisted_rows
                    .fetch_add(report.rows, Ordering::Relaxed);
                // The covered segments are no longer needed; a failure here only costs disk
                // until the next start, which removes them.
                let wal_dir = self.config.data_dir.join("wal");
                if let Ok(segments) = wal::list_segments(&wal_dir) {
                    for (seq, path) in segments {
                        if seq > through {
                            continue;
                        }
                        if let Err(e) = std::fs::remove_file(&path) {
                            tracing::warn!(segment = %path.display(), error = %e, "could not remove a persisted wal segment");
                        }
                    }
                }
                Ok(Some(report))
            }
            Err(e) => {
                self.stats.persist_failures.fetch_add(1, Ordering::Relaxed);
                let mut s = lock(&self.state);
                s.frozen = None;
                s.active.prepend(frozen);
                Err(e)
            }
        }
    }

    fn write_frozen(&self, frozen: &Buffers, through: u64) -> Result<PersistReport> {
        let dir = &self.config.data_dir;
        let mut files = Vec::new();
        for (table, buf) in frozen.tables() {
            files.extend(persist::write_table(dir, table, buf.batches(), through)?);
        }
        let mut catalog = lock(&self.state).catalog.clone();
        catalog.files.extend(files.iter().cloned());
        catalog.wal_persisted_through = through;
        catalog.save(dir)?;
        let mut s = lock(&self.state);
        s.catalog = catalog;
        s.frozen = None;
        let rows = files.iter().map(|f| f.rows).sum();
        Ok(PersistReport {
            files,
            rows,
            wal_persisted_through: through,
        })
    }
}

impl ReadStore for Store {
    fn snapshot(&self, table: Table) -> TableSnapshot {
        let s = lock(&self.state);
        let mut batches: Vec<RecordBatch> = Vec::new();
        if let Some(f) = &s.frozen {
            batches.extend(f.batches(table).iter().cloned());
        }
        batches.extend(s.active.batches(table).iter().cloned());
        let files = s
            .catalog
            .files
            .iter()
            .filter(|f| f.table == table.name())
            .map(|f| (Catalog::absolute(&self.config.data_dir, f), f.clone()))
            .collect();
        TableSnapshot { batches, files }
    }
}

#[cfg(test)]
mod tests;
