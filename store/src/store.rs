//! The store: WAL, buffer and Parquet files tied together.
//!
//! A write is appended to the WAL and added to the buffer under one lock, so the buffer and the
//! WAL always hold the same writes; the lock is then released and the writer waits for the WAL's
//! group commit to make its record durable (one fsync shared by every writer waiting at that
//! moment) before the write is acknowledged. A persist rotates the WAL, freezes the buffer,
//! writes the frozen batches as Parquet, records the files and the last covered WAL segment in the
//! catalog, then drops the frozen batches and the covered segments. Queries see the active buffer,
//! the frozen one and the catalog's files; the frozen batches are swapped for their files in one
//! step, so a query never sees a row twice or misses one.
//!
//! Every change of the catalog (persist, compaction, retention) is a read-modify-write under one
//! lock, saved atomically before it is installed, so they never undo each other.
//!
//! With an object store ([`StoreConfig::object_store`]) the Parquet files and the catalog live
//! there and the WAL stays in the data directory. A catalog version another server wrote first
//! ([`Error::CatalogConflict`]) stops persistence for good in this process: writes are refused
//! with [`Error::Fenced`] (the WAL keeps what was acknowledged) and [`Store::fenced`] says why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::array::RecordBatch;

use crate::buffer::Buffers;
use crate::clock::Clock;
use crate::compact::{self, CompactionConfig, HOUR_NANOS, MaintenanceReport, RetentionConfig};
use crate::ingest::WriteBatch;
use crate::persist::{self, Catalog, FileMeta, Retired, Storage};
use crate::schema::Table;
use crate::wal::{self, GroupCommit, Wal};
use crate::{Error, Result};

/// How the store is set up.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the WAL, the catalog and the Parquet files live.
    pub data_dir: PathBuf,
    /// Fsync (group commit) every WAL append before acknowledging it (`--wal-sync always`).
    /// When false (`--wal-sync interval`), writes are acknowledged once in the page cache and the
    /// owner calls [`Store::sync_wal`] periodically: a process crash loses nothing, a machine
    /// crash may lose the writes of the last interval.
    pub wal_sync: bool,
    /// A WAL segment is closed and a new one started once it holds this many bytes.
    pub wal_segment_bytes: u64,
    /// The in-memory buffer's cap. At half of it a persist is requested early; at the cap writes
    /// are refused with [`Error::BufferFull`]. Replay at start persists whenever it reaches half.
    pub max_buffer_bytes: usize,
    /// Compaction of the persisted files.
    pub compaction: CompactionConfig,
    /// Retention per table.
    pub retention: RetentionConfig,
    /// `s3://bucket/prefix`: keep the Parquet files and the catalog there instead of the data
    /// directory (the WAL stays in the data directory). Credentials and endpoint come from the
    /// AWS environment variables.
    pub object_store: Option<String>,
    /// Settings of the object store client applied over the environment's, as
    /// `object_store::aws::AmazonS3ConfigKey` names (`aws_endpoint`, `aws_allow_http`, ...).
    pub object_store_options: Vec<(String, String)>,
}

impl StoreConfig {
    /// Defaults for a data directory: fsync before ack, 64 MiB segments, 1 GiB buffer.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            wal_sync: true,
            wal_segment_bytes: 64 << 20,
            max_buffer_bytes: 1 << 30,
            compaction: CompactionConfig::default(),
            retention: RetentionConfig::default(),
            object_store: None,
            object_store_options: Vec::new(),
        }
    }
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
    /// Writes refused because the buffer was full.
    pub rejected_buffer_full: AtomicU64,
    /// Writes refused because the disk was full.
    pub rejected_disk_full: AtomicU64,
    /// Compactions completed (one per window merged).
    pub compactions: AtomicU64,
    /// Files removed by retention.
    pub retention_deleted_files: AtomicU64,
}

/// What the query side reads: a consistent view of one table.
#[derive(Debug, Clone, Default)]
pub struct TableSnapshot {
    /// Buffered batches (not yet in any file).
    pub batches: Vec<RecordBatch>,
    /// Persisted files: where to read each (an absolute path, or `s3://bucket/prefix/...`) and
    /// its catalog entry.
    pub files: Vec<(String, FileMeta)>,
}

/// The narrow read interface the query engine uses.
pub trait ReadStore: Send + Sync + std::fmt::Debug {
    /// A consistent view of `table` now.
    fn snapshot(&self, table: Table) -> TableSnapshot;

