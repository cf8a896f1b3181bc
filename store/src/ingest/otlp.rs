//! OTLP metrics export requests (protobuf or JSON) decoded into table rows.
//!
//! A data point that carries a GPU id (`hw.id` or `gpu.uuid`) and a `gpu_metrics` metric name
//! becomes one cell of the `gpu_metrics` row keyed by (time, host, GPU, MIG instance); the
//! agent's `gpu.process.*` points become cells of the `gpu_processes` row keyed by (time, host,
//! GPU, pid) and its `gpu.event` points `gpu_events` rows; all other gauge and sum points become
//! `metrics` rows, and histograms and summaries become
//! Prometheus-style `metrics` rows (`_count`, `_sum`, `_bucket` with `le`, …). Rejected points
//! (non-finite, too far ahead, delta sums of cumulative GPU counters) are counted in
//! [`DecodeStats`] and reported in the OTLP partial-success answer. docs/schema.md is the
//! reference.

use std::collections::{BTreeMap, HashMap};

use super::otlp_json::Rejections;
use super::rows::{Cell, EventRow, GpuRow, MetricRow, ProcessRow, WriteBatch};
use crate::Result;
use crate::schema::{
    EVENT_METRIC, JOB_SHARES_ATTRIBUTE, LABEL_COLUMNS, POD_LABEL_PREFIX, PROCESS_MEMORY_METRIC,
    PROCESS_SM_METRIC, VALUE_COLUMNS, canonical_job_shares, job_labels_text, value_index,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, ExponentialHistogram, Histogram, NumberDataPoint, Summary,
    metric::Data, number_data_point,
};

/// Counts of what a decode kept and rejected.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DecodeStats {
    /// Data points stored (a histogram or summary point counts once, whatever rows it gives).
    pub points: u64,
    /// Data points rejected, all reasons (the sum of the counts below).
    pub rejected: u64,
    /// Rejected: a NaN or infinite value, or no value at all.
    pub non_finite: u64,
    /// Rejected: a time more than [`MAX_FUTURE`] ahead of the server clock.
    pub future: u64,
    /// Rejected: a delta-temporality sum for a `gpu_metrics` column that holds a cumulative
    /// counter (`energy_joules`, the `*_total` columns).
    pub delta_counter: u64,
    /// Rejected: a data point (or the metric around it) that could not be read, named in
    /// `problems`.
    pub unreadable: u64,
    /// The first few unreadable data points, each with its metric, index and what is wrong.
    pub problems: Vec<String>,
    /// Not stored: exponential histogram points' buckets (their count, sum, min and max are
    /// stored). Not a rejection.
    pub unsupported: u64,
}

impl DecodeStats {
    fn reject(&mut self, counter: fn(&mut Self) -> &mut u64) {
        *counter(self) += 1;
        self.rejected += 1;
    }

    /// Counts the data points a decoder could not read.
    pub fn add_unreadable(&mut self, rejections: Rejections) {
        self.unreadable += rejections.points;
        self.rejected += rejections.points;
        self.problems.extend(rejections.problems);
    }

    /// The OTLP partial-success message, or `None` when nothing was rejected.
    pub fn partial_success_message(&self) -> Option<String> {
        if self.rejected == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if self.unreadable > 0 {
            parts.push(format!(
                "{} that could not be read ({})",
                self.unreadable,
                self.problems.join("; ")
            ));
        }
        if self.non_finite > 0 {
            parts.push(format!(
                "{} with a nan, infinite or absent value",
                self.non_finite
            ));
        }
        if self.future > 0 {
            parts.push(format!(
                "{} more than 10 minutes ahead of the server clock (check the sender's clock)",
                self.future
            ));
        }
        if self.delta_counter > 0 {
            parts.push(format!(
                "{} delta-temporality sums for a cumulative gpu_metrics counter (send cumulative temporality)",
                self.delta_counter
            ));
        }
        Some(format!(
            "{} data points rejected: {}",
            self.rejected,
            parts.join(", ")
        ))
    }
}

/// How far ahead of the server clock a data point may be (10 minutes), as for remote write.
pub const MAX_FUTURE: i64 = super::remote_write::MAX_FUTURE;

