//! OTLP metrics export requests (protobuf or JSON) decoded into table rows.
//!
//! A data point that carries a GPU id (`hw.id` or `gpu.uuid`) and a `gpu_metrics` metric name
//! becomes one cell of the `gpu_metrics` row keyed by (time, host, GPU, MIG instance); all other
//! gauge and sum points become `metrics` rows. docs/schema.md is the reference.

use std::collections::{BTreeMap, HashMap};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, metric::Data, number_data_point};
use prost::Message;

use super::rows::{Cell, GpuRow, MetricRow, WriteBatch};
use crate::schema::{LABEL_COLUMNS, value_index};
use crate::{Error, Result};

/// Counts of what a decode kept and skipped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStats {
    /// Gauge and sum points stored.
    pub points: u64,
    /// Points skipped: non-finite or absent values.
    pub rejected: u64,
    /// Histogram, exponential histogram and summary points (not stored yet).
    pub unsupported: u64,
}

/// Decodes a protobuf `ExportMetricsServiceRequest`.
pub fn decode_protobuf(body: &[u8]) -> Result<ExportMetricsServiceRequest> {
    ExportMetricsServiceRequest::decode(body).map_err(|e| Error::malformed("otlp protobuf", e))
}

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest`.
pub fn decode_json(body: &[u8]) -> Result<ExportMetricsServiceRequest> {
    serde_json::from_slice(body).map_err(|e| Error::malformed("otlp json", e))
}

/// Turns a request into rows. `now` (ns) stands in for a point without a timestamp.
pub fn to_write_batch(
    req: &ExportMetricsServiceRequest,
    now: i64,
) -> Result<(WriteBatch, DecodeStats)> {
    let mut stats = DecodeStats::default();
    let mut gpu_rows: Vec<GpuRow> = Vec::new();
    let mut gpu_index: HashMap<(i64, String, String, Option<String>), usize> = HashMap::new();
    let mut metric_rows: Vec<MetricRow> = Vec::new();

    for rm in &req.resource_metrics {
        let resource_attrs: &[KeyValue] = rm
            .resource
            .as_ref()
            .map(|r| r.attributes.as_slice())
            .unwrap_or(&[]);
        for sm in &rm.scope_metrics {
            for metric in &sm.metrics {
                let points: &[NumberDataPoint] = match &metric.data {
                    Some(Data::Gauge(g)) => &g.data_points,
                    Some(Data::Sum(s)) => &s.data_points,
                    Some(Data::Histogram(h)) => {
                        stats.unsupported += h.data_points.len() as u64;
                        continue;
                    }
                    Some(Data::ExponentialHistogram(h)) => {
                        stats.unsupported += h.data_points.len() as u64;
                        continue;
                    }
                    Some(Data::Summary(s)) => {
                        stats.unsupported += s.data_points.len() as u64;
                        continue;
                    }
                    None => continue,
                };
                let column = value_index(&metric.name);
                for p in points {
                    let Some(cell) = point_value(p) else {
                        stats.rejected += 1;
                        continue;
                    };
                    let time = point_time(p.time_unix_nano, now)?;
                    stats.points += 1;
                    let gpu_id = find_attr(&p.attributes, resource_attrs, LABEL_COLUMNS[1].1);
                    match (column, gpu_id) {
                        (Some(col), Some(gpu)) => {
                            let host = find_attr(&p.attributes, resource_attrs, LABEL_COLUMNS[0].1)
                                .unwrap_or_default();
                            let mig =
                                find_attr(&p.attributes, resource_attrs, &["gpu.mig.instance"]);
                            let key = (time, host, gpu, mig);
                            let idx = match gpu_index.get(&key) {
                                Some(&i) => i,
                                None => {
                                    let mut row = GpuRow::new(time);
                                    for (li, (_, names)) in LABEL_COLUMNS.iter().enumerate() {
                                        row.labels[li] =
                                            find_attr(&p.attributes, resource_attrs, names);
                                    }
                                    gpu_rows.push(row);
                                    gpu_index.insert(key, gpu_rows.len() - 1);
                                    gpu_rows.len() - 1
                                }
                            };
                            gpu_rows[idx].values[col] = Some(cell);
                        }
                        _ => {
                            let mut labels: BTreeMap<String, String> = BTreeMap::new();
                            for kv in resource_attrs.iter().chain(&p.attributes) {
                                if let Some(v) = kv.value.as_ref().and_then(any_to_string) {
                                    labels.insert(kv.key.clone(), v);
                                }
                            }
                            let value = match cell {
                                Cell::F(v) => v,
                                Cell::I(v) => v as f64,
                            };
                            metric_rows.push(MetricRow {
                                time,
                                metric: metric.name.clone(),
                                value,
                                labels: labels.into_iter().collect(),
                            });
                        }
                    }
                }
            }
        }
    }
    Ok((WriteBatch::from_rows(&gpu_rows, &metric_rows)?, stats))
}

fn point_time(t: u64, now: i64) -> Result<i64> {
    if t == 0 {
        return Ok(now);
    }
    i64::try_from(t).map_err(|_| {
        Error::malformed(
            "otlp data point",
            format!("time_unix_nano {t} is past the year 2262"),
        )
    })
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
    use crate::schema::Table;
    use arrow::array::{Array, AsArray};
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

    #[test]
    fn pivots_gpu_points_into_rows_and_keeps_the_rest() {
        let req = decode_json(json_request().as_bytes()).expect("valid json");
        let (wb, stats) = to_write_batch(&req, 0).expect("decodes");
        assert_eq!(
            stats,
            DecodeStats {
                points: 5,
                rejected: 1,
                unsupported: 1
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
        assert_eq!(m.num_rows(), 1);
        assert_eq!(m.column(2).as_primitive::<Float64Type>().value(0), 7.0);
        let labels = m.column(3).as_map();
        let keys = labels.keys().as_string::<i32>();
        let got: Vec<_> = (0..keys.len()).map(|i| keys.value(i)).collect();
        assert_eq!(got, vec!["host.name", "q"]);
    }

    #[test]
    fn protobuf_round_trip_matches_json() {
        let req = decode_json(json_request().as_bytes()).expect("valid json");
        let bytes = req.encode_to_vec();
        let again = decode_protobuf(&bytes).expect("valid protobuf");
        assert_eq!(req, again);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = decode_protobuf(b"\xff\xff\xff\xff").expect_err("garbage");
        assert!(
            err.to_string().starts_with("malformed otlp protobuf"),
            "{err}"
        );
        let err = decode_json(b"{\"resourceMetrics\": 3}").expect_err("bad json");
        assert!(err.is_client_error());
    }

    #[test]
    fn missing_time_uses_now() {
        let req = decode_json(br#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"x","gauge":{"dataPoints":[{"asDouble":1}]}}]}]}]}"#).expect("json");
        let (wb, _) = to_write_batch(&req, 99).expect("decodes");
        let t = wb.batches[0]
            .1
            .column(0)
            .as_primitive::<arrow::datatypes::TimestampNanosecondType>()
            .value(0);
        assert_eq!(t, 99);
    }
}