    /// The object store the files live in, if any: the address to register it under
    /// (`s3://bucket`) and a client for the query engine's runtime.
    fn object_store(&self) -> Option<(String, Arc<dyn object_store::ObjectStore>)> {
        None
    }
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
    storage: Storage,
    /// Why persistence stopped (a catalog conflict), if it did.
    fenced: Mutex<Option<String>>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    commit: GroupCommit,
    persist_lock: Mutex<()>,
    catalog_lock: Mutex<()>,
    /// File count of every closed window that late files reopened, as of the previous pass.
    maintain_lock: Mutex<std::collections::HashMap<(Table, i64), usize>>,
    persist_wanted: tokio::sync::Notify,
    stats: StoreStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every step is all-or-nothing).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records that the files cover this writer's WAL through segment `through`.
fn mark_persisted(storage: &Storage, catalog: &mut Catalog, through: u64) {
    catalog.wal_persisted_through = through;
    if let Some(w) = storage.writer() {
        catalog.wal_persisted_by.insert(w.id.clone(), through);
    }
}

/// The last segment of this writer's WAL that the catalog's files cover.
fn covered(storage: &Storage, catalog: &Catalog) -> u64 {
    match storage.writer() {
        None => catalog.wal_persisted_through,
        Some(w) => catalog.wal_persisted_by.get(&w.id).copied().unwrap_or(0),
    }
}

/// Saves `catalog` as the next version, signed by this writer.
fn save_next(storage: &Storage, catalog: &mut Catalog) -> Result<()> {
    catalog.generation += 1;
    catalog.writer = storage.writer().cloned();
    storage.save_catalog(catalog)
}

/// Writes `frozen` as Parquet files covering WAL segments up to `through`, and saves a catalog
/// naming them. Returns the new catalog (not yet installed) and the files.
fn persist_buffers(
    storage: &Storage,
    frozen: &Buffers,
    through: u64,
    mut catalog: Catalog,
) -> Result<(Catalog, Vec<FileMeta>)> {
    let mut files = Vec::new();
    for (table, buf) in frozen.tables() {
        files.extend(persist::write_table(
            storage,
            table,
            buf.batches(),
            through,
        )?);
    }
    catalog.files.extend(files.iter().cloned());
    mark_persisted(storage, &mut catalog, through);
    save_next(storage, &mut catalog)?;
    Ok((catalog, files))
}

/// Removes the files of a failed catalog change, unless the change may have landed: on an object
/// store a failed request may still have written the catalog version, so its files stay (a
/// leftover is removed at the next start). A conflict is certain not to name them.
fn discard_files(storage: &Storage, files: &[FileMeta], error: &Error) {
    if storage.is_object_store() && !matches!(error, Error::CatalogConflict { .. }) {
        return;
    }
    persist::remove_files(storage, files);
}

/// Removes WAL segments up to `through`. A failure only costs disk until the next start, which
/// removes them.
fn remove_segments_through(wal_dir: &Path, through: u64) {
    if let Ok(segments) = wal::list_segments(wal_dir) {
        for (seq, path) in segments {
            if seq > through {
                continue;
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(segment = %path.display(), error = %e, "could not remove a persisted wal segment");
            }
        }
    }
}

