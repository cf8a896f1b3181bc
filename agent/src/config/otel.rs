//! The OpenTelemetry SDK environment variables of the OTLP exporter, so the agent fits any
//! collector configured the standard way: `OTEL_EXPORTER_OTLP_ENDPOINT`, `…_METRICS_ENDPOINT`,
//! `…_HEADERS`, `…_TIMEOUT`, `…_COMPRESSION`, `…_PROTOCOL`, `…_CERTIFICATE`, `…_CLIENT_KEY`,
//! `…_CLIENT_CERTIFICATE` (each also as `OTEL_EXPORTER_OTLP_METRICS_…`) and
//! `OTEL_RESOURCE_ATTRIBUTES`.
//!
//! Precedence, as the OpenTelemetry specification orders it below the agent's own settings:
//! a flag, a `GPUWATCH_*` variable or a config-file key wins; then the metrics-specific
//! `OTEL_EXPORTER_OTLP_METRICS_*` variable; then the generic `OTEL_EXPORTER_OTLP_*` one; then the
//! default. `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is used as given (its path too);
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is a base URL to which OTLP/HTTP appends `/v1/metrics`.
//! Headers merge by name: generic, then metrics-specific, then `--header` win in that order.
//! Resource attributes merge the same way under `--label`.

use std::path::PathBuf;
use std::time::Duration;

use super::Protocol;
use crate::error::{Error, Result};
use crate::export::Compression;

/// What the OTEL variables say (each `None` or empty when unset).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct OtelEnv {
    /// An endpoint used exactly as given (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    pub exact_endpoint: Option<String>,
    /// A base endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub base_endpoint: Option<String>,
    /// The protocol.
    pub protocol: Option<Protocol>,
    /// Headers sent with every request, merged by name.
    pub headers: Vec<(String, String)>,
    /// The request timeout.
    pub timeout: Option<Duration>,
    /// The body compression.
    pub compression: Option<Compression>,
    /// A PEM file of CA certificates that sign the endpoint's.
    pub certificate: Option<PathBuf>,
    /// The agent's PEM private key for mutual TLS.
    pub client_key: Option<PathBuf>,
    /// The agent's PEM certificate chain for mutual TLS.
    pub client_certificate: Option<PathBuf>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource_attributes: Vec<(String, String)>,
}

const PREFIX: &str = "OTEL_EXPORTER_OTLP_";
const METRICS_PREFIX: &str = "OTEL_EXPORTER_OTLP_METRICS_";

