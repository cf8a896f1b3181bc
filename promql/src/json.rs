//! Prometheus's JSON answers, written directly: times as seconds with milliseconds
//! (`1700000000.123`), values as strings in Go's shortest form (`"97"`, `"NaN"`, `"+Inf"`).

use std::fmt::Write;

use crate::aggregate::format_value;
use crate::eval::{Grid, Series, Value};
use crate::labels::Labels;
use crate::select::RawSeries;

/// A JSON string literal.
pub fn string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Prometheus's timestamp form: seconds, and `.mmm` when there are milliseconds.
pub fn time(out: &mut String, ms: i64) {
    let (sign, ms) = if ms < 0 { ("-", -ms) } else { ("", ms) };
    let _ = write!(out, "{sign}{}", ms / 1000);
    let frac = ms % 1000;
    if frac != 0 {
        let _ = write!(out, ".{frac:03}");
    }
}

fn point(out: &mut String, ms: i64, v: f64) {
    out.push('[');
    time(out, ms);
    out.push_str(",\"");
    out.push_str(&format_value(v));
    out.push_str("\"]");
}

/// A label set as a JSON object.
pub fn labels(out: &mut String, l: &Labels) {
    out.push('{');
    for (i, (k, v)) in l.pairs().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&string(k));
        out.push(':');
        out.push_str(&string(v));
    }
    out.push('}');
}

/// `{"status":"success","data":…}` around `data`.
pub fn success(data: &str) -> String {
    format!("{{\"status\":\"success\",\"data\":{data}}}")
}

/// A success with Prometheus's `warnings` (what the answer left out), when there are any.
pub fn success_warned(data: &str, warnings: &[String]) -> String {
    if warnings.is_empty() {
        return success(data);
    }
    let list: Vec<String> = warnings.iter().map(|w| string(w)).collect();
    format!(
        "{{\"status\":\"success\",\"data\":{data},\"warnings\":[{}]}}",
        list.join(",")
    )
}

/// The `data` of an instant query at `t`.
pub fn instant(v: &Value, t: i64, keep_order: bool) -> String {
    let mut out = String::with_capacity(256);
    let kind = match v {
        Value::Scalar(_) => "scalar",
        Value::Str(_) => "string",
        Value::Vector(_) => "vector",
        Value::Matrix(_) => "matrix",
    };
    out.push_str("{\"resultType\":\"");
    out.push_str(kind);
    out.push_str("\",\"result\":");
    match v {
        Value::Scalar(s) => point(&mut out, t, s.first().copied().unwrap_or(f64::NAN)),
        Value::Str(s) => {
            out.push('[');
            time(&mut out, t);
            out.push(',');
            out.push_str(&string(s));
            out.push(']');
        }
        Value::Vector(series) => instant_vector(&mut out, series, t, keep_order),
        Value::Matrix(series) => instant_matrix(&mut out, series),
    }
    out.push('}');
    out
}

/// An instant vector's `result`: the series with a value, by labels unless `keep_order`.
fn instant_vector(out: &mut String, series: &[Series], t: i64, keep_order: bool) {
    out.push('[');
    let mut list: Vec<&Series> = series.iter().filter(|s| s.vals[0].is_some()).collect();
    if !keep_order {
        list.sort_by(|a, b| a.labels.cmp(&b.labels));
    }
    for (i, s) in list.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"metric\":");
        labels(out, &s.labels);
        out.push_str(",\"value\":");
        point(out, t, s.vals[0].unwrap_or(f64::NAN));
        out.push('}');
    }
    out.push(']');
}

/// A range vector's `result` (an instant query of a range selector): every raw sample, the
/// series by labels.
fn instant_matrix(out: &mut String, series: &[RawSeries]) {
    out.push('[');
    let mut list: Vec<&RawSeries> = series.iter().collect();
    list.sort_by(|a, b| a.labels.cmp(&b.labels));
    for (i, s) in list.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"metric\":");
        labels(out, &s.labels);
        out.push_str(",\"values\":[");
        for (j, (&pt, &pv)) in s.t.iter().zip(&s.v).enumerate() {
            if j > 0 {
                out.push(',');
            }
            point(out, pt, pv);
        }
        out.push_str("]}");
    }
    out.push(']');
}

/// The `data` of a range query over `g` (a scalar becomes one series without labels).
pub fn range(v: &Value, g: Grid) -> String {
    let mut out = String::with_capacity(1024);
    out.push_str("{\"resultType\":\"matrix\",\"result\":[");
    let scalar;
    let mut list: Vec<&Series> = match v {
        Value::Vector(series) => series.iter().collect(),
        Value::Scalar(s) => {
            scalar = Series {
                labels: Labels::default(),
                vals: s.iter().map(|x| Some(*x)).collect(),
            };
            vec![&scalar]
        }
        _ => Vec::new(),
    };
    list.retain(|s| s.vals.iter().any(Option::is_some));
    list.sort_by(|a, b| a.labels.cmp(&b.labels));
    for (i, s) in list.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"metric\":");
        labels(&mut out, &s.labels);
        out.push_str(",\"values\":[");
        let mut first = true;
        for (j, x) in s.vals.iter().enumerate() {
            let Some(x) = x else { continue };
            if !first {
                out.push(',');
            }
            first = false;
            point(&mut out, g.at(j), *x);
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_values_as_prometheus_writes_them() {
        let mut s = String::new();
        time(&mut s, 1_700_000_000_080);
        assert_eq!(s, "1700000000.080");
        s.clear();
        time(&mut s, 1_700_000_000_000);
        assert_eq!(s, "1700000000");
        assert_eq!(format_value(97.0), "97");
        assert_eq!(format_value(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_value(1e21), "1000000000000000000000");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
    }

    #[test]
    fn instant_answers_of_every_type() {
        let gpu = |n: &str| Labels::new(vec![("gpu".into(), n.into())]);
        let t = 1_700_000_000_500;
        assert_eq!(
            instant(&Value::Scalar(vec![2.5]), t, false),
            r#"{"resultType":"scalar","result":[1700000000.500,"2.5"]}"#
        );
        assert_eq!(
            instant(&Value::Str("a\"b".into()), t, false),
            r#"{"resultType":"string","result":[1700000000.500,"a\"b"]}"#
        );
        let vector = Value::Vector(vec![
            Series {
                labels: gpu("1"),
                vals: vec![Some(1.0)],
            },
            Series {
                labels: gpu("2"),
                vals: vec![None],
            },
            Series {
                labels: gpu("0"),
                vals: vec![Some(f64::INFINITY)],
            },
        ]);
        assert_eq!(
            instant(&vector, t, false),
            r#"{"resultType":"vector","result":[{"metric":{"gpu":"0"},"value":[1700000000.500,"+Inf"]},{"metric":{"gpu":"1"},"value":[1700000000.500,"1"]}]}"#
        );
        assert_eq!(
            instant(&vector, t, true),
            r#"{"resultType":"vector","result":[{"metric":{"gpu":"1"},"value":[1700000000.500,"1"]},{"metric":{"gpu":"0"},"value":[1700000000.500,"+Inf"]}]}"#
        );
        let matrix = Value::Matrix(vec![RawSeries {
            labels: gpu("3"),
            t: vec![1_000, 2_000],
            v: vec![4.0, f64::NAN],
            stale: Vec::new(),
        }]);
        assert_eq!(
            instant(&matrix, t, false),
            r#"{"resultType":"matrix","result":[{"metric":{"gpu":"3"},"values":[[1,"4"],[2,"NaN"]]}]}"#
        );
    }
}