impl Store {
    /// Opens the store: loads the catalog, removes leftovers of an interrupted persist or
    /// compaction, replays the WAL segments the catalog does not cover (persisting along the way
    /// whenever the replayed rows reach half the buffer cap, so memory stays bounded however large
    /// the WAL), and starts a new segment.
    pub fn open(config: StoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let started = Instant::now();
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let storage = match &config.object_store {
            Some(url) => Storage::object_store(url, &config.object_store_options, dir)?,
            None => Storage::local(dir),
        };
        let mut catalog = storage.load_catalog()?;
        storage.remove_orphans(&catalog, config.compaction.grace)?;
        if !catalog.retired.is_empty() && !storage.is_object_store() {
            // No query of an earlier process can still read them, and `remove_orphans` deleted
            // them; the next catalog change records that if this save cannot (a full disk).
            // (On an object store they are deleted after their grace period as usual.)
            catalog.retired.clear();
            if let Err(e) = save_next(&storage, &mut catalog) {
                tracing::warn!(error = %e, "could not record the deletion of retired files yet");
            }
        }
        let wal_dir = dir.join("wal");
        let stats = StoreStats::default();
        let mut active = Buffers::default();
        let covered_through = covered(&storage, &catalog);
        let mut last_seq = covered_through;
        let replay_limit = (config.max_buffer_bytes / 2).max(1);
        for (seq, path) in wal::list_segments(&wal_dir)? {
            last_seq = last_seq.max(seq);
            if seq <= covered_through {
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
            if active.bytes() >= replay_limit {
                let (saved, files) = persist_buffers(&storage, &active, seq, catalog)?;
                catalog = saved;
                remove_segments_through(&wal_dir, seq);
                tracing::info!(
                    through = seq,
                    files = files.len(),
                    "replay reached half the buffer cap: persisted"
                );
                stats.persists.fetch_add(1, Ordering::Relaxed);
                active = Buffers::default();
            }
        }
        let wal = Wal::create(&wal_dir, last_seq + 1)?;
        tracing::info!(
            data_dir = %dir.display(),
            files_in = %storage.describe(),
            catalog_version = catalog.generation,
            files = catalog.files.len(),
            replayed_records = stats.replayed_records.load(Ordering::Relaxed),
            replayed_rows = active.rows(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "store opened"
        );
        Ok(Self {
            config,
            storage,
            fenced: Mutex::new(None),
            clock,
            state: Mutex::new(State {
                wal,
                active,
                frozen: None,
                catalog,
            }),
            commit: GroupCommit::default(),
            persist_lock: Mutex::new(()),
            catalog_lock: Mutex::new(()),
            maintain_lock: Mutex::new(Default::default()),
            persist_wanted: tokio::sync::Notify::new(),
            stats,
        })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// Where the Parquet files and the catalog live.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Why persistence stopped, if it did (another server wrote to the same object store
    /// prefix). Writes are refused from then on; `/readyz` reports it.
    pub fn fenced(&self) -> Option<String> {
        lock(&self.fenced).clone()
    }

    fn check_fenced(&self) -> Result<()> {
        match self.fenced() {
            Some(why) => Err(Error::Fenced(why)),
            None => Ok(()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The injected clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Fsyncs performed by the WAL's group commit.
    pub fn wal_fsyncs(&self) -> u64 {
        self.commit.fsyncs()
    }

    /// Notified when the buffer reaches half its cap: the owner should persist now.
    pub fn persist_wanted(&self) -> &tokio::sync::Notify {
        &self.persist_wanted
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

    /// A copy of the current catalog.
    pub fn catalog(&self) -> Catalog {
        lock(&self.state).catalog.clone()
    }

    /// Makes a write durable (WAL, fsynced through the group commit unless `wal_sync` is off) and
    /// visible to queries. When this returns `Ok`, the write survives a crash of the process.
    /// Refuses the write with [`Error::BufferFull`] when the buffer is at its cap, and with an
    /// I/O error ([`Error::is_disk_full`]) when the disk is full; nothing is stored then.
    pub fn write(&self, write: &WriteBatch) -> Result<()> {
        if write.is_empty() {
            return Ok(());
        }
        self.check_fenced()?;
        // Spans of the write (children of the caller's ingest span): the WAL record appended and
        // made durable, and the rows added to the queryable buffer.
        let wal_span = tracing::info_span!("wal_commit", rows = write.rows());
        let payload = wal_span.in_scope(|| wal::encode_payload(write))?;
        let incoming: usize = write
            .batches
            .iter()
            .map(|(_, b)| b.get_array_memory_size())
            .sum();
        let limit = self.config.max_buffer_bytes;
        let pos = {
            let mut s = lock(&self.state);
            let held = s.active.bytes() + s.frozen.as_ref().map(Buffers::bytes).unwrap_or(0);
            if held > 0 && held + incoming > limit {
                drop(s);
                self.persist_wanted.notify_one();
                self.stats
                    .rejected_buffer_full
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Error::BufferFull { held, limit });
            }
            let pos = match wal_span.in_scope(|| s.wal.append(&payload)) {
                Ok(p) => p,
                Err(e) => {
                    if s.wal.is_broken() {
                        self.commit.fail(s.wal.seq(), &e.to_string());
                    }
                    if e.is_disk_full() {
                        self.stats
                            .rejected_disk_full
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(e);
                }
            };
            // Cannot fail for a batch of the table's schema; if it did, the record would be
            // replayed at the next start although the write was refused (at least once).
            tracing::info_span!("buffer").in_scope(|| s.active.push(write))?;
            if s.active.bytes() >= limit / 2 {
                self.persist_wanted.notify_one();
            }
            if s.wal.bytes() >= self.config.wal_segment_bytes
                && let Err(e) = s.wal.rotate()
            {
                tracing::warn!(error = %e, "could not start a new write-ahead log segment; appending to the current one");
            }
            pos
        };
        if self.config.wal_sync {
            let _durable = wal_span.enter();
            self.commit.wait_durable(
                pos,
                || lock(&self.state).wal.sync_target(),
                |seq| lock(&self.state).wal.mark_broken(seq),
            )?;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rows
            .fetch_add(write.rows() as u64, Ordering::Relaxed);
        self.stats
            .wal_bytes
            .fetch_add(payload.len() as u64 + 8, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every write appended so far durable (used with `wal_sync` off, on a timer).
    pub fn sync_wal(&self) -> Result<()> {
        let pos = lock(&self.state).wal.position();
        self.commit.wait_durable(
            pos,
            || lock(&self.state).wal.sync_target(),
            |seq| lock(&self.state).wal.mark_broken(seq),
        )
    }

    /// Applies `change` to a copy of the current catalog, saves it atomically, then installs it
    /// (together with `install`, under the state lock). Serialised with every other catalog
    /// change.
    fn change_catalog<T>(
        &self,
        change: impl FnOnce(&mut Catalog) -> Result<T>,
        install: impl FnOnce(&mut State),
    ) -> Result<T> {
        let _serial = lock(&self.catalog_lock);
        self.check_fenced()?;
        let mut catalog = lock(&self.state).catalog.clone();
        let out = change(&mut catalog)?;
        if let Err(e) = save_next(&self.storage, &mut catalog) {
            if let Error::CatalogConflict { .. } = &e {
                tracing::error!(error = %e, prefix = %self.storage.describe(),
                    "another server writes to this object store prefix: persistence stopped, writes refused");
                *lock(&self.fenced) = Some(e.to_string());
            }
            return Err(e);
        }
        let mut s = lock(&self.state);
        s.catalog = catalog;
        install(&mut s);
        Ok(out)
    }

    /// Writes everything buffered to Parquet and truncates the WAL. Returns `None` when there was
    /// nothing to persist.
    pub fn persist(&self) -> Result<Option<PersistReport>> {
        let _one_at_a_time = lock(&self.persist_lock);
        self.check_fenced()?;
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
                remove_segments_through(&self.config.data_dir.join("wal"), through);
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
        let storage = &self.storage;
        let mut files = Vec::new();
        for (table, buf) in frozen.tables() {
            match persist::write_table(storage, table, buf.batches(), through) {
                Ok(f) => files.extend(f),
                Err(e) => {
                    persist::remove_files(storage, &files);
                    return Err(e);
                }
            }
        }
        let saved = self.change_catalog(
            |c| {
                c.files.extend(files.iter().cloned());
                mark_persisted(storage, c, through);
                Ok(())
            },
            |s| s.frozen = None,
        );
        if let Err(e) = saved {
            discard_files(storage, &files, &e);
            return Err(e);
        }
        let rows = files.iter().map(|f| f.rows).sum();
        Ok(PersistReport {
            files,
            rows,
            wal_persisted_through: through,
        })
    }
}

fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Store {
    /// One maintenance pass: retention, then compaction and rollups of the windows that need
    /// it, then deletion of retired files whose grace period is over. Safe to run beside
    /// writes, persists and queries.
    pub fn maintain(&self) -> Result<MaintenanceReport> {
        let mut reopened = lock(&self.maintain_lock);
        self.check_fenced()?;
        let now = self.clock.now_nanos();
        let mut report = MaintenanceReport::default();
        self.expire(now, &mut report)?;
        self.compact(now, &mut reopened, &mut report)?;
        self.delete_retired(now, &mut report)?;
        let current = lock(&self.state).catalog.generation;
        match self
            .storage
            .delete_old_catalogs(current, self.config.compaction.grace)
        {
            Ok(n) => report.catalogs_deleted += n,
            Err(e) => {
                tracing::warn!(error = %e, "could not delete old catalog versions; retrying later")
            }
        }
        Ok(report)
    }

    fn expire(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        let retention = &self.config.retention;
        let doomed: Vec<String> = self
            .catalog()
            .files
            .iter()
            .filter(|f| {
                let Some(table) = Table::from_name(&f.table) else {
                    return false;
                };
                let Some(keep) = retention.keep_nanos(table) else {
                    return false;
                };
                // Raw samples go only once their hour is rolled up.
                let rolled = table != Table::GpuMetrics || f.level >= 1;
                f.max_time < now.saturating_sub(keep) && rolled
            })
            .map(|f| f.path.clone())
            .collect();
        if doomed.is_empty() {
            return Ok(());
        }
        self.change_catalog(
            |c| {
                c.files.retain(|f| !doomed.contains(&f.path));
                c.retired.extend(doomed.iter().map(|p| Retired {
                    path: p.clone(),
                    at: now,
                }));
                Ok(())
            },
            |_| {},
        )?;
        report.files_expired += doomed.len();
        self.stats
            .retention_deleted_files
            .fetch_add(doomed.len() as u64, Ordering::Relaxed);
        tracing::info!(
            files = doomed.len(),
            "retention: files past their table's retention dropped"
        );
        Ok(())
    }

    fn compact(
        &self,
        now: i64,
        reopened: &mut std::collections::HashMap<(Table, i64), usize>,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let cfg = &self.config.compaction;
        let mut windows: std::collections::BTreeMap<(Table, i64), Vec<FileMeta>> =
            Default::default();
        for f in self.catalog().files {
            if let Some(t) = Table::from_name(&f.table).filter(|t| t.is_ingested()) {
                windows
                    .entry((t, compact::window_of(&f)))
                    .or_default()
                    .push(f);
            }
        }
        let mut still_reopened = std::collections::HashMap::new();
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
                self.compact_window(table, hour, &files, closed, now, report)?;
            }
        }
        *reopened = still_reopened;
        Ok(())
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
        let storage = &self.storage;
        let merged = persist::sort_batch(table, &compact::read_files(storage, table, inputs)?)?;
        let id = self.catalog().next_id;
        let name = storage.file_name(&format!("c{id:020}"));
        let mut written: Vec<FileMeta> = Vec::new();
        let mut write = |t: Table, batch: &RecordBatch| -> Result<()> {
            let mut meta = persist::write_file(storage, t, batch, hour, &name)?;
            meta.level = u8::from(closed);
            written.push(meta);
            Ok(())
        };
        let mut result = write(table, &merged);
        if closed && table == Table::GpuMetrics {
            for rollup in [Table::GpuMetrics1m, Table::GpuMetrics1h] {
                result =
                    result.and_then(|()| write(rollup, &compact::rollup::rollup(&merged, rollup)?));
            }
        }
        if let Err(e) = result {
            persist::remove_files(storage, &written);
            return Err(e);
        }
        let input_paths: Vec<&str> = inputs.iter().map(|f| f.path.as_str()).collect();
        let rollups = written.len() - 1;
        let changed = self.change_catalog(
            |c| {
                // A concurrent change (retention) took an input away: leave the window be.
                if !input_paths
                    .iter()
                    .all(|p| c.files.iter().any(|f| f.path == *p))
                {
                    return Ok(false);
                }
                let replaced = |f: &FileMeta| {
                    input_paths.contains(&f.path.as_str())
                        || (rollups > 0
                            && (f.table == Table::GpuMetrics1m.name()
                                || f.table == Table::GpuMetrics1h.name())
                            && compact::window_of(f) == hour)
                };
                let gone: Vec<String> = c
                    .files
                    .iter()
                    .filter(|f| replaced(f))
                    .map(|f| f.path.clone())
                    .collect();
                c.files.retain(|f| !replaced(f));
                c.files.extend(written.iter().cloned());
                c.retired
                    .extend(gone.into_iter().map(|path| Retired { path, at: now }));
                c.next_id = id + 1;
                Ok(true)
            },
            |_| {},
        );
        match changed {
            Ok(true) => {
                report.windows_compacted += 1;
                report.files_merged += inputs.len();
                report.rollup_files += rollups;
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
            Ok(false) => {
                persist::remove_files(storage, &written);
                Ok(())
            }
            Err(e) => {
                discard_files(storage, &written, &e);
                Err(e)
            }
        }
    }

    fn delete_retired(&self, now: i64, report: &mut MaintenanceReport) -> Result<()> {
        let grace = nanos(self.config.compaction.grace);
        let due: Vec<String> = self
            .catalog()
            .retired
            .iter()
            .filter(|r| r.at.saturating_add(grace) <= now)
            .map(|r| r.path.clone())
            .collect();
        let mut deleted = Vec::new();
        for rel in due {
            match self.storage.delete(&rel) {
                Ok(()) => deleted.push(rel),
                Err(e) => {
                    tracing::warn!(error = %e, "could not delete a retired file; retrying later")
                }
            }
        }
        if deleted.is_empty() {
            return Ok(());
        }
        self.change_catalog(
            |c| {
                c.retired.retain(|r| !deleted.contains(&r.path));
                Ok(())
            },
            |_| {},
        )?;
        report.files_deleted += deleted.len();
        Ok(())
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
            .map(|f| (self.storage.location(&f.path), f.clone()))
            .collect();
        TableSnapshot { batches, files }
    }

    fn object_store(&self) -> Option<(String, Arc<dyn object_store::ObjectStore>)> {
        self.storage.query_object_store()
    }
}

#[cfg(test)]
mod tests;
