//! The persisted tables as Delta Lake tables, one per table at `<root>/tables/<table>/`
//! (`<root>` = the data directory or the `--object-store` prefix), through `deltalake-core`.
//!
//! - **Commits.** A persist is one commit per table of `add` actions (a blind append) with a
//!   `txn` action whose app id is the writer's id and whose version is the last WAL segment the
//!   files cover, so the WAL coverage lands in the same atomic commit as the files. Compaction is
//!   `remove` + `add` with `dataChange=false`; rollups replace their hour (`remove` + `add`);
//!   retention is `remove`, and the files go at the next vacuum after the grace period.
//! - **Who may commit at once.** Any number of writers append concurrently; Delta's conflict
//!   rules let blind appends through, and an append that meets a concurrent `remove` is simply
//!   committed again on the new version. Every maintenance commit (compaction, rollups,
//!   retention) carries a `txn` of the app id [`MAINTENANCE_APP`], so two maintainers always
//!   conflict: the second one's commit fails, writes nothing, and its pass is retried.
//! - **Exactly once.** A commit that fails in a way that may have landed (a timeout; a retried
//!   put that met its own first attempt) is checked against the log before it is reported:
//!   an append by its `txn` version, other commits by their files.
//! - **Checkpoints** every `delta.checkpointInterval` (100) commits and expired log cleanup are
//!   deltalake's post-commit hooks; a failure there never fails the commit.
//!
//! The store calls these methods synchronously; they run on the storage runtime.

pub mod convert;
pub mod durable;
pub mod files;
pub mod guard;
pub mod schema;
pub mod view;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake_core::kernel::{Action, StructField, Transaction};
use deltalake_core::logstore::{LogStoreRef, StorageConfig, default_logstore};
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableError};
use object_store::prefix::PrefixStore;

use self::guard::{FILES_KEY, Inspection, Inspector, LogHealth};
use self::view::{Ceiling, LogView, Veil};
use crate::persist::{FileMeta, Storage};
use crate::schema::Table;
use crate::{Error, Result};

/// The `txn` app id of every maintenance commit (compaction, rollups, retention).
pub const MAINTENANCE_APP: &str = "gpuwatch-maintenance";

/// How many times an append is committed again after meeting a concurrent `remove`.
const APPEND_ATTEMPTS: usize = 5;

/// What a commit does, which decides its Delta operation and how its conflicts are judged.
#[derive(Debug, Clone)]
pub enum Kind {
    /// New rows (a persist, an import): a blind append.
    Append,
    /// Files merged (`dataChange=false`): OPTIMIZE.
    Compact,
    /// The rollups of one hour rebuilt.
    Replace {
        /// The replaced range, for the commit's record (`time >= … AND time < …`).
        predicate: String,
    },
    /// Files past retention removed.
    Expire {
        /// The removed range, for the commit's record.
        predicate: String,
    },
}

impl Kind {
    fn operation(&self) -> DeltaOperation {
        let partition_by = Some(vec![schema::PARTITION_COLUMN.to_string()]);
        match self {
            Kind::Append => DeltaOperation::Write {
                mode: SaveMode::Append,
                partition_by,
                predicate: None,
            },
            Kind::Compact => DeltaOperation::Optimize {
                predicate: None,
                target_size: 0,
            },
            Kind::Replace { predicate } => DeltaOperation::Write {
                mode: SaveMode::Overwrite,
                partition_by,
                predicate: Some(predicate.clone()),
            },
            Kind::Expire { predicate } => DeltaOperation::Delete {
                predicate: Some(predicate.clone()),
            },
        }
    }
}

/// One table's log and what the store knows of its files.
struct TableLog {
    table: DeltaTable,
    /// `FileMeta` of every active file, by its path in the table.
    known: HashMap<String, FileMeta>,
    /// The active files.
    files: Arc<Vec<FileMeta>>,
    /// What `deltalake` is shown of the log (`view.rs`).
    veil: Arc<RwLock<Veil>>,
    /// The checks of the log (`guard.rs`), kept between refreshes.
    inspector: Inspector,
    /// What the last checks found.
    health: LogHealth,
}

