//! The `alerts` table: one row per state transition (`time`, `rule`, `state`, `labels`, `value`,
//! `fingerprint`). A server writes it through its store ([`History::in_store`]): every row goes
//! to the write-ahead log and the buffer like any ingested row, and is persisted to the `alerts`
//! Delta table, so every server on the same tables (query nodes included) answers it. Without a
//! store (tests) it is kept in memory.
//!
//! Earlier releases appended the history to `<data-dir>/alerts/history.jsonl`; that file is
//! imported into the table once (a commit carrying the `txn` [`IMPORT_APP`], so a restart never
//! imports it twice) and renamed `history.jsonl.imported`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use arrow::array::{
    ArrayRef, Float64Builder, MapBuilder, RecordBatch, StringBuilder, TimestampNanosecondBuilder,
};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use gpuwatch_store::schema::Table;
use gpuwatch_store::{ReadStore, Store, WriteBatch};
use serde::{Deserialize, Serialize};

use crate::engine::Alert;
use crate::error::{Error, Result};

/// The `txn` app id of the one-time import of an earlier release's history file.
pub const IMPORT_APP: &str = "gpuwatch-alert-history-import";

/// One transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRow {
    /// When (ns).
    pub time: i64,
    /// The rule.
    pub rule: String,
    /// `pending`, `firing` or `resolved`.
    pub state: String,
    /// The alert's labels.
    pub labels: BTreeMap<String, String>,
    /// The value at that time.
    pub value: f64,
    /// The alert's fingerprint.
    pub fingerprint: String,
}

impl HistoryRow {
    /// The row for `alert` entering its current state at `now`.
    pub fn of(alert: &Alert, now: i64) -> Self {
        Self {
            time: now,
            rule: alert.rule.clone(),
            state: alert.state.as_str().to_string(),
            labels: alert.labels.clone(),
            value: alert.value,
            fingerprint: alert.fingerprint.clone(),
        }
    }
}

/// The schema of the `alerts` table.
pub fn schema() -> SchemaRef {
    Table::Alerts.schema()
}

pub(crate) fn to_batch(rows: &[HistoryRow]) -> Result<RecordBatch> {
    let mut time = TimestampNanosecondBuilder::new().with_timezone("UTC");
    let mut rule = StringBuilder::new();
    let mut state = StringBuilder::new();
    let mut value = Float64Builder::new();
    let mut fp = StringBuilder::new();
    let mut labels = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new())
        .with_values_field(Arc::new(Field::new("values", DataType::Utf8, true)));
    for r in rows {
        time.append_value(r.time);
        rule.append_value(&r.rule);
        state.append_value(&r.state);
        if r.value.is_nan() {
            value.append_null();
        } else {
            value.append_value(r.value);
        }
        fp.append_value(&r.fingerprint);
        for (k, v) in &r.labels {
            labels.keys().append_value(k);
            labels.values().append_value(v);
        }
        labels
            .append(true)
            .map_err(|e| Error::Other(e.to_string()))?;
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(time.finish()),
        Arc::new(rule.finish()),
        Arc::new(state.finish()),
        Arc::new(labels.finish()),
        Arc::new(value.finish()),
        Arc::new(fp.finish()),
    ];
    RecordBatch::try_new(schema(), columns).map_err(|e| Error::Other(e.to_string()))
}

/// Where the history goes.
#[derive(Debug, Clone)]
enum Sink {
    Memory(Arc<RwLock<Vec<RecordBatch>>>),
    Store(Arc<Store>),
}

/// The alert history.
#[derive(Debug, Clone)]
pub struct History {
    sink: Sink,
}

impl Default for History {
    fn default() -> Self {
        Self::in_memory()
    }
}

impl History {
    /// A history kept only in memory.
    pub fn in_memory() -> Self {
        Self {
            sink: Sink::Memory(Arc::default()),
        }
    }

    /// A history written to `store`'s `alerts` table. An earlier release's history file at
    /// `legacy` (`<data-dir>/alerts/history.jsonl`) is imported once, then renamed.
    pub fn in_store(store: Arc<Store>, legacy: Option<&Path>) -> Result<Self> {
        if let Some(path) = legacy.filter(|p| p.exists()) {
            let health = store.log_health(Table::Alerts);
            if health.blocks() {
                // Imported at a later start, once the table is repaired: the file stays.
                tracing::error!(file = %path.display(), "the earlier release's alert history is not imported yet: {}",
                    health.describe(Table::Alerts));
            } else {
                import(&store, path)?;
            }
        }
        Ok(Self {
            sink: Sink::Store(store),
        })
    }

