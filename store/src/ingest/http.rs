//! Request-level handling of OTLP/HTTP bodies: content type, gzip and size limits.
//!
//! Kept free of any HTTP framework so that every listener (and the tests) share it.

use std::io::Read;

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceResponse,
};
use prost::Message;

use super::WriteBatch;
use super::otlp::{self, DecodeStats};
use crate::{Error, Result};

/// The body format of an OTLP/HTTP request, which its answer uses too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpFormat {
    /// `application/x-protobuf`.
    Protobuf,
    /// `application/json`.
    Json,
}

impl OtlpFormat {
    /// Format from a `Content-Type` header (parameters such as `charset` are ignored).
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self> {
        let raw = content_type.unwrap_or("");
        let essence = raw
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/x-protobuf" | "application/protobuf" => Ok(Self::Protobuf),
            "application/json" => Ok(Self::Json),
            _ => Err(Error::UnsupportedContentType(raw.to_string())),
        }
    }

    /// The `Content-Type` of answers in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Protobuf => "application/x-protobuf",
            Self::Json => "application/json",
        }
    }

    /// The body of a successful export answer.
    pub fn success_body(self) -> Vec<u8> {
        self.answer_body(&DecodeStats::default())
    }

    /// The body of an export answer: empty on full success, else with `partial_success` holding
    /// the rejected data points count and a message (OTLP spec, "Partial Success").
    pub fn answer_body(self, stats: &DecodeStats) -> Vec<u8> {
        let partial_success =
            stats
                .partial_success_message()
                .map(|message| ExportMetricsPartialSuccess {
                    rejected_data_points: i64::try_from(stats.rejected).unwrap_or(i64::MAX),
                    error_message: message,
                });
        match self {
            Self::Protobuf => ExportMetricsServiceResponse { partial_success }.encode_to_vec(),
            Self::Json => match partial_success {
                None => b"{}".to_vec(),
                Some(p) => serde_json::json!({
                    "partialSuccess": {
                        "rejectedDataPoints": p.rejected_data_points,
                        "errorMessage": p.error_message,
                    }
                })
                .to_string()
                .into_bytes(),
            },
        }
    }
}

/// Removes the content encoding, refusing to inflate beyond `max_bytes`.
pub fn decompress(
    content_encoding: Option<&str>,
    body: &[u8],
    max_bytes: usize,
) -> Result<Vec<u8>> {
    let encoding = content_encoding
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => {
            if body.len() > max_bytes {
                return Err(Error::TooLarge { limit: max_bytes });
            }
            Ok(body.to_vec())
        }
        "gzip" | "x-gzip" => {
            let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(max_bytes));
            let mut reader = flate2::read::MultiGzDecoder::new(body).take(max_bytes as u64 + 1);
            reader
                .read_to_end(&mut out)
                .map_err(|e| Error::malformed("gzip body", e))?;
            if out.len() > max_bytes {
                return Err(Error::TooLarge { limit: max_bytes });
            }
            Ok(out)
        }
        other => Err(Error::UnsupportedContentEncoding(other.to_string())),
    }
}

/// Decodes a whole OTLP/HTTP metrics request into rows.
pub fn decode_request(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decoded_bytes: usize,
    now: i64,
) -> Result<(WriteBatch, DecodeStats, OtlpFormat)> {
    let format = OtlpFormat::from_content_type(content_type)?;
    let raw = decompress(content_encoding, body, max_decoded_bytes)?;
    if raw.is_empty() {
        return Err(Error::malformed(
            "otlp request",
            "empty body: send an ExportMetricsServiceRequest",
        ));
    }
    let (req, unreadable) = match format {
        OtlpFormat::Protobuf => otlp::decode_protobuf(&raw)?,
        OtlpFormat::Json => otlp::decode_json(&raw)?,
    };
    let (batch, mut stats) = otlp::to_write_batch(&req, now)?;
    stats.add_unreadable(unreadable);
    Ok((batch, stats, format))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("write");
        e.finish().expect("finish")
    }

    #[test]
    fn content_types() {
        assert_eq!(
            OtlpFormat::from_content_type(Some("application/json; charset=utf-8")).ok(),
            Some(OtlpFormat::Json)
        );
        assert_eq!(
            OtlpFormat::from_content_type(Some("Application/X-Protobuf")).ok(),
            Some(OtlpFormat::Protobuf)
        );
        let err = OtlpFormat::from_content_type(Some("text/plain")).expect_err("refused");
        assert!(err.to_string().contains("text/plain"));
        assert!(OtlpFormat::from_content_type(None).is_err());
    }

    #[test]
    fn gzip_is_inflated_within_the_limit() {
        let data = vec![b'a'; 10_000];
        assert_eq!(
            decompress(Some("gzip"), &gzip(&data), 10_000).expect("fits"),
            data
        );
        let err = decompress(Some("gzip"), &gzip(&data), 9_999).expect_err("too large");
        assert!(matches!(err, Error::TooLarge { .. }));
        let err = decompress(Some("gzip"), b"not gzip", 100).expect_err("bad gzip");
        assert!(err.is_client_error());
        assert!(decompress(Some("br"), b"x", 100).is_err());
    }

    #[test]
    fn empty_body_is_refused() {
        let err =
            decode_request(Some("application/x-protobuf"), None, b"", 100, 0).expect_err("empty");
        assert!(err.to_string().contains("empty body"), "{err}");
        assert!(decode_request(Some("application/json"), None, b"", 100, 0).is_err());
    }

    #[test]
    fn partial_success_answers() {
        let full = DecodeStats::default();
        assert!(OtlpFormat::Protobuf.answer_body(&full).is_empty());
        assert_eq!(OtlpFormat::Json.answer_body(&full), b"{}");
        let partial = DecodeStats {
            points: 1,
            rejected: 2,
            non_finite: 2,
            ..DecodeStats::default()
        };
        let pb = OtlpFormat::Protobuf.answer_body(&partial);
        let resp = ExportMetricsServiceResponse::decode(pb.as_slice()).expect("protobuf answer");
        let p = resp.partial_success.expect("partial success");
        assert_eq!(p.rejected_data_points, 2);
        assert!(
            p.error_message.contains("2 with a nan"),
            "{}",
            p.error_message
        );
        let json: serde_json::Value =
            serde_json::from_slice(&OtlpFormat::Json.answer_body(&partial)).expect("json answer");
        assert_eq!(json["partialSuccess"]["rejectedDataPoints"], 2);
        assert!(json["partialSuccess"]["errorMessage"].as_str().is_some());
        // The JSON answer is valid OTLP/JSON: the SDK types parse it.
        let again: ExportMetricsServiceResponse =
            serde_json::from_slice(&OtlpFormat::Json.answer_body(&partial)).expect("otlp json");
        assert_eq!(
            again.partial_success.map(|p| p.rejected_data_points),
            Some(2)
        );
    }
}