impl TableLog {
    fn version(&self) -> Option<u64> {
        self.table.state.as_ref().map(|s| s.version())
    }

    fn veil(&self) -> std::sync::RwLockWriteGuard<'_, Veil> {
        self.veil.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Shows `deltalake` what `inspection` decided, and keeps what it found.
    fn apply(&mut self, table: Table, inspection: Inspection) {
        self.veil().set(inspection.ceiling, inspection.hidden);
        if inspection.health != self.health {
            if inspection.health.damaged() {
                tracing::error!(
                    table = table.name(),
                    read_at = ?inspection.health.read_at,
                    newest = ?inspection.health.newest,
                    "{}",
                    inspection.health.describe(table)
                );
            } else if self.health.damaged() {
                tracing::info!(table = table.name(), "delta log readable again");
            }
        }
        self.health = inspection.health;
    }
}

/// What the checks of every table's log found, readable without the lock the commits hold.
#[derive(Debug, Clone, Default)]
pub struct HealthView(Arc<RwLock<BTreeMap<Table, LogHealth>>>);

impl HealthView {
    /// What the checks of `table`'s log found.
    pub fn get(&self, table: Table) -> LogHealth {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&table)
            .cloned()
            .unwrap_or_default()
    }

    /// Why no commit may run on `table` now, if so.
    pub fn blocked(&self, table: Table) -> Option<String> {
        let health = self.get(table);
        health.blocks().then(|| health.describe(table))
    }

    fn set(&self, table: Table, health: &LogHealth) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(table, health.clone());
    }
}

/// Every table's Delta log.
pub struct DeltaTables {
    storage: Storage,
    logs: BTreeMap<Table, TableLog>,
    health: HealthView,
}

impl std::fmt::Debug for DeltaTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let versions: BTreeMap<&str, Option<u64>> = self
            .logs
            .iter()
            .map(|(t, l)| (t.name(), l.version()))
            .collect();
        f.debug_struct("DeltaTables")
            .field("storage", &self.storage)
            .field("versions", &versions)
            .finish()
    }
}

fn delta_error(storage: &Storage, table: Table, source: DeltaTableError) -> Error {
    Error::Delta {
        table,
        location: storage.location(&table_dir(table)),
        source,
    }
}

fn not_open(table: Table) -> Error {
    Error::DeltaSchema(format!("table {} is not open", table.name()))
}

/// A table's directory, relative to the root.
pub fn table_dir(table: Table) -> String {
    format!("tables/{}", table.name())
}

/// True for the errors that say another commit got in the way (the commit did not land).
fn is_conflict(e: &DeltaTableError) -> bool {
    matches!(
        e,
        DeltaTableError::Transaction {
            source: TransactionError::CommitConflict(_) | TransactionError::MaxCommitAttempts(_)
        }
    )
}

/// A veil that hides nothing yet, for `table`'s log.
fn new_veil(storage: &Storage, table: Table) -> Result<Arc<RwLock<Veil>>> {
    let prefix = format!("{}/_delta_log/", storage.key(&table_dir(table))?);
    Ok(Arc::new(RwLock::new(Veil::new(prefix))))
}

/// The log store of `table`: the storage's root store seen through `veil`, from the table's
/// directory.
fn log_store(storage: &Storage, table: Table, veil: &Arc<RwLock<Veil>>) -> Result<LogStoreRef> {
    let rel = table_dir(table);
    let url = storage.url(&rel)?;
    let view: Arc<dyn object_store::ObjectStore> =
        Arc::new(LogView::new(storage.root_store(), Arc::clone(veil)));
    let prefixed: Arc<dyn object_store::ObjectStore> =
        Arc::new(PrefixStore::new(Arc::clone(&view), storage.key(&rel)?));
    Ok(default_logstore(
        prefixed,
        view,
        &url,
        &StorageConfig::default(),
    ))
}