/// `gpu_metrics` columns that hold cumulative counters.
/// The semantic conventions' name of ECC errors: `hw.errors`, told apart by `error.type`.
const HW_ERRORS: &str = "hw.errors";
/// `hw.gpu.memory.utilization`: used/limit from senders that follow the semantic conventions
/// (a `schema_url` on their scope or resource), stored in `metrics` like any other metric
/// (`memory_used_bytes` and `memory_total_bytes` hold it); the memory controller's busy time
/// from agents of earlier releases (no `schema_url`), which fills `memory_utilization`.
const LEGACY_MEMORY_UTILIZATION: &str = "hw.gpu.memory.utilization";

/// Where a point of metric `name` goes in `gpu_metrics`, beside the name table.
fn column_of(name: &str, semconv: bool, point: &[KeyValue]) -> Option<usize> {
    let by_column = |c: &str| VALUE_COLUMNS.iter().position(|v| v.column == c);
    match name {
        HW_ERRORS => match find_attr(point, &[], &["error.type"]).as_deref() {
            Some("corrected") => by_column("ecc_sbe_volatile_total"),
            Some("uncorrected") => by_column("ecc_dbe_volatile_total"),
            _ => None,
        },
        LEGACY_MEMORY_UTILIZATION if semconv => None,
        LEGACY_MEMORY_UTILIZATION => by_column("memory_utilization"),
        other => value_index(other),
    }
}

const COUNTER_COLUMNS: &[&str] = &[
    "energy_joules",
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "xid_errors_total",
];

