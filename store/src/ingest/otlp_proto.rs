//! OTLP protobuf read point by point when the whole request does not decode: a data point whose
//! bytes cannot be read (a bad wire type, a string that is not UTF-8, a truncated field inside
//! it) is left out alone and reported in [`Rejections`], and the rest of the request is kept.
//!
//! A request that decodes as a whole takes the fast path (one `prost` decode). Otherwise the
//! request is walked field by field down to the data points (request → resource metrics →
//! scope metrics → metric → gauge/sum/histogram/… → data point), each data point is decoded on
//! its own, and a copy of the request without the unreadable points is decoded. Framing that
//! breaks above a data point (a length running past its message) leaves nothing to trust and
//! refuses the request whole.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{
    ExponentialHistogramDataPoint, HistogramDataPoint, NumberDataPoint, SummaryDataPoint,
};
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

use super::otlp_json::Rejections;
use crate::{Error, Result};

/// Decodes a protobuf `ExportMetricsServiceRequest`, leaving out (and counting) every data
/// point that cannot be read.
pub(super) fn decode(body: &[u8]) -> Result<(ExportMetricsServiceRequest, Rejections)> {
    let first = match ExportMetricsServiceRequest::decode(body) {
        Ok(req) => return Ok((req, Rejections::default())),
        Err(e) => e,
    };
    let mut rejections = Rejections::default();
    let clean = rewrite(body, Level::Request, "", &mut rejections)
        .ok_or_else(|| Error::malformed("otlp protobuf", &first))?;
    let req = ExportMetricsServiceRequest::decode(clean.as_slice())
        .map_err(|_| Error::malformed("otlp protobuf", &first))?;
    Ok((req, rejections))
}

/// Where in the request a message sits.
#[derive(Debug, Clone, Copy)]
enum Level {
    Request,
    ResourceMetrics,
    ScopeMetrics,
    Metric,
    /// A gauge or sum, a histogram, an exponential histogram or a summary.
    Data(PointKind),
}

#[derive(Debug, Clone, Copy)]
enum PointKind {
    Number,
    Histogram,
    Exponential,
    Summary,
}

impl PointKind {
    fn decodes(self, bytes: &[u8]) -> std::result::Result<(), prost::DecodeError> {
        match self {
            Self::Number => NumberDataPoint::decode(bytes).map(drop),
            Self::Histogram => HistogramDataPoint::decode(bytes).map(drop),
            Self::Exponential => ExponentialHistogramDataPoint::decode(bytes).map(drop),
            Self::Summary => SummaryDataPoint::decode(bytes).map(drop),
        }
    }
}

impl Level {
    /// The level of the message in field `tag` of this one, when it is walked into.
    fn child(self, tag: u32) -> Option<Level> {
        match (self, tag) {
            (Self::Request, 1) => Some(Self::ResourceMetrics),
            (Self::ResourceMetrics, 2) => Some(Self::ScopeMetrics),
            (Self::ScopeMetrics, 2) => Some(Self::Metric),
            (Self::Metric, 5 | 7) => Some(Self::Data(PointKind::Number)),
            (Self::Metric, 9) => Some(Self::Data(PointKind::Histogram)),
            (Self::Metric, 10) => Some(Self::Data(PointKind::Exponential)),
            (Self::Metric, 11) => Some(Self::Data(PointKind::Summary)),
            _ => None,
        }
    }
}

/// One field of a message: its tag, its bytes (key included) and, when length-delimited, its
/// payload.
struct Field<'a> {
    tag: u32,
    whole: &'a [u8],
    payload: Option<&'a [u8]>,
}

/// Splits a message into its fields, or `None` when its framing is broken.
fn fields(mut buf: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let start = buf;
        let (tag, wire) = decode_key(&mut buf).ok()?;
        let payload = match wire {
            WireType::Varint => {
                decode_varint(&mut buf).ok()?;
                None
            }
            WireType::SixtyFourBit => {
                buf = buf.get(8..)?;
                None
            }
            WireType::ThirtyTwoBit => {
                buf = buf.get(4..)?;
                None
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                let payload = buf.get(..len)?;
                buf = &buf[len..];
                Some(payload)
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        let used = start.len() - buf.len();
        out.push(Field {
            tag,
            whole: &start[..used],
            payload,
        });
    }
    Some(out)
}

/// A copy of the message at `level` without the data points that cannot be decoded, or `None`
/// when its framing is broken. `metric` names the enclosing metric in messages.
fn rewrite(buf: &[u8], level: Level, metric: &str, rejections: &mut Rejections) -> Option<Vec<u8>> {
    let fields = fields(buf)?;
    let name = match level {
        Level::Metric => fields
            .iter()
            .find(|f| f.tag == 1)
            .and_then(|f| f.payload)
            .map(|p| format!("metric {:?}", String::from_utf8_lossy(p)))
            .unwrap_or_else(|| "a metric without a name".to_string()),
        _ => metric.to_string(),
    };
    let mut out = Vec::with_capacity(buf.len());
    let mut index = 0usize;
    for f in fields {
        match (level, f.payload) {
            (Level::Data(kind), Some(p)) if f.tag == 1 => {
                let k = index;
                index += 1;
                match kind.decodes(p) {
                    Ok(()) => out.extend_from_slice(f.whole),
                    Err(e) => rejections.add(1, || format!("{name} point {k}: {e}")),
                }
            }
            (_, Some(p)) => match level.child(f.tag) {
                Some(child) => {
                    let inner = rewrite(p, child, &name, rejections)?;
                    encode_key(f.tag, WireType::LengthDelimited, &mut out);
                    encode_varint(inner.len() as u64, &mut out);
                    out.extend_from_slice(&inner);
                }
                None => out.extend_from_slice(f.whole),
            },
            (_, None) => out.extend_from_slice(f.whole),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Metric, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
    };

    fn point(t: u64, attr: &str) -> NumberDataPoint {
        NumberDataPoint {
            time_unix_nano: t,
            value: Some(number_data_point::Value::AsDouble(1.0)),
            attributes: vec![KeyValue {
                key: "k".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(attr.into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn request(points: Vec<NumberDataPoint>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![Metric {
                        name: "x".into(),
                        data: Some(Data::Gauge(Gauge {
                            data_points: points,
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_point_that_does_not_decode_is_rejected_alone() {
        // The middle point's attribute "QQQQ" is made not UTF-8 in the bytes.
        let req = request(vec![point(5, "a"), point(6, "QQQQ"), point(7, "c")]);
        let mut bytes = req.encode_to_vec();
        let at = bytes.windows(4).position(|w| w == b"QQQQ").expect("marker");
        bytes[at] = 0xff;
        assert!(ExportMetricsServiceRequest::decode(bytes.as_slice()).is_err());
        let (got, rej) = decode(&bytes).expect("decodes");
        assert_eq!(rej.points, 1);
        assert!(
            rej.problems[0].starts_with("metric \"x\" point 1"),
            "{rej:?}"
        );
        assert_eq!(got, request(vec![point(5, "a"), point(7, "c")]));
    }

    #[test]
    fn a_whole_request_takes_the_fast_path_and_broken_framing_is_refused() {
        let req = request(vec![point(5, "a")]);
        let bytes = req.encode_to_vec();
        assert_eq!(
            decode(&bytes).expect("decodes"),
            (req, Rejections::default())
        );
        let err = decode(&bytes[..bytes.len() - 3]).expect_err("truncated");
        assert!(err.is_client_error(), "{err}");
        assert!(decode(b"\xff\xff\xff\xff").is_err());
    }
}
