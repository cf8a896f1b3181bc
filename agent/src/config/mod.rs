//! Flags, environment variables and the config file, merged into [`AgentOptions`].
//!
//! Every flag `--some-flag` can also come from the environment variable `GPUWATCH_SOME_FLAG`
//! and from the key `some_flag` of the TOML file given by `--config` (or `GPUWATCH_CONFIG`).
//! Precedence: flag > env > file > default. Which flags were really typed on the command line
//! is told by clap's [`clap::ArgMatches::value_source`]; a value from a lower layer is used only
//! where the flag's source is the default or absent.
//!
//! The environment is passed in as a lookup function, so the precedence is tested without
//! touching the process environment.
//!
//! | piece | file |
//! |---|---|
//! | the command line ([`Cli`], clap) and its `--help` text | `cli.rs` |
//! | the TOML file ([`FileConfig`]) read into a `Layer` | `file.rs` |
//! | the `GPUWATCH_*` environment read into a `Layer` | `env.rs` |
//! | flag > env > file > default, checks, [`AgentOptions`] | `merge.rs` |
//! | value parsers shared by the three layers | `parse.rs` |
//! | the `OTEL_EXPORTER_OTLP_*` and `OTEL_RESOURCE_ATTRIBUTES` variables, below all three | `otel.rs` |
//! | the options, their defaults, [`load`] | this file |

mod cli;
mod env;
mod file;
mod merge;
mod otel;
mod parse;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, ValueEnum};

use crate::error::Result;
use crate::hostname::hostname;

pub use cli::Cli;
pub use file::FileConfig;
pub use merge::{default_host, seed_from_host};
pub use parse::{parse_duration, parse_label, parse_metrics_addr};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies, gzip-compressed.
    #[default]
    Http,
    /// OTLP/gRPC (MetricsService/Export), gzip-compressed.
    Grpc,
}

/// Where samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
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
}

/// Parse the command line `args` (the first item is the program name), read the environment
/// through `env`, read the config file, and merge them: flag > env > file > default.
pub fn load<I, T>(args: I, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let env_layer = env::env_layer(env)?;
    let config_path = if merge::typed(&matches, "config") {
        cli.config.clone()
    } else {
        env_layer.config.clone()
    };
    let file_layer = match &config_path {
        Some(path) => file::file_layer(path)?,
        None => merge::Layer::default(),
    };
    let otel_env = otel::read(env)?;
    merge::merge(&cli, &matches, env_layer, file_layer, otel_env)
}

#[cfg(test)]
mod tests;