    /// Appends rows (durably, through the store's write-ahead log, when backed by a store).
    pub fn append(&self, rows: &[HistoryRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let b = to_batch(rows)?;
        match &self.sink {
            Sink::Memory(batches) => batches.write().unwrap_or_else(|p| p.into_inner()).push(b),
            Sink::Store(store) => store
                .write(&WriteBatch {
                    batches: vec![(Table::Alerts, b)],
                })
                .map_err(|e| Error::Other(format!("cannot record alert history: {e}")))?,
        }
        Ok(())
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        match &self.sink {
            Sink::Memory(batches) => batches
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(RecordBatch::num_rows)
                .sum(),
            Sink::Store(store) => {
                let snap = store.snapshot(Table::Alerts);
                snap.batches
                    .iter()
                    .map(RecordBatch::num_rows)
                    .sum::<usize>()
                    + snap
                        .files
                        .iter()
                        .map(|(_, f)| f.rows as usize)
                        .sum::<usize>()
            }
        }
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batches of an in-memory history.
    pub fn memory_batches(&self) -> Vec<RecordBatch> {
        match &self.sink {
            Sink::Memory(batches) => batches.read().unwrap_or_else(|p| p.into_inner()).clone(),
            Sink::Store(_) => Vec::new(),
        }
    }

    /// The table provider for an in-memory history (a store-backed one is the store's `alerts`
    /// table, which the query engine registers with the others).
    pub fn table(&self) -> Arc<dyn TableProvider> {
        Arc::new(HistoryTable(self.clone()))
    }
}

/// Imports an earlier release's history file into the store, once.
fn import(store: &Store, path: &Path) -> Result<()> {
    let io = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    let text = std::fs::read_to_string(path).map_err(io("cannot read alert history"))?;
    let mut rows = Vec::new();
    for line in text.lines() {
        // A torn last line (crash while appending) is skipped; anything else is kept.
        match serde_json::from_str::<HistoryRow>(line) {
            Ok(r) => rows.push(r),
            Err(e) => tracing::warn!(error = %e, "skipping an unreadable alert history line"),
        }
    }
    if !rows.is_empty() {
        let imported = store
            .import_once(Table::Alerts, &[to_batch(&rows)?], IMPORT_APP)
            .map_err(|e| {
                Error::Other(format!(
                    "cannot import the alert history {}: {e}",
                    path.display()
                ))
            })?;
        tracing::info!(rows = rows.len(), imported, file = %path.display(), "alert history of an earlier release imported into the alerts table");
    }
    let done = path.with_extension("jsonl.imported");
    std::fs::rename(path, &done).map_err(io("cannot rename the imported alert history"))
}

#[derive(Debug)]
struct HistoryTable(History);

#[async_trait]
impl TableProvider for HistoryTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let batches = self.0.memory_batches();
        let mem = MemTable::try_new(schema(), vec![batches])?;
        mem.scan(state, projection, filters, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuwatch_store::StoreConfig;
    use gpuwatch_store::clock::ManualClock;

    fn row(time: i64, state: &str) -> HistoryRow {
        HistoryRow {
            time,
            rule: "GpuIdle".into(),
            state: state.into(),
            labels: BTreeMap::from([("host".to_string(), "h1".to_string())]),
            value: 0.0,
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn an_earlier_release_history_file_is_imported_once_and_new_rows_go_through_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let legacy = dir.path().join("alerts/history.jsonl");
        std::fs::create_dir_all(legacy.parent().expect("dir")).expect("mkdir");
        let lines: Vec<String> = [row(1_000_000_000, "pending"), row(61_000_000_000, "firing")]
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        std::fs::write(&legacy, format!("{}\n{{torn", lines.join("\n"))).expect("write");
        let clock = Arc::new(ManualClock::new(100_000_000_000));
        let open = || {
            Arc::new(
                Store::open(StoreConfig::new(dir.path().join("data")), clock.clone())
                    .expect("store"),
            )
        };
        let store = open();
        let h = History::in_store(Arc::clone(&store), Some(&legacy)).expect("history");
        assert_eq!(h.len(), 2, "the two whole lines, not the torn one");
        assert!(!legacy.exists());
        assert!(legacy.with_extension("jsonl.imported").exists());
        h.append(&[row(121_000_000_000, "resolved")])
            .expect("append");
        assert_eq!(h.len(), 3);
        drop(h);
        drop(store);
        // The same file put back (a restore from a backup) is not imported again.
        std::fs::copy(legacy.with_extension("jsonl.imported"), &legacy).expect("restore");
        let store = open();
        let h = History::in_store(Arc::clone(&store), Some(&legacy)).expect("history");
        assert_eq!(h.len(), 3);
        store.persist().expect("persist");
        assert_eq!(h.len(), 3);
    }
}
