//! Flags, environment variables and the config file, merged into [`AgentOptions`].
//!
//! Every flag `--some-flag` can also come from the environment variable `GPUWATCH_SOME_FLAG`
//! and from the key `some_flag` of the TOML file given by `--config` (or `GPUWATCH_CONFIG`).
//! Precedence: flag > env > file > default. Which flags were really typed on the command line
//! is told by clap's [`ArgMatches::value_source`]; a value from a lower layer is used only where
//! the flag's source is the default or absent.
//!
//! The environment is passed in as a lookup function, so the precedence is tested without
//! touching the process environment.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, ValueEnum};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::hostname::hostname;

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

const AFTER_HELP: &str = "\
Every flag can also be set by an environment variable GPUWATCH_<FLAG> (e.g. GPUWATCH_ENDPOINT,
GPUWATCH_SYNTHETIC_GPUS; GPUWATCH_LABEL takes a comma-separated list; GPUWATCH_ONCE=true) and
by a key of the TOML file given by --config, named like the flag with underscores:

    endpoint = \"http://gpuwatch.example:4318\"
    interval = \"10s\"
    synthetic_gpus = 4
    label = [\"cluster=prod\", \"rack=r12\"]

Precedence: flag > environment > config file > default. Unknown keys in the file are errors.
Exit codes: 0 ok, 2 usage or configuration error (or NVML not available), 1 other failure.";

/// The command line of `gpuwatch-agent`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpuwatch-agent",
    version,
    about = "gpuwatch host agent: reads the GPUs of this host (NVML) or a simulated node, \
             and streams the samples to a gpuwatch server over OTLP",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// OTLP endpoint. With http, `/v1/metrics` is appended unless already there; with grpc it
    /// is `http://host:port` and defaults to http://127.0.0.1:4317 [env: GPUWATCH_ENDPOINT]
    #[arg(long, value_name = "URL", default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,

    /// Wire protocol: `http` (OTLP/HTTP protobuf) or `grpc` (OTLP/gRPC), both gzip
    /// [env: GPUWATCH_PROTOCOL]
    #[arg(long, value_enum, default_value_t = Protocol::Http)]
    pub protocol: Protocol,

    /// Time between samples, e.g. 5s, 500ms, 1m [env: GPUWATCH_INTERVAL]
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub interval: Duration,

    /// Where samples come from. `auto` uses NVML when libnvidia-ml.so.1 loads and otherwise
    /// exits saying so; it never falls back to simulated data [env: GPUWATCH_SOURCE]
    #[arg(long, value_enum, default_value_t = SourceKind::Auto)]
    pub source: SourceKind,

    /// Number of simulated GPUs with --source synthetic [env: GPUWATCH_SYNTHETIC_GPUS]
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SYNTHETIC_GPUS)]
    pub synthetic_gpus: usize,

    /// Host name sent as `host.name`; defaults to this machine's hostname, or to
    /// `sim-<hostname>` with --source synthetic so simulated data is never mistaken for this
    /// host's [env: GPUWATCH_HOST]
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,

    /// Static label added to every sample as a resource attribute; repeatable
    /// [env: GPUWATCH_LABEL, comma-separated]
    #[arg(long, value_name = "KEY=VALUE", value_parser = label_arg)]
    pub label: Vec<(String, String)>,

    /// Seed of the simulated fleet; defaults to a hash of the host name, so each simulated
    /// host gets its own GPUs and jobs [env: GPUWATCH_SEED]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Collect once, print the samples as JSON to stdout, send nothing, exit
    /// [env: GPUWATCH_ONCE]
    #[arg(long)]
    pub once: bool,

    /// Directory of job mapping files written by the Slurm prolog/epilog (dcgm-exporter's
    /// --hpc-job-mapping-dir layout: one file per GPU index, or `index.gi` for MIG, holding
    /// job ids one per line) [env: GPUWATCH_JOB_MAPPING_DIR]
    #[arg(long, value_name = "DIR", default_value = crate::attribute::DEFAULT_JOB_MAPPING_DIR)]
    pub job_mapping_dir: PathBuf,

    /// The kubelet's pod-resources socket (v1 PodResourcesLister); while it exists, each GPU
    /// is labelled with the pod holding it, asked again at every collection
    /// [env: GPUWATCH_POD_RESOURCES_SOCKET]
    #[arg(long, value_name = "PATH", default_value = crate::attribute::kubernetes::DEFAULT_POD_RESOURCES_SOCKET)]
    pub pod_resources_socket: PathBuf,

    /// Where the Prometheus exposition (dcgm-exporter names, plus the agent's own metrics) is
    /// served on /metrics; `off` disables it [env: GPUWATCH_METRICS_ADDR]
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS_ADDR, value_parser = metrics_addr_arg)]
    pub metrics_addr: MetricsAddr,

    /// Directory of the disk spool that keeps samples while the endpoint is down (replayed in
    /// order when it is back); without it they wait in memory [env: GPUWATCH_BUFFER_DIR]
    #[arg(long, value_name = "DIR")]
    pub buffer_dir: Option<PathBuf>,

    /// Most bytes the disk spool may hold; the oldest samples are dropped (and counted) beyond
    /// [env: GPUWATCH_BUFFER_MAX_BYTES]
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BUFFER_MAX_BYTES)]
    pub buffer_max_bytes: u64,

    /// Least time between two reads of the counters that cost milliseconds of CPU per call:
    /// the energy counter (advanced by power × time in between) and per-process utilisation;
    /// the GPU count and each GPU's MIG mode are read again this often too
    /// [env: GPUWATCH_SLOW_INTERVAL]
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration_arg)]
    pub slow_interval: Duration,

    /// Longest time a collection waits before it is sent: the collections of this span go in
    /// one request (one request per collection when it is no longer than --interval, `0s`
    /// included); shutdown sends what waits [env: GPUWATCH_FLUSH_INTERVAL]
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_arg)]
    pub flush_interval: Duration,

    /// Device nodes of the fake GPUs with --source fake (`nvidia0`, `nvidia1`, …)
    /// [env: GPUWATCH_FAKE_DEV_DIR]
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub fake_dev_dir: PathBuf,

    /// With --source fake: split every GPU into N MIG instances (0 to 7; 0: MIG off), each a
    /// row of its own [env: GPUWATCH_FAKE_MIG]
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub fake_mig: u32,

    /// TOML config file; keys are the flag names with underscores [env: GPUWATCH_CONFIG]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log filter for stderr: a level (error, warn, info, debug, trace) or tracing directives
    /// such as `gpuwatch_agent=debug` [env: GPUWATCH_LOG_LEVEL]
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log_level: String,
}

