//! Rows decoded from the wire, and their conversion into Arrow batches.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Builder, Int32Builder, Int64Builder, MapBuilder, RecordBatch, StringBuilder,
    TimestampNanosecondBuilder,
};

use crate::Result;
use crate::schema::{LABEL_COLUMNS, Table, VALUE_COLUMNS, ValueType};

/// A value cell: kept in the type it arrived in until the column's type is applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cell {
    /// A double.
    F(f64),
    /// An integer.
    I(i64),
}

impl Cell {
    /// The value as a double.
    pub fn as_f64(self) -> f64 {
        match self {
            Cell::F(v) => v,
            Cell::I(v) => v as f64,
        }
    }

    /// The value as an integer (a double is rounded).
    pub fn as_i64(self) -> i64 {
        match self {
            // `as` saturates; the value was checked to be finite on decode.
            Cell::F(v) => v.round() as i64,
            Cell::I(v) => v,
        }
    }
}

/// One `gpu_metrics` row.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    /// Nanoseconds since the Unix epoch.
    pub time: i64,
    /// Label values, in [`LABEL_COLUMNS`] order (`gpu_index` and `job_time_limit_seconds` as
    /// decimal text).
    pub labels: Vec<Option<String>>,
    /// Value cells, in [`VALUE_COLUMNS`] order.
    pub values: Vec<Option<Cell>>,
    /// The `series_labels` column: the series' labels beside the columns (remote write), as a
    /// JSON object; `None` (null) for OTLP rows.
    pub series_labels: Option<String>,
    /// The `job_shares` column ([`crate::schema::JOB_SHARES_COLUMN`]); `None` unless several
    /// jobs shared the GPU.
    pub job_shares: Option<String>,
}

impl GpuRow {
    /// An empty row at `time`.
    pub fn new(time: i64) -> Self {
        Self {
            time,
            labels: vec![None; LABEL_COLUMNS.len()],
            values: vec![None; VALUE_COLUMNS.len()],
            series_labels: None,
            job_shares: None,
        }
    }
}

/// One `metrics` row.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricRow {
    /// Nanoseconds since the Unix epoch.
    pub time: i64,
    /// Metric name.
    pub metric: String,
    /// Value.
    pub value: f64,
    /// Labels, sorted by key, keys unique.
    pub labels: Vec<(String, String)>,
}

/// One `gpu_processes` row.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessRow {
    /// Nanoseconds since the Unix epoch.
    pub time: i64,
    /// `host.name`.
    pub host: String,
    /// The GPU the process runs on.
    pub gpu_uuid: String,
    /// Process id.
    pub pid: i64,
    /// `/proc/<pid>/comm`, when the agent could read it.
    pub process_name: Option<String>,
    /// The process's job.
    pub job_id: Option<String>,
    /// The job's user.
    pub job_user: Option<String>,
    /// GPU memory used by the process, bytes.
    pub used_memory_bytes: Option<i64>,
    /// Ratio 0..1 of the GPU's SM time the process used.
    pub sm_utilization: Option<f64>,
}

/// One `gpu_events` row.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Nanoseconds since the Unix epoch.
    pub time: i64,
    /// `host.name`.
    pub host: String,
    /// The GPU the event happened on.
    pub gpu_uuid: String,
    /// `xid`, `ecc_sbe`, `ecc_dbe`, …
    pub kind: String,
    /// The XID number; 0 for ECC events.
    pub code: Option<i64>,
    /// Free text, e.g. `xid 79`.
    pub detail: Option<String>,
}

/// What one write request adds to the store: at most one batch per table.
#[derive(Debug, Clone, Default)]
pub struct WriteBatch {
    /// Batches, each in its table's schema.
    pub batches: Vec<(Table, RecordBatch)>,
}

impl WriteBatch {
    /// Builds the batches of decoded rows.
    pub fn from_rows(gpu: &[GpuRow], metrics: &[MetricRow]) -> Result<Self> {
        let mut batches = Vec::new();
        if !gpu.is_empty() {
            batches.push((Table::GpuMetrics, gpu_batch(gpu)?));
        }
        if !metrics.is_empty() {
            batches.push((Table::Metrics, metrics_batch(metrics)?));
        }
        Ok(Self { batches })
    }

