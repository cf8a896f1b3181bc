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
    /// Label values, in [`LABEL_COLUMNS`] order (`gpu_index` as decimal text).
    pub labels: Vec<Option<String>>,
    /// Value cells, in [`VALUE_COLUMNS`] order.
    pub values: Vec<Option<Cell>>,
}

impl GpuRow {
    /// An empty row at `time`.
    pub fn new(time: i64) -> Self {
        Self {
            time,
            labels: vec![None; LABEL_COLUMNS.len()],
            values: vec![None; VALUE_COLUMNS.len()],
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
    let n = rows.len();
    let mut columns: Vec<ArrayRef> =
        Vec::with_capacity(1 + LABEL_COLUMNS.len() + VALUE_COLUMNS.len());
    let mut time = TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC");
    for r in rows {
        time.append_value(r.time);
    }
    columns.push(Arc::new(time.finish()));
    for (i, (name, _)) in LABEL_COLUMNS.iter().enumerate() {
        if *name == "gpu_index" {
            let mut b = Int32Builder::with_capacity(n);
            for r in rows {
                b.append_option(r.labels[i].as_deref().and_then(|s| s.parse::<i32>().ok()));
            }
            columns.push(Arc::new(b.finish()));
        } else {
            let mut b = StringBuilder::with_capacity(n, n * 16);
            for r in rows {
                match (&r.labels[i], *name) {
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
                for r in rows {
                    b.append_option(r.values[i].map(Cell::as_f64));
                }
                columns.push(Arc::new(b.finish()));
            }
            ValueType::Int => {
                let mut b = Int64Builder::with_capacity(n);
                for r in rows {
                    b.append_option(r.values[i].map(Cell::as_i64));
                }
                columns.push(Arc::new(b.finish()));
            }
        }
    }
    Ok(RecordBatch::try_new(Table::GpuMetrics.schema(), columns)?)
}

fn metrics_batch(rows: &[MetricRow]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut time = TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut metric = StringBuilder::with_capacity(n, n * 24);
    let mut value = Float64Builder::with_capacity(n);
    let mut labels = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new())
        .with_values_field(Arc::new(arrow::datatypes::Field::new(
            "values",
            arrow::datatypes::DataType::Utf8,
            true,
        )));
    for r in rows {
        time.append_value(r.time);
        metric.append_value(&r.metric);
        value.append_value(r.value);
        for (k, v) in &r.labels {
            labels.keys().append_value(k);
            labels.values().append_value(v);
        }
        labels.append(true)?;
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(time.finish()),
        Arc::new(metric.finish()),
        Arc::new(value.finish()),
        Arc::new(labels.finish()),
    ];
    Ok(RecordBatch::try_new(Table::Metrics.schema(), columns)?)
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
