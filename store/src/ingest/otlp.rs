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
    EVENT_METRIC, LABEL_COLUMNS, PROCESS_MEMORY_METRIC, PROCESS_SM_METRIC, VALUE_COLUMNS,
    value_index,
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
                for (li, (_, names)) in LABEL_COLUMNS.iter().enumerate() {
                    row.labels[li] = find_attr(&p.attributes, res, names);
                }
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
mod tests {
    use super::*;
    use prost::Message;

    /// A request with every point readable.
    fn json(body: &[u8]) -> Result<ExportMetricsServiceRequest> {
        decode_json(body).map(|(req, rej)| {
            assert_eq!(rej, Rejections::default());
            req
        })
    }
    use crate::schema::Table;
    use arrow::array::{Array, AsArray, RecordBatch};
    use arrow::datatypes::{Float64Type, Int32Type, Int64Type};

    fn json_request() -> &'static str {
        r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"node-1"}}]},
          "scopeMetrics":[{"scope":{"name":"t"},"metrics":[
            {"name":"hw.gpu.utilization","unit":"1","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000000","asDouble":0.5,"attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"gpu.index","value":{"intValue":"0"}},
                {"key":"job.id","value":{"stringValue":"42"}}]},
              {"timeUnixNano":"1700000000000000000","asDouble":0.25,"attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-b"}},{"key":"gpu.index","value":{"intValue":"1"}}]}]}},
            {"name":"hw.gpu.memory.usage","unit":"By","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000000","asInt":"1024","attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
            {"name":"hw.energy","unit":"J","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
              {"timeUnixNano":"1700000000000000000","asDouble":12.5,"attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
            {"name":"queue.depth","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000001","asInt":"7","attributes":[{"key":"q","value":{"stringValue":"x"}}]},
              {"timeUnixNano":"1700000000000000001","asDouble":"NaN"}]}},
            {"name":"latency","histogram":{"dataPoints":[{"timeUnixNano":"1","count":"1"}]}}
          ]}]}]}"#
    }

    fn process_and_event_request() -> &'static str {
        r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"host.name","value":{"stringValue":"node-1"}}]},
          "scopeMetrics":[{"metrics":[
            {"name":"gpu.process.memory.usage","unit":"By","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000000","asInt":"2048","attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"4242"}},
                {"key":"process.executable.name","value":{"stringValue":"python3"}},
                {"key":"job.id","value":{"stringValue":"77"}},{"key":"job.user","value":{"stringValue":"alice"}}]},
              {"timeUnixNano":"1700000000000000000","asInt":"512","attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"99"}}]},
              {"timeUnixNano":"1700000000000000000","asInt":"1","attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}}]}]}},
            {"name":"gpu.process.sm.utilization","unit":"1","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000000","asDouble":0.75,"attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-a"}},{"key":"process.pid","value":{"intValue":"4242"}}]}]}},
            {"name":"gpu.event","unit":"1","gauge":{"dataPoints":[
              {"timeUnixNano":"1700000000000000005","asInt":"79","attributes":[
                {"key":"hw.id","value":{"stringValue":"GPU-b"}},{"key":"gpu.event.kind","value":{"stringValue":"xid"}},
                {"key":"gpu.event.detail","value":{"stringValue":"xid 79"}}]},
              {"timeUnixNano":"1700000000000000006","asInt":"3","attributes":[
                {"key":"gpu.event.kind","value":{"stringValue":"xid"}}]}]}}
          ]}]}]}"#
    }

    #[test]
    fn process_and_event_points_fill_their_tables() {
        let req = json(process_and_event_request().as_bytes()).expect("valid json");
        let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decodes");
        assert_eq!(stats.points, 6);
        assert_eq!(stats.rejected, 0);
        let table = |t: Table| {
            wb.batches
                .iter()
                .find(|(x, _)| *x == t)
                .map(|(_, b)| b.clone())
                .unwrap_or_else(|| panic!("no {} batch", t.name()))
        };
        let p = table(Table::GpuProcesses);
        assert_eq!(p.schema(), Table::GpuProcesses.schema());
        assert_eq!(p.num_rows(), 2, "memory and sm of pid 4242 share one row");
        let col = |b: &RecordBatch, n: &str| b.column_by_name(n).expect(n).clone();
        let pid = col(&p, "pid");
        let pid = pid.as_primitive::<Int64Type>();
        assert_eq!((pid.value(0), pid.value(1)), (4242, 99));
        assert_eq!(col(&p, "host").as_string::<i32>().value(0), "node-1");
        assert_eq!(col(&p, "gpu_uuid").as_string::<i32>().value(0), "GPU-a");
        assert_eq!(
            col(&p, "process_name").as_string::<i32>().value(0),
            "python3"
        );
        assert!(col(&p, "process_name").is_null(1));
        assert_eq!(col(&p, "job_id").as_string::<i32>().value(0), "77");
        assert_eq!(col(&p, "job_user").as_string::<i32>().value(0), "alice");
        let mem = col(&p, "used_memory_bytes");
        assert_eq!(mem.as_primitive::<Int64Type>().value(0), 2048);
        assert_eq!(mem.as_primitive::<Int64Type>().value(1), 512);
        let sm = col(&p, "sm_utilization");
        assert_eq!(sm.as_primitive::<Float64Type>().value(0), 0.75);
        assert!(sm.is_null(1), "pid 99 had no sm point");

        let e = table(Table::GpuEvents);
        assert_eq!(e.schema(), Table::GpuEvents.schema());
        assert_eq!(e.num_rows(), 1);
        assert_eq!(col(&e, "gpu_uuid").as_string::<i32>().value(0), "GPU-b");
        assert_eq!(col(&e, "kind").as_string::<i32>().value(0), "xid");
        assert_eq!(col(&e, "code").as_primitive::<Int64Type>().value(0), 79);
        assert_eq!(col(&e, "detail").as_string::<i32>().value(0), "xid 79");

        // A process point without a pid and an event without a GPU are kept in `metrics`.
        let m = table(Table::Metrics);
        let names = col(&m, "metric");
        let names: Vec<&str> = names.as_string::<i32>().iter().flatten().collect();
        assert_eq!(names, ["gpu.process.memory.usage", "gpu.event"]);
        assert!(wb.batches.iter().all(|(t, _)| *t != Table::GpuMetrics));
    }

    #[test]
    fn pivots_gpu_points_into_rows_and_keeps_the_rest() {
        let req = json(json_request().as_bytes()).expect("valid json");
        let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decodes");
        assert_eq!(
            stats,
            DecodeStats {
                points: 6,
                rejected: 1,
                non_finite: 1,
                ..DecodeStats::default()
            }
        );
        let (t, gpu) = &wb.batches[0];
        assert_eq!(*t, Table::GpuMetrics);
        assert_eq!(gpu.num_rows(), 2);
        let col = |n: &str| gpu.column_by_name(n).expect(n).clone();
        let uuid = col("gpu_uuid");
        let uuid = uuid.as_string::<i32>();
        assert_eq!(uuid.value(0), "GPU-a");
        assert_eq!(col("host").as_string::<i32>().value(1), "node-1");
        assert_eq!(col("gpu_index").as_primitive::<Int32Type>().value(1), 1);
        assert_eq!(
            col("gpu_utilization")
                .as_primitive::<Float64Type>()
                .value(0),
            0.5
        );
        assert_eq!(
            col("memory_used_bytes")
                .as_primitive::<Int64Type>()
                .value(0),
            1024
        );
        assert!(
            col("memory_used_bytes").is_null(1),
            "absent value is null, not 0"
        );
        assert_eq!(
            col("energy_joules").as_primitive::<Float64Type>().value(0),
            12.5
        );
        assert_eq!(col("job_id").as_string::<i32>().value(0), "42");
        assert!(col("job_id").is_null(1));
        assert!(col("power_watts").is_null(0));

        let (t, m) = &wb.batches[1];
        assert_eq!(*t, Table::Metrics);
        assert_eq!(m.num_rows(), 2, "queue.depth and latency_count");
        assert_eq!(m.column(2).as_primitive::<Float64Type>().value(0), 7.0);
        let rows = metric_rows(&wb);
        let keys: Vec<_> = rows[0].2.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["host.name", "q"]);
        assert_eq!(rows[1].0, "latency_count");
    }

    #[test]
    fn protobuf_round_trip_matches_json() {
        let req = json(json_request().as_bytes()).expect("valid json");
        let bytes = req.encode_to_vec();
        let (again, rej) = decode_protobuf(&bytes).expect("valid protobuf");
        assert_eq!(rej, Rejections::default());
        // Compared as bytes: the request holds a NaN, which is not equal to itself.
        assert_eq!(again.encode_to_vec(), bytes);
    }

    #[test]
    fn json_doubles_are_the_exact_values_sent() {
        // Values whose shortest decimal form the default serde_json parser reads one unit in the
        // last place off.
        for v in [
            1002.3515436649323_f64,
            1000.7359268665314,
            0.1 + 0.2,
            123456.78901234567,
        ] {
            let body = format!(
                r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{{"name":"x","gauge":{{"dataPoints":[{{"timeUnixNano":"1","asDouble":{v}}}]}}}}]}}]}}]}}"#
            );
            let req = json(body.as_bytes()).expect("json");
            let (wb, _) = to_write_batch(&req, 99).expect("decodes");
            let got = wb.batches[0]
                .1
                .column(2)
                .as_primitive::<Float64Type>()
                .value(0);
            assert_eq!(got.to_bits(), v.to_bits(), "{v} read as {got}");
        }
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = decode_protobuf(b"\xff\xff\xff\xff").expect_err("garbage");
        assert!(
            err.to_string().starts_with("malformed otlp protobuf"),
            "{err}"
        );
        let err = json(b"{\"resourceMetrics\": 3}").expect_err("bad json");
        assert!(err.is_client_error());
    }

    #[test]
    fn missing_time_uses_now() {
        let req = json(br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x","gauge":{"dataPoints":[{"asDouble":1}]}}]}]}]}"#).expect("json");
        let (wb, _) = to_write_batch(&req, 99).expect("decodes");
        let t = wb.batches[0]
            .1
            .column(0)
            .as_primitive::<arrow::datatypes::TimestampNanosecondType>()
            .value(0);
        assert_eq!(t, 99);
    }

    type Row = (String, f64, Vec<(String, String)>);

    fn metric_rows(wb: &WriteBatch) -> Vec<Row> {
        let Some((_, m)) = wb.batches.iter().find(|(t, _)| *t == Table::Metrics) else {
            return Vec::new();
        };
        let names = m.column(1).as_string::<i32>();
        let values = m.column(2).as_primitive::<Float64Type>();
        let maps = m.column(3).as_map();
        (0..m.num_rows())
            .map(|i| {
                let entry = maps.value(i);
                let k = entry.column(0).as_string::<i32>();
                let v = entry.column(1).as_string::<i32>();
                let labels = (0..k.len())
                    .map(|j| (k.value(j).to_string(), v.value(j).to_string()))
                    .collect();
                (names.value(i).to_string(), values.value(i), labels)
            })
            .collect()
    }

    #[test]
    fn histograms_and_summaries_become_prometheus_style_rows() {
        let req = json(br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
            {"name":"lat","histogram":{"aggregationTemporality":2,"dataPoints":[{"timeUnixNano":"5","count":"6","sum":12.5,"min":0.5,"max":9,
              "bucketCounts":["1","2","3"],"explicitBounds":[1,5],"attributes":[{"key":"route","value":{"stringValue":"/a"}}]}]}},
            {"name":"sz","exponentialHistogram":{"dataPoints":[{"timeUnixNano":"5","count":"4","sum":8,"scale":1,"positive":{"offset":0,"bucketCounts":["4"]}}]}},
            {"name":"rpc","summary":{"dataPoints":[{"timeUnixNano":"5","count":"10","sum":3,"quantileValues":[{"quantile":0.5,"value":0.2},{"quantile":0.99,"value":1.5}]}]}}
        ]}]}]}"#).expect("json");
        let (wb, stats) = to_write_batch(&req, 10).expect("decodes");
        assert_eq!(stats.points, 3);
        assert_eq!(stats.rejected, 0);
        let rows = metric_rows(&wb);
        let get = |name: &str, label: Option<(&str, &str)>| {
            rows.iter()
                .find(|(n, _, l)| {
                    n == name && label.is_none_or(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
                })
                .map(|(_, v, _)| *v)
        };
        assert_eq!(get("lat_count", None), Some(6.0));
        assert_eq!(get("lat_sum", None), Some(12.5));
        assert_eq!(get("lat_min", None), Some(0.5));
        assert_eq!(get("lat_max", None), Some(9.0));
        assert_eq!(get("lat_bucket", Some(("le", "1"))), Some(1.0));
        assert_eq!(
            get("lat_bucket", Some(("le", "5"))),
            Some(3.0),
            "cumulative"
        );
        assert_eq!(get("lat_bucket", Some(("le", "+Inf"))), Some(6.0));
        assert!(
            rows.iter()
                .filter(|(n, _, _)| n == "lat_bucket")
                .all(|(_, _, l)| l.iter().any(|(k, v)| k == "route" && v == "/a"))
        );
        assert_eq!(get("sz_count", None), Some(4.0));
        assert_eq!(get("sz_sum", None), Some(8.0));
        assert_eq!(get("rpc_count", None), Some(10.0));
        assert_eq!(get("rpc", Some(("quantile", "0.99"))), Some(1.5));
        assert_eq!(rows.len(), 4 + 3 + 2 + 2 + 2);
    }

    #[test]
    fn rejections_are_counted_and_explained() {
        let now: i64 = 1_700_000_000_000_000_000;
        let far = now + MAX_FUTURE + 1;
        let body = format!(
            r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[
            {{"name":"hw.energy","sum":{{"aggregationTemporality":1,"isMonotonic":true,"dataPoints":[
              {{"timeUnixNano":"{now}","asDouble":5,"attributes":[{{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}]}}]}}}},
            {{"name":"hw.power","sum":{{"aggregationTemporality":1,"dataPoints":[
              {{"timeUnixNano":"{now}","asDouble":300,"attributes":[{{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}]}}]}}}},
            {{"name":"requests","sum":{{"aggregationTemporality":1,"isMonotonic":true,"dataPoints":[
              {{"timeUnixNano":"{now}","asInt":"3"}}]}}}},
            {{"name":"g","gauge":{{"dataPoints":[{{"timeUnixNano":"{far}","asDouble":1}},{{"timeUnixNano":"{now}","asDouble":"Infinity"}},
              {{"timeUnixNano":"18446744073709551615","asDouble":1}},{{"timeUnixNano":"{now}"}}]}}}}
        ]}}]}}]}}"#
        );
        let req = json(body.as_bytes()).expect("json");
        let (wb, stats) = to_write_batch(&req, now).expect("decodes");
        assert_eq!(
            stats,
            DecodeStats {
                points: 2,
                rejected: 5,
                non_finite: 2,
                future: 2,
                delta_counter: 1,
                ..DecodeStats::default()
            }
        );
        let msg = stats.partial_success_message().expect("message");
        assert!(msg.starts_with("5 data points rejected"), "{msg}");
        assert!(msg.contains("cumulative temporality"), "{msg}");
        // A delta sum of a non-counter column (power) and of any other metric are kept.
        assert_eq!(wb.rows(), 2);
        assert_eq!(metric_rows(&wb)[0].0, "requests");
    }

    /// One GPU point of `name` with `value` and extra attributes `attrs` (JSON fragments).
    fn semconv_request(schema_url: &str, metrics: &[(&str, f64, &str)]) -> String {
        let ms: Vec<String> = metrics
            .iter()
            .map(|(name, v, attrs)| {
                format!(
                    r#"{{"name":"{name}","sum":{{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
                      {{"timeUnixNano":"1700000000000000000","asDouble":{v},"attributes":[
                        {{"key":"hw.id","value":{{"stringValue":"GPU-a"}}}}{attrs}]}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"resourceMetrics":[{{"resource":{{"attributes":[{{"key":"host.name","value":{{"stringValue":"n"}}}}]}},
              "scopeMetrics":[{{"scope":{{"name":"gpuwatch-agent"}},"schemaUrl":"{schema_url}","metrics":[{}]}}]}}]}}"#,
            ms.join(",")
        )
    }

    fn cell(b: &RecordBatch, col: &str) -> Option<f64> {
        let c = b.column_by_name(col).expect(col);
        if c.is_null(0) {
            return None;
        }
        Some(match c.data_type() {
            arrow::datatypes::DataType::Int64 => c.as_primitive::<Int64Type>().value(0) as f64,
            _ => c.as_primitive::<Float64Type>().value(0),
        })
    }

    #[test]
    fn semantic_convention_names_and_those_of_earlier_agents() {
        let error = |t: &str| format!(r#",{{"key":"error.type","value":{{"stringValue":"{t}"}}}}"#);
        // This release's agent: hw.errors by error.type, the controller under its own name,
        // hw.gpu.memory.utilization (used/limit) a metric like any other.
        let (c, u) = (error("corrected"), error("uncorrected"));
        let body = semconv_request(
            "https://opentelemetry.io/schemas/1.37.0",
            &[
                ("hw.errors", 3.0, &c),
                ("hw.errors", 1.0, &u),
                ("gpu.memory_controller.utilization", 0.25, ""),
                ("hw.gpu.memory.utilization", 0.5, ""),
            ],
        );
        let req = json(body.as_bytes()).expect("json");
        let (wb, stats) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decode");
        assert_eq!(stats.rejected, 0);
        let g = wb
            .batches
            .iter()
            .find(|(t, _)| *t == Table::GpuMetrics)
            .expect("gpu")
            .1
            .clone();
        assert_eq!(cell(&g, "ecc_sbe_volatile_total"), Some(3.0));
        assert_eq!(cell(&g, "ecc_dbe_volatile_total"), Some(1.0));
        assert_eq!(cell(&g, "memory_utilization"), Some(0.25));
        let m = wb
            .batches
            .iter()
            .find(|(t, _)| *t == Table::Metrics)
            .expect("metrics")
            .1
            .clone();
        assert_eq!(
            m.column(1).as_string::<i32>().value(0),
            "hw.gpu.memory.utilization"
        );
        // An earlier agent (no schema URL): hw.gpu.memory.utilization is the controller's busy
        // time, the ECC counters have their own names.
        let body = semconv_request(
            "",
            &[
                ("hw.gpu.memory.utilization", 0.75, ""),
                ("gpu.ecc.sbe.volatile", 4.0, ""),
                ("gpu.ecc.dbe.volatile", 2.0, ""),
            ],
        );
        let req = json(body.as_bytes()).expect("json");
        let (wb, _) = to_write_batch(&req, 1_700_000_000_000_000_000).expect("decode");
        let g = wb
            .batches
            .iter()
            .find(|(t, _)| *t == Table::GpuMetrics)
            .expect("gpu")
            .1
            .clone();
        assert_eq!(cell(&g, "memory_utilization"), Some(0.75));
        assert_eq!(cell(&g, "ecc_sbe_volatile_total"), Some(4.0));
        assert_eq!(cell(&g, "ecc_dbe_volatile_total"), Some(2.0));
        assert!(wb.batches.iter().all(|(t, _)| *t != Table::Metrics));
    }
}