/// The config file: the same settings as the flags, keys named like them with underscores.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// OTLP endpoint.
    pub endpoint: Option<String>,
    /// `http` or `grpc`.
    pub protocol: Option<String>,
    /// Humantime duration, e.g. `"5s"`.
    pub interval: Option<String>,
    /// `auto`, `nvml` or `synthetic`.
    pub source: Option<String>,
    /// Simulated GPUs.
    pub synthetic_gpus: Option<usize>,
    /// Host name.
    pub host: Option<String>,
    /// Static labels, `["key=value", …]`.
    pub label: Option<Vec<String>>,
    /// Seed of the simulated fleet.
    pub seed: Option<u64>,
    /// Collect once and print.
    pub once: Option<bool>,
    /// Log filter.
    pub log_level: Option<String>,
    /// Job mapping directory.
    pub job_mapping_dir: Option<PathBuf>,
    /// The kubelet's pod-resources socket.
    pub pod_resources_socket: Option<PathBuf>,
    /// `/metrics` address or `off`.
    pub metrics_addr: Option<String>,
    /// Disk spool directory.
    pub buffer_dir: Option<PathBuf>,
    /// Disk spool bound, bytes.
    pub buffer_max_bytes: Option<u64>,
    /// Device nodes of `--source fake`.
    pub fake_dev_dir: Option<PathBuf>,
    /// MIG instances per GPU of `--source fake`.
    pub fake_mig: Option<u32>,
    /// Humantime duration between reads of the costly counters.
    pub slow_interval: Option<String>,
    /// Humantime duration a collection may wait to be sent with the next ones.
    pub flush_interval: Option<String>,
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

