//! Every setting of `gpuwatch-agent`, declared once: the field's name is the config file's key,
//! its `#[arg]` the flag, the `GPUWATCH_*` variable and the default, its doc comment the
//! `--help` text (and docs/configuration.md's agent table). `super::load` merges flag > env >
//! file > default for all of them (`gpuwatch_common::settings`).

use std::path::PathBuf;

use clap::Parser;
use gpuwatch_common::HumanDuration;
use gpuwatch_common::logging::LogFormat;
use serde::{Deserialize, Serialize};

use super::{
    DEFAULT_BUFFER_MAX_BYTES, DEFAULT_ENDPOINT, DEFAULT_METRICS_ADDR, DEFAULT_SYNTHETIC_GPUS,
};
use super::{Header, Label, MetricsAddr, Protocol, SourceKind};

const AFTER_HELP: &str = "\
Every flag can also be set by an environment variable GPUWATCH_<FLAG> (e.g. GPUWATCH_ENDPOINT,
GPUWATCH_SYNTHETIC_GPUS; GPUWATCH_LABEL, GPUWATCH_HEADER and GPUWATCH_POD_LABEL take a comma-separated list;
GPUWATCH_ONCE=true) and by a key of the TOML file given by --config, named like the flag with
underscores:

    endpoint = \"http://gpuwatch.example:4318\"
    interval = \"10s\"
    synthetic_gpus = 4
    label = [\"cluster=prod\", \"rack=r12\"]

Precedence: flag > environment > config file > default. Unknown keys in the file are errors.
Below those, the OpenTelemetry SDK variables are read too: OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, …_HEADERS, …_TIMEOUT (ms), …_COMPRESSION (gzip|none),
…_PROTOCOL (grpc|http/protobuf), …_CERTIFICATE, …_CLIENT_KEY, …_CLIENT_CERTIFICATE (each also
as OTEL_EXPORTER_OTLP_METRICS_…, which wins) and OTEL_RESOURCE_ATTRIBUTES.
A server run with --auth-tokens wants a bearer token with the ingest scope: put it in a file
readable only by the agent (e.g. /etc/gpuwatch/agent.token, mode 0600) and give
--auth-token-file /etc/gpuwatch/agent.token; the file is read again when it changes.
Exit codes: 0 ok, 2 usage or configuration error (or NVML not available), 1 other failure.";

/// The command line of `gpuwatch-agent`.
#[derive(Debug, Clone, Parser, Serialize, Deserialize)]
#[command(
    name = "gpuwatch-agent",
    version,
    about = "gpuwatch host agent: reads the GPUs of this host (NVML) or a simulated node, \
             and streams the samples to a gpuwatch server over OTLP",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// OTLP endpoint. With http, `/v1/metrics` is appended unless already there; with grpc it
    /// is `http://host:port` (`https://host:port` for TLS) and defaults to http://127.0.0.1:4317
    #[arg(long, env = "GPUWATCH_ENDPOINT", value_name = "URL", default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,

    /// Wire protocol: `http` (OTLP/HTTP protobuf) or `grpc` (OTLP/gRPC), both gzip
    #[arg(long, env = "GPUWATCH_PROTOCOL", value_enum, ignore_case = true, default_value_t = Protocol::Http)]
    pub protocol: Protocol,

    /// Time between samples, e.g. 5s, 500ms, 1m
    #[arg(
        long,
        env = "GPUWATCH_INTERVAL",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub interval: HumanDuration,

    /// Where samples come from. `auto` uses NVML when libnvidia-ml.so.1 loads and otherwise
    /// exits saying so; it never falls back to simulated data
    #[arg(long, env = "GPUWATCH_SOURCE", value_enum, ignore_case = true, default_value_t = SourceKind::Auto)]
    pub source: SourceKind,

    /// Number of simulated GPUs with --source synthetic
    #[arg(long, env = "GPUWATCH_SYNTHETIC_GPUS", value_name = "N", default_value_t = DEFAULT_SYNTHETIC_GPUS)]
    pub synthetic_gpus: usize,

    /// Host name sent as `host.name`; defaults to this machine's hostname, or to
    /// `sim-<hostname>` with --source synthetic so simulated data is never mistaken for this
    /// host's
    #[arg(long, env = "GPUWATCH_HOST", value_name = "NAME")]
    pub host: Option<String>,

    /// Static label added to every sample as a resource attribute; repeatable
    #[arg(long, env = "GPUWATCH_LABEL", value_name = "KEY=VALUE")]
    pub label: Vec<Label>,

    /// Seed of the simulated fleet; defaults to a hash of the host name, so each simulated
    /// host gets its own GPUs and jobs
    #[arg(long, env = "GPUWATCH_SEED", value_name = "N")]
    pub seed: Option<u64>,

    /// Collect once, print the samples as JSON to stdout, send nothing, exit
    #[arg(long, env = "GPUWATCH_ONCE")]
    pub once: bool,

    /// Directory of job mapping files written by the Slurm prolog/epilog (dcgm-exporter's
    /// --hpc-job-mapping-dir layout: one file per GPU index, or `index.gi` for MIG, holding
    /// job ids one per line)
    #[arg(long, env = "GPUWATCH_JOB_MAPPING_DIR", value_name = "DIR", default_value = crate::attribute::DEFAULT_JOB_MAPPING_DIR)]
    pub job_mapping_dir: PathBuf,

    /// The kubelet's pod-resources socket (v1 PodResourcesLister); while it exists, each GPU
    /// is labelled with the pod holding it, asked again at every collection
    #[arg(long, env = "GPUWATCH_POD_RESOURCES_SOCKET", value_name = "PATH", default_value = crate::attribute::kubernetes::DEFAULT_POD_RESOURCES_SOCKET)]
    pub pod_resources_socket: PathBuf,

    /// A pod label to carry on the pod's samples as `k8s.pod.label.<NAME>` (repeatable; env:
    /// comma-separated), read from the kubelet's /pods; statements group by it (label:NAME)
    #[arg(
        long,
        env = "GPUWATCH_POD_LABEL",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub pod_label: Vec<String>,

    /// The kubelet whose /pods gives the pod labels (with --pod-label)
    #[arg(long, env = "GPUWATCH_KUBELET_URL", value_name = "URL", default_value = crate::attribute::kubelet::DEFAULT_KUBELET_URL)]
    pub kubelet_url: String,

    /// Bearer token sent to the kubelet (read at every call; needs get on nodes/proxy)
    #[arg(long, env = "GPUWATCH_KUBELET_TOKEN_FILE", value_name = "FILE", default_value = crate::attribute::kubelet::DEFAULT_TOKEN_FILE)]
    pub kubelet_token_file: PathBuf,

    /// CA certificates (PEM) of the kubelet's serving certificate [default: the system's]
    #[arg(long, env = "GPUWATCH_KUBELET_CA_FILE", value_name = "FILE")]
    pub kubelet_ca_file: Option<PathBuf>,

    /// Accept any kubelet serving certificate (kubelets often serve a self-signed one)
    #[arg(long, env = "GPUWATCH_KUBELET_INSECURE_TLS")]
    pub kubelet_insecure_tls: bool,

    /// Where the Prometheus exposition (dcgm-exporter names, plus the agent's own metrics) is
    /// served on /metrics; `off` disables it
    #[arg(long, env = "GPUWATCH_METRICS_ADDR", value_name = "ADDR", default_value = DEFAULT_METRICS_ADDR)]
    pub metrics_addr: MetricsAddr,

    /// Directory of the disk spool that keeps samples while the endpoint is down (replayed in
    /// order when it is back); without it they wait in memory
    #[arg(long, env = "GPUWATCH_BUFFER_DIR", value_name = "DIR")]
    pub buffer_dir: Option<PathBuf>,

    /// Most bytes the disk spool may hold; the oldest samples are dropped (and counted) beyond
    #[arg(long, env = "GPUWATCH_BUFFER_MAX_BYTES", value_name = "N", default_value_t = DEFAULT_BUFFER_MAX_BYTES)]
    pub buffer_max_bytes: u64,

    /// Least time between two reads of the counters that cost milliseconds of CPU per call:
    /// the energy counter (advanced by power × time in between) and per-process utilisation;
    /// the GPU count and each GPU's MIG mode are read again this often too
    #[arg(
        long,
        env = "GPUWATCH_SLOW_INTERVAL",
        value_name = "DURATION",
        default_value = "60s"
    )]
    pub slow_interval: HumanDuration,

    /// Longest time a collection waits before it is sent: the collections of this span go in
    /// one request (one request per collection when it is no longer than --interval, `0s`
    /// included); shutdown sends what waits
    #[arg(
        long,
        env = "GPUWATCH_FLUSH_INTERVAL",
        value_name = "DURATION",
        default_value = "10s"
    )]
    pub flush_interval: HumanDuration,

    /// Device nodes of the fake GPUs with --source fake (`nvidia0`, `nvidia1`, …)
    #[arg(
        long,
        env = "GPUWATCH_FAKE_DEV_DIR",
        value_name = "DIR",
        default_value = "/dev"
    )]
    pub fake_dev_dir: PathBuf,

    /// With --source fake: split every GPU into N MIG instances (0 to 7; 0: MIG off), each a
    /// row of its own
    #[arg(long, env = "GPUWATCH_FAKE_MIG", value_name = "N", default_value_t = 0)]
    pub fake_mig: u32,

    /// File holding the bearer token sent to the endpoint (`Authorization: Bearer <token>` over
    /// http, `authorization` metadata over grpc): one token, surrounding whitespace ignored; a
    /// gpuwatch server wants one with the `ingest` (or `admin`) scope when it runs with
    /// --auth-tokens. The file is read at start (an empty or unreadable file stops the agent)
    /// and read again before a send when its modification time, size or inode changed, and after
    /// every 401/403, so a rotated token (a Kubernetes Secret update) is used without a restart.
    /// Requests the endpoint refuses with 401/403 stay queued and are retried. There is no flag
    /// or variable taking the token itself: command lines and environments are readable by
    /// other processes
    #[arg(long, env = "GPUWATCH_AUTH_TOKEN_FILE", value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,

    /// Header sent with every request (HTTP header, gRPC metadata), e.g. `X-Scope-OrgID=team-a`;
    /// repeatable; overrides OTEL_EXPORTER_OTLP_HEADERS by name. For a bearer token use
    /// --auth-token-file
    #[arg(long, env = "GPUWATCH_HEADER", value_name = "KEY=VALUE")]
    pub header: Vec<Header>,

    /// TOML config file; keys are the flag names with underscores
    #[arg(long, env = "GPUWATCH_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Log filter for stderr: a level (error, warn, info, debug, trace) or tracing directives
    /// such as `gpuwatch_agent=debug`
    #[arg(
        long,
        env = "GPUWATCH_LOG_LEVEL",
        value_name = "FILTER",
        default_value = "info"
    )]
    pub log_level: String,

    /// Log lines on stderr: `text` for people, or `json` (one object per line) for log pipelines
    #[arg(long, env = "GPUWATCH_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}