/// Decodes a protobuf `ExportMetricsServiceRequest`; the data points that cannot be read are
/// left out and counted (see `otlp_proto`).
pub fn decode_protobuf(body: &[u8]) -> Result<(ExportMetricsServiceRequest, Rejections)> {
    super::otlp_proto::decode(body)
}

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest`; the data points that cannot be read are
/// left out and counted (see `otlp_json`).
pub fn decode_json(body: &[u8]) -> Result<(ExportMetricsServiceRequest, Rejections)> {
    super::otlp_json::decode(body)
}

/// The labels of a `metrics` row: resource attributes, then the point's (the point wins).
fn labels_of(resource: &[KeyValue], point: &[KeyValue]) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for kv in resource.iter().chain(point) {
        if let Some(v) = kv.value.as_ref().and_then(any_to_string) {
            labels.insert(kv.key.clone(), v);
        }
    }
    labels
}

/// Formats a bucket bound as Prometheus does (`le` label).
fn le_label(bound: f64) -> String {
    if bound == f64::INFINITY {
        "+Inf".to_string()
    } else {
        bound.to_string()
    }
}

/// Collects `metrics` rows.
struct MetricSink<'a> {
    rows: &'a mut Vec<MetricRow>,
}

impl MetricSink<'_> {
    fn push(&mut self, time: i64, name: String, value: f64, labels: &BTreeMap<String, String>) {
        self.rows.push(MetricRow {
            time,
            metric: name,
            value,
            labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }

    fn push_with(
        &mut self,
        time: i64,
        name: String,
        value: f64,
        labels: &BTreeMap<String, String>,
        extra: (&str, String),
    ) {
        let mut l = labels.clone();
        l.insert(extra.0.to_string(), extra.1);
        self.push(time, name, value, &l);
    }
}

/// Turns a request into rows. `now` (ns) stands in for a point without a timestamp and bounds
/// how far ahead a point may be.
///
/// Gauges and sums (monotonic or not, cumulative or delta) give one cell or row per point.
/// Histograms give Prometheus-style `metrics` rows: `<name>_count`, `<name>_sum`, `<name>_min`,
/// `<name>_max` and cumulative `<name>_bucket` rows labelled `le` (the last `+Inf`). Exponential
/// histograms give `_count`, `_sum`, `_min`, `_max`; summaries `_count`, `_sum` and `<name>` rows
/// labelled `quantile`.
pub fn to_write_batch(
    req: &ExportMetricsServiceRequest,
    now: i64,
) -> Result<(WriteBatch, DecodeStats)> {
    let mut d = Decoder::new(now);
    let delta = AggregationTemporality::Delta as i32;
    for rm in &req.resource_metrics {
        let res: &[KeyValue] = rm
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        for sm in &rm.scope_metrics {
            let semconv = !sm.schema_url.is_empty() || !rm.schema_url.is_empty();
            for metric in &sm.metrics {
                let name = &metric.name;
                match &metric.data {
                    Some(Data::Gauge(g)) => d.numbers(name, &g.data_points, false, semconv, res),
                    Some(Data::Sum(s)) => {
                        let is_delta = s.aggregation_temporality == delta;
                        d.numbers(name, &s.data_points, is_delta, semconv, res);
                    }
                    Some(Data::Histogram(h)) => d.histogram(name, h, res),
                    Some(Data::ExponentialHistogram(h)) => d.exponential_histogram(name, h, res),
                    Some(Data::Summary(s)) => d.summary(name, s, res),
                    None => {}
                }
            }
        }
    }
    let mut batch = WriteBatch::from_rows(&d.gpu_rows, &d.metric_rows)?;
    batch.add_processes_and_events(&d.procs.rows, &d.events)?;
    Ok((batch, d.stats))
}

/// The rows of one request as its points are decoded.
struct Decoder {
    /// The receive time (ns): stands in for a missing timestamp, bounds the future.
    now: i64,
    stats: DecodeStats,
    gpu_rows: Vec<GpuRow>,
    /// (time, host, GPU, MIG instance) → index into `gpu_rows`.
    gpu_index: HashMap<(i64, String, String, Option<String>), usize>,
    metric_rows: Vec<MetricRow>,
    procs: ProcessSink,
    events: Vec<EventRow>,
}

impl Decoder {
    fn new(now: i64) -> Self {
        Self {
            now,
            stats: DecodeStats::default(),
            gpu_rows: Vec::new(),
            gpu_index: HashMap::new(),
            metric_rows: Vec::new(),
            procs: ProcessSink::default(),
            events: Vec::new(),
        }
    }

    fn sink(&mut self) -> MetricSink<'_> {
        MetricSink {
            rows: &mut self.metric_rows,
        }
    }

    /// A point's time, or `None` (counted) when it lies too far ahead.
    #[inline]
    fn time(&mut self, time_unix_nano: u64) -> Option<i64> {
        check_time(time_unix_nano, self.now, &mut self.stats)
    }

    /// `<name>_count`, and `_sum`, `_min`, `_max` where finite.
    fn count_and_extras(
        &mut self,
        time: i64,
        name: &str,
        count: u64,
        extras: [(&str, Option<f64>); 3],
        labels: &BTreeMap<String, String>,
    ) {
        let mut sink = self.sink();
        sink.push(time, format!("{name}_count"), count as f64, labels);
        for (suffix, v) in extras {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                sink.push(time, format!("{name}_{suffix}"), v, labels);
            }
        }
    }

    /// Prometheus-style rows of a histogram: count, sum, min, max and cumulative buckets.
    fn histogram(&mut self, name: &str, h: &Histogram, res: &[KeyValue]) {
        for p in &h.data_points {
            let Some(time) = self.time(p.time_unix_nano) else {
                continue;
            };
            self.stats.points += 1;
            let labels = labels_of(res, &p.attributes);
            let extras = [("sum", p.sum), ("min", p.min), ("max", p.max)];
            self.count_and_extras(time, name, p.count, extras, &labels);
            let mut sink = self.sink();
            let mut cumulative = 0u64;
            for (i, c) in p.bucket_counts.iter().enumerate() {
                cumulative = cumulative.saturating_add(*c);
                let bound = p.explicit_bounds.get(i).copied().unwrap_or(f64::INFINITY);
                sink.push_with(
                    time,
                    format!("{name}_bucket"),
                    cumulative as f64,
                    &labels,
                    ("le", le_label(bound)),
                );
            }
        }
    }

    /// An exponential histogram's count, sum, min and max (its buckets are not kept).
    fn exponential_histogram(&mut self, name: &str, h: &ExponentialHistogram, res: &[KeyValue]) {
        for p in &h.data_points {
            let Some(time) = self.time(p.time_unix_nano) else {
                continue;
            };
            self.stats.points += 1;
            self.stats.unsupported += 1;
            let labels = labels_of(res, &p.attributes);
            let extras = [("sum", p.sum), ("min", p.min), ("max", p.max)];
            self.count_and_extras(time, name, p.count, extras, &labels);
        }
    }

    /// A summary's count, sum and quantiles.
    fn summary(&mut self, name: &str, s: &Summary, res: &[KeyValue]) {
        for p in &s.data_points {
            let Some(time) = self.time(p.time_unix_nano) else {
                continue;
            };
            self.stats.points += 1;
            let labels = labels_of(res, &p.attributes);
            let extras = [("sum", Some(p.sum)), ("min", None), ("max", None)];
            self.count_and_extras(time, name, p.count, extras, &labels);
            let mut sink = self.sink();
            for q in p.quantile_values.iter().filter(|q| q.value.is_finite()) {
                let quantile = ("quantile", q.quantile.to_string());
                sink.push_with(time, name.to_string(), q.value, &labels, quantile);
            }
        }
    }

    /// Gauge and sum points: GPU cells, process and event rows, or `metrics` rows.
    fn numbers(
        &mut self,
        name: &String,
        points: &[NumberDataPoint],
        is_delta: bool,
        semconv: bool,
        res: &[KeyValue],
    ) {
        for p in points {
            let column = column_of(name, semconv, &p.attributes);
            let counter_column =
                column.is_some_and(|c| COUNTER_COLUMNS.contains(&VALUE_COLUMNS[c].column));
            let Some(cell) = point_value(p) else {
                self.stats.reject(|s| &mut s.non_finite);
                continue;
            };
            let Some(time) = self.time(p.time_unix_nano) else {
                continue;
            };
            let gpu_id = find_attr(&p.attributes, res, LABEL_COLUMNS[1].1);
            if let Some(gpu) = &gpu_id
                && self.process_or_event(name, p, res, time, gpu, cell)
            {
                continue;
            }
            match (column, gpu_id) {
                (Some(_), Some(_)) if is_delta && counter_column => {
                    self.stats.reject(|s| &mut s.delta_counter);
                }
                (Some(col), Some(gpu)) => self.gpu_cell(p, res, time, gpu, col, cell),
                _ => {
                    self.stats.points += 1;
                    let value = match cell {
                        Cell::F(v) => v,
                        Cell::I(v) => v as f64,
                    };
                    let labels = labels_of(res, &p.attributes);
                    self.sink().push(time, name.clone(), value, &labels);
                }
            }
        }
    }

    /// A process's memory or SM point, or a GPU event, of GPU `gpu`: true when `p` was one
    /// (and went to its row).
    fn process_or_event(
        &mut self,
        name: &str,
        p: &NumberDataPoint,
        res: &[KeyValue],
        time: i64,
        gpu: &str,
        cell: Cell,
    ) -> bool {
        let host = || find_attr(&p.attributes, res, LABEL_COLUMNS[0].1).unwrap_or_default();
        if name == PROCESS_MEMORY_METRIC || name == PROCESS_SM_METRIC {
            let Some(pid) =
                find_attr(&p.attributes, res, &["process.pid"]).and_then(|v| v.parse::<i64>().ok())
            else {
                return false;
            };
            self.stats.points += 1;
            let row = self.procs.row(time, host(), gpu, pid, || {
                let attr = |n: &str| find_attr(&p.attributes, res, &[n]);
                (
                    attr("process.executable.name"),
                    attr("job.id"),
                    attr("job.user"),
                )
            });
            if name == PROCESS_MEMORY_METRIC {
                row.used_memory_bytes = Some(cell.as_i64());
            } else {
                row.sm_utilization = Some(cell.as_f64());
            }
            return true;
        }
        if name != EVENT_METRIC {
            return false;
        }
        let Some(kind) = find_attr(&p.attributes, res, &["gpu.event.kind"]) else {
            return false;
        };
        self.stats.points += 1;
        self.events.push(EventRow {
            time,
            host: host(),
            gpu_uuid: gpu.to_string(),
            kind,
            code: Some(cell.as_i64()),
            detail: find_attr(&p.attributes, res, &["gpu.event.detail"]),
        });
        true
    }

    /// A `gpu_metrics` cell: the row of (time, host, GPU, MIG instance), made on first use.
    fn gpu_cell(
        &mut self,
        p: &NumberDataPoint,
        res: &[KeyValue],
        time: i64,
        gpu: String,
        col: usize,
        cell: Cell,
    ) {
        self.stats.points += 1;
        let host = find_attr(&p.attributes, res, LABEL_COLUMNS[0].1).unwrap_or_default();
        let mig = find_attr(&p.attributes, res, &["gpu.mig.instance"]);
        let key = (time, host, gpu, mig);
        let idx = match self.gpu_index.get(&key) {
            Some(&i) => i,
            None => {
                let mut row = GpuRow::new(time);
                for (li, (column, names)) in LABEL_COLUMNS.iter().enumerate() {
                    row.labels[li] = if *column == "job_labels" {
                        pod_labels(&p.attributes, res)
                    } else {
                        find_attr(&p.attributes, res, names)
                    };
                }
                row.job_shares = find_attr(&p.attributes, res, &[JOB_SHARES_ATTRIBUTE])
                    .and_then(|t| canonical_job_shares(&t));
                self.gpu_rows.push(row);
                self.gpu_index.insert(key, self.gpu_rows.len() - 1);
                self.gpu_rows.len() - 1
            }
        };
        self.gpu_rows[idx].values[col] = Some(cell);
    }
}

/// Collects `gpu_processes` rows: the memory and SM points of one process at one time fill
/// one row.
#[derive(Default)]
struct ProcessSink {
    rows: Vec<ProcessRow>,
    index: HashMap<(i64, String, String, i64), usize>,
}

type ProcessLabels = (Option<String>, Option<String>, Option<String>);

impl ProcessSink {
    fn row(
        &mut self,
        time: i64,
        host: String,
        gpu: &str,
        pid: i64,
        labels: impl FnOnce() -> ProcessLabels,
    ) -> &mut ProcessRow {
        let key = (time, host, gpu.to_string(), pid);
        let idx = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let (process_name, job_id, job_user) = labels();
                self.rows.push(ProcessRow {
                    time,
                    host: key.1.clone(),
                    gpu_uuid: key.2.clone(),
                    pid,
                    process_name,
                    job_id,
                    job_user,
                    used_memory_bytes: None,
                    sm_utilization: None,
                });
                self.index.insert(key, self.rows.len() - 1);
                self.rows.len() - 1
            }
        };
        &mut self.rows[idx]
    }
}

/// The time of a point in ns (`now` when absent), or `None` (counted) when it is too far ahead.
fn check_time(t: u64, now: i64, stats: &mut DecodeStats) -> Option<i64> {
    if t == 0 {
        return Some(now);
    }
    match i64::try_from(t) {
        Ok(t) if t <= now.saturating_add(MAX_FUTURE) => Some(t),
        _ => {
            stats.reject(|s| &mut s.future);
            None
        }
    }
}

fn point_value(p: &NumberDataPoint) -> Option<Cell> {
    match p.value? {
        number_data_point::Value::AsDouble(v) if v.is_finite() => Some(Cell::F(v)),
        number_data_point::Value::AsDouble(_) => None,
        number_data_point::Value::AsInt(v) => Some(Cell::I(v)),
    }
}

/// The `job_labels` text of every `k8s.pod.label.<name>` attribute (the point's winning over
/// the resource's for the same name), or `None` when there is none.
fn pod_labels(point: &[KeyValue], resource: &[KeyValue]) -> Option<String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for attrs in [point, resource] {
        for kv in attrs {
            let Some(name) = kv.key.strip_prefix(POD_LABEL_PREFIX) else {
                continue;
            };
            if name.is_empty() || pairs.iter().any(|(k, _)| k == name) {
                continue;
            }
            if let Some(v) = kv.value.as_ref().and_then(any_to_string) {
                pairs.push((name.to_string(), v));
            }
        }
    }
    job_labels_text(pairs)
}

/// The first of `names` found in the point's attributes, then in the resource's.
fn find_attr(point: &[KeyValue], resource: &[KeyValue], names: &[&str]) -> Option<String> {
    for attrs in [point, resource] {
        for name in names {
            if let Some(v) = attrs
                .iter()
                .find(|kv| kv.key == *name)
                .and_then(|kv| kv.value.as_ref())
                .and_then(any_to_string)
            {
                return Some(v);
            }
        }
    }
    None
}

/// An attribute value as text: strings as they are, scalars in their usual form, composites as
/// JSON. Empty values give `None`.
fn any_to_string(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BytesValue(b) => Some(b.iter().map(|x| format!("{x:02x}")).collect()),
        any_value::Value::ArrayValue(a) => {
            let items: Vec<serde_json::Value> = a
                .values
                .iter()
                .map(|x| {
                    any_to_string(x)
                        .map(serde_json::Value::String)
                        .unwrap_or(serde_json::Value::Null)
                })
                .collect();
            Some(serde_json::Value::Array(items).to_string())
        }
        any_value::Value::KvlistValue(kv) => {
            let map: serde_json::Map<String, serde_json::Value> = kv
                .values
                .iter()
                .map(|x| {
                    let v = x.value.as_ref().and_then(any_to_string);
                    (
                        x.key.clone(),
                        v.map(serde_json::Value::String)
                            .unwrap_or(serde_json::Value::Null),
                    )
                })
                .collect();
            Some(serde_json::Value::Object(map).to_string())
        }
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

#[cfg(test)]
mod tests;