/// One layer of settings (environment or file), every value optional.
#[derive(Debug, Default, Clone, PartialEq)]
struct Layer {
    endpoint: Option<String>,
    protocol: Option<Protocol>,
    interval: Option<Duration>,
    source: Option<SourceKind>,
    synthetic_gpus: Option<usize>,
    host: Option<String>,
    label: Option<Vec<(String, String)>>,
    seed: Option<u64>,
    once: Option<bool>,
    config: Option<PathBuf>,
    log_level: Option<String>,
    job_mapping_dir: Option<PathBuf>,
    pod_resources_socket: Option<PathBuf>,
    metrics_addr: Option<MetricsAddr>,
    buffer_dir: Option<PathBuf>,
    buffer_max_bytes: Option<u64>,
    fake_dev_dir: Option<PathBuf>,
    fake_mig: Option<u32>,
    slow_interval: Option<Duration>,
    flush_interval: Option<Duration>,
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
    let env_layer = env_layer(env)?;
    let config_path = if typed(&matches, "config") {
        cli.config.clone()
    } else {
        env_layer.config.clone()
    };
    let file_layer = match &config_path {
        Some(path) => file_layer(path)?,
        None => Layer::default(),
    };
    merge(&cli, &matches, env_layer, file_layer)
}

/// Whether flag `id` was typed on the command line (not a default, not absent).
fn typed(matches: &ArgMatches, id: &str) -> bool {
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

fn merge(cli: &Cli, m: &ArgMatches, env: Layer, file: Layer) -> Result<Settings> {
    let protocol = pick(m, "protocol", cli.protocol, env.protocol, file.protocol);
    // Left unset everywhere, the endpoint follows the protocol: 4318 for http, 4317 for grpc.
    let endpoint_given = typed(m, "endpoint") || env.endpoint.is_some() || file.endpoint.is_some();
    let endpoint = pick(
        m,
        "endpoint",
        cli.endpoint.clone(),
        env.endpoint,
        file.endpoint,
    );
    let endpoint = if !endpoint_given && protocol == Protocol::Grpc {
        crate::export::DEFAULT_GRPC_ENDPOINT.to_string()
    } else {
        endpoint
    };
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
        Some(h) => h,
        None => default_host(source),
    };
    let seed = seed.unwrap_or_else(|| seed_from_host(&host));
    match protocol {
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
        },
        log_level,
    })
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

/// Parse a humantime duration (`5s`, `500ms`, `1m`).
pub fn parse_duration(value: &str) -> Result<Duration> {
    humantime::parse_duration(value.trim()).map_err(|e| Error::BadDuration {
        value: value.to_string(),
        reason: e.to_string(),
    })
}

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

fn duration_arg(value: &str) -> Result<Duration, String> {
    parse_duration(value).map_err(|e| e.to_string())
}

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

fn metrics_addr_arg(value: &str) -> Result<MetricsAddr, String> {
    parse_metrics_addr(value)
}

fn label_arg(value: &str) -> Result<(String, String), String> {
    parse_label(value).map_err(|e| e.to_string())
}

fn value_enum<T: ValueEnum>(value: &str) -> Result<T, String> {
    T::from_str(value.trim(), true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("expected one of: {}", names.join(", "))
    })
}

fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".to_string()),
    }
}

