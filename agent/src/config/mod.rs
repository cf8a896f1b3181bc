//! Flags, environment variables and the config file, merged into [`AgentOptions`].
//!
//! Every setting is one field of [`Cli`] (flag, `GPUWATCH_*` variable, TOML key, default and
//! help in one declaration); `gpuwatch_common::settings` merges them with the server's
//! precedence, flag > env > file > default. The environment is passed in as a lookup function,
//! so the precedence is tested without touching the process environment. Below all three come
//! the OpenTelemetry SDK variables (`OTEL_EXPORTER_OTLP_*`, `OTEL_RESOURCE_ATTRIBUTES`), merged
//! in one call of `validate.rs`.
//!
//! | piece | file |
//! |---|---|
//! | every setting ([`Cli`]) and the `--help` text | `cli.rs` |
//! | checks across settings, defaults that depend on others, [`AgentOptions`] | `validate.rs` |
//! | the `OTEL_EXPORTER_OTLP_*` and `OTEL_RESOURCE_ATTRIBUTES` variables, below all three | `otel.rs` |
//! | the options, their defaults, the value types, [`load`] | this file |

mod cli;
mod otel;
mod validate;

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{CommandFactory, ValueEnum};
use gpuwatch_common::logging::LogFormat;
use gpuwatch_common::settings::{self, Sources};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::hostname::hostname;

pub use cli::Cli;
pub use gpuwatch_common::duration::parse_duration;
pub use validate::{default_host, seed_from_host};

/// Default OTLP/HTTP endpoint (the server's `--otlp-http-addr`).
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4318";
/// Default collection interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Default `--flush-interval`: collections wait at most this long to be sent together.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);
/// Default number of simulated GPUs.
pub const DEFAULT_SYNTHETIC_GPUS: usize = 8;
/// Most simulated GPUs one agent may have.
pub const MAX_SYNTHETIC_GPUS: usize = 1024;
/// Shortest accepted interval.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Default `--metrics-addr` (dcgm-exporter's port).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9400";
/// Default `--buffer-max-bytes`: 256 MiB.
pub const DEFAULT_BUFFER_MAX_BYTES: u64 = 256 << 20;
/// Most MIG instances of one GPU (an A100/H100 has at most 7).
pub const MAX_FAKE_MIG: u32 = 7;
/// Smallest accepted `--buffer-max-bytes`.
pub const MIN_BUFFER_MAX_BYTES: u64 = 64 << 10;

/// Wire protocol to the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies, gzip-compressed.
    #[default]
    Http,
    /// OTLP/gRPC (MetricsService/Export), gzip-compressed.
    Grpc,
}

/// Where samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// NVML when libnvidia-ml.so.1 loads; otherwise exit with a message saying so (never
    /// falls back to simulated data).
    #[default]
    Auto,
    /// NVML, the NVIDIA Management Library (real GPUs).
    Nvml,
    /// A simulated node of H100s running jobs (clearly labelled simulated).
    Synthetic,
    /// A simulated NVML for tests on hosts without GPUs: --synthetic-gpus idle GPUs whose
    /// processes are those holding `<--fake-dev-dir>/nvidia<N>` open; job attribution applies
    /// (labelled simulated).
    Fake,
}

/// `--metrics-addr`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<SocketAddr>);

/// Parse `--metrics-addr`: `host:port`, or `off` / `none` / empty to disable.
pub fn parse_metrics_addr(value: &str) -> Result<MetricsAddr, String> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") {
        return Ok(MetricsAddr(None));
    }
    v.parse::<SocketAddr>()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("expected an address such as 127.0.0.1:9400, or off; got {v:?}"))
}

impl FromStr for MetricsAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_metrics_addr(s)
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("off"),
        }
    }
}

/// A static label `key=value` (`--label`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label(pub String, pub String);

/// Parse `key=value`.
pub fn parse_label(value: &str) -> Result<(String, String)> {
    let bad = || Error::BadLabel {
        value: value.to_string(),
    };
    let (k, v) = value.split_once('=').ok_or_else(bad)?;
    let k = k.trim();
    if k.is_empty() {
        return Err(bad());
    }
    Ok((k.to_string(), v.trim().to_string()))
}

impl FromStr for Label {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_label(s)
            .map(|(k, v)| Label(k, v))
            .map_err(|e| e.to_string())
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.0, self.1)
    }
}

