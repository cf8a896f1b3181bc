//! OTLP/JSON read point by point: a data point that cannot be read (a time with a trailing
//! space, `"-5"` as a time, an `asInt` of `"notanumber"`, a value of the wrong type) is left out
//! alone and reported, never taking the other points of its metric with it.
//!
//! The body is parsed into a JSON value tree first; each level (resource metrics, scope
//! metrics, metric, data point) is then read into its OTLP type on its own. A level that cannot
//! be read rejects the data points under it, counted and named in [`Rejections`]; only a body
//! that is not JSON, or whose top level is not an export request, is refused whole.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, SummaryDataPoint, metric::Data, number_data_point,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::{Error, Result};

/// How many problems [`Rejections`] names (the count covers them all).
pub const MAX_NAMED_PROBLEMS: usize = 3;

/// Data points left out because they could not be read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rejections {
    /// How many data points were left out.
    pub points: u64,
    /// The first [`MAX_NAMED_PROBLEMS`] problems, each naming its metric and point.
    pub problems: Vec<String>,
}

impl Rejections {
    /// Counts `points` rejected data points for `problem`.
    pub fn add(&mut self, points: u64, problem: impl FnOnce() -> String) {
        if points == 0 {
            return;
        }
        self.points += points;
        if self.problems.len() < MAX_NAMED_PROBLEMS {
            self.problems.push(problem());
        }
    }
}

/// The keys of a metric's data, with how each names its kind.
const DATA_KEYS: [&str; 5] = [
    "gauge",
    "sum",
    "histogram",
    "exponentialHistogram",
    "summary",
];

/// Decodes an OTLP/JSON `ExportMetricsServiceRequest`, leaving out (and counting) every data
/// point that cannot be read.
pub fn decode(body: &[u8]) -> Result<(ExportMetricsServiceRequest, Rejections)> {
    let root: Value = serde_json::from_slice(body).map_err(|e| Error::malformed("otlp json", e))?;
    let Value::Object(mut root) = root else {
        return Err(Error::malformed(
            "otlp json",
            "the body is not a JSON object: send an ExportMetricsServiceRequest",
        ));
    };
    let mut rejections = Rejections::default();
    let mut req = ExportMetricsServiceRequest::default();
    let items = match take(&mut root, "resourceMetrics", "resource_metrics") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(Error::malformed(
                "otlp json",
                "resourceMetrics is not an array: send an ExportMetricsServiceRequest",
            ));
        }
    };
    for (i, rm) in items.into_iter().enumerate() {
        if let Some(rm) = resource_metrics(rm, i, &mut rejections) {
            req.resource_metrics.push(rm);
        }
    }
    Ok((req, rejections))
}

/// Removes and returns `key` (or its snake_case spelling) from an object.
fn take(obj: &mut Map<String, Value>, key: &str, snake: &str) -> Option<Value> {
    obj.remove(key).or_else(|| obj.remove(snake))
}

/// Takes the array under `key` out of `v` (an object), leaving `v` without it. `Err` holds
/// the value found when it is neither an array nor absent.
fn take_array(v: &mut Value, key: &str, snake: &str) -> std::result::Result<Vec<Value>, Value> {
    let Value::Object(obj) = v else {
        return Ok(Vec::new());
    };
    match take(obj, key, snake) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(other),
    }
}

/// How many data points a JSON subtree holds (what is lost when it cannot be read).
fn count_points(v: &Value) -> u64 {
    match v {
        Value::Object(obj) => obj
            .iter()
            .map(|(k, v)| match (k.as_str(), v) {
                ("dataPoints" | "data_points", Value::Array(a)) => a.len() as u64,
                _ => count_points(v),
            })
            .sum(),
        Value::Array(a) => a.iter().map(count_points).sum(),
        _ => 0,
    }
}

/// Reads `v` as a `T`, or counts the points under it as rejected for `what`.
fn read<T: DeserializeOwned>(
    v: Value,
    points: u64,
    what: impl FnOnce() -> String,
    rejections: &mut Rejections,
) -> Option<T> {
    match serde_json::from_value(v) {
        Ok(t) => Some(t),
        Err(e) => {
            rejections.add(points, || format!("{}: {e}", what()));
            None
        }
    }
}

fn resource_metrics(
    mut v: Value,
    i: usize,
    rejections: &mut Rejections,
) -> Option<ResourceMetrics> {
    let where_ = || format!("resourceMetrics[{i}]");
    let scopes = match take_array(&mut v, "scopeMetrics", "scope_metrics") {
        Ok(s) => s,
        Err(bad) => {
            rejections.add(count_points(&bad), || {
                format!("{}: scopeMetrics is not an array", where_())
            });
            Vec::new()
        }
    };
    let points: u64 = scopes.iter().map(count_points).sum();
    let mut rm = read::<ResourceMetrics>(v, points, where_, rejections)?;
    for (j, sm) in scopes.into_iter().enumerate() {
        if let Some(sm) = scope_metrics(sm, i, j, rejections) {
            rm.scope_metrics.push(sm);
        }
    }
    Some(rm)
}

