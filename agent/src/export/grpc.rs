//! OTLP/gRPC (`--protocol grpc`): the `opentelemetry.proto.collector.metrics.v1.MetricsService`
//! `Export` call over a tonic channel, gzip-compressed, to the server's `--otlp-grpc-addr`
//! (4317). The retry spool, batching and backoff around it live in
//! [`crate::export::exporter`], shared with OTLP/HTTP.
//!
//! The endpoint is `http://host:port` or, over TLS, `https://host:port` (no path: gRPC names
//! the method itself). TLS checks the server against the CA certificates of
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`, or the system's roots, and presents the agent's
//! certificate when `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `…_CLIENT_KEY` are set.
//!
//! With `--auth-token-file` every call carries the `authorization: Bearer <token>` metadata;
//! `--header` and `OTEL_EXPORTER_OTLP_HEADERS` add theirs (names lowercased, as gRPC wants).
//!
//! Status codes, following the OTLP specification: `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//! `CANCELLED`, `ABORTED`, `OUT_OF_RANGE`, `DATA_LOSS`, `INTERNAL` and `UNKNOWN` (also what a
//! broken connection gives) are retried. `UNAUTHENTICATED` and `PERMISSION_DENIED` refuse the
//! token, not the data: the request is kept and retried too, as after an HTTP 401/403. Every
//! other code (`INVALID_ARGUMENT`, `UNIMPLEMENTED`, `RESOURCE_EXHAUSTED` — the server's answer
//! to a request over `--max-body-bytes` — …) drops the request, as a 4xx does over HTTP.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, Result};
use crate::export::exporter::Outcome;
use crate::export::options::{Compression, ExportOptions, read_pem};
use crate::export::token::Bearer;

/// Default OTLP/gRPC endpoint (the server's `--otlp-grpc-addr`).
pub const DEFAULT_GRPC_ENDPOINT: &str = "http://127.0.0.1:4317";

/// Check a gRPC endpoint and return it without a trailing `/`.
pub fn grpc_url(endpoint: &str) -> Result<String> {
    let trimmed = endpoint.trim();
    let bad = |reason: &str| Error::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let (scheme, rest) = if let Some(r) = trimmed.strip_prefix("https://") {
        ("https", r)
    } else if let Some(r) = trimmed.strip_prefix("http://") {
        ("http", r)
    } else {
        return Err(bad(
            "it must start with http:// or https://, e.g. http://127.0.0.1:4317",
        ));
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("it has no host"));
    }
    if rest.contains(['/', '?', '#']) {
        return Err(bad(
            "a grpc endpoint has no path, query or fragment: give http://host:port",
        ));
    }
    let url = format!("{scheme}://{rest}");
    Endpoint::from_shared(url.clone()).map_err(|e| bad(&e.to_string()))?;
    Ok(url)
}

/// The gRPC client, connected on first use (a tonic channel needs a running runtime).
pub(crate) struct GrpcTransport {
    url: String,
    client: Option<MetricsServiceClient<Channel>>,
    metadata: MetadataMap,
    timeout: Duration,
    gzip: bool,
    tls: Option<ClientTlsConfig>,
}

/// The TLS settings of an `https://` endpoint.
fn tls_config(options: &ExportOptions) -> Result<ClientTlsConfig> {
    // ring and aws-lc-rs are both linked in: name the process's provider (a second call, or
    // one made by the embedding program first, leaves the one in place).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut tls = ClientTlsConfig::new();
    tls = match &options.ca_file {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read_pem(ca, "CA certificate file")?)),
        None => tls.with_native_roots(),
    };
    if let Some((cert, key)) = &options.client_identity {
        tls = tls.identity(Identity::from_pem(
            read_pem(cert, "client certificate file")?,
            read_pem(key, "client key file")?,
        ));
    }
    Ok(tls)
}