/// The commit properties of a gpuwatch commit: its `txn`, and in `commitInfo` how many
/// `add`/`remove` actions it holds (so that a commit cut short is told apart, `guard.rs`).
fn commit_properties(
    actions: &[Action],
    txn: Option<Transaction>,
    blind: bool,
) -> CommitProperties {
    let files = actions
        .iter()
        .filter(|a| matches!(a, Action::Add(_) | Action::Remove(_)))
        .count();
    let mut metadata = vec![(FILES_KEY.to_string(), serde_json::json!(files))];
    if blind {
        metadata.push(("isBlindAppend".to_string(), serde_json::json!(true)));
    }
    let mut props = CommitProperties::default().with_metadata(metadata);
    if let Some(t) = txn {
        props = props.with_application_transaction(t);
    }
    props
}

/// Loads `table`'s log; creates the table when it does not exist and `create` is set.
async fn load_or_create(
    log_store: LogStoreRef,
    table: Table,
    create: bool,
    extra: Vec<Action>,
    txn: Option<Transaction>,
) -> std::result::Result<DeltaTable, DeltaTableError> {
    let mut delta = DeltaTable::new(Arc::clone(&log_store));
    if log_store.is_delta_table_location().await? {
        delta.load().await?;
        if !create {
            return Ok(delta);
        }
        let missing = missing_columns(&delta, table)?;
        return add_missing_columns(delta, missing).await;
    }
    if !create {
        return Ok(delta);
    }
    let props = commit_properties(&extra, txn, false);
    let created = CreateBuilder::new()
        .with_log_store(Arc::clone(&log_store))
        .with_table_name(table.name())
        .with_comment(format!(
            "gpuwatch table {}: see docs/schema.md and docs/scale-out.md",
            table.name()
        ))
        .with_columns(
            schema::delta_columns(table).map_err(|e| DeltaTableError::Generic(e.to_string()))?,
        )
        .with_partition_columns([schema::PARTITION_COLUMN])
        .with_actions(extra)
        .with_commit_properties(props)
        .with_save_mode(SaveMode::Ignore)
        .await;
    match created {
        Ok(t) => Ok(t),
        // Another server created it first: use theirs.
        Err(_) if log_store.is_delta_table_location().await? => {
            delta.load().await?;
            Ok(delta)
        }
        Err(e) => Err(e),
    }
}

/// The columns of `table` that `delta`'s schema lacks (added by a later release), nullable.
fn missing_columns(
    delta: &DeltaTable,
    table: Table,
) -> std::result::Result<Vec<StructField>, DeltaTableError> {
    let have: HashSet<String> = delta
        .snapshot()?
        .schema()
        .fields()
        .map(|f| f.name().clone())
        .collect();
    Ok(schema::delta_columns(table)
        .map_err(|e| DeltaTableError::Generic(e.to_string()))?
        .into_iter()
        .filter(|c| !have.contains(c.name()))
        .map(|c| StructField::new(c.name().clone(), c.data_type().clone(), true))
        .collect())
}

