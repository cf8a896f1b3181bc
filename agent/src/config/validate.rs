//! The checks across settings, the defaults that depend on other settings (the endpoint on the
//! protocol, the host on the source, the seed on the host), and [`AgentOptions`].

use std::collections::BTreeSet;

use super::{
    AgentOptions, Cli, MAX_FAKE_MIG, MAX_SYNTHETIC_GPUS, MIN_BUFFER_MAX_BYTES, MIN_INTERVAL,
    Protocol, Settings, SourceKind,
};
use crate::error::{Error, Result};
use crate::hostname::hostname;

/// Checks the merged settings; `given` holds the keys a flag, a variable or the file set.
pub(super) fn validate(cli: Cli, given: &BTreeSet<String>) -> Result<Settings> {
    // Left unset everywhere, the endpoint follows the protocol: 4318 for http, 4317 for grpc.
    let endpoint = if !given.contains("endpoint") && cli.protocol == Protocol::Grpc {
        crate::export::DEFAULT_GRPC_ENDPOINT.to_string()
    } else {
        cli.endpoint.clone()
    };
    check(&cli)?;
    let host = match cli.host.as_ref().map(|h| h.trim().to_string()) {
        Some(h) if h.is_empty() => {
            return Err(Error::Invalid(
                "host is empty: give a name or leave it out".to_string(),
            ));
        }
        Some(h) => h,
        None => default_host(cli.source),
    };
    let seed = cli.seed.unwrap_or_else(|| seed_from_host(&host));
    match cli.protocol {
        Protocol::Http => crate::export::metrics_url(&endpoint).map(drop)?,
        Protocol::Grpc => crate::export::grpc_url(&endpoint).map(drop)?,
    }
    Ok(Settings {
        agent: AgentOptions {
            endpoint,
            protocol: cli.protocol,
            interval: cli.interval.get(),
            source: cli.source,
            synthetic_gpus: cli.synthetic_gpus,
            host,
            labels: cli.label.into_iter().map(|l| (l.0, l.1)).collect(),
            seed,
            once: cli.once,
            job_mapping_dir: cli.job_mapping_dir,
            pod_resources_socket: cli.pod_resources_socket,
            metrics_addr: cli.metrics_addr.0,
            buffer_dir: cli.buffer_dir,
            buffer_max_bytes: cli.buffer_max_bytes,
            fake_dev_dir: cli.fake_dev_dir,
            fake_mig: cli.fake_mig,
            slow_interval: cli.slow_interval.get(),
            flush_interval: cli.flush_interval.get(),
            auth_token_file: cli.auth_token_file,
        },
        log_level: cli.log_level,
        log_format: cli.log_format,
    })
}

/// The ranges and reserved names one value alone cannot be checked for.
fn check(cli: &Cli) -> Result<()> {
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
