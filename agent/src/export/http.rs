//! OTLP/HTTP: protobuf, gzip, POST to `<endpoint>/v1/metrics`. The retry spool, batching and
//! backoff around it live in [`crate::export::exporter`].
//!
//! With `--auth-token-file` every request carries `Authorization: Bearer <token>`.
//!
//! A connect error, a timeout, 429 or 5xx may pass: the exporter keeps the request. 401 and 403
//! refuse the token, not the data: the exporter keeps the request too. Another 4xx will never
//! succeed: the request is logged with the response body and dropped. A 2xx answer's body is
//! read as an `ExportMetricsServiceResponse` for its partial success.

use std::time::Duration;

use flate2::{Compress, Compression, FlushCompress, Status};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;

use crate::error::{Error, Result};
use crate::export::exporter::Outcome;
use crate::export::options::{Compression as BodyCompression, ExportOptions, read_pem};
use crate::export::token::Bearer;

/// Per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a rejection's response body is logged.
const MAX_BODY_IN_LOG: usize = 512;

/// The URL to POST metrics to: `<endpoint>/v1/metrics`, or the endpoint itself when it already
/// ends with `/v1/metrics`.
pub fn metrics_url(endpoint: &str) -> Result<String> {
    let trimmed = endpoint.trim();
    let bad = |reason: &str| Error::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(|| bad("it must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("it has no host"));
    }
    if trimmed.contains(['?', '#']) {
        return Err(bad("it must not carry a query or fragment"));
    }
    let base = trimmed.trim_end_matches('/');
    if base.ends_with("/v1/metrics") {
        Ok(base.to_string())
    } else {
        Ok(format!("{base}/v1/metrics"))
    }
}

/// Protobuf-encode and gzip a request: the body the exporter POSTs.
pub fn encode_body(req: &ExportMetricsServiceRequest) -> Result<Vec<u8>> {
    Gzip::new().encode(&req.encode_to_vec())
}

/// A gzip encoder that keeps its compression state between requests.
///
/// A fresh deflate state is a few hundred KiB that the allocator maps and the kernel faults in
/// at every request: about 0.3 ms of CPU for a 1 KiB answer, more than encoding and compressing
/// the request itself (`cargo run --release -p gpuwatch-agent --example gzip_cost`). Reusing one
/// state makes a request's body cost what its bytes cost. Level 1: telemetry requests compress
/// about 7:1 at level 1 and barely better above it.
pub struct Gzip {
    deflate: Compress,
}

impl std::fmt::Debug for Gzip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gzip").finish_non_exhaustive()
    }
}

impl Default for Gzip {
    fn default() -> Self {
        Self::new()
    }
}

impl Gzip {
    /// A new encoder.
    pub fn new() -> Self {
        Gzip {
            deflate: Compress::new(Compression::fast(), false),
        }
    }

    /// `raw` as one gzip member (RFC 1952): header, raw deflate, CRC-32 and length.
    pub fn encode(&mut self, raw: &[u8]) -> Result<Vec<u8>> {
        // Header: magic, deflate, no flags, no mtime, fastest, unknown OS.
        let mut out = Vec::with_capacity(raw.len() / 4 + 64);
        out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255]);
        self.deflate.reset();
        let mut input = raw;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let before_in = self.deflate.total_in();
            let status = self
                .deflate
                .compress_vec(input, &mut out, FlushCompress::Finish)
                .map_err(|e| Error::Encode(e.to_string()))?;
            let used = usize::try_from(self.deflate.total_in() - before_in).unwrap_or(input.len());
            input = &input[used.min(input.len())..];
            if status == Status::StreamEnd {
                break;
            }
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(raw);
        out.extend_from_slice(&crc.finalize().to_le_bytes());
        // ISIZE is the length modulo 2^32 by definition.
        out.extend_from_slice(&((raw.len() & 0xffff_ffff) as u32).to_le_bytes());
        Ok(out)
    }
}

/// OTLP/HTTP: POST to `<endpoint>/v1/metrics` with reqwest.
pub(crate) struct HttpTransport {
    client: reqwest::Client,
    url: String,
    /// `url` parsed once: parsing it again for every request was 4 % of the agent's CPU.
    parsed: reqwest::Url,
    /// Send bodies uncompressed (`OTEL_EXPORTER_OTLP_COMPRESSION=none`).
    plain: bool,
}

