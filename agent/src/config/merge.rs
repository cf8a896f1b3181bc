//! The merge of the three layers, flag > env > file > default, and the checks on the result.

use std::path::PathBuf;
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::otel::OtelEnv;
use super::{
    AgentOptions, Cli, MAX_FAKE_MIG, MAX_SYNTHETIC_GPUS, MIN_BUFFER_MAX_BYTES, MIN_INTERVAL,
    MetricsAddr, Protocol, Settings, SourceKind,
};
use crate::error::{Error, Result};
use crate::hostname::hostname;

/// One layer of settings (environment or file), every value optional.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Layer {
    pub(super) endpoint: Option<String>,
    pub(super) protocol: Option<Protocol>,
    pub(super) interval: Option<Duration>,
    pub(super) source: Option<SourceKind>,
    pub(super) synthetic_gpus: Option<usize>,
    pub(super) host: Option<String>,
    pub(super) label: Option<Vec<(String, String)>>,
    pub(super) seed: Option<u64>,
    pub(super) once: Option<bool>,
    pub(super) config: Option<PathBuf>,
    pub(super) log_level: Option<String>,
    pub(super) job_mapping_dir: Option<PathBuf>,
    pub(super) pod_resources_socket: Option<PathBuf>,
    pub(super) metrics_addr: Option<MetricsAddr>,
    pub(super) buffer_dir: Option<PathBuf>,
    pub(super) buffer_max_bytes: Option<u64>,
    pub(super) fake_dev_dir: Option<PathBuf>,
    pub(super) fake_mig: Option<u32>,
    pub(super) slow_interval: Option<Duration>,
    pub(super) flush_interval: Option<Duration>,
    pub(super) auth_token_file: Option<PathBuf>,
    pub(super) header: Option<Vec<(String, String)>>,
}

/// Whether flag `id` was typed on the command line (not a default, not absent).
pub(super) fn typed(matches: &ArgMatches, id: &str) -> bool {
    matches.value_source(id) == Some(ValueSource::CommandLine)
}

/// Pick the flag's value if typed, else env, else file, else the flag's default.
fn pick<T>(matches: &ArgMatches, id: &str, flag: T, env: Option<T>, file: Option<T>) -> T {
    if typed(matches, id) {
        return flag;
    }
    env.or(file).unwrap_or(flag)
}

fn pick_opt<T>(
    matches: &ArgMatches,
    id: &str,
    flag: Option<T>,
    env: Option<T>,
    file: Option<T>,
) -> Option<T> {
    if typed(matches, id) {
        return flag;
    }
    env.or(file).or(flag)
}