// Both are written as text in the config file, as on the command line.
impl Serialize for MetricsAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MetricsAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A header `KEY=VALUE` sent with every request (`--header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header(pub String, pub String);

impl FromStr for Header {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        otel::check_header(&k, &v)?;
        Ok(Header(k, v))
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.0, self.1)
    }
}

impl Serialize for Header {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// What the agent does: everything [`crate::run`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentOptions {
    /// OTLP endpoint (`/v1/metrics` is appended unless present).
    pub endpoint: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Time between samples.
    pub interval: Duration,
    /// Where samples come from.
    pub source: SourceKind,
    /// Simulated GPUs (synthetic source only).
    pub synthetic_gpus: usize,
    /// `host.name` on every request.
    pub host: String,
    /// Static resource attributes.
    pub labels: Vec<(String, String)>,
    /// Seed of the simulated fleet.
    pub seed: u64,
    /// Collect once, print JSON, send nothing.
    pub once: bool,
    /// Job mapping directory (Slurm prolog/epilog).
    pub job_mapping_dir: PathBuf,
    /// The kubelet's pod-resources socket (used while it exists).
    pub pod_resources_socket: PathBuf,
    /// Pod labels to carry, and how to read them from the kubelet.
    pub kubelet: crate::attribute::kubelet::KubeletOptions,
    /// Where `/metrics` is served; `None`: nowhere.
    pub metrics_addr: Option<SocketAddr>,
    /// Disk spool directory; `None`: an in-memory queue.
    pub buffer_dir: Option<PathBuf>,
    /// Disk spool bound, bytes.
    pub buffer_max_bytes: u64,
    /// Device nodes of `--source fake`.
    pub fake_dev_dir: PathBuf,
    /// MIG instances per GPU of `--source fake` (0: MIG off).
    pub fake_mig: u32,
    /// Least time between reads of the costly NVML counters (energy, per-process utilisation),
    /// and between two looks at the GPU count and MIG modes.
    pub slow_interval: Duration,
    /// Longest time a collection waits to be sent together with the next ones.
    pub flush_interval: Duration,
    /// File holding the bearer token sent to the endpoint; `None`: no `Authorization`.
    pub auth_token_file: Option<PathBuf>,
    /// Headers, timeout, compression and TLS of the requests (`--header`, `OTEL_EXPORTER_OTLP_*`).
    pub export: crate::export::ExportOptions,
}

impl Default for AgentOptions {
    /// The defaults of the command line, except that no `/metrics` listener is started (the
    /// server's `demo` runs several agents in one process); the host is this machine's hostname.
    fn default() -> Self {
        let host = hostname();
        AgentOptions {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            protocol: Protocol::Http,
            interval: DEFAULT_INTERVAL,
            source: SourceKind::Auto,
            synthetic_gpus: DEFAULT_SYNTHETIC_GPUS,
            seed: seed_from_host(&host),
            host,
            labels: Vec::new(),
            once: false,
            job_mapping_dir: PathBuf::from(crate::attribute::DEFAULT_JOB_MAPPING_DIR),
            pod_resources_socket: PathBuf::from(
                crate::attribute::kubernetes::DEFAULT_POD_RESOURCES_SOCKET,
            ),
            kubelet: crate::attribute::kubelet::KubeletOptions::default(),
            metrics_addr: None,
            buffer_dir: None,
            buffer_max_bytes: DEFAULT_BUFFER_MAX_BYTES,
            fake_dev_dir: PathBuf::from("/dev"),
            fake_mig: 0,
            slow_interval: crate::collect::nvml::DEFAULT_SLOW_INTERVAL,
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            auth_token_file: None,
            export: crate::export::ExportOptions::default(),
        }
    }
}

impl AgentOptions {
    /// Options for a simulated host: `gpus` synthetic H100s named `host`, from `seed`,
    /// sending to `endpoint`. What the server's `demo` uses.
    pub fn synthetic(endpoint: &str, host: &str, gpus: usize, seed: u64) -> Self {
        AgentOptions {
            endpoint: endpoint.to_string(),
            protocol: Protocol::Http,
            interval: DEFAULT_INTERVAL,
            source: SourceKind::Synthetic,
            synthetic_gpus: gpus,
            host: host.to_string(),
            labels: Vec::new(),
            seed,
            once: false,
            ..AgentOptions::default()
        }
    }
}

/// The agent's options plus what only the binary needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// What the agent does.
    pub agent: AgentOptions,
    /// Log filter for tracing-subscriber's `EnvFilter`.
    pub log_level: String,
    /// Text or JSON log lines.
    pub log_format: LogFormat,
}

/// Parse the command line `args` (the first item is the program name), read the environment
/// through `env`, read the config file, and merge them: flag > env > file > default.
pub fn load<I, T>(args: I, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let loaded = settings::load::<Cli, _, _>(
        Cli::command(),
        args,
        Sources {
            env,
            other_keys: &[],
        },
    )?;
    // The OTEL_* variables sit below every setting of the agent's own: validate merges them.
    let otel_env = otel::read(env)?;
    validate::validate(loaded.settings, &loaded.given, otel_env)
}

/// The settings a config file's `text` gives (read from `path`, for messages), over the
/// defaults.
pub fn parse_file(path: &Path, text: &str) -> Result<Cli> {
    let cmd = Cli::command();
    let no_env = |_: &str| None;
    let matches = settings::parse(&cmd, vec!["gpuwatch-agent".into()], &no_env)?;
    let loaded = settings::resolve_text::<Cli>(
        &cmd,
        matches,
        Some(path),
        text,
        Sources {
            env: &no_env,
            other_keys: &[],
        },
    )?;
    Ok(loaded.settings)
}

#[cfg(test)]
mod tests;