/// The headers of `--header` / `OTEL_EXPORTER_OTLP_HEADERS`, checked.
fn header_map(headers: &[(String, String)]) -> Result<reqwest::header::HeaderMap> {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| Error::Invalid(format!("header name {k:?}: {e}")))?;
        let value = reqwest::header::HeaderValue::from_str(v)
            .map_err(|e| Error::Invalid(format!("value of header {k}: {e}")))?;
        map.insert(name, value);
    }
    Ok(map)
}

impl HttpTransport {
    #[cfg(test)]
    pub(crate) fn new(endpoint: &str) -> Result<Self> {
        Self::with_options(endpoint, &ExportOptions::default())
    }

    pub(crate) fn with_options(endpoint: &str, options: &ExportOptions) -> Result<Self> {
        let url = if options.exact_url {
            endpoint.trim().to_string()
        } else {
            metrics_url(endpoint)?
        };
        let parsed = reqwest::Url::parse(&url).map_err(|e| Error::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: format!("it is not a valid URL ({e})"),
        })?;
        let mut builder = reqwest::Client::builder()
            .timeout(options.timeout)
            .default_headers(header_map(&options.headers)?);
        if let Some(ca) = &options.ca_file {
            let pem = read_pem(ca, "CA certificate file")?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| Error::Invalid(format!("CA certificates in {}: {e}", ca.display())))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &options.client_identity {
            let mut pem = read_pem(cert, "client certificate file")?;
            pem.extend_from_slice(b"\n");
            pem.extend(read_pem(key, "client key file")?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| Error::Invalid(format!("client certificate and key: {e}")))?;
            builder = builder.identity(identity);
        }
        let client = builder
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("gpuwatch-agent/", env!("CARGO_PKG_VERSION")))
            // reqwest's own retries are for HTTP/2 and HTTP/3 refusals, protocols this client
            // does not speak; left on, its retry layer still copied every request's headers in
            // case. Retries are the exporter's job (spool, backoff).
            .retry(reqwest::retry::never().max_retries_per_request(0))
            .build()
            .map_err(Error::HttpClient)?;
        Ok(HttpTransport {
            client,
            url,
            parsed,
            plain: options.compression == BodyCompression::None,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// POST one gzip protobuf body, with the bearer token if there is one.
    pub(crate) async fn post(&self, body: Vec<u8>, bearer: Option<&Bearer>) -> Outcome {
        let mut request = self
            .client
            .post(self.parsed.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf");
        // Bodies are spooled gzipped; without compression they are inflated on the way out.
        let body = if self.plain {
            let mut raw = Vec::with_capacity(body.len() * 4);
            if let Err(e) =
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut raw)
            {
                return Outcome::Rejected {
                    status: "unreadable request".to_string(),
                    body: e.to_string(),
                };
            }
            raw
        } else {
            request = request.header(reqwest::header::CONTENT_ENCODING, "gzip");
            body
        };
        if let Some(b) = bearer {
            request = request.header(reqwest::header::AUTHORIZATION, b.http.clone());
        }
        let response = request.body(body).send().await;
        let response = match response {
            Ok(r) => r,
            Err(e) => return Outcome::Retry(error_chain(&e)),
        };
        let status = response.status();
        let code = status.as_u16();
        if status.is_success() {
            // An OTLP answer: empty, or an ExportMetricsServiceResponse with partial_success.
            let bytes = response.bytes().await.unwrap_or_default();
            let partial = ExportMetricsServiceResponse::decode(&bytes[..])
                .ok()
                .and_then(|r| r.partial_success);
            return match partial {
                Some(p) => Outcome::Sent {
                    rejected_points: p.rejected_data_points,
                    message: p.error_message,
                },
                None => Outcome::Sent {
                    rejected_points: 0,
                    message: String::new(),
                },
            };
        }
        if code == 429 || status.is_server_error() {
            return Outcome::Retry(format!("http {code}"));
        }
        let mut text = response.text().await.unwrap_or_default();
        if text.len() > MAX_BODY_IN_LOG {
            let mut cut = MAX_BODY_IN_LOG;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        if code == 401 || code == 403 {
            Outcome::Refused {
                status: format!("http {code}"),
                body: text,
            }
        } else if status.is_client_error() {
            Outcome::Rejected {
                status: format!("http {code}"),
                body: text,
            }
        } else {
            // 1xx/3xx after redirects: unexpected, but not proof the data is bad.
            Outcome::Retry(format!("unexpected http {code}"))
        }
    }
}

/// An error and its sources, joined with `: ` (reqwest's own text omits the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::GpuSample;
    use crate::export::otlp::encode;
    use crate::export::{Exporter, MemoryQueue};
    use flate2::read::GzDecoder;
    use std::collections::VecDeque;
    use std::io::Read;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn gunzip(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        GzDecoder::new(body)
            .read_to_end(&mut out)
            .expect("valid gzip");
        out
    }

    #[test]
    fn reused_gzip_state_gives_independent_valid_members() {
        let mut gz = Gzip::new();
        // Empty, small, compressible, and large incompressible input (more than one output
        // buffer's worth), twice each through the same encoder.
        let mut noise = Vec::with_capacity(3 << 20);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        while noise.len() < 3 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            noise.extend_from_slice(&x.to_le_bytes());
        }
        let inputs: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"gpu".to_vec(),
            b"gpu_utilization 0.97 ".repeat(5000),
            noise,
        ];
        for _ in 0..2 {
            for input in &inputs {
                let body = gz.encode(input).expect("encode");
                assert_eq!(gunzip(&body), *input, "{} bytes", input.len());
            }
        }
        let text = b"gpu_utilization 0.97 ".repeat(5000);
        assert!(gz.encode(&text).expect("encode").len() < text.len() / 10);
    }

    #[test]
    fn url_joining() {
        let ok = |e: &str| metrics_url(e).unwrap();
        assert_eq!(
            ok("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/metrics"
        );
        assert_eq!(
            ok("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/metrics"
        );
        assert_eq!(
            ok("https://gw.example/otlp"),
            "https://gw.example/otlp/v1/metrics"
        );
        assert_eq!(ok("http://h:9500/v1/metrics"), "http://h:9500/v1/metrics");
        assert_eq!(ok("http://h:9500/v1/metrics/"), "http://h:9500/v1/metrics");
        assert_eq!(ok(" http://h:1 "), "http://h:1/v1/metrics");
        for bad in [
            "127.0.0.1:4318",
            "ftp://h",
            "http://",
            "http:///x",
            "http://h/?a=b",
        ] {
            let e = metrics_url(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        // The URL is parsed once, when the transport is made: one that cannot be parsed is a
        // configuration error at start-up, not a send that fails at every tick.
        for bad in ["http://h:99999", "http://a b:1"] {
            let e = HttpTransport::new(bad).err().expect(bad);
            assert_eq!(e.exit_code(), 2, "{bad}: {e}");
        }
        assert_eq!(
            HttpTransport::new("http://h:1").unwrap().parsed.as_str(),
            "http://h:1/v1/metrics"
        );
    }

    /// One request as the test server saw it.
    #[derive(Debug, Clone)]
    struct Received {
        path: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Received {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }

        /// The `time_unix_nano` of the first point of each resource: the marker each test
        /// request carries (a batch carries several).
        fn markers(&self) -> Vec<u64> {
            let mut raw = Vec::new();
            GzDecoder::new(&self.body[..])
                .read_to_end(&mut raw)
                .unwrap();
            let req = ExportMetricsServiceRequest::decode(&raw[..]).unwrap();
            req.resource_metrics
                .iter()
                .map(
                    |rm| match rm.scope_metrics[0].metrics[0].data.as_ref().unwrap() {
                        opentelemetry_proto::tonic::metrics::v1::metric::Data::Gauge(g) => {
                            g.data_points[0].time_unix_nano
                        }
                        other => panic!("{other:?}"),
                    },
                )
                .collect()
        }
    }

    /// Scripted answer: 200 with a partial success of 3 rejected points.
    const PARTIAL: u16 = 2003;

    /// A tiny HTTP/1.1 server: answers each request with the next scripted status (200 when
    /// the script is empty; [`PARTIAL`] for a partial success) and `Connection: close`.
    struct TestServer {
        url: String,
        received: Arc<Mutex<Vec<Received>>>,
    }

    impl TestServer {
        async fn start(script: &[u16]) -> TestServer {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let received = Arc::new(Mutex::new(Vec::new()));
            let script = Arc::new(Mutex::new(
                script.iter().copied().collect::<VecDeque<u16>>(),
            ));
            let rec = received.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (rec, script) = (rec.clone(), script.clone());
                    tokio::spawn(async move { serve(stream, rec, script).await });
                }
            });
            TestServer { url, received }
        }

        fn received(&self) -> Vec<Received> {
            self.received.lock().unwrap().clone()
        }
    }

    async fn serve(
        mut stream: TcpStream,
        received: Arc<Mutex<Vec<Received>>>,
        script: Arc<Mutex<VecDeque<u16>>>,
    ) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let path = request_line
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = buf[head_end..head_end + len].to_vec();
        received.lock().unwrap().push(Received {
            path,
            headers,
            body,
        });
        let scripted = script.lock().unwrap().pop_front().unwrap_or(200);
        let (status, kind, reply): (u16, &str, Vec<u8>) = match scripted {
            200 => (200, "application/x-protobuf", Vec::new()),
            PARTIAL => (
                200,
                "application/x-protobuf",
                ExportMetricsServiceResponse {
                    partial_success: Some(
                        opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsPartialSuccess {
                            rejected_data_points: 3,
                            error_message: "3 points ahead of the server clock".into(),
                        },
                    ),
                }
                .encode_to_vec(),
            ),
            other => (
                other,
                "application/json",
                b"{\"error\":\"bad request: test says no\"}".to_vec(),
            ),
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nContent-Type: {kind}\r\nConnection: close\r\n\r\n",
            reply.len()
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(&reply).await;
        let _ = stream.shutdown().await;
    }

    fn request(marker: u64) -> ExportMetricsServiceRequest {
        let mut s = GpuSample::empty(marker, "GPU-t".into(), 0, "test".into());
        s.gpu_utilization = Some(0.5);
        encode(&[s], &[("host.name".into(), "t".into())])
    }

    /// Markers per request received, in order.
    fn markers(server: &TestServer) -> Vec<Vec<u64>> {
        server.received().iter().map(Received::markers).collect()
    }

    /// An exporter that retries at every call (backoff is tested on its own).
    fn eager(url: &str, spool: Box<dyn crate::export::Spool>) -> Exporter {
        let mut e = Exporter::with_spool(url, spool).unwrap();
        e.set_backoff(Duration::ZERO, Duration::ZERO);
        e
    }

    #[tokio::test]
    async fn posts_gzip_protobuf_to_v1_metrics() {
        let server = TestServer::start(&[]).await;
        let mut exporter = Exporter::new(&server.url).unwrap();
        exporter.send(&request(7)).await.unwrap();
        let got = server.received();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].path, "/v1/metrics");
        assert_eq!(
            got[0].header("content-type"),
            Some("application/x-protobuf")
        );
        assert_eq!(got[0].header("content-encoding"), Some("gzip"));
        assert_eq!(got[0].markers(), vec![7]);
        let mut raw = Vec::new();
        GzDecoder::new(&got[0].body[..])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(
            ExportMetricsServiceRequest::decode(&raw[..]).unwrap(),
            request(7)
        );
        assert_eq!(exporter.queued(), 0);
    }

    #[tokio::test]
    async fn retries_in_order_after_5xx_and_429() {
        let server = TestServer::start(&[503, 429]).await;
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::default()));
        let e = exporter.send(&request(1)).await.unwrap_err();
        assert!(matches!(e, Error::ExportRetry { queued: 1, .. }), "{e}");
        assert!(e.to_string().contains("http 503"), "{e}");
        let e = exporter.send(&request(2)).await.unwrap_err();
        assert!(matches!(e, Error::ExportRetry { queued: 2, .. }), "{e}");
        exporter.send(&request(3)).await.unwrap();
        assert_eq!(exporter.queued(), 0);
        // 1 failed alone, then in a batch with 2; then 1, 2, 3 went out in one batch, in order.
        assert_eq!(markers(&server), vec![vec![1], vec![1, 2], vec![1, 2, 3]]);
    }

    #[tokio::test]
    async fn backoff_defers_attempts_until_flush() {
        let server = TestServer::start(&[503]).await;
        let mut exporter = Exporter::new(&server.url).unwrap();
        assert!(exporter.send(&request(1)).await.is_err());
        // Within the backoff: queued, not sent.
        let e = exporter.send(&request(2)).await.unwrap_err();
        assert!(e.to_string().contains("backing off"), "{e}");
        assert_eq!(markers(&server), vec![vec![1]]);
        assert_eq!(exporter.queued(), 2);
        // The shutdown flush does not wait.
        exporter.flush().await.unwrap();
        assert_eq!(markers(&server), vec![vec![1], vec![1, 2]]);
        // A success resets the delay: the next send goes out at once.
        exporter.send(&request(3)).await.unwrap();
        assert_eq!(markers(&server).last(), Some(&vec![3]));
    }

    #[tokio::test]
    async fn partial_success_counts_as_sent_and_counts_points() {
        let server = TestServer::start(&[PARTIAL]).await;
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::default()));
        exporter.send(&request(1)).await.unwrap();
        assert_eq!(exporter.queued(), 0);
        assert_eq!(exporter.rejected(), 0);
        assert_eq!(exporter.rejected_points(), 3);
    }

    #[tokio::test]
    async fn client_error_drops_the_request() {
        let server = TestServer::start(&[400]).await;
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::default()));
        let e = exporter.send(&request(1)).await.unwrap_err();
        match &e {
            Error::ExportRejected { status, body, .. } => {
                assert_eq!(status, "http 400");
                assert!(body.contains("test says no"), "{body}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(exporter.queued(), 0);
        assert_eq!(exporter.rejected(), 1);
        exporter.send(&request(2)).await.unwrap();
        assert_eq!(markers(&server), vec![vec![1], vec![2]]);
    }

    #[tokio::test]
    async fn a_rejected_batch_is_split_and_only_the_bad_request_dropped() {
        let server = TestServer::start(&[503, 400, 400]).await;
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::default()));
        assert!(exporter.send(&request(1)).await.is_err());
        // [1, 2] is rejected as a batch; alone, 1 is rejected again and dropped, 2 goes through
        // (and the older rejection does not fail the newer request).
        exporter.send(&request(2)).await.unwrap();
        assert_eq!(
            markers(&server),
            vec![vec![1], vec![1, 2], vec![1], vec![2]]
        );
        assert_eq!(exporter.rejected(), 1);
        assert_eq!(exporter.queued(), 0);
    }

    #[tokio::test]
    async fn connect_error_keeps_the_request() {
        // A port nothing listens on.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let mut exporter = Exporter::new(&url).unwrap();
        let e = exporter.send(&request(1)).await.unwrap_err();
        assert!(matches!(e, Error::ExportRetry { queued: 1, .. }), "{e}");
        assert!(e.is_transient());
        let e = exporter.flush().await.unwrap_err();
        assert!(matches!(e, Error::ExportRetry { queued: 1, .. }), "{e}");
    }

    /// A token file in a fresh temp dir; replaced with [`put_token`].
    fn token_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuwatch-agent-http-token-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Write `token` to `dir/token` the way a Kubernetes Secret update does: a new file moved
    /// over the old one.
    fn put_token(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
        let path = dir.join("token");
        let next = dir.join("token.next");
        std::fs::write(&next, format!("{token}\n")).unwrap();
        std::fs::rename(&next, &path).unwrap();
        path
    }

    fn authorizations(server: &TestServer) -> Vec<Option<String>> {
        server
            .received()
            .iter()
            .map(|r| r.header("authorization").map(str::to_string))
            .collect()
    }

    #[tokio::test]
    async fn sends_the_bearer_token_of_the_token_file() {
        let server = TestServer::start(&[]).await;
        let dir = token_dir("sends");
        let path = put_token(&dir, "ingest-token-0123456789");
        let mut exporter = Exporter::new(&server.url).unwrap();
        exporter.set_token_file(crate::export::TokenFile::load(&path).unwrap());
        exporter.send(&request(1)).await.unwrap();
        assert_eq!(
            authorizations(&server),
            vec![Some("Bearer ingest-token-0123456789".to_string())]
        );
        // Without a token file, no Authorization header at all.
        let mut plain = Exporter::new(&server.url).unwrap();
        plain.send(&request(2)).await.unwrap();
        assert_eq!(authorizations(&server)[1], None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_refused_token_keeps_the_requests_until_the_token_file_is_fixed() {
        let server = TestServer::start(&[401, 403]).await;
        let dir = token_dir("refused");
        let path = put_token(&dir, "wrong-token-0123456789");
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::default()));
        exporter.set_token_file(crate::export::TokenFile::load(&path).unwrap());
        let e = exporter.send(&request(1)).await.unwrap_err();
        assert!(matches!(e, Error::ExportRefused { queued: 1, .. }), "{e}");
        assert!(e.is_transient(), "the loop goes on");
        assert!(e.to_string().contains("--auth-token-file"), "{e}");
        assert!(!e.to_string().contains("wrong-token"), "{e}");
        // 403 (a token without the ingest scope) too; the batch is not split, nothing dropped.
        let e = exporter.send(&request(2)).await.unwrap_err();
        assert!(matches!(e, Error::ExportRefused { queued: 2, .. }), "{e}");
        assert_eq!(exporter.rejected(), 0);
        assert_eq!(exporter.auth_refusals(), 2);
        // The file is fixed: the next send reads it and everything goes out, in order.
        put_token(&dir, "right-token-0123456789");
        exporter.send(&request(3)).await.unwrap();
        assert_eq!(exporter.queued(), 0);
        assert_eq!(markers(&server), vec![vec![1], vec![1, 2], vec![1, 2, 3]]);
        let wrong = Some("Bearer wrong-token-0123456789".to_string());
        let right = Some("Bearer right-token-0123456789".to_string());
        assert_eq!(authorizations(&server), vec![wrong.clone(), wrong, right]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_new_token_is_tried_without_waiting_for_the_backoff() {
        let server = TestServer::start(&[401]).await;
        let dir = token_dir("backoff");
        let path = put_token(&dir, "wrong-token-0123456789");
        // The default backoff: 1 s after the first failure.
        let mut exporter = Exporter::new(&server.url).unwrap();
        exporter.set_token_file(crate::export::TokenFile::load(&path).unwrap());
        assert!(exporter.send(&request(1)).await.is_err());
        let e = exporter.send(&request(2)).await.unwrap_err();
        assert!(e.to_string().contains("backing off"), "{e}");
        put_token(&dir, "right-token-0123456789");
        exporter.send(&request(3)).await.unwrap();
        assert_eq!(markers(&server), vec![vec![1], vec![1, 2, 3]]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn refused_requests_wait_in_the_disk_spool_across_a_restart() {
        let server = TestServer::start(&[401, 401]).await;
        let dir = token_dir("disk");
        let spool_dir = dir.join("spool");
        // No token at all: 401, kept on disk.
        {
            let spool = crate::buffer::DiskSpool::open(&spool_dir, 1 << 20).unwrap();
            let mut exporter = eager(&server.url, Box::new(spool));
            let e = exporter.send(&request(1)).await.unwrap_err();
            assert!(matches!(e, Error::ExportRefused { .. }), "{e}");
            assert!(e.to_string().contains("http 401"), "{e}");
            let e = exporter.send(&request(2)).await.unwrap_err();
            assert!(matches!(e, Error::ExportRefused { queued: 2, .. }), "{e}");
        }
        // The agent restarts with a token: the spool is replayed, nothing lost.
        let path = put_token(&dir, "right-token-0123456789");
        let spool = crate::buffer::DiskSpool::open(&spool_dir, 1 << 20).unwrap();
        let mut exporter = eager(&server.url, Box::new(spool));
        assert_eq!(exporter.queued(), 2);
        exporter.set_token_file(crate::export::TokenFile::load(&path).unwrap());
        exporter.flush().await.unwrap();
        assert_eq!(markers(&server), vec![vec![1], vec![1, 2], vec![1, 2]]);
        assert_eq!(exporter.queued(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn bounded_queue_drops_oldest_and_keeps_order() {
        let server = TestServer::start(&[503, 503, 503]).await;
        let mut exporter = eager(&server.url, Box::new(MemoryQueue::new(2)));
        assert!(exporter.send(&request(1)).await.is_err()); // [1]
        assert!(exporter.send(&request(2)).await.is_err()); // [1, 2]
        assert!(exporter.send(&request(3)).await.is_err()); // 1 dropped: [2, 3]
        exporter.send(&request(4)).await.unwrap(); // 2 dropped: [3, 4], sent together
        assert_eq!(exporter.dropped(), 2);
        assert_eq!(exporter.queued(), 0);
        assert_eq!(
            markers(&server),
            vec![vec![1], vec![1, 2], vec![2, 3], vec![3, 4]]
        );
    }
}