    /// Adds `gpu_processes` and `gpu_events` rows (nothing for empty slices).
    pub fn add_processes_and_events(
        &mut self,
        processes: &[ProcessRow],
        events: &[EventRow],
    ) -> Result<()> {
        if !processes.is_empty() {
            self.batches
                .push((Table::GpuProcesses, processes_batch(processes)?));
        }
        if !events.is_empty() {
            self.batches.push((Table::GpuEvents, events_batch(events)?));
        }
        Ok(())
    }

    /// Number of rows over all tables.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(|(_, b)| b.num_rows()).sum()
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }
}

fn gpu_batch(rows: &[GpuRow]) -> Result<RecordBatch> {
    gpu_batch_with(
        rows.len(),
        |r| rows[r].time,
        |r, c| rows[r].labels[c].as_deref(),
        |r, c| rows[r].values[c],
        |r| rows[r].series_labels.as_deref(),
        |r| rows[r].job_shares.as_deref(),
    )
}

/// (name, value) pairs as the JSON object of the `series_labels` column.
pub(crate) fn series_labels_json<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let map: serde_json::Map<String, serde_json::Value> = pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Builds a `gpu_metrics` batch of `n` rows, column by column: `time(row)`, `label(row, i)` for
/// the label columns in [`LABEL_COLUMNS`] order (`gpu_index` as decimal text), `value(row, i)`
/// for the value columns in [`VALUE_COLUMNS`] order, `series(row)` for the `labels` column and
/// `shares(row)` for `job_shares` (null when `None`).
pub(crate) fn gpu_batch_with<'s>(
    n: usize,
    time: impl Fn(usize) -> i64,
    label: impl Fn(usize, usize) -> Option<&'s str>,
    value: impl Fn(usize, usize) -> Option<Cell>,
    series: impl Fn(usize) -> Option<&'s str>,
    shares: impl Fn(usize) -> Option<&'s str>,
) -> Result<RecordBatch> {
    let mut columns: Vec<ArrayRef> =
        Vec::with_capacity(1 + LABEL_COLUMNS.len() + VALUE_COLUMNS.len());
    let mut t = TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC");
    for r in 0..n {
        t.append_value(time(r));
    }
    columns.push(Arc::new(t.finish()));
    for (i, (name, _)) in LABEL_COLUMNS.iter().enumerate() {
        if *name == "gpu_index" {
            let mut b = Int32Builder::with_capacity(n);
            for r in 0..n {
                b.append_option(label(r, i).and_then(|s| s.parse::<i32>().ok()));
            }
            columns.push(Arc::new(b.finish()));
        } else if *name == "job_time_limit_seconds" {
            // Sent as an integer attribute (text here); anything else is left null.
            let mut b = Int64Builder::with_capacity(n);
            for r in 0..n {
                b.append_option(label(r, i).and_then(|s| s.parse::<i64>().ok()));
            }
            columns.push(Arc::new(b.finish()));
        } else {
            let bytes = (0..n).map(|r| label(r, i).map_or(0, str::len)).sum();
            let mut b = StringBuilder::with_capacity(n, bytes);
            for r in 0..n {
                match (label(r, i), *name) {
                    (Some(v), _) => b.append_value(v),
                    // host and gpu_uuid are not nullable: an absent host is the empty string.
                    (None, "host" | "gpu_uuid") => b.append_value(""),
                    (None, _) => b.append_null(),
                }
            }
            columns.push(Arc::new(b.finish()));
        }
    }
    for (i, c) in VALUE_COLUMNS.iter().enumerate() {
        match c.ty {
            ValueType::Float => {
                let mut b = Float64Builder::with_capacity(n);
                for r in 0..n {
                    b.append_option(value(r, i).map(Cell::as_f64));
                }
                columns.push(Arc::new(b.finish()));
            }
            ValueType::Int => {
                let mut b = Int64Builder::with_capacity(n);
                for r in 0..n {
                    b.append_option(value(r, i).map(Cell::as_i64));
                }
                columns.push(Arc::new(b.finish()));
            }
        }
    }
    for text in [&series as &dyn Fn(usize) -> Option<&'s str>, &shares] {
        let mut b = StringBuilder::with_capacity(n, 0);
        for r in 0..n {
            b.append_option(text(r));
        }
        columns.push(Arc::new(b.finish()));
    }
    Ok(RecordBatch::try_new(Table::GpuMetrics.schema(), columns)?)
}