/// Adds to a table made by an earlier release the columns it lacks (those of
/// `gpu_metrics` listed after "Added after the first release" in schema.rs, `series_labels`), as
/// nullable columns appended at the end in one metadata commit (Delta's `ADD COLUMNS`), so
/// that other engines see them too. Files written
/// before read them as null. A concurrent writer that added them first leaves nothing to do.
async fn add_missing_columns(
    delta: DeltaTable,
    missing: Vec<StructField>,
) -> std::result::Result<DeltaTable, DeltaTableError> {
    if missing.is_empty() {
        return Ok(delta);
    }
    let log_store = delta.log_store();
    let names: Vec<String> = missing.iter().map(|f| f.name().clone()).collect();
    match delta.add_columns().with_fields(missing).await {
        Ok(t) => Ok(t),
        Err(e) if is_conflict(&e) => {
            // Another writer committed first: it added them, or the next open tries again.
            let mut again = DeltaTable::new(log_store);
            again.load().await?;
            let schema = again.snapshot()?.schema();
            if names.iter().all(|n| schema.contains(n)) {
                Ok(again)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

impl DeltaTables {
    /// Opens every table's log. With `create`, missing tables are created (an ingest node);
    /// without, a missing table reads as empty until it appears (a query node). A table whose
    /// log is damaged is read at its last good version and never created over.
    pub fn open(storage: &Storage, create: bool) -> Result<Self> {
        let mut logs = BTreeMap::new();
        let health = HealthView::default();
        for table in Table::ALL {
            let log = Self::open_table(storage, table, create)?;
            health.set(table, &log.health);
            logs.insert(table, log);
        }
        Ok(Self {
            storage: storage.clone(),
            logs,
            health,
        })
    }

    fn open_table(storage: &Storage, table: Table, create: bool) -> Result<TableLog> {
        let veil = new_veil(storage, table)?;
        let mut inspector = Inspector::default();
        let inspection = inspector.inspect(storage, table, false)?;
        let absent = inspection.health.newest.is_none();
        let mut log = TableLog {
            table: DeltaTable::new(log_store(storage, table, &veil)?),
            known: HashMap::new(),
            files: Arc::default(),
            veil,
            inspector,
            health: LogHealth::default(),
        };
        log.apply(table, inspection);
        let store = log.table.log_store();
        // An ingest node gives a healthy table of an earlier release the columns added since; a
        // damaged log is left as it is until it is repaired (docs/operations.md).
        let evolve = create && !absent && log.health.bad.is_empty();
        let create = create && absent;
        if create {
            log.veil().open();
        }
        log.table = storage
            .block(load_or_create(store, table, create, Vec::new(), None))?
            .map_err(|e| delta_error(storage, table, e))?;
        let lacking = if evolve {
            missing_columns(&log.table, table).map_err(|e| delta_error(storage, table, e))?
        } else {
            Vec::new()
        };
        if !lacking.is_empty() {
            // Every version is shown while committing, as for any commit; then the table is
            // read at the version it reached.
            log.veil().open();
            let loaded = log.table.clone();
            log.table = storage
                .block(add_missing_columns(loaded, lacking))?
                .map_err(|e| delta_error(storage, table, e))?;
            if let Some(v) = log.table.version() {
                log.veil().set_ceiling(Ceiling::At(v as u64));
            }
        }
        if create {
            let inspection = log.inspector.inspect(storage, table, false)?;
            log.apply(table, inspection);
        }
        rebuild_files(table, &mut log);
        Ok(log)
    }

    /// True when `table` exists as a Delta table.
    pub fn exists(storage: &Storage, table: Table) -> Result<bool> {
        let store = log_store(storage, table, &new_veil(storage, table)?)?;
        storage
            .block(async move { store.is_delta_table_location().await })?
            .map_err(|e| delta_error(storage, table, e))
    }

    /// Creates `table` with `adds` and a `txn` in its first commit (conversion of an earlier
    /// release's files, a log rebuilt by `gpuwatch repair`). Does nothing if the table exists.
    pub fn create_with(
        storage: &Storage,
        table: Table,
        adds: Vec<Action>,
        txn: Option<Transaction>,
    ) -> Result<()> {
        let store = log_store(storage, table, &new_veil(storage, table)?)?;
        storage
            .block(load_or_create(store, table, true, adds, txn))?
            .map(|_| ())
            .map_err(|e| delta_error(storage, table, e))
    }

    /// What the checks of every table's log found, readable without this lock.
    pub fn health_view(&self) -> HealthView {
        self.health.clone()
    }

    /// What the checks of `table`'s log found.
    pub fn health(&self, table: Table) -> LogHealth {
        self.logs
            .get(&table)
            .map(|l| l.health.clone())
            .unwrap_or_default()
    }

    /// Why no commit may run on `table` now (versions of its log are not read), if so.
    pub fn blocked(&self, table: Table) -> Option<String> {
        let log = self.logs.get(&table)?;
        log.health.blocks().then(|| log.health.describe(table))
    }

    fn log(&self, table: Table) -> Result<&TableLog> {
        self.logs.get(&table).ok_or_else(|| not_open(table))
    }

    /// The active files of `table`.
    pub fn files(&self, table: Table) -> Arc<Vec<FileMeta>> {
        self.logs
            .get(&table)
            .map(|l| Arc::clone(&l.files))
            .unwrap_or_default()
    }

    /// The table versions, for `/metrics` and logs.
    pub fn versions(&self) -> BTreeMap<Table, Option<u64>> {
        self.logs.iter().map(|(t, l)| (*t, l.version())).collect()
    }

    /// The last `txn` version of `app` in `table` (0 when none).
    pub fn txn_version(&self, table: Table, app: &str) -> Result<u64> {
        let log = self.log(table)?;
        let Some(state) = log.table.state.clone() else {
            return Ok(0);
        };
        let store = log.table.log_store();
        let app = app.to_string();
        let v = self
            .storage
            .block(async move { state.transaction_version(store.as_ref(), app).await })?
            .map_err(|e| delta_error(&self.storage, table, e))?;
        Ok(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0))
    }

    /// Brings every table to its newest version. Returns the tables whose files changed.
    pub fn refresh(&mut self) -> Result<Vec<Table>> {
        let mut changed = Vec::new();
        let tables: Vec<Table> = self.logs.keys().copied().collect();
        for table in tables {
            if self.refresh_table(table)? {
                changed.push(table);
            }
        }
        Ok(changed)
    }

    /// Checks `table`'s log again and brings the table to its newest good version. Returns
    /// whether its files changed.
    pub fn refresh_table(&mut self, table: Table) -> Result<bool> {
        let storage = self.storage.clone();
        let log = self.logs.get_mut(&table).ok_or_else(|| not_open(table))?;
        let before = log.version();
        let inspection = log.inspector.inspect(&storage, table, false)?;
        let ceiling = inspection.ceiling;
        log.apply(table, inspection);
        self.health.set(table, &log.health);
        let mut delta = log.table.clone();
        // A version already read that now fails its checks (a race with another writer, or
        // damage after it was read): read the table again up to the last good version.
        let reload = match (ceiling, before) {
            (Ceiling::Nothing, Some(_)) => true,
            (Ceiling::At(c), Some(v)) => v > c,
            _ => false,
        };
        let updated = storage
            .block(async move {
                if reload {
                    delta = DeltaTable::new(delta.log_store());
                }
                if delta.state.is_none() && !delta.log_store().is_delta_table_location().await? {
                    return Ok(delta);
                }
                delta.update_incremental(None).await.map(|()| delta)
            })?
            .map_err(|e| delta_error(&storage, table, e))?;
        log.table = updated;
        if log.version() == before && !reload {
            return Ok(false);
        }
        rebuild_files(table, log);
        Ok(true)
    }

    /// Commits `actions` to `table` (with `txn`, if any), and brings the table to the version
    /// committed. Returns the version.
    pub fn commit(
        &mut self,
        table: Table,
        actions: Vec<Action>,
        kind: Kind,
        txn: Option<Transaction>,
    ) -> Result<u64> {
        if let Some(why) = self.blocked(table) {
            return Err(Error::LogDamaged(why));
        }
        let attempts = if matches!(kind, Kind::Append) {
            APPEND_ATTEMPTS
        } else {
            1
        };
        let mut last = None;
        for _ in 0..attempts {
            match self.commit_once(table, actions.clone(), &kind, txn.clone()) {
                Ok(v) => return Ok(v),
                Err(e) if is_conflict(&e) => {
                    // A concurrent commit got in the way: the commit did not land. Appends
                    // read nothing, so they are committed again on the new version.
                    tracing::info!(table = table.name(), error = %e, "delta commit met a concurrent commit");
                    last = Some(e);
                    self.refresh_table(table)?;
                }
                Err(e) => {
                    // It may have landed (a timeout after the put went through): look.
                    self.refresh_table(table)?;
                    if self.landed(table, &actions, &kind, txn.as_ref())? {
                        tracing::warn!(table = table.name(), error = %e,
                            "a delta commit reported a failure but is in the log: counted as done");
                        return self
                            .log(table)?
                            .version()
                            .ok_or_else(|| delta_error(&self.storage, table, e));
                    }
                    return Err(delta_error(&self.storage, table, e));
                }
            }
        }
        let source = last.unwrap_or_else(|| DeltaTableError::Generic("no commit attempt".into()));
        Err(Error::DeltaConflict { table, source })
    }

    /// Commits a repair (`gpuwatch repair`, offline): files re-added and damaged ones removed.
    /// The `txn` of every writer whose files it re-adds rides along as `Action::Txn`. One
    /// attempt.
    pub fn commit_repair(&mut self, table: Table, actions: Vec<Action>) -> Result<u64> {
        if let Some(why) = self.blocked(table) {
            return Err(Error::LogDamaged(why));
        }
        let kind = Kind::Expire {
            predicate: "gpuwatch repair".into(),
        };
        self.commit_once(table, actions, &kind, None)
            .map_err(|e| delta_error(&self.storage, table, e))
    }

    /// The paths (in the table) of every file removed from `table` and not vacuumed yet, as its
    /// log's tombstones say.
    pub fn tombstones(&self, table: Table) -> Result<HashSet<String>> {
        use futures::TryStreamExt;
        let log = self.log(table)?;
        let Some(state) = log.table.state.clone() else {
            return Ok(HashSet::new());
        };
        let store = log.table.log_store();
        self.storage
            .block(async move {
                state
                    .all_tombstones(store.as_ref())
                    .map_ok(|t| t.path().into_owned())
                    .try_collect::<HashSet<String>>()
                    .await
            })?
            .map_err(|e| delta_error(&self.storage, table, e))
    }

    fn commit_once(
        &mut self,
        table: Table,
        actions: Vec<Action>,
        kind: &Kind,
        txn: Option<Transaction>,
    ) -> std::result::Result<u64, DeltaTableError> {
        let log = self.logs.get_mut(&table).ok_or_else(|| {
            DeltaTableError::Generic(format!("table {} is not open", table.name()))
        })?;
        let Some(state) = log.table.state.clone() else {
            return Err(DeltaTableError::NotATable(format!(
                "{} has no Delta log yet",
                table.name()
            )));
        };
        let store = log.table.log_store();
        let props = commit_properties(&actions, txn, matches!(kind, Kind::Append));
        let operation = kind.operation();
        // Every version is shown while committing (conflicts are checked against the commits
        // that got in first); the next refresh checks them.
        log.veil().open();
        let outcome = self
            .storage
            .block(async move {
                let post = CommitBuilder::from(props)
                    .with_actions(actions)
                    .build(Some(&state), Arc::clone(&store), operation)
                    .into_prepared_commit_future()
                    .await?
                    .await?;
                let version = post.version;
                // The commit is in the log: a failure of the post-commit hooks (checkpoint,
                // log cleanup) does not undo it.
                let snapshot = post.await.map(|f| f.snapshot);
                Ok::<_, DeltaTableError>((version, snapshot))
            })
            .map_err(|e| DeltaTableError::Generic(e.to_string()))??;
        let (version, snapshot) = outcome;
        log.veil().set_ceiling(Ceiling::At(version));
        match snapshot {
            Ok(s) => {
                log.table.state = Some(s);
                rebuild_files(table, log);
            }
            Err(e) => {
                tracing::warn!(table = table.name(), version, error = %e,
                    "delta commit done, its checkpoint or log cleanup failed; retried at a later commit");
                self.refresh_table(table)
                    .map_err(|e| DeltaTableError::Generic(e.to_string()))?;
            }
        }
        Ok(version)
    }

    /// After a failed commit: is it in the log anyway?
    fn landed(
        &self,
        table: Table,
        actions: &[Action],
        kind: &Kind,
        txn: Option<&Transaction>,
    ) -> Result<bool> {
        if let (Kind::Append, Some(t)) = (kind, txn) {
            let have = self.txn_version(table, &t.app_id)?;
            return Ok(u64::try_from(t.version).is_ok_and(|v| have >= v));
        }
        let log = self.log(table)?;
        let present: HashSet<&str> = log.known.keys().map(String::as_str).collect();
        let mut any = false;
        for a in actions {
            match a {
                Action::Add(add) => {
                    any = true;
                    if !present.contains(add.path.as_str()) {
                        return Ok(false);
                    }
                }
                Action::Remove(r) => {
                    any = true;
                    if present.contains(r.path.as_str()) {
                        return Ok(false);
                    }
                }
                _ => {}
            }
        }
        Ok(any)
    }

    /// Deletes files no version within `retention` needs: files removed from the table more
    /// than `retention` ago, and files no commit names (left by a persist or compaction that
    /// failed before its commit) written more than `retention` ago. The log is not written
    /// (Delta's VACUUM audit commits are optional), so a vacuum with nothing to do costs one
    /// listing. Returns how many files were deleted.
    pub fn vacuum(&mut self, table: Table, retention: Duration, now_millis: i64) -> Result<usize> {
        use futures::TryStreamExt;
        let log = self.log(table)?;
        if log.health.blocks() {
            // Files the unread versions added look unnamed: nothing is deleted until the log
            // is repaired.
            tracing::warn!(
                table = table.name(),
                "vacuum skipped: {}",
                log.health.describe(table)
            );
            return Ok(0);
        }
        let Some(state) = log.table.state.clone() else {
            return Ok(0);
        };
        let cutoff =
            now_millis.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        let store = log.table.log_store();
        let tombstones: HashMap<String, i64> = self
            .storage
            .block(async move {
                state
                    .all_tombstones(store.as_ref())
                    .map_ok(|t| (t.path().into_owned(), t.deletion_timestamp().unwrap_or(0)))
                    .try_collect::<HashMap<String, i64>>()
                    .await
            })?
            .map_err(|e| delta_error(&self.storage, table, e))?;
        let dir = table_dir(table);
        let active: HashSet<&str> = log.known.keys().map(String::as_str).collect();
        let mut deleted = 0;
        for listed in self.storage.list(&dir)? {
            let Some(in_table) = listed.rel.strip_prefix(&format!("{dir}/")) else {
                continue;
            };
            // The log and hidden files are not data files; a temporary file of an interrupted
            // write (`.<name>.<pid>.<n>.tmp`) is a leftover like an unnamed data file.
            let name = in_table.rsplit('/').next().unwrap_or(in_table);
            let leftover = name.starts_with('.') && name.ends_with(".tmp");
            if in_table.starts_with("_delta_log/")
                || name.starts_with('_')
                || (name.starts_with('.') && !leftover)
                || active.contains(in_table)
            {
                continue;
            }
            let gone_at = tombstones
                .get(in_table)
                .copied()
                .unwrap_or_else(|| listed.last_modified.timestamp_millis());
            if gone_at >= cutoff {
                continue;
            }
            match self.storage.delete(&listed.rel) {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::warn!(file = %listed.rel, error = %e, "vacuum could not delete a file; retried later")
                }
            }
        }
        Ok(deleted)
    }
}

/// Rebuilds the list of active files from the log's snapshot, parsing the statistics only of
/// files not seen before.
fn rebuild_files(table: Table, log: &mut TableLog) {
    let Some(state) = &log.table.state else {
        log.known.clear();
        log.files = Arc::default();
        return;
    };
    let mut known = HashMap::with_capacity(log.known.len() + 8);
    let mut files = Vec::with_capacity(log.known.len() + 8);
    for view in state.log_data().iter() {
        let path = view.path().into_owned();
        let meta = match log.known.remove(&path) {
            Some(m) => m,
            None => {
                #[allow(deprecated)]
                let add = view.add_action();
                let level = add
                    .tags
                    .as_ref()
                    .and_then(|t| t.get(files::LEVEL_TAG))
                    .and_then(|v| v.as_deref());
                files::file_meta(table, &path, add.size, add.stats.as_deref(), level)
            }
        };
        files.push(meta.clone());
        known.insert(path, meta);
    }
    files.sort_by(|a, b| (a.min_time, &a.path).cmp(&(b.min_time, &b.path)));
    log.known = known;
    log.files = Arc::new(files);
}

#[cfg(test)]
mod tests;
