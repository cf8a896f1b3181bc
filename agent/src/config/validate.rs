//! The checks across settings, the defaults that depend on other settings (the endpoint on the
//! protocol, the host on the source, the seed on the host), the OpenTelemetry variables below
//! the agent's own settings, and [`AgentOptions`].

use std::collections::BTreeSet;

use super::otel::{self, OtelEnv};
use super::{
    AgentOptions, Cli, MAX_FAKE_MIG, MAX_SYNTHETIC_GPUS, MIN_BUFFER_MAX_BYTES, MIN_INTERVAL,
    Protocol, Settings, SourceKind,
};
use crate::error::{Error, Result};
use crate::hostname::hostname;

/// Checks the merged settings; `given` holds the keys a flag, a variable or the file set. The
/// OTEL variables (`otel`) come in here, in one call, below every setting of the agent's own.
pub(super) fn validate(cli: Cli, given: &BTreeSet<String>, otel: OtelEnv) -> Result<Settings> {
    check(&cli)?;
    // The agent's own protocol when given, else OTEL_EXPORTER_OTLP_PROTOCOL, else the default.
    let protocol = match otel.protocol {
        Some(p) if !given.contains("protocol") => p,
        _ => cli.protocol,
    };
    let host = match cli.host.as_ref().map(|h| h.trim().to_string()) {
        Some(h) if h.is_empty() => {
            return Err(Error::Invalid(
                "host is empty: give a name or leave it out".to_string(),
            ));
        }
        other => other,
    };
    // Left unset everywhere (OTEL variables included), the endpoint follows the protocol: 4318
    // for http, 4317 for grpc.
    let merged = otel::apply(
        otel,
        otel::Own {
            endpoint_given: given.contains("endpoint"),
            endpoint: cli.endpoint.clone(),
            protocol,
            headers: cli
                .header
                .iter()
                .map(|h| (h.0.clone(), h.1.clone()))
                .collect(),
            labels: cli
                .label
                .iter()
                .map(|l| (l.0.clone(), l.1.clone()))
                .collect(),
            host,
        },
    )?;
    let host = merged.host.unwrap_or_else(|| default_host(cli.source));
    let seed = cli.seed.unwrap_or_else(|| seed_from_host(&host));
    check_endpoint(protocol, &merged.endpoint, merged.export.exact_url)?;
    Ok(Settings {
        agent: AgentOptions {
            endpoint: merged.endpoint,
            protocol,
            interval: cli.interval.get(),
            source: cli.source,
            synthetic_gpus: cli.synthetic_gpus,
            host,
            labels: merged.labels,
            seed,
            once: cli.once,
            job_mapping_dir: cli.job_mapping_dir,
            pod_resources_socket: cli.pod_resources_socket,
            kubelet: crate::attribute::kubelet::KubeletOptions {
                labels: cli.pod_label.iter().map(|l| l.trim().to_string()).collect(),
                url: cli.kubelet_url,
                token_file: cli.kubelet_token_file,
                ca_file: cli.kubelet_ca_file,
                insecure_tls: cli.kubelet_insecure_tls,
            },
            metrics_addr: cli.metrics_addr.0,
            buffer_dir: cli.buffer_dir,
            buffer_max_bytes: cli.buffer_max_bytes,
            fake_dev_dir: cli.fake_dev_dir,
            fake_mig: cli.fake_mig,
            slow_interval: cli.slow_interval.get(),
            flush_interval: cli.flush_interval.get(),
            auth_token_file: cli.auth_token_file,
            export: merged.export,
        },
        log_level: cli.log_level,
        log_format: cli.log_format,
    })
}

/// Checks the endpoint for the protocol: a full OTLP/HTTP URL given as is (the metrics-specific
/// OTEL variable) only needs an http(s) scheme.
fn check_endpoint(protocol: Protocol, endpoint: &str, exact_url: bool) -> Result<()> {
    match protocol {
        Protocol::Http if exact_url => match url_scheme(endpoint) {
            Some("http" | "https") => Ok(()),
            _ => Err(Error::BadEndpoint {
                endpoint: endpoint.to_string(),
                reason: "it must be an http:// or https:// URL".to_string(),
            }),
        },
        Protocol::Http => crate::export::metrics_url(endpoint).map(drop),
        Protocol::Grpc => crate::export::grpc_url(endpoint).map(drop),
    }
}

fn url_scheme(s: &str) -> Option<&str> {
    s.trim().split_once("://").map(|(scheme, _)| scheme)
}

/// The ranges and reserved names one value alone cannot be checked for.
fn check(cli: &Cli) -> Result<()> {
    if let Some(bad) = cli
        .pod_label
        .iter()
        .find(|l| !crate::attribute::kubelet::valid_label_name(l.trim()))
    {
        return Err(Error::Invalid(format!(
            "pod_label {bad:?} is not a Kubernetes label name (letters, digits, '-', '_', '.', an optional prefix/)"
        )));
    }
    if !cli.pod_label.is_empty() && reqwest::Url::parse(&cli.kubelet_url).is_err() {
        return Err(Error::Invalid(format!(
            "kubelet_url {:?} is not a URL: use https://<node>:10250",
            cli.kubelet_url
        )));
    }
    if cli.fake_mig > MAX_FAKE_MIG {
        return Err(Error::Invalid(format!(
            "fake_mig must be between 0 and {MAX_FAKE_MIG} (MIG instances per gpu), got {}",
            cli.fake_mig
        )));
    }
    if cli
        .auth_token_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(Error::Invalid(
            "auth_token_file is empty: give the path of the token file or leave it out".to_string(),
        ));
    }
    if cli.buffer_max_bytes < MIN_BUFFER_MAX_BYTES {
        return Err(Error::Invalid(format!(
            "buffer_max_bytes {} is too small: use at least {MIN_BUFFER_MAX_BYTES}",
            cli.buffer_max_bytes
        )));
    }
    if cli.interval.get() < MIN_INTERVAL {
        return Err(Error::Invalid(format!(
            "interval {} is too short: use at least 100ms",
            cli.interval
        )));
    }
    if matches!(cli.source, SourceKind::Synthetic | SourceKind::Fake)
        && !(1..=MAX_SYNTHETIC_GPUS).contains(&cli.synthetic_gpus)
    {
        return Err(Error::Invalid(format!(
            "synthetic_gpus must be between 1 and {MAX_SYNTHETIC_GPUS}, got {}",
            cli.synthetic_gpus
        )));
    }
    for label in &cli.label {
        if label.0 == "host.name" || label.0 == "gpuwatch.simulated" {
            return Err(Error::ReservedLabel {
                key: label.0.clone(),
            });
        }
    }
    if cli.log_level.trim().is_empty() {
        return Err(Error::Invalid(
            "log_level is empty: use e.g. info".to_string(),
        ));
    }
    Ok(())
}

/// This machine's hostname, or `sim-<hostname>` for simulated data so it cannot be mistaken
/// for the real host.
pub fn default_host(source: SourceKind) -> String {
    match source {
        SourceKind::Synthetic | SourceKind::Fake => format!("sim-{}", hostname()),
        SourceKind::Auto | SourceKind::Nvml => hostname(),
    }
}

/// A stable seed from a host name (FNV-1a), so each simulated host gets its own fleet.
pub fn seed_from_host(host: &str) -> u64 {
    host.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