impl GrpcTransport {
    pub(crate) fn with_options(endpoint: &str, options: &ExportOptions) -> Result<Self> {
        let url = grpc_url(endpoint)?;
        let mut metadata = MetadataMap::new();
        for (k, v) in &options.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| Error::Invalid(format!("header name {k:?} as grpc metadata: {e}")))?;
            let value = MetadataValue::try_from(v.as_str()).map_err(|e| {
                Error::Invalid(format!("value of header {k} as grpc metadata: {e}"))
            })?;
            metadata.insert(key, value);
        }
        let tls = if url.starts_with("https://") {
            Some(tls_config(options)?)
        } else {
            None
        };
        Ok(GrpcTransport {
            url,
            client: None,
            metadata,
            timeout: options.timeout,
            gzip: options.compression == Compression::Gzip,
            tls,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    fn client(&mut self) -> Result<MetricsServiceClient<Channel>, String> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| e.to_string())?
            .timeout(self.timeout)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("gpuwatch-agent/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| e.to_string())?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| e.to_string())?;
        }
        let mut client = MetricsServiceClient::new(endpoint.connect_lazy())
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(4 << 20);
        if self.gzip {
            client = client.send_compressed(CompressionEncoding::Gzip);
        }
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Send one request, with the bearer token if there is one.
    pub(crate) async fn export(
        &mut self,
        req: ExportMetricsServiceRequest,
        bearer: Option<&Bearer>,
    ) -> Outcome {
        let mut client = match self.client() {
            Ok(c) => c,
            Err(e) => {
                return Outcome::Rejected {
                    status: "bad endpoint".to_string(),
                    body: e,
                };
            }
        };
        let mut request =
            tonic::Request::from_parts(self.metadata.clone(), tonic::Extensions::default(), req);
        if let Some(b) = bearer {
            request
                .metadata_mut()
                .insert("authorization", b.grpc.clone());
        }
        match client.export(request).await {
            Ok(response) => match response.into_inner().partial_success {
                Some(p) => Outcome::Sent {
                    rejected_points: p.rejected_data_points,
                    message: p.error_message,
                },
                None => Outcome::Sent {
                    rejected_points: 0,
                    message: String::new(),
                },
            },
            Err(status) => outcome_of(&status),
        }
    }
}

/// What a gRPC error status means for the request.
pub(crate) fn outcome_of(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let text = status_text(status);
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::OutOfRange
        | Code::DataLoss
        | Code::Internal
        | Code::Unknown => Outcome::Retry(format!("grpc {:?}: {text}", status.code())),
        code @ (Code::Unauthenticated | Code::PermissionDenied) => Outcome::Refused {
            status: format!("grpc {code:?}"),
            body: text,
        },
        code => Outcome::Rejected {
            status: format!("grpc {code:?}"),
            body: text,
        },
    }
}

/// The status message with the transport error behind it, if any.
fn status_text(status: &tonic::Status) -> String {
    let mut out = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_checks() {
        assert_eq!(
            grpc_url("http://127.0.0.1:4317").unwrap(),
            "http://127.0.0.1:4317"
        );
        assert_eq!(grpc_url(" http://gw:4317/ ").unwrap(), "http://gw:4317");
        // TLS: https:// (checked against OTEL_EXPORTER_OTLP_CERTIFICATE or the system roots).
        assert_eq!(grpc_url("https://gw:4317").unwrap(), "https://gw:4317");
        for (bad, says) in [
            ("127.0.0.1:4317", "http://"),
            ("http://gw:4317/v1/metrics", "no path"),
            ("http://", "no host"),
            ("http://gw:4317?x=1", "no path"),
        ] {
            let e = grpc_url(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn status_codes_map_like_the_otlp_spec() {
        let retry = [
            tonic::Status::unavailable("down"),
            tonic::Status::deadline_exceeded("slow"),
            tonic::Status::internal("oops"),
        ];
        for s in retry {
            assert!(matches!(outcome_of(&s), Outcome::Retry(_)), "{s:?}");
        }
        // A refused token is not the data's fault: kept, like a failure that may pass.
        for s in [
            tonic::Status::unauthenticated("no token"),
            tonic::Status::permission_denied("no ingest scope"),
        ] {
            match outcome_of(&s) {
                Outcome::Refused { status, body } => {
                    assert!(status.starts_with("grpc "), "{status}");
                    assert_eq!(body, s.message());
                }
                other => panic!("{s:?} gave {other:?}"),
            }
        }
        for s in [
            tonic::Status::invalid_argument("bad point"),
            tonic::Status::resource_exhausted("too large"),
        ] {
            match outcome_of(&s) {
                Outcome::Rejected { status, body } => {
                    assert!(status.starts_with("grpc "), "{status}");
                    assert_eq!(body, s.message());
                }
                other => panic!("{s:?} gave {other:?}"),
            }
        }
    }
}