fn scope_metrics(
    mut v: Value,
    i: usize,
    j: usize,
    rejections: &mut Rejections,
) -> Option<ScopeMetrics> {
    let where_ = || format!("resourceMetrics[{i}].scopeMetrics[{j}]");
    let metrics = match take_array(&mut v, "metrics", "metrics") {
        Ok(m) => m,
        Err(bad) => {
            rejections.add(count_points(&bad), || {
                format!("{}: metrics is not an array", where_())
            });
            Vec::new()
        }
    };
    let points: u64 = metrics.iter().map(count_points).sum();
    let mut sm = read::<ScopeMetrics>(v, points, where_, rejections)?;
    for m in metrics {
        if let Some(m) = metric(m, rejections) {
            sm.metrics.push(m);
        }
    }
    Some(sm)
}

/// The name of a metric for messages, as sent.
fn name_of(v: &Value) -> String {
    match v.get("name") {
        Some(Value::String(s)) => format!("metric {s:?}"),
        _ => "a metric without a name".to_string(),
    }
}

/// Reads one metric: its data points one by one, then the rest of it.
fn metric(mut v: Value, rejections: &mut Rejections) -> Option<Metric> {
    let name = name_of(&v);
    let key = DATA_KEYS.iter().copied().find(|k| v.get(*k).is_some());
    let points = match key.and_then(|k| v.get_mut(k)) {
        Some(data) => match take_array(data, "dataPoints", "data_points") {
            Ok(p) => p,
            Err(bad) => {
                rejections.add(1, || format!("{name}: dataPoints is not an array: {bad}"));
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let mut m = read::<Metric>(v.clone(), points.len() as u64, || name.clone(), rejections)?;
    match (key, &mut m.data) {
        (None, _) => {}
        (Some(k), None) => {
            // The data's own fields (temporality, monotonicity) could not be read: say why.
            let detail = v
                .get(k)
                .map(|d| data_error(k, d.clone()))
                .unwrap_or_default();
            rejections.add(points.len() as u64, || format!("{name}: {k}: {detail}"));
            return Some(m);
        }
        (Some(_), Some(data)) => push_points(data, points, &name, rejections),
    }
    Some(m)
}

/// Why a metric's data (without its points) cannot be read.
fn data_error(key: &str, v: Value) -> String {
    use opentelemetry_proto::tonic::metrics::v1::{
        ExponentialHistogram, Gauge, Histogram, Sum, Summary,
    };
    let err = match key {
        "gauge" => serde_json::from_value::<Gauge>(v).err(),
        "sum" => serde_json::from_value::<Sum>(v).err(),
        "histogram" => serde_json::from_value::<Histogram>(v).err(),
        "exponentialHistogram" => serde_json::from_value::<ExponentialHistogram>(v).err(),
        _ => serde_json::from_value::<Summary>(v).err(),
    };
    err.map(|e| e.to_string())
        .unwrap_or_else(|| "could not be read".to_string())
}

/// Reads each point into `data`, rejecting those that cannot be read.
fn push_points(data: &mut Data, points: Vec<Value>, name: &str, rejections: &mut Rejections) {
    for (k, p) in points.into_iter().enumerate() {
        let what = || format!("{name} point {k}");
        match data {
            Data::Gauge(g) => number_point(p, what, rejections, &mut g.data_points),
            Data::Sum(s) => number_point(p, what, rejections, &mut s.data_points),
            Data::Histogram(h) => {
                h.data_points
                    .extend(read::<HistogramDataPoint>(p, 1, what, rejections));
            }
            Data::ExponentialHistogram(h) => {
                h.data_points.extend(read::<ExponentialHistogramDataPoint>(
                    p, 1, what, rejections,
                ));
            }
            Data::Summary(s) => {
                s.data_points
                    .extend(read::<SummaryDataPoint>(p, 1, what, rejections));
            }
        }
    }
}

/// Reads a gauge or sum point. A value that was sent but could not be read (`"asInt":
/// "notanumber"`, a string or boolean `asDouble`) rejects the point here; the OTLP types would
/// read it as a point without a value.
fn number_point(
    p: Value,
    what: impl Fn() -> String,
    rejections: &mut Rejections,
    out: &mut Vec<NumberDataPoint>,
) {
    let sent = ["asDouble", "as_double", "asInt", "as_int"]
        .into_iter()
        .find_map(|k| p.get(k).map(|v| (k, v.clone())));
    let Some(mut point) = read::<NumberDataPoint>(p, 1, &what, rejections) else {
        return;
    };
    match (sent, point.value) {
        (Some((key, v)), None) => match double_from_string(key, &v) {
            Some(d) => {
                point.value = Some(number_data_point::Value::AsDouble(d));
                out.push(point);
            }
            None => rejections.add(1, || format!("{}: {key} {v} is not a number", what())),
        },
        _ => out.push(point),
    }
}

/// A double sent as a string, as proto3 JSON allows (`"NaN"`, `"Infinity"`, `"-Infinity"`,
/// `"1.5"`); the later checks reject the non-finite ones with their own reason.
fn double_from_string(key: &str, v: &Value) -> Option<f64> {
    match (key, v) {
        ("asDouble" | "as_double", Value::String(s)) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            s if s
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
            {
                s.parse().ok()
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge(points: &str) -> String {
        format!(
            r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{{"name":"x","gauge":{{"dataPoints":[{points}]}}}}]}}]}}]}}"#
        )
    }

    fn kept_times(req: &ExportMetricsServiceRequest) -> Vec<u64> {
        let m = &req.resource_metrics[0].scope_metrics[0].metrics[0];
        match &m.data {
            Some(Data::Gauge(g)) => g.data_points.iter().map(|p| p.time_unix_nano).collect(),
            Some(Data::Sum(s)) => s.data_points.iter().map(|p| p.time_unix_nano).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn a_bad_point_is_rejected_alone() {
        for bad in [
            r#"{"timeUnixNano":"5 ","asDouble":1}"#,
            r#"{"timeUnixNano":"-5","asDouble":1}"#,
            r#"{"timeUnixNano":"5","asInt":"notanumber"}"#,
            r#"{"timeUnixNano":"5","asDouble":"x"}"#,
            r#"{"timeUnixNano":"5","asDouble":"1.5 "}"#,
            r#"{"timeUnixNano":"5","asDouble":true}"#,
            r#"{"timeUnixNano":"5","asDouble":1,"attributes":3}"#,
            r#"7"#,
        ] {
            let body = gauge(&format!(
                r#"{{"timeUnixNano":"6","asDouble":2}},{bad},{{"timeUnixNano":"7","asInt":"3"}}"#
            ));
            let (req, rej) = decode(body.as_bytes()).expect("decodes");
            assert_eq!(kept_times(&req), [6, 7], "{bad}");
            assert_eq!(rej.points, 1, "{bad}");
            assert!(
                rej.problems[0].starts_with("metric \"x\" point 1"),
                "{rej:?}"
            );
        }
    }

    #[test]
    fn a_metric_whose_own_fields_are_bad_rejects_its_points_only() {
        let body = r#"{"resourceMetrics":[{"scopeMetrics":[{"metrics":[
            {"name":"m","sum":{"isMonotonic":"true","dataPoints":[{"timeUnixNano":"6","asDouble":2},{"asDouble":3}]}},
            {"name":"ok","sum":{"isMonotonic":true,"aggregationTemporality":2,"dataPoints":[{"timeUnixNano":"6","asDouble":2}]}}
        ]}]}]}"#;
        let (req, rej) = decode(body.as_bytes()).expect("decodes");
        assert_eq!(rej.points, 2);
        assert!(rej.problems[0].contains("metric \"m\": sum"), "{rej:?}");
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics.len(), 2);
        match &metrics[1].data {
            Some(Data::Sum(s)) => assert_eq!(s.data_points.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_the_first_problems_are_named_but_all_are_counted() {
        let bad = r#"{"timeUnixNano":"x","asDouble":1}"#;
        let body = gauge(&[bad; 5].join(","));
        let (_, rej) = decode(body.as_bytes()).expect("decodes");
        assert_eq!(rej.points, 5);
        assert_eq!(rej.problems.len(), MAX_NAMED_PROBLEMS);
    }

    #[test]
    fn a_bad_scope_rejects_its_points_and_keeps_the_others() {
        let body = r#"{"resourceMetrics":[{"scopeMetrics":[
            {"scope":{"name":5},"metrics":[{"name":"a","gauge":{"dataPoints":[{"asDouble":1},{"asDouble":2}]}}]},
            {"metrics":[{"name":"b","gauge":{"dataPoints":[{"asDouble":1}]}}]}]}]}"#;
        let (req, rej) = decode(body.as_bytes()).expect("decodes");
        assert_eq!(rej.points, 2, "{rej:?}");
        assert_eq!(req.resource_metrics[0].scope_metrics.len(), 1);
    }

    #[test]
    fn not_an_export_request_is_refused_whole() {
        for body in ["[]", "{\"resourceMetrics\": 3}", "{", "null"] {
            let err = decode(body.as_bytes()).expect_err(body);
            assert!(err.is_client_error(), "{body}: {err}");
        }
        let (req, rej) = decode(b"{}").expect("empty request");
        assert!(req.resource_metrics.is_empty());
        assert_eq!(rej.points, 0);
    }
}
