//! How requests are sent, beside where: headers, timeout, compression and TLS material, from
//! `--header` and the `OTEL_EXPORTER_OTLP_*` variables (docs/agent.md, "Collectors").

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::export::http::REQUEST_TIMEOUT;

/// Body compression of the OTLP requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// gzip (the default).
    #[default]
    Gzip,
    /// None.
    None,
}

/// How requests are sent.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// Headers (HTTP) or metadata (gRPC) sent with every request.
    pub headers: Vec<(String, String)>,
    /// Time limit of one request.
    pub timeout: Duration,
    /// Body compression.
    pub compression: Compression,
    /// PEM file of the CA certificates that sign the endpoint's (TLS); the system's roots
    /// when `None`.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain and private key of the agent (mutual TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// OTLP/HTTP: the endpoint is the full URL (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`), nothing
    /// is appended.
    pub exact_url: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            headers: Vec::new(),
            timeout: REQUEST_TIMEOUT,
            compression: Compression::Gzip,
            ca_file: None,
            client_identity: None,
            exact_url: false,
        }
    }
}

/// Reads a PEM file named by a setting, with an error that names it.
pub(crate) fn read_pem(path: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::Invalid(format!(
            "cannot read the {what} {} ({e}): check OTEL_EXPORTER_OTLP_CERTIFICATE / CLIENT_CERTIFICATE / CLIENT_KEY",
            path.display()
        ))
    })
}