pub(super) fn merge(
    cli: &Cli,
    m: &ArgMatches,
    env: Layer,
    file: Layer,
    otel: OtelEnv,
) -> Result<Settings> {
    let protocol_given = typed(m, "protocol") || env.protocol.is_some() || file.protocol.is_some();
    let protocol = match (protocol_given, otel.protocol) {
        (false, Some(p)) => p,
        _ => pick(m, "protocol", cli.protocol, env.protocol, file.protocol),
    };
    let endpoint_given = typed(m, "endpoint") || env.endpoint.is_some() || file.endpoint.is_some();
    let endpoint = pick(
        m,
        "endpoint",
        cli.endpoint.clone(),
        env.endpoint,
        file.endpoint,
    );
    let headers = pick(m, "header", cli.header.clone(), env.header, file.header);
    let interval = pick(m, "interval", cli.interval, env.interval, file.interval);
    let source = pick(m, "source", cli.source, env.source, file.source);
    let synthetic_gpus = pick(
        m,
        "synthetic_gpus",
        cli.synthetic_gpus,
        env.synthetic_gpus,
        file.synthetic_gpus,
    );
    let host = pick_opt(m, "host", cli.host.clone(), env.host, file.host);
    let labels = pick(m, "label", cli.label.clone(), env.label, file.label);
    let seed = pick_opt(m, "seed", cli.seed, env.seed, file.seed);
    let once = pick(m, "once", cli.once, env.once, file.once);
    let log_level = pick(
        m,
        "log_level",
        cli.log_level.clone(),
        env.log_level,
        file.log_level,
    );

    let job_mapping_dir = pick(
        m,
        "job_mapping_dir",
        cli.job_mapping_dir.clone(),
        env.job_mapping_dir,
        file.job_mapping_dir,
    );
    let pod_resources_socket = pick(
        m,
        "pod_resources_socket",
        cli.pod_resources_socket.clone(),
        env.pod_resources_socket,
        file.pod_resources_socket,
    );
    let metrics_addr = pick(
        m,
        "metrics_addr",
        cli.metrics_addr,
        env.metrics_addr,
        file.metrics_addr,
    );
    let buffer_dir = pick_opt(
        m,
        "buffer_dir",
        cli.buffer_dir.clone(),
        env.buffer_dir,
        file.buffer_dir,
    );
    let buffer_max_bytes = pick(
        m,
        "buffer_max_bytes",
        cli.buffer_max_bytes,
        env.buffer_max_bytes,
        file.buffer_max_bytes,
    );
    let fake_dev_dir = pick(
        m,
        "fake_dev_dir",
        cli.fake_dev_dir.clone(),
        env.fake_dev_dir,
        file.fake_dev_dir,
    );
    let fake_mig = pick(m, "fake_mig", cli.fake_mig, env.fake_mig, file.fake_mig);
    if fake_mig > MAX_FAKE_MIG {
        return Err(Error::Invalid(format!(
            "fake_mig must be between 0 and {MAX_FAKE_MIG} (MIG instances per gpu), got {fake_mig}"
        )));
    }
    let slow_interval = pick(
        m,
        "slow_interval",
        cli.slow_interval,
        env.slow_interval,
        file.slow_interval,
    );
    let flush_interval = pick(
        m,
        "flush_interval",
        cli.flush_interval,
        env.flush_interval,
        file.flush_interval,
    );
    let auth_token_file = pick_opt(
        m,
        "auth_token_file",
        cli.auth_token_file.clone(),
        env.auth_token_file,
        file.auth_token_file,
    );
    if auth_token_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err(Error::Invalid(
            "auth_token_file is empty: give the path of the token file or leave it out".to_string(),
        ));
    }
    if buffer_max_bytes < MIN_BUFFER_MAX_BYTES {
        return Err(Error::Invalid(format!(
            "buffer_max_bytes {buffer_max_bytes} is too small: use at least {MIN_BUFFER_MAX_BYTES}"
        )));
    }
    if interval < MIN_INTERVAL {
        return Err(Error::Invalid(format!(
            "interval {} is too short: use at least 100ms",
            humantime::format_duration(interval)
        )));
    }
    if matches!(source, SourceKind::Synthetic | SourceKind::Fake)
        && !(1..=MAX_SYNTHETIC_GPUS).contains(&synthetic_gpus)
    {
        return Err(Error::Invalid(format!(
            "synthetic_gpus must be between 1 and {MAX_SYNTHETIC_GPUS}, got {synthetic_gpus}"
        )));
    }
    for (key, _) in &labels {
        if key == "host.name" || key == "gpuwatch.simulated" {
            return Err(Error::ReservedLabel { key: key.clone() });
        }
    }
    if log_level.trim().is_empty() {
        return Err(Error::Invalid(
            "log_level is empty: use e.g. info".to_string(),
        ));
    }
    let host = match host.map(|h| h.trim().to_string()) {
        Some(h) if h.is_empty() => {
            return Err(Error::Invalid(
                "host is empty: give a name or leave it out".to_string(),
            ));
        }
        other => other,
    };
    // The one place the OTEL_* variables come in, below every setting of the agent's own.
    let otel = super::otel::apply(
        otel,
        super::otel::Own {
            endpoint_given,
            endpoint,
            protocol,
            headers,
            labels,
            host,
        },
    )?;
    let (endpoint, labels, export) = (otel.endpoint, otel.labels, otel.export);
    let host = match otel.host {
        Some(h) => h,
        None => default_host(source),
    };
    let seed = seed.unwrap_or_else(|| seed_from_host(&host));
    match protocol {
        Protocol::Http if export.exact_url => reqwest_url(&endpoint)?,
        Protocol::Http => crate::export::metrics_url(&endpoint).map(drop)?,
        Protocol::Grpc => crate::export::grpc_url(&endpoint).map(drop)?,
    }
    Ok(Settings {
        agent: AgentOptions {
            endpoint,
            protocol,
            interval,
            source,
            synthetic_gpus,
            host,
            labels,
            seed,
            once,
            job_mapping_dir,
            pod_resources_socket,
            metrics_addr: metrics_addr.0,
            buffer_dir,
            buffer_max_bytes,
            fake_dev_dir,
            fake_mig,
            slow_interval,
            flush_interval,
            auth_token_file,
            export,
        },
        log_level,
    })
}

/// Checks a full OTLP/HTTP URL given as is.
fn reqwest_url(endpoint: &str) -> Result<()> {
    match url_scheme(endpoint) {
        Some("http" | "https") => Ok(()),
        _ => Err(Error::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: "it must be an http:// or https:// URL".to_string(),
        }),
    }
}

fn url_scheme(s: &str) -> Option<&str> {
    s.trim().split_once("://").map(|(scheme, _)| scheme)
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
