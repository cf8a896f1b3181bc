//! The `alerts` table: one row per state transition (`time`, `rule`, `state`, `labels`, `value`,
//! `fingerprint`), kept in memory for queries and appended to a JSON-lines file (fsynced) in the
//! data directory, which is read back at start. It is registered in the query engine's DataFusion
//! context beside the store's tables.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use arrow::array::{
    ArrayRef, Float64Builder, MapBuilder, RecordBatch, StringBuilder, TimestampNanosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use serde::{Deserialize, Serialize};

use crate::engine::Alert;
use crate::error::{Error, Result};

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
    let entries = Field::new(
        "entries",
        DataType::Struct(
            vec![
                Field::new("keys", DataType::Utf8, false),
                Field::new("values", DataType::Utf8, true),
            ]
            .into(),
        ),
        false,
    );
    Arc::new(Schema::new(vec![
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("rule", DataType::Utf8, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("labels", DataType::Map(Arc::new(entries), false), true),
        Field::new("value", DataType::Float64, true),
        Field::new("fingerprint", DataType::Utf8, false),
    ]))
}

fn to_batch(rows: &[HistoryRow]) -> Result<RecordBatch> {
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

/// The history file's path and, once opened, its handle.
type HistoryFile = (PathBuf, Option<std::fs::File>);

/// The alert history: in memory for queries, on disk for restarts.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub(crate) batches: Arc<RwLock<Vec<RecordBatch>>>,
    file: Option<Arc<Mutex<HistoryFile>>>,
}

impl History {
    /// A history kept only in memory.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A history appended to `path` (created if missing), with the rows already there loaded.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |what: &'static str| {
            let path = path.to_path_buf();
            move |source| Error::Io { what, path, source }
        };
        let mut rows = Vec::new();
        if path.exists() {
            let text = std::fs::read_to_string(path).map_err(io("cannot read alert history"))?;
            for line in text.lines() {
                // A torn last line (crash while appending) is skipped; anything else is kept.
                match serde_json::from_str::<HistoryRow>(line) {
                    Ok(r) => rows.push(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "skipping an unreadable alert history line")
                    }
                }
            }
        }
        let h = Self {
            batches: Arc::default(),
            file: Some(Arc::new(Mutex::new((path.to_path_buf(), None)))),
        };
        if !rows.is_empty() {
            let b = to_batch(&rows)?;
            h.batches.write().unwrap_or_else(|p| p.into_inner()).push(b);
        }
        Ok(h)
    }

    /// Appends rows (durably when backed by a file).
    pub fn append(&self, rows: &[HistoryRow]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if let Some(file) = &self.file {
            let mut g = file.lock().unwrap_or_else(|p| p.into_inner());
            let path = g.0.clone();
            let io = |what: &'static str| {
                let path = path.clone();
                move |source| Error::Io { what, path, source }
            };
            if g.1.is_none() {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io("cannot create directory for"))?;
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(io("cannot open alert history"))?;
                g.1 = Some(f);
            }
            let mut text = String::new();
            for r in rows {
                let line = serde_json::to_string(r)
                    .map_err(|e| Error::Other(format!("cannot encode alert history: {e}")))?;
                text.push_str(&line);
                text.push('\n');
            }
            if let Some(f) = g.1.as_mut() {
                f.write_all(text.as_bytes())
                    .map_err(io("cannot append to alert history"))?;
                f.sync_data().map_err(io("cannot sync alert history"))?;
            }
        }
        let b = to_batch(rows)?;
        self.batches
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(b);
        Ok(())
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.batches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(RecordBatch::num_rows)
            .sum()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The table provider for the query engine.
    pub fn table(&self) -> Arc<dyn TableProvider> {
        Arc::new(HistoryTable(self.clone()))
    }
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
        let batches = self
            .0
            .batches
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mem = MemTable::try_new(schema(), vec![batches])?;
        mem.scan(state, projection, filters, limit).await
    }
}