/// Reads the variables through `env` (empty values count as unset).
pub(super) fn read(env: &dyn Fn(&str) -> Option<String>) -> Result<OtelEnv> {
    let get = |name: &str| {
        env(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    // The metrics-specific variable, else the generic one, with the name it came from.
    let either = |suffix: &str| {
        get(&format!("{METRICS_PREFIX}{suffix}"))
            .map(|v| (format!("{METRICS_PREFIX}{suffix}"), v))
            .or_else(|| get(&format!("{PREFIX}{suffix}")).map(|v| (format!("{PREFIX}{suffix}"), v)))
    };
    let bad = |var: &str, value: &str, reason: &str| Error::BadEnv {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let mut out = OtelEnv {
        exact_endpoint: get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
        base_endpoint: get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ..OtelEnv::default()
    };
    if let Some((var, v)) = either("PROTOCOL") {
        out.protocol = Some(match v.as_str() {
            "grpc" => Protocol::Grpc,
            "http/protobuf" => Protocol::Http,
            "http/json" => {
                return Err(bad(
                    &var,
                    &v,
                    "the agent sends http/protobuf or grpc; use one of them",
                ));
            }
            _ => return Err(bad(&var, &v, "use grpc or http/protobuf")),
        });
    }
    for suffix in ["HEADERS", "METRICS_HEADERS"] {
        let var = format!("{PREFIX}{suffix}");
        if let Some(v) = get(&var) {
            for (k, val) in parse_pairs(&v).map_err(|r| bad(&var, &v, &r))? {
                out.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&k));
                out.headers.push((k, val));
            }
        }
    }
    if let Some((var, v)) = either("TIMEOUT") {
        let ms: u64 = v
            .parse()
            .map_err(|_| bad(&var, &v, "give the timeout in milliseconds, e.g. 10000"))?;
        if ms == 0 {
            return Err(bad(&var, &v, "the timeout must be at least 1 millisecond"));
        }
        out.timeout = Some(Duration::from_millis(ms));
    }
    if let Some((var, v)) = either("COMPRESSION") {
        out.compression = Some(match v.as_str() {
            "gzip" => Compression::Gzip,
            "none" => Compression::None,
            _ => return Err(bad(&var, &v, "use gzip or none")),
        });
    }
    out.certificate = either("CERTIFICATE").map(|(_, v)| PathBuf::from(v));
    out.client_key = either("CLIENT_KEY").map(|(_, v)| PathBuf::from(v));
    out.client_certificate = either("CLIENT_CERTIFICATE").map(|(_, v)| PathBuf::from(v));
    if out.client_key.is_some() != out.client_certificate.is_some() {
        return Err(Error::Invalid(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY and OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE go together: set both or neither".into(),
        ));
    }
    if let Some(v) = get("OTEL_RESOURCE_ATTRIBUTES") {
        out.resource_attributes =
            parse_pairs(&v).map_err(|r| bad("OTEL_RESOURCE_ATTRIBUTES", &v, &r))?;
    }
    Ok(out)
}

/// `key1=value1,key2=value2` with percent-encoded values (the W3C baggage form the
/// specification uses for headers and resource attributes).
pub(super) fn parse_pairs(s: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value"))?;
        let k = percent_decode(k.trim())?;
        if k.is_empty() {
            return Err(format!("{item:?} has an empty key"));
        }
        out.push((k, percent_decode(v.trim())?));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-escape in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

/// Checks a header for what HTTP and gRPC metadata accept.
pub(super) fn check_header(name: &str, value: &str) -> std::result::Result<(), String> {
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
    if !name_ok {
        return Err(format!(
            "header name {name:?} is not a valid HTTP header name"
        ));
    }
    if value.bytes().any(|c| c < 0x20 && c != b'\t' || c == 0x7f) {
        return Err(format!("the value of header {name} has control characters"));
    }
    Ok(())
}

/// The agent's own settings that the OTEL variables may fill in.
#[derive(Debug)]
pub(super) struct Own {
    /// True when a flag, `GPUWATCH_ENDPOINT` or the file gave the endpoint.
    pub endpoint_given: bool,
    /// The endpoint (the default when not given).
    pub endpoint: String,
    /// The protocol, decided already (the agent's own, else the OTEL one, else http).
    pub protocol: Protocol,
    /// `--header` pairs.
    pub headers: Vec<(String, String)>,
    /// `--label` pairs.
    pub labels: Vec<(String, String)>,
    /// `--host`, if given.
    pub host: Option<String>,
}

/// The merged result.
#[derive(Debug)]
pub(super) struct Merged {
    /// The endpoint.
    pub endpoint: String,
    /// Resource attributes: `--label`, then the OTEL ones it does not name.
    pub labels: Vec<(String, String)>,
    /// The host: `--host`, else `host.name` of `OTEL_RESOURCE_ATTRIBUTES`.
    pub host: Option<String>,
    /// How requests are sent.
    pub export: crate::export::ExportOptions,
}

/// Fills in what the agent's own settings leave open from the OTEL variables.
pub(super) fn apply(otel: OtelEnv, own: Own) -> Result<Merged> {
    let mut export = crate::export::ExportOptions::default();
    let endpoint = if own.endpoint_given {
        own.endpoint
    } else if let Some(exact) = otel.exact_endpoint {
        export.exact_url = own.protocol == Protocol::Http;
        exact
    } else if let Some(base) = otel.base_endpoint {
        base
    } else if own.protocol == Protocol::Grpc {
        crate::export::DEFAULT_GRPC_ENDPOINT.to_string()
    } else {
        own.endpoint
    };
    let mut headers = otel.headers;
    for (k, v) in own.headers {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&k));
        headers.push((k, v));
    }
    export.headers = headers;
    if let Some(t) = otel.timeout {
        export.timeout = t;
    }
    export.compression = otel.compression.unwrap_or_default();
    export.ca_file = otel.certificate;
    export.client_identity = otel.client_certificate.zip(otel.client_key);
    let mut host = own.host;
    let mut labels = own.labels;
    for (k, v) in otel.resource_attributes {
        match k.as_str() {
            "host.name" => {
                host.get_or_insert(v);
            }
            "gpuwatch.simulated" => {}
            _ if labels.iter().any(|(n, _)| *n == k) => {}
            _ => labels.push((k, v)),
        }
    }
    Ok(Merged {
        endpoint,
        labels,
        host,
        export,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    #[test]
    fn metrics_specific_variables_win_over_generic_ones() {
        let o = read(&env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "X-Scope-OrgID=tenant-a,api-key=one",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "api-key=two%20words"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_RESOURCE_ATTRIBUTES", "cluster=prod,rack=r%2C12"),
        ]))
        .expect("reads");
        assert_eq!(o.base_endpoint.as_deref(), Some("http://collector:4318"));
        assert_eq!(o.exact_endpoint, None);
        assert_eq!(o.protocol, Some(Protocol::Grpc));
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.compression, Some(Compression::None));
        assert_eq!(
            o.headers,
            vec![
                ("X-Scope-OrgID".to_string(), "tenant-a".to_string()),
                ("api-key".to_string(), "two words".to_string())
            ]
        );
        assert_eq!(
            o.resource_attributes,
            vec![
                ("cluster".into(), "prod".into()),
                ("rack".into(), "r,12".into())
            ]
        );
    }

    #[test]
    fn bad_values_say_which_variable() {
        for (var, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_RESOURCE_ATTRIBUTES", "a=%zz"),
        ] {
            let e = read(&env_of(&[(var, value)])).expect_err(var).to_string();
            assert!(e.contains(var), "{e}");
        }
        let e = read(&env_of(&[("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem")])).expect_err("half");
        assert!(e.to_string().contains("set both"), "{e}");
    }
}
