//! The store: WAL, buffer and Delta tables tied together.
//!
//! A write is appended to the WAL and added to the buffer under one lock, so the buffer and the
//! WAL always hold the same writes; the lock is then released and the writer waits for the WAL's
//! group commit to make its record durable (one fsync shared by every writer waiting at that
//! moment) before the write is acknowledged. A persist rotates the WAL, freezes the buffer,
//! writes each table's frozen rows as Parquet files and commits them to the table's Delta log
//! together with a `txn` action naming the last WAL segment they cover ([`crate::delta`]); the
//! table's frozen rows are swapped for its files in one step, so a query never sees a row twice
//! or misses one. Once every table's commit landed, the covered WAL segments are deleted.
//!
//! At start the store replays the WAL segments its commits do not cover: per table, a segment's
//! rows are replayed only when the segment is newer than that table's `txn` version for this
//! writer, so a crash between two tables' commits (or between a file and its commit) loses and
//! doubles nothing.
//!
//! Several servers may write one set of tables (each with its own data directory, hence its own
//! writer id and WAL): their commits are blind appends. A process that finds this writer's `txn`
//! ahead of what it committed itself shares a writer id with another (a copied data directory):
//! it stops persisting ([`Store::fenced`]) and refuses writes; its WAL keeps what it acknowledged.
//!
//! A store opened without ingest ([`StoreConfig::ingest`] false: `--role query`) has no WAL and
//! takes no writes; [`Store::refresh`] brings its view of the tables up to date.

mod damage;
mod days;
mod maintain;
mod replace;
mod replay;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrow::array::RecordBatch;
use deltalake_core::kernel::{Action, Transaction};

use crate::buffer::Buffers;
use crate::clock::Clock;
use crate::compact::{CompactionConfig, RetentionConfig};
use crate::delta::{self, DeltaTables, Kind};
use crate::ingest::WriteBatch;
use crate::persist::{self, FileMeta, Storage, Written};
use crate::schema::Table;
use crate::wal::{self, GroupCommit, Wal};
use crate::{Error, Result, startup};

pub use damage::{DamagedFile, check_presence, verify as verify_file};
use replay::{Replay, WalDamage, retire_segments};

/// How the store is set up.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Where the WAL (and, without an object store, the tables) live.
    pub data_dir: PathBuf,
    /// This store takes writes (a WAL, persists). False for a query node (`--role query`).
    pub ingest: bool,
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
    /// `s3://bucket/prefix`: keep the tables there instead of the data directory (the WAL stays
    /// in the data directory). Credentials and endpoint come from the AWS environment variables.
    pub object_store: Option<String>,
    /// Settings of the object store client applied over the environment's, as
    /// `object_store::aws::AmazonS3ConfigKey` names (`aws_endpoint`, `aws_allow_http`, ...).
    pub object_store_options: Vec<(String, String)>,
}

impl StoreConfig {
    /// Defaults for a data directory: ingest, fsync before ack, 64 MiB segments, 1 GiB buffer.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            ingest: true,
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
    /// Delta commits made by this process.
    pub delta_commits: AtomicU64,
    /// Delta commits that met a concurrent commit they conflict with (nothing written).
    pub delta_conflicts: AtomicU64,
    /// Refreshes that found new versions of the tables.
    pub refreshes: AtomicU64,
    /// Files deleted by vacuum.
    pub vacuumed_files: AtomicU64,
    /// WAL segments found damaged at replay (bytes skipped; every valid record replayed).
    pub wal_damaged_segments: AtomicU64,
    /// WAL bytes skipped at replay because they held no valid record.
    pub wal_skipped_bytes: AtomicU64,
    /// Damaged WAL segments moved to quarantine once their valid records were committed.
    pub wal_quarantined_segments: AtomicU64,
    /// Data files found damaged (missing, empty, wrong size, unreadable).
    pub damaged_files: AtomicU64,
    /// Persists that held a table's rows back because its log is damaged.
    pub persists_held_back: AtomicU64,
}

/// What the query side reads: a consistent view of one table.
#[derive(Debug, Clone, Default)]
pub struct TableSnapshot {
    /// Buffered batches (not yet in any file).
    pub batches: Vec<RecordBatch>,
    /// Persisted files: where to read each (an absolute path, or `s3://bucket/prefix/...`) and
    /// what the store knows of it.
    pub files: Vec<(String, FileMeta)>,
    /// What this view leaves out and why (damaged files, unread versions of a damaged log):
    /// every answer that could have read it says so.
    pub warnings: Vec<Skipped>,
}

