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
    fn as_f64(self) -> f64 {
        match self {
            Cell::F(v) => v,
            Cell::I(v) => v as f64,
        }
    }

    fn as_i64(self) -> i64 {
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