/// The environment layer. Empty variables count as unset.
fn env_layer(env: &dyn Fn(&str) -> Option<String>) -> Result<Layer> {
    fn get<T>(
        env: &dyn Fn(&str) -> Option<String>,
        var: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>> {
        let Some(value) = env(var).filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        parse(&value).map(Some).map_err(|reason| Error::BadEnv {
            var: var.to_string(),
            value,
            reason,
        })
    }
    let string = |v: &str| Ok(v.trim().to_string());
    Ok(Layer {
        endpoint: get(env, "GPUWATCH_ENDPOINT", string)?,
        protocol: get(env, "GPUWATCH_PROTOCOL", value_enum::<Protocol>)?,
        interval: get(env, "GPUWATCH_INTERVAL", duration_arg)?,
        source: get(env, "GPUWATCH_SOURCE", value_enum::<SourceKind>)?,
        synthetic_gpus: get(env, "GPUWATCH_SYNTHETIC_GPUS", |v| {
            v.trim().parse::<usize>().map_err(|e| e.to_string())
        })?,
        host: get(env, "GPUWATCH_HOST", string)?,
        label: get(env, "GPUWATCH_LABEL", |v| {
            v.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(label_arg)
                .collect::<Result<Vec<_>, String>>()
        })?,
        seed: get(env, "GPUWATCH_SEED", |v| {
            v.trim().parse::<u64>().map_err(|e| e.to_string())
        })?,
        once: get(env, "GPUWATCH_ONCE", parse_bool)?,
        config: get(env, "GPUWATCH_CONFIG", |v| Ok(PathBuf::from(v.trim())))?,
        log_level: get(env, "GPUWATCH_LOG_LEVEL", string)?,
        job_mapping_dir: get(env, "GPUWATCH_JOB_MAPPING_DIR", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        pod_resources_socket: get(env, "GPUWATCH_POD_RESOURCES_SOCKET", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        metrics_addr: get(env, "GPUWATCH_METRICS_ADDR", parse_metrics_addr)?,
        buffer_dir: get(env, "GPUWATCH_BUFFER_DIR", |v| Ok(PathBuf::from(v.trim())))?,
        buffer_max_bytes: get(env, "GPUWATCH_BUFFER_MAX_BYTES", |v| {
            v.trim().parse::<u64>().map_err(|e| e.to_string())
        })?,
        fake_dev_dir: get(env, "GPUWATCH_FAKE_DEV_DIR", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        fake_mig: get(env, "GPUWATCH_FAKE_MIG", |v| {
            v.trim().parse::<u32>().map_err(|e| e.to_string())
        })?,
        slow_interval: get(env, "GPUWATCH_SLOW_INTERVAL", duration_arg)?,
        flush_interval: get(env, "GPUWATCH_FLUSH_INTERVAL", duration_arg)?,
    })
}

/// Read and parse the config file at `path`.
fn file_layer(path: &Path) -> Result<Layer> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &text)
}

/// Parse config file `text` (read from `path`, for messages).
fn parse_file(path: &Path, text: &str) -> Result<Layer> {
    let bad = |message: String| Error::ConfigParse {
        path: path.to_path_buf(),
        message,
    };
    let file: FileConfig =
        toml::from_str(text).map_err(|e| bad(e.to_string().trim().to_string()))?;
    let field = |key: &str, message: String| bad(format!("key `{key}`: {message}"));
    Ok(Layer {
        endpoint: file.endpoint,
        protocol: file
            .protocol
            .map(|v| value_enum::<Protocol>(&v).map_err(|m| field("protocol", m)))
            .transpose()?,
        interval: file
            .interval
            .map(|v| parse_duration(&v).map_err(|e| field("interval", e.to_string())))
            .transpose()?,
        source: file
            .source
            .map(|v| value_enum::<SourceKind>(&v).map_err(|m| field("source", m)))
            .transpose()?,
        synthetic_gpus: file.synthetic_gpus,
        host: file.host,
        label: file
            .label
            .map(|labels| {
                labels
                    .iter()
                    .map(|l| parse_label(l).map_err(|e| field("label", e.to_string())))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?,
        seed: file.seed,
        once: file.once,
        config: None,
        log_level: file.log_level,
        job_mapping_dir: file.job_mapping_dir,
        pod_resources_socket: file.pod_resources_socket,
        metrics_addr: file
            .metrics_addr
            .map(|v| parse_metrics_addr(&v).map_err(|m| field("metrics_addr", m)))
            .transpose()?,
        buffer_dir: file.buffer_dir,
        buffer_max_bytes: file.buffer_max_bytes,
        fake_dev_dir: file.fake_dev_dir,
        fake_mig: file.fake_mig,
        slow_interval: file
            .slow_interval
            .map(|v| parse_duration(&v).map_err(|e| field("slow_interval", e.to_string())))
            .transpose()?,
        flush_interval: file
            .flush_interval
            .map(|v| parse_duration(&v).map_err(|e| field("flush_interval", e.to_string())))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// A config file in the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, text: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!(
                "gpuwatch-agent-test-{}-{name}.toml",
                std::process::id()
            ));
            std::fs::write(&path, text).unwrap();
            TempFile(path)
        }

        fn arg(&self) -> String {
            self.0.display().to_string()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn load_with(args: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Result<Settings> {
        load(
            std::iter::once("gpuwatch-agent").chain(args.iter().copied()),
            env,
        )
    }

    #[test]
    fn defaults() {
        let s = load_with(&[], &no_env).unwrap();
        let a = &s.agent;
        assert_eq!(a.endpoint, "http://127.0.0.1:4318");
        assert_eq!(a.protocol, Protocol::Http);
        assert_eq!(a.interval, Duration::from_secs(5));
        assert_eq!(a.source, SourceKind::Auto);
        assert_eq!(a.synthetic_gpus, 8);
        assert_eq!(a.host, hostname());
        assert_eq!(a.seed, seed_from_host(&a.host));
        assert!(a.labels.is_empty());
        assert!(!a.once);
        assert_eq!(s.log_level, "info");
    }

    #[test]
    fn synthetic_host_is_labelled_simulated() {
        let s = load_with(&["--source", "synthetic"], &no_env).unwrap();
        assert_eq!(s.agent.host, format!("sim-{}", hostname()));
        let s = load_with(&["--source", "synthetic", "--host", "lab1"], &no_env).unwrap();
        assert_eq!(s.agent.host, "lab1");
    }

    #[test]
    fn flags() {
        let s = load_with(
            &[
                "--endpoint",
                "http://gw:9500",
                "--protocol",
                "http",
                "--interval",
                "250ms",
                "--source",
                "synthetic",
                "--synthetic-gpus",
                "4",
                "--host",
                "n1",
                "--label",
                "cluster=prod",
                "--label",
                "rack = r12",
                "--seed",
                "42",
                "--once",
                "--log-level",
                "debug",
            ],
            &no_env,
        )
        .unwrap();
        let a = &s.agent;
        assert_eq!(a.endpoint, "http://gw:9500");
        assert_eq!(a.interval, Duration::from_millis(250));
        assert_eq!(a.source, SourceKind::Synthetic);
        assert_eq!(a.synthetic_gpus, 4);
        assert_eq!(a.host, "n1");
        assert_eq!(
            a.labels,
            vec![
                ("cluster".to_string(), "prod".to_string()),
                ("rack".to_string(), "r12".to_string())
            ]
        );
        assert_eq!(a.seed, 42);
        assert!(a.once);
        assert_eq!(s.log_level, "debug");
    }

    #[test]
    fn precedence_flag_env_file_default() {
        let file = TempFile::new(
            "precedence",
            r#"
endpoint = "http://file:1"
interval = "30s"
synthetic_gpus = 3
source = "synthetic"
label = ["from=file"]
seed = 7
host = "file-host"
"#,
        );
        let env = env_of(&[
            ("GPUWATCH_CONFIG", &file.arg()),
            ("GPUWATCH_ENDPOINT", "http://env:2"),
            ("GPUWATCH_INTERVAL", "20s"),
            ("GPUWATCH_LABEL", "from=env,second=yes"),
            ("GPUWATCH_HOST", ""),
        ]);
        let s = load_with(&["--endpoint", "http://flag:3"], &env).unwrap();
        let a = &s.agent;
        // flag beats env and file
        assert_eq!(a.endpoint, "http://flag:3");
        // env beats file
        assert_eq!(a.interval, Duration::from_secs(20));
        assert_eq!(a.labels.len(), 2);
        assert_eq!(a.labels[0], ("from".to_string(), "env".to_string()));
        // file beats default (an empty env var counts as unset)
        assert_eq!(a.synthetic_gpus, 3);
        assert_eq!(a.source, SourceKind::Synthetic);
        assert_eq!(a.seed, 7);
        assert_eq!(a.host, "file-host");
        // default where nobody says anything
        assert_eq!(s.log_level, "info");
        assert_eq!(a.protocol, Protocol::Http);

        // A flag typed with the default value still wins over env and file.
        let s = load_with(&["--synthetic-gpus", "8", "--interval", "5s"], &env).unwrap();
        assert_eq!(s.agent.synthetic_gpus, 8);
        assert_eq!(s.agent.interval, Duration::from_secs(5));

        // --config beats GPUWATCH_CONFIG.
        let other = TempFile::new("other", "synthetic_gpus = 5\n");
        let s = load_with(&["--config", &other.arg()], &env).unwrap();
        assert_eq!(s.agent.synthetic_gpus, 5);
        assert_eq!(s.agent.interval, Duration::from_secs(20));
    }

    #[test]
    fn env_values_are_parsed() {
        let env = env_of(&[
            ("GPUWATCH_SOURCE", "Synthetic"),
            ("GPUWATCH_SYNTHETIC_GPUS", "2"),
            ("GPUWATCH_ONCE", "true"),
            ("GPUWATCH_SEED", "9"),
            ("GPUWATCH_LOG_LEVEL", "warn"),
        ]);
        let s = load_with(&[], &env).unwrap();
        assert_eq!(s.agent.source, SourceKind::Synthetic);
        assert_eq!(s.agent.synthetic_gpus, 2);
        assert!(s.agent.once);
        assert_eq!(s.agent.seed, 9);
        assert_eq!(s.log_level, "warn");
    }

    #[test]
    fn bad_label_is_a_usage_error() {
        let e = load_with(&["--label", "novalue"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("key=value"), "{e}");
        let e = load_with(&["--label", "=x"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);

        let e = load_with(&[], &env_of(&[("GPUWATCH_LABEL", "a=b,broken")])).unwrap_err();
        assert!(matches!(e, Error::BadEnv { .. }), "{e}");
        assert!(e.to_string().contains("GPUWATCH_LABEL"), "{e}");
        assert_eq!(e.exit_code(), 2);

        let file = TempFile::new("badlabel", "label = [\"oops\"]\n");
        let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
        assert!(matches!(e, Error::ConfigParse { .. }), "{e}");
        assert!(e.to_string().contains("oops"), "{e}");

        let e = load_with(&["--label", "host.name=x"], &no_env).unwrap_err();
        assert!(matches!(e, Error::ReservedLabel { .. }), "{e}");
    }

    #[test]
    fn unknown_config_key() {
        let file = TempFile::new("unknown", "endpoint = \"http://x:1\"\nsynthetic_gpu = 4\n");
        let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(msg.contains("synthetic_gpu"), "{msg}");
        assert!(msg.contains(&file.arg()), "{msg}");
    }

    #[test]
    fn bad_values() {
        // Bad duration: on the command line, in env, in the file.
        let e = load_with(&["--interval", "5 parsecs"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = load_with(&[], &env_of(&[("GPUWATCH_INTERVAL", "soon")])).unwrap_err();
        assert!(e.to_string().contains("GPUWATCH_INTERVAL"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let file = TempFile::new("baddur", "interval = \"5x\"\n");
        let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
        assert!(e.to_string().contains("interval"), "{e}");
        assert_eq!(e.exit_code(), 2);
        // A type error in the file.
        let file = TempFile::new("badtype", "synthetic_gpus = \"four\"\n");
        let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        // Missing file.
        let e = load_with(&["--config", "/nonexistent/gpuwatch.toml"], &no_env).unwrap_err();
        assert!(matches!(e, Error::ConfigRead { .. }), "{e}");
        assert_eq!(e.exit_code(), 2);
        // Protocols.
        let e = load_with(&["--protocol", "udp"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = load_with(&[], &env_of(&[("GPUWATCH_PROTOCOL", "udp")])).unwrap_err();
        assert!(e.to_string().contains("expected one of: http, grpc"), "{e}");
        // MIG instances of the fake source.
        let e = load_with(&["--source", "fake", "--fake-mig", "8"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("fake_mig"), "{e}");
        let a = load_with(
            &["--source", "fake"],
            &env_of(&[("GPUWATCH_FAKE_MIG", "3")]),
        )
        .unwrap()
        .agent;
        assert_eq!(a.fake_mig, 3);
        // A grpc endpoint has no path and no tls.
        for bad in ["http://gw:4317/v1/metrics", "https://gw:4317"] {
            let e = load_with(&["--protocol", "grpc", "--endpoint", bad], &no_env).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        // Out of range.
        let e = load_with(&["--interval", "1ms"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e =
            load_with(&["--source", "synthetic", "--synthetic-gpus", "0"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = load_with(&["--endpoint", "127.0.0.1:4318"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        // Unknown flag.
        let e = load_with(&["--frobnicate"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn grpc_protocol_and_its_default_endpoint() {
        // Nothing says where: the grpc port.
        let a = load_with(&["--protocol", "grpc"], &no_env).unwrap().agent;
        assert_eq!(a.protocol, Protocol::Grpc);
        assert_eq!(a.endpoint, "http://127.0.0.1:4317");
        let a = load_with(&[], &env_of(&[("GPUWATCH_PROTOCOL", "grpc")]))
            .unwrap()
            .agent;
        assert_eq!(a.endpoint, "http://127.0.0.1:4317");
        // An endpoint given anywhere wins.
        let a = load_with(
            &["--protocol", "grpc"],
            &env_of(&[("GPUWATCH_ENDPOINT", "http://gw:14317")]),
        )
        .unwrap()
        .agent;
        assert_eq!(a.endpoint, "http://gw:14317");
        let file = TempFile::new(
            "grpc",
            "protocol = \"grpc\"\nendpoint = \"http://gw:4317\"\n",
        );
        let a = load_with(&["--config", &file.arg()], &no_env)
            .unwrap()
            .agent;
        assert_eq!(a.protocol, Protocol::Grpc);
        assert_eq!(a.endpoint, "http://gw:4317");
        // The flag beats the file.
        let a = load_with(&["--config", &file.arg(), "--protocol", "http"], &no_env)
            .unwrap()
            .agent;
        assert_eq!(a.protocol, Protocol::Http);
    }

    #[test]
    fn help_and_version_exit_zero() {
        let e = load_with(&["--help"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 0);
        let help = e.to_string();
        for flag in [
            "--endpoint",
            "--protocol",
            "--interval",
            "--source",
            "--synthetic-gpus",
            "--host",
            "--label",
            "--seed",
            "--once",
            "--config",
            "--log-level",
            "GPUWATCH_SYNTHETIC_GPUS",
            "grpc",
        ] {
            assert!(help.contains(flag), "--help lacks {flag}");
        }
        let e = load_with(&["--version"], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 0);
    }

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn example_file_parses() {
        let text = "endpoint = \"http://gw:4318\"\nprotocol = \"http\"\ninterval = \"10s\"\n\
                    source = \"nvml\"\nsynthetic_gpus = 4\nhost = \"n1\"\nlabel = [\"a=b\"]\n\
                    seed = 1\nonce = false\nlog_level = \"info\"\n";
        let layer = parse_file(Path::new("x.toml"), text).unwrap();
        assert_eq!(layer.source, Some(SourceKind::Nvml));
        assert_eq!(layer.interval, Some(Duration::from_secs(10)));
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn the_shipped_example_parses() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpuwatch-agent.example.toml");
        let text = std::fs::read_to_string(&path).expect("deploy/gpuwatch-agent.example.toml");
        parse_file(&path, &text).expect("the example parses");
    }
}