/// Data a snapshot leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// What and why, for the client.
    pub text: String,
    /// The `time` range (ns, inclusive) the data left out covers: a query outside it missed
    /// nothing. `i64::MIN..=i64::MAX` when unknown.
    pub min_time: i64,
    /// See `min_time`.
    pub max_time: i64,
}

impl Skipped {
    /// Data left out at any time.
    pub fn anytime(text: String) -> Self {
        Self {
            text,
            min_time: i64::MIN,
            max_time: i64::MAX,
        }
    }
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

    /// After a query failed reading `table`'s files at `locations`: reads them whole, leaves
    /// the damaged ones out of later snapshots, and returns a warning for each found.
    fn verify(&self, table: Table, locations: &[String]) -> Vec<String> {
        let _ = (table, locations);
        Vec::new()
    }
}

#[derive(Debug)]
struct State {
    wal: Option<Wal>,
    active: Buffers,
    frozen: Buffers,
    files: BTreeMap<Table, Arc<Vec<FileMeta>>>,
}

/// What one persist did.
#[derive(Debug, Clone, Default)]
pub struct PersistReport {
    /// Files written.
    pub files: Vec<FileMeta>,
    /// Rows written.
    pub rows: u64,
    /// Last WAL segment now covered by files (of every table not held back).
    pub wal_persisted_through: u64,
    /// Tables whose rows were held back because their log is damaged: they stay buffered and
    /// in the WAL, which is not truncated.
    pub held_back: Vec<Table>,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    config: StoreConfig,
    storage: Storage,
    /// Why persistence stopped (another process commits under this writer id), if it did.
    fenced: Mutex<Option<String>>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    commit: GroupCommit,
    persist_lock: Mutex<()>,
    /// The Delta logs; every commit and refresh holds this lock.
    tables: Mutex<DeltaTables>,
    /// Per table, the last WAL segment this process saw committed under its writer id.
    committed: Mutex<BTreeMap<Table, u64>>,
    maintain: maintain::Maintenance,
    persist_wanted: tokio::sync::Notify,
    stats: StoreStats,
    /// What the checks of the tables' logs found (read without the tables' lock).
    health: delta::HealthView,
    /// Damaged data files, left out of reads and maintenance.
    damage: Mutex<damage::Damage>,
    /// Damaged WAL segments still in `wal/`, by sequence: moved to quarantine once committed.
    wal_damage: Mutex<BTreeMap<u64, WalDamage>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data (every step is all-or-nothing).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn now_millis(clock: &dyn Clock) -> i64 {
    clock.now_nanos().div_euclid(1_000_000)
}

/// Writes one table's rows as files and commits them with this writer's `txn` at `through`.
/// Checks first that no other process committed under this writer id.
fn commit_table(
    storage: &Storage,
    tables: &mut DeltaTables,
    committed: &mut BTreeMap<Table, u64>,
    table: Table,
    batches: &[RecordBatch],
    through: u64,
    now_millis: i64,
) -> Result<Vec<Written>> {
    let writer = storage.writer().id.clone();
    tables.refresh_table(table)?;
    if let Some(why) = tables.blocked(table) {
        return Err(Error::LogDamaged(why));
    }
    let seen = tables.txn_version(table, &writer)?;
    let mine = committed.get(&table).copied().unwrap_or(0);
    if seen > mine {
        return Err(Error::Fenced(format!(
            "table {} already holds WAL segment {seen} of writer {writer}, beyond the {mine} this process committed: another server uses this data directory's writer id (a copied data directory?) on {}; stop one of them and give each its own data directory (delete the copy's {} file), then restart this one",
            table.name(),
            storage.describe(),
            persist::storage::WRITER_ID_FILE
        )));
    }
    let written = persist::write_table(
        storage,
        table,
        batches,
        &format!("p{through:020}"),
        now_millis,
    )?;
    if written.is_empty() {
        return Ok(written);
    }
    let actions: Vec<Action> = written.iter().map(|w| Action::Add(w.add.clone())).collect();
    let txn = Transaction::new_with_last_update(
        writer,
        i64::try_from(through).unwrap_or(i64::MAX),
        Some(now_millis),
    );
    match tables.commit(table, actions, Kind::Append, Some(txn)) {
        Ok(_) => {
            committed.insert(table, through);
            Ok(written)
        }
        Err(e) => {
            // The commit is known not to have landed (`DeltaTables::commit` looks): its files
            // go; any left over are vacuumed after the grace period.
            persist::remove_files(storage, &written);
            Err(e)
        }
    }
}

impl Store {
    /// Opens the store: converts an earlier release's catalog to Delta tables if there is one,
    /// opens the tables (creating them unless this is a query node), replays the WAL segments
    /// the commits do not cover (persisting along the way whenever the replayed rows reach half
    /// the buffer cap, so memory stays bounded however large the WAL), and starts a new segment.
    pub fn open(config: StoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let started = Instant::now();
        let dir = &config.data_dir;
        if config.ingest {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let storage = match &config.object_store {
            Some(url) => {
                Storage::object_store(url, &config.object_store_options, dir, config.ingest)?
            }
            None => Storage::local(dir, config.ingest)?,
        };
        if config.ingest {
            startup::set("converting an earlier release's data, if any");
            delta::convert::run(&storage, now_millis(clock.as_ref()))?;
        } else if delta::convert::pending(&storage)? {
            tracing::warn!(root = %storage.describe(),
                "the tables are still in an earlier release's format: they appear once a server with --role ingest or all has started on them and converted them");
        }
        startup::set(format!(
            "opening the tables' delta logs in {}",
            storage.describe()
        ));
        let mut tables = DeltaTables::open(&storage, config.ingest)?;
        let stats = StoreStats::default();
        let (committed, active, wal, wal_damage) = if config.ingest {
            let replayed = Replay {
                config: &config,
                storage: &storage,
                clock: clock.as_ref(),
                stats: &stats,
            }
            .run(&mut tables)?;
            (
                replayed.committed,
                replayed.active,
                Some(replayed.wal),
                replayed.damage,
            )
        } else {
            (BTreeMap::new(), Buffers::default(), None, BTreeMap::new())
        };
        let files: BTreeMap<Table, Arc<Vec<FileMeta>>> =
            Table::ALL.iter().map(|t| (*t, tables.files(*t))).collect();
        let health = tables.health_view();
        tracing::info!(
            data_dir = %dir.display(),
            tables_in = %storage.describe(),
            writer = %storage.writer().id,
            ingest = config.ingest,
            files = files.values().map(|f| f.len()).sum::<usize>(),
            replayed_records = stats.replayed_records.load(Ordering::Relaxed),
            replayed_rows = active.rows(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "store opened"
        );
        Ok(Self {
            maintain: maintain::Maintenance::default(),
            config,
            storage,
            fenced: Mutex::new(None),
            clock,
            state: Mutex::new(State {
                wal,
                active,
                frozen: Buffers::default(),
                files,
            }),
            commit: GroupCommit::default(),
            persist_lock: Mutex::new(()),
            tables: Mutex::new(tables),
            committed: Mutex::new(committed),
            persist_wanted: tokio::sync::Notify::new(),
            stats,
            health,
            damage: Mutex::default(),
            wal_damage: Mutex::new(wal_damage),
        }
        .checked())
    }

    /// Checks that every table's files are present, before the store is handed out.
    fn checked(self) -> Self {
        startup::set("checking the tables' data files");
        for table in Table::ALL {
            self.check_new_files(table);
        }
        self
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// Where the tables live.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// True when this store takes writes.
    pub fn ingests(&self) -> bool {
        self.config.ingest
    }

    /// Why persistence stopped, if it did (another process commits under this writer id).
    /// Writes are refused from then on; `/readyz` reports it.
    pub fn fenced(&self) -> Option<String> {
        lock(&self.fenced).clone()
    }

    fn check_fenced(&self) -> Result<()> {
        match self.fenced() {
            Some(why) => Err(Error::Fenced(why)),
            None => Ok(()),
        }
    }

    fn fence_on(&self, e: &Error) {
        if let Error::Fenced(why) = e {
            tracing::error!(error = %e, "persistence stopped, writes refused");
            *lock(&self.fenced) = Some(why.clone());
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

    /// The latency histogram of the WAL's fsyncs (the server registers it).
    pub fn wal_fsync_seconds(
        &self,
    ) -> gpuwatch_common::metrics::prometheus_client::metrics::histogram::Histogram {
        self.commit.fsync_seconds().clone()
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
        (
            s.active.rows() + s.frozen.rows(),
            s.active.bytes() + s.frozen.bytes(),
        )
    }

    /// Number of persisted files, over all tables.
    pub fn file_count(&self) -> usize {
        lock(&self.state).files.values().map(|f| f.len()).sum()
    }

    /// The active files of `table`.
    pub fn files(&self, table: Table) -> Arc<Vec<FileMeta>> {
        lock(&self.state)
            .files
            .get(&table)
            .cloned()
            .unwrap_or_default()
    }

    /// Each table's Delta version (`None`: not created yet).
    pub fn table_versions(&self) -> BTreeMap<Table, Option<u64>> {
        lock(&self.tables).versions()
    }

    /// What the checks of `table`'s Delta log found (damaged entries, versions not read).
    pub fn log_health(&self, table: Table) -> delta::guard::LogHealth {
        self.health.get(table)
    }

    /// The last `txn` version of `app` in `table` (0 when none).
    pub fn txn_version(&self, table: Table, app: &str) -> Result<u64> {
        lock(&self.tables).txn_version(table, app)
    }

    /// Makes a write durable (WAL, fsynced through the group commit unless `wal_sync` is off) and
    /// visible to queries. When this returns `Ok`, the write survives a crash of the process.
    /// Refuses the write with [`Error::BufferFull`] when the buffer is at its cap, and with an
    /// I/O error ([`Error::is_disk_full`]) when the disk is full; nothing is stored then.
    pub fn write(&self, write: &WriteBatch) -> Result<()> {
        if write.is_empty() {
            return Ok(());
        }
        if !self.config.ingest {
            return Err(Error::ReadOnly);
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
            let mut guard = lock(&self.state);
            let s = &mut *guard;
            let held = s.active.bytes() + s.frozen.bytes();
            if held > 0 && held + incoming > limit {
                drop(guard);
                self.persist_wanted.notify_one();
                self.stats
                    .rejected_buffer_full
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Error::BufferFull {
                    held,
                    limit,
                    why: self.held_back_why(),
                });
            }
            let Some(wal) = s.wal.as_mut() else {
                return Err(Error::ReadOnly);
            };
            let pos = match wal_span.in_scope(|| wal.append(&payload)) {
                Ok(p) => p,
                Err(e) => {
                    if wal.is_broken() {
                        self.commit.fail(wal.seq(), &e.to_string());
                    }
                    if e.is_disk_full() {
                        self.stats
                            .rejected_disk_full
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(e);
                }
            };
            if wal.bytes() >= self.config.wal_segment_bytes
                && let Err(e) = wal.rotate()
            {
                tracing::warn!(error = %e, "could not start a new write-ahead log segment; appending to the current one");
            }
            // Cannot fail for a batch of the table's schema; if it did, the record would be
            // replayed at the next start although the write was refused (at least once).
            tracing::info_span!("buffer").in_scope(|| s.active.push(write))?;
            if s.active.bytes() >= limit / 2 && self.persistable_bytes(&s.active) >= limit / 2 {
                self.persist_wanted.notify_one();
            }
            pos
        };
        if self.config.wal_sync {
            let _durable = wal_span.enter();
            self.wait_durable(pos)?;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .rows
            .fetch_add(write.rows() as u64, Ordering::Relaxed);
        self.stats.wal_bytes.fetch_add(
            (payload.len() + wal::FRAME_HEADER_V2) as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Bytes of `buffers` a persist can commit: those of tables whose log is not damaged.
    fn persistable_bytes(&self, buffers: &Buffers) -> usize {
        buffers
            .tables()
            .filter(|(t, _)| self.health.blocked(*t).is_none())
            .map(|(_, b)| b.bytes())
            .sum()
    }

    /// Why a persist cannot empty the buffer (tables whose log is damaged), for the answer of
    /// a write refused because the buffer is full; empty when nothing is held back.
    fn held_back_why(&self) -> String {
        let blocked: Vec<&str> = Table::ALL
            .iter()
            .filter(|t| self.health.blocked(**t).is_some())
            .map(|t| t.name())
            .collect();
        if blocked.is_empty() {
            return String::new();
        }
        format!(
            "; the rows of {} cannot be persisted because the table's delta log is damaged (see /readyz, run `gpuwatch check`)",
            blocked.join(", ")
        )
    }

    fn wait_durable(&self, pos: wal::Position) -> Result<()> {
        self.commit.wait_durable(
            pos,
            || lock(&self.state).wal.as_ref().map(Wal::sync_target),
            |seq| {
                if let Some(w) = lock(&self.state).wal.as_mut() {
                    w.mark_broken(seq);
                }
            },
        )
    }

    /// Makes every write appended so far durable (used with `wal_sync` off, on a timer).
    pub fn sync_wal(&self) -> Result<()> {
        let Some(pos) = lock(&self.state).wal.as_ref().map(Wal::position) else {
            return Ok(());
        };
        self.wait_durable(pos)
    }

    /// Writes everything buffered to the tables and truncates the WAL. Returns `None` when there
    /// was nothing to persist.
    pub fn persist(&self) -> Result<Option<PersistReport>> {
        let _one_at_a_time = lock(&self.persist_lock);
        if !self.config.ingest {
            return Ok(None);
        }
        self.check_fenced()?;
        let (frozen, through) = {
            let mut s = lock(&self.state);
            if s.active.is_empty() || self.persistable_bytes(&s.active) == 0 {
                // Nothing, or only rows of tables whose log is damaged: no commit can take
                // them, so the WAL is not rotated for nothing.
                return Ok(None);
            }
            let Some(wal) = s.wal.as_mut() else {
                return Ok(None);
            };
            let through = wal.rotate()?;
            let frozen = std::mem::take(&mut s.active);
            s.frozen = frozen.clone();
            (frozen, through)
        };
        let mut report = PersistReport {
            wal_persisted_through: through,
            ..Default::default()
        };
        let mut failure = None;
        let mut held_back = Vec::new();
        let mut failed = Buffers::default();
        let now = now_millis(self.clock.as_ref());
        for (table, buf) in frozen.tables() {
            match self.persist_table(table, buf.batches(), through, now) {
                Ok(written) => {
                    self.stats.delta_commits.fetch_add(1, Ordering::Relaxed);
                    report.rows += written.iter().map(|w| w.meta.rows).sum::<u64>();
                    report.files.extend(written.into_iter().map(|w| w.meta));
                }
                Err(Error::LogDamaged(why)) => {
                    tracing::warn!(
                        table = table.name(),
                        "persist held the table's rows back (they stay buffered and in the write-ahead log): {why}"
                    );
                    failed.prepend(lock(&self.state).frozen.take(table));
                    held_back.push(table);
                }
                Err(e) => {
                    tracing::warn!(table = table.name(), error = %e, "persisting a table failed; its rows stay buffered and in the write-ahead log");
                    if matches!(e, Error::DeltaConflict { .. }) {
                        self.stats.delta_conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    self.fence_on(&e);
                    failed.prepend(lock(&self.state).frozen.take(table));
                    failure.get_or_insert(e);
                }
            }
        }
        {
            let mut s = lock(&self.state);
            s.frozen = Buffers::default();
            if !failed.is_empty() {
                s.active.prepend(failed);
            }
        }
        if let Some(e) = failure {
            self.stats.persist_failures.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.persisted(report, held_back).map(Some)
    }

    /// Commits one table's frozen rows; once the commit is in the log, its rows leave the
    /// buffer as its files enter the view, in one step.
    fn persist_table(
        &self,
        table: Table,
        batches: &[RecordBatch],
        through: u64,
        now: i64,
    ) -> Result<Vec<Written>> {
        let mut tables = lock(&self.tables);
        let mut committed = lock(&self.committed);
        let r = commit_table(
            &self.storage,
            &mut tables,
            &mut committed,
            table,
            batches,
            through,
            now,
        );
        let mut s = lock(&self.state);
        if r.is_ok() {
            s.frozen.take(table);
        }
        // A refresh may have brought other servers' files too.
        s.files.insert(table, tables.files(table));
        r
    }

    /// After every table's commit landed (or was held back): counts, and retires the WAL
    /// segments the commits cover — unless rows were held back, which keep the WAL.
    fn persisted(&self, mut report: PersistReport, held_back: Vec<Table>) -> Result<PersistReport> {
        self.stats.persists.fetch_add(1, Ordering::Relaxed);
        self.stats
            .persisted_rows
            .fetch_add(report.rows, Ordering::Relaxed);
        if held_back.is_empty() {
            let now = now_millis(self.clock.as_ref());
            retire_segments(
                &self.config.data_dir,
                0..=report.wal_persisted_through,
                &mut lock(&self.wal_damage),
                now,
                &self.stats,
            );
        } else {
            // The WAL keeps every segment until a good commit covers the held-back rows.
            self.stats
                .persists_held_back
                .fetch_add(1, Ordering::Relaxed);
            report.held_back = held_back;
        }
        Ok(report)
    }

    /// Brings the view of the tables to their newest versions (commits of other servers).
    /// Returns how many tables changed.
    pub fn refresh(&self) -> Result<usize> {
        let mut tables = lock(&self.tables);
        tables.refresh()?;
        // Install every table whose files changed, by this refresh or by an earlier step that
        // brought a table forward without installing it (a commit that met a conflict).
        let mut s = lock(&self.state);
        let mut changed = Vec::new();
        for t in Table::ALL {
            let files = tables.files(t);
            if s.files.get(&t).is_none_or(|f| !Arc::ptr_eq(f, &files)) {
                s.files.insert(t, files);
                changed.push(t);
            }
        }
        drop(s);
        drop(tables);
        for t in &changed {
            self.check_new_files(*t);
        }
        if !changed.is_empty() {
            self.stats.refreshes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(changed.len())
    }

    /// Imports `batches` into `table` once: a commit with the `txn` `(app, 1)`, skipped when the
    /// table already holds it (an earlier release's alert history, say). Returns whether it
    /// imported.
    pub fn import_once(&self, table: Table, batches: &[RecordBatch], app: &str) -> Result<bool> {
        let mut tables = lock(&self.tables);
        if tables.txn_version(table, app)? >= 1 {
            return Ok(false);
        }
        let now = now_millis(self.clock.as_ref());
        let batches: Vec<RecordBatch> = batches
            .iter()
            .map(crate::buffer::to_micros)
            .collect::<Result<_>>()?;
        let written = persist::write_table(&self.storage, table, &batches, "import", now)?;
        let actions = written.iter().map(|w| Action::Add(w.add.clone())).collect();
        let txn = Transaction::new_with_last_update(app, 1, Some(now));
        if let Err(e) = tables.commit(table, actions, Kind::Append, Some(txn)) {
            persist::remove_files(&self.storage, &written);
            return Err(e);
        }
        let files = tables.files(table);
        lock(&self.state).files.insert(table, files);
        Ok(true)
    }
}

impl ReadStore for Store {
    fn snapshot(&self, table: Table) -> TableSnapshot {
        let s = lock(&self.state);
        let mut batches: Vec<RecordBatch> = Vec::new();
        batches.extend(s.frozen.batches(table).iter().cloned());
        batches.extend(s.active.batches(table).iter().cloned());
        let all = s.files.get(&table).cloned().unwrap_or_default();
        drop(s);
        let mut warnings = Vec::new();
        if let Some(why) = self.health.blocked(table) {
            warnings.push(Skipped::anytime(why));
        }
        let damage = lock(&self.damage);
        let mut files = Vec::with_capacity(all.len());
        for m in all.iter() {
            match damage.file(&m.path) {
                Some(d) => warnings.push(Skipped {
                    text: d.warning(),
                    min_time: m.min_time,
                    max_time: m.max_time,
                }),
                None => files.push((self.storage.location(&m.path), m.clone())),
            }
        }
        TableSnapshot {
            batches,
            files,
            warnings,
        }
    }

    fn object_store(&self) -> Option<(String, Arc<dyn object_store::ObjectStore>)> {
        self.storage.query_object_store()
    }

    fn verify(&self, table: Table, locations: &[String]) -> Vec<String> {
        self.verify_files(table, locations)
            .iter()
            .map(DamagedFile::warning)
            .collect()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_damage;
#[cfg(test)]
mod tests_days;
#[cfg(test)]
mod tests_processes;
#[cfg(test)]
mod tests_replace;