fn metrics_batch(rows: &[MetricRow]) -> Result<RecordBatch> {
    let mut b = MetricsBatchBuilder::with_capacity(rows.len());
    for r in rows {
        b.append(
            r.time,
            &r.metric,
            r.value,
            r.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
    }
    b.finish()
}

/// A builder of the tables' `labels` map column.
fn labels_builder() -> MapBuilder<StringBuilder, StringBuilder> {
    MapBuilder::new(None, StringBuilder::new(), StringBuilder::new()).with_values_field(Arc::new(
        arrow::datatypes::Field::new("values", arrow::datatypes::DataType::Utf8, true),
    ))
}

/// Builds a `metrics` batch row by row.
pub(crate) struct MetricsBatchBuilder {
    time: TimestampNanosecondBuilder,
    metric: StringBuilder,
    value: Float64Builder,
    labels: MapBuilder<StringBuilder, StringBuilder>,
}

impl MetricsBatchBuilder {
    /// A builder for about `n` rows.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            time: TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC"),
            metric: StringBuilder::with_capacity(n, n * 24),
            value: Float64Builder::with_capacity(n),
            labels: labels_builder(),
        }
    }

    /// Adds one row; `labels` sorted by key, keys unique.
    pub(crate) fn append<'l>(
        &mut self,
        time: i64,
        metric: &str,
        value: f64,
        labels: impl IntoIterator<Item = (&'l str, &'l str)>,
    ) -> Result<()> {
        self.time.append_value(time);
        self.metric.append_value(metric);
        self.value.append_value(value);
        for (k, v) in labels {
            self.labels.keys().append_value(k);
            self.labels.values().append_value(v);
        }
        self.labels.append(true)?;
        Ok(())
    }

    /// The batch.
    pub(crate) fn finish(mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.time.finish()),
            Arc::new(self.metric.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.labels.finish()),
        ];
        Ok(RecordBatch::try_new(Table::Metrics.schema(), columns)?)
    }
}

fn processes_batch(rows: &[ProcessRow]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut time = TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut host = StringBuilder::with_capacity(n, n * 16);
    let mut gpu = StringBuilder::with_capacity(n, n * 40);
    let mut pid = Int64Builder::with_capacity(n);
    let mut name = StringBuilder::with_capacity(n, n * 16);
    let mut job_id = StringBuilder::with_capacity(n, n * 8);
    let mut job_user = StringBuilder::with_capacity(n, n * 8);
    let mut memory = Int64Builder::with_capacity(n);
    let mut sm = Float64Builder::with_capacity(n);
    for r in rows {
        time.append_value(r.time);
        host.append_value(&r.host);
        gpu.append_value(&r.gpu_uuid);
        pid.append_value(r.pid);
        name.append_option(r.process_name.as_deref());
        job_id.append_option(r.job_id.as_deref());
        job_user.append_option(r.job_user.as_deref());
        memory.append_option(r.used_memory_bytes);
        sm.append_option(r.sm_utilization);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(time.finish()),
        Arc::new(host.finish()),
        Arc::new(gpu.finish()),
        Arc::new(pid.finish()),
        Arc::new(name.finish()),
        Arc::new(job_id.finish()),
        Arc::new(job_user.finish()),
        Arc::new(memory.finish()),
        Arc::new(sm.finish()),
    ];
    Ok(RecordBatch::try_new(Table::GpuProcesses.schema(), columns)?)
}

fn events_batch(rows: &[EventRow]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut time = TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut host = StringBuilder::with_capacity(n, n * 16);
    let mut gpu = StringBuilder::with_capacity(n, n * 40);
    let mut kind = StringBuilder::with_capacity(n, n * 4);
    let mut code = Int64Builder::with_capacity(n);
    let mut detail = StringBuilder::with_capacity(n, n * 16);
    for r in rows {
        time.append_value(r.time);
        host.append_value(&r.host);
        gpu.append_value(&r.gpu_uuid);
        kind.append_value(&r.kind);
        code.append_option(r.code);
        detail.append_option(r.detail.as_deref());
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(time.finish()),
        Arc::new(host.finish()),
        Arc::new(gpu.finish()),
        Arc::new(kind.finish()),
        Arc::new(code.finish()),
        Arc::new(detail.finish()),
    ];
    Ok(RecordBatch::try_new(Table::GpuEvents.schema(), columns)?)
}
