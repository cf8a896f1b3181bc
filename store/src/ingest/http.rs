//! Request-level handling of OTLP/HTTP bodies: content type, gzip and size limits.
//!
//! Kept free of any HTTP framework so that every listener (and the tests) share it.

use std::io::Read;

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceResponse,
};
use prost::Message;

use super::otlp::{self, DecodeStats};
use super::{DecodeBudget, INFLATE_STEP, Unbounded, WriteBatch};
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
    decompress_within(content_encoding, body, max_bytes, &mut Unbounded)
}

/// [`decompress`], asking `budget` for room before each step is inflated (a plain body: for
/// the whole body, before it is decoded).
pub fn decompress_within(
    content_encoding: Option<&str>,
    body: &[u8],
    max_bytes: usize,
    budget: &mut dyn DecodeBudget,
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
            budget.inflated(body.len())?;
            Ok(body.to_vec())
        }
        "gzip" | "x-gzip" => inflate_gzip(body, max_bytes, budget),
        other => Err(Error::UnsupportedContentEncoding(other.to_string())),
    }
}

/// Inflates a gzip body [`INFLATE_STEP`] bytes at a time, each step paid for in `budget`
/// before it is inflated, never past `max_bytes`.
fn inflate_gzip(body: &[u8], max_bytes: usize, budget: &mut dyn DecodeBudget) -> Result<Vec<u8>> {
    let mut reader = flate2::read::MultiGzDecoder::new(body).take(max_bytes as u64 + 1);
    let mut out: Vec<u8> = Vec::new();
    loop {
        budget.inflated(INFLATE_STEP)?;
        let start = out.len();
        out.resize(start + INFLATE_STEP, 0);
        let mut filled = start;
        while filled < out.len() {
            match reader.read(&mut out[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::malformed("gzip body", e)),
            }
        }
        out.truncate(filled);
        if out.len() > max_bytes {
            return Err(Error::TooLarge { limit: max_bytes });
        }
        if filled < start + INFLATE_STEP {
            return Ok(out);
        }
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
    let encoding = Encoding {
        content_type,
        content_encoding,
        max_decoded_bytes,
    };
    decode_request_within(&encoding, body, now, &mut Unbounded)
}

/// The headers and limit of one OTLP/HTTP request.
#[derive(Debug, Clone, Copy)]
pub struct Encoding<'a> {
    /// `Content-Type`.
    pub content_type: Option<&'a str>,
    /// `Content-Encoding`.
    pub content_encoding: Option<&'a str>,
    /// The largest body after inflating.
    pub max_decoded_bytes: usize,
}

/// [`decode_request`] within a memory budget: room for the inflated body and what decoding
/// it builds is asked for before each step is inflated.
pub fn decode_request_within(
    encoding: &Encoding<'_>,
    body: &[u8],
    now: i64,
    budget: &mut dyn DecodeBudget,
) -> Result<(WriteBatch, DecodeStats, OtlpFormat)> {
    let format = OtlpFormat::from_content_type(encoding.content_type)?;
    let raw = decompress_within(
        encoding.content_encoding,
        body,
        encoding.max_decoded_bytes,
        budget,
    )?;
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
    drop(raw);
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

    /// A budget of `left` bytes that records what was asked for.
    struct Capped {
        left: usize,
        asked: usize,
    }

    impl DecodeBudget for Capped {
        fn inflated(&mut self, bytes: usize) -> Result<()> {
            self.asked += bytes;
            if bytes > self.left {
                return Err(Error::DecodeRefused("no room".into()));
            }
            self.left -= bytes;
            Ok(())
        }
    }

    #[test]
    fn a_gzip_bomb_stops_where_the_budget_ends() {
        // 64 MiB of zeros compress to about 64 KiB.
        let bomb = gzip(&vec![0u8; 64 << 20]);
        let mut budget = Capped {
            left: 3 * INFLATE_STEP,
            asked: 0,
        };
        let err =
            decompress_within(Some("gzip"), &bomb, 128 << 20, &mut budget).expect_err("refused");
        assert!(matches!(err, Error::DecodeRefused(_)), "{err}");
        // It asked before each step and stopped at the first refusal.
        assert_eq!(budget.asked, 4 * INFLATE_STEP);
        // Within the budget: the body's size and one step of slack are asked for.
        let small = vec![7u8; INFLATE_STEP + 10];
        let mut budget = Capped {
            left: usize::MAX,
            asked: 0,
        };
        let out =
            decompress_within(Some("gzip"), &gzip(&small), 1 << 20, &mut budget).expect("fits");
        assert_eq!(out, small);
        assert_eq!(budget.asked, 2 * INFLATE_STEP);
        let mut budget = Capped { left: 5, asked: 0 };
        assert!(decompress_within(None, b"123456", 100, &mut budget).is_err());
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
