//! Every setting of `gpuwatch serve` and `gpuwatch demo`, declared once.
//!
//! A field is a setting: its name is the config file's key, its `#[arg]` the flag, the
//! `GPUWATCH_*` variable and the default, its doc comment the `--help` text and its line in
//! docs/configuration.md. Adding a setting is adding a field to the group that uses it;
//! `super::load` merges flag > env > file > default for all of them, and `validate` beside the
//! groups checks what one value alone cannot.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use gpuwatch_common::HumanDuration;
use gpuwatch_common::logging::LogFormat;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `gpuwatch serve`: every setting, grouped as the server uses them.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct ServeSettings {
    /// TOML config file; its keys are the flag names with underscores (flag > env > file >
    /// default).
    #[arg(long, env = "GPUWATCH_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub listeners: Listeners,
    #[command(flatten)]
    #[serde(flatten)]
    pub storage: Storage,
    #[command(flatten)]
    #[serde(flatten)]
    pub role: RoleSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    #[serde(flatten)]
    pub promql: PromQl,
    #[command(flatten)]
    #[serde(flatten)]
    pub telemetry: Telemetry,
    #[command(flatten)]
    #[serde(flatten)]
    pub alerts: Alerts,
}

/// `gpuwatch demo`: the server's settings and the simulated fleet's.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct DemoSettings {
    #[command(flatten)]
    #[serde(flatten)]
    pub serve: ServeSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub fleet: Fleet,
}

/// Listeners, TLS and who may connect.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Listeners {
    /// Main HTTP listener: SQL API, OTLP/HTTP at /v1/metrics, health, self metrics.
    #[arg(long, env = "GPUWATCH_HTTP_ADDR", default_value = "127.0.0.1:9500")]
    pub http_addr: SocketAddr,
    /// OTLP/HTTP listener (the same handler as <http-addr>/v1/metrics).
    #[arg(
        long,
        env = "GPUWATCH_OTLP_HTTP_ADDR",
        default_value = "127.0.0.1:4318"
    )]
    pub otlp_http_addr: SocketAddr,
    /// OTLP/gRPC listener (opentelemetry.proto.collector.metrics.v1.MetricsService).
    #[arg(
        long,
        env = "GPUWATCH_OTLP_GRPC_ADDR",
        default_value = "127.0.0.1:4317"
    )]
    pub otlp_grpc_addr: SocketAddr,
    /// PostgreSQL wire protocol listener (psql, Grafana's PostgreSQL data source), or `off`.
    #[arg(long, env = "GPUWATCH_PG_ADDR", default_value = "127.0.0.1:5433")]
    pub pg_addr: OptionalAddr,
    /// TLS certificate chain (PEM) for every listener: HTTP, OTLP/HTTP, OTLP/gRPC and Postgres
    /// (needs --tls-key).
    #[arg(long, env = "GPUWATCH_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1) matching --tls-cert.
    #[arg(long, env = "GPUWATCH_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Bearer tokens with scopes ingest, query, admin (TOML, see docs/http-api.md); without it
    /// every endpoint is open and only loopback addresses may be bound.
    #[arg(long, env = "GPUWATCH_AUTH_TOKENS", value_name = "FILE")]
    pub auth_tokens: Option<PathBuf>,
    /// Host names (and addresses) the HTTP API answers to besides localhost, the loopback
    /// addresses and the address bound (env: comma-separated); `*` allows every name. Other
    /// names are refused (403) on the main listener, except health, /metrics and ingest: a
    /// name rebound to this server (DNS rebinding) reads nothing.
    #[arg(
        long,
        env = "GPUWATCH_ALLOWED_HOSTS",
        value_name = "HOST",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Allow listening on non-loopback addresses without authentication.
    #[arg(long, env = "GPUWATCH_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
}

/// Storage: the data directory or object store, the write-ahead log, persistence and
/// maintenance.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Storage {
    /// Data directory: WAL, writer id, damaged files set aside (quarantine/,
    /// docs/operations.md), and the Delta tables (tables/<table>/) unless --object-store is
    /// given [default: ./gpuwatch-data; demo: ./gpuwatch-demo-data].
    #[arg(long, env = "GPUWATCH_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the Delta tables in an object store, s3://bucket/prefix, instead of the data
    /// directory (which keeps the write-ahead log). Credentials and endpoint come from
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP.
    /// Several servers may share a prefix, each with its own data directory (docs/scale-out.md).
    #[arg(long, env = "GPUWATCH_OBJECT_STORE", value_name = "URL")]
    pub object_store: Option<String>,
    /// How often buffered data is written to Parquet (and the WAL truncated) [default: 5m;
    /// demo: 1m].
    #[arg(long, env = "GPUWATCH_PERSIST_INTERVAL")]
    pub persist_interval: Option<HumanDuration>,
    /// When the write-ahead log is fsynced: `always` before every acknowledgement (concurrent
    /// writes share one fsync), or `interval` every --wal-sync-interval, which is weaker: a
    /// machine crash (not a process crash) may lose the last interval's acknowledged writes.
    #[arg(long, env = "GPUWATCH_WAL_SYNC", value_enum, default_value = "always")]
    pub wal_sync: WalSync,
    /// With --wal-sync interval: how often the write-ahead log is fsynced.
    #[arg(long, env = "GPUWATCH_WAL_SYNC_INTERVAL", default_value = "100ms")]
    pub wal_sync_interval: HumanDuration,
    /// Cap of the in-memory write buffer, in bytes: at half of it the buffer is persisted early;
    /// when it is full, writes get 503 with Retry-After until a persist frees it.
    #[arg(long, env = "GPUWATCH_MAX_BUFFER_BYTES", default_value_t = 1 << 30)]
    pub max_buffer_bytes: usize,
    /// How often persisted files are compacted (small files of an hour merged, rollups of
    /// closed hours built) and retention applied.
    #[arg(long, env = "GPUWATCH_COMPACTION_INTERVAL", default_value = "1m")]
    pub compaction_interval: HumanDuration,
    /// How often the tables' Delta logs are read for commits of other servers.
    #[arg(long, env = "GPUWATCH_REFRESH_INTERVAL", default_value = "5s")]
    pub refresh_interval: HumanDuration,
}

/// What this server does among those sharing the tables.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct RoleSettings {
    /// What this server does: `all` (ingest, persist, SQL, alerts), `ingest` (takes writes and
    /// persists them to the tables), or `query` (no WAL, takes no writes: serves SQL, Postgres and
    /// the console over the tables, read again every --refresh-interval) (docs/scale-out.md).
    #[arg(long, env = "GPUWATCH_ROLE", value_enum, default_value = "all")]
    pub role: Role,
    /// Run compaction, rollups, retention and vacuum on this server; of the servers sharing one
    /// set of tables exactly one should [default: on with --role all, off otherwise].
    #[arg(long, env = "GPUWATCH_MAINTENANCE", value_enum)]
    pub maintenance: Option<OnOff>,
}

/// Limits of requests, queries and memory.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Limits {
    /// Largest request body accepted, before and after decompression (413 above it).
    #[arg(long, env = "GPUWATCH_MAX_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// How long an HTTP connection (main and OTLP/HTTP listeners) may take to send a request's
    /// headers, idle keep-alive time included, and a gRPC or Postgres connection its first
    /// bytes; then it is closed.
    #[arg(long, env = "GPUWATCH_HEADER_TIMEOUT", default_value = "30s")]
    pub header_timeout: HumanDuration,
    /// How long a gRPC or Postgres connection may stay silent (no bytes either way) before it
    /// is closed; clients reconnect on their next request.
    #[arg(long, env = "GPUWATCH_IDLE_TIMEOUT", default_value = "5m")]
    pub idle_timeout: HumanDuration,
    /// Open connections per listener (HTTP, OTLP/HTTP, OTLP/gRPC, Postgres); at the cap the
    /// connection idle longest is closed to take a new one. 0: derived from the process's
    /// open-file limit, below it with room for the store (docs/operations.md).
    #[arg(long, env = "GPUWATCH_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,
    /// A query running longer than this is cancelled with 504.
    #[arg(long, env = "GPUWATCH_QUERY_TIMEOUT", default_value = "30s")]
    pub query_timeout: HumanDuration,
    /// Memory one query may use in bytes (sorts, joins and aggregations spill or fail beyond
    /// it, with an answer); 0 for unbounded.
    #[arg(long, env = "GPUWATCH_QUERY_MEMORY_LIMIT", default_value_t = 2 * 1024 * 1024 * 1024)]
    pub query_memory_limit: usize,
    /// Queries running at once; one more gets 429 with Retry-After; 0 for unbounded.
    #[arg(long, env = "GPUWATCH_MAX_CONCURRENT_QUERIES", default_value_t = 16)]
    pub max_concurrent_queries: usize,
    /// Memory ceiling of the whole process, in bytes: the ingest buffer, WAL replay,
    /// compaction and all queries together (queries fail with 503 and writes get 503 +
    /// Retry-After before it is reached); 0 for none [default: 60% of the machine's memory or
    /// of the cgroup's limit, whichever is lower].
    #[arg(long, env = "GPUWATCH_MEMORY_LIMIT")]
    pub memory_limit: Option<usize>,
    /// The largest value a SQL function may build, in bytes (repeat, lpad, array_repeat,
    /// string_agg, array_agg, range, ...); a query that would build a larger one gets 400.
    #[arg(long, env = "GPUWATCH_MAX_VALUE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_value_bytes: usize,
    /// The largest answer sent, in bytes: 413 when the first part is already larger, otherwise
    /// the answer is cut with an error at its end; 0 for unbounded.
    #[arg(long, env = "GPUWATCH_MAX_ANSWER_BYTES", default_value_t = 1024 * 1024 * 1024)]
    pub max_answer_bytes: usize,
}

/// PromQL evaluation: the Prometheus query API on the HTTP port and `expr:` alert rules
/// (docs/promql.md). The limits of SQL (--query-timeout, --max-concurrent-queries,
/// --max-answer-bytes) apply too.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct PromQl {
    /// How far back an instant selector looks for a sample: the latest one in `[t - delta, t]`
    /// (Prometheus's --query.lookback-delta).
    #[arg(long, env = "GPUWATCH_PROMQL_LOOKBACK_DELTA", default_value = "5m")]
    pub promql_lookback_delta: HumanDuration,
    /// Samples one PromQL query may load; past that it fails with `execution` (Prometheus's
    /// --query.max-samples).
    #[arg(
        long,
        env = "GPUWATCH_PROMQL_MAX_SAMPLES",
        default_value_t = 50_000_000
    )]
    pub promql_max_samples: usize,
    /// The step of a subquery that gives none (`expr[1h:]`), as Prometheus's global
    /// evaluation_interval is.
    #[arg(long, env = "GPUWATCH_PROMQL_SUBQUERY_STEP", default_value = "1m")]
    pub promql_subquery_step: HumanDuration,
}

/// Logs and the server's own traces and metrics.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Telemetry {
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, env = "GPUWATCH_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log lines on stderr: `text` for people, or `json` (one object per line) for log
    /// pipelines.
    #[arg(long, env = "GPUWATCH_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Send the server's own traces and metrics over OTLP/HTTP to this base URL (`/v1/traces`,
    /// `/v1/metrics`), or `self` for its own OTLP endpoint (metrics land in the `metrics` table).
    #[arg(long, env = "GPUWATCH_SELF_TELEMETRY_ENDPOINT", value_name = "URL")]
    pub self_telemetry_endpoint: Option<String>,
    /// How often the server's own metrics are sent to --self-telemetry-endpoint.
    #[arg(long, env = "GPUWATCH_SELF_TELEMETRY_INTERVAL", default_value = "10s")]
    pub self_telemetry_interval: HumanDuration,
}

/// Alert rules (receivers, routes and prices are the file's `[alerting]` and `[cost]`).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Alerts {
    /// Alert rules file (YAML; repeat for several; env: comma-separated). Receivers, routes and
    /// prices are the [alerting] and [cost] sections of --config (docs/alerts.md, docs/cost.md).
    #[arg(
        long,
        env = "GPUWATCH_RULES",
        value_name = "FILE",
        value_delimiter = ','
    )]
    pub rules: Vec<PathBuf>,
}

/// The simulated fleet of `gpuwatch demo`.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub(crate) struct Fleet {
    /// Simulated hosts.
    #[arg(long, env = "GPUWATCH_SYNTHETIC_HOSTS", default_value_t = 4)]
    pub synthetic_hosts: usize,
    /// Simulated GPUs per host.
    #[arg(long, env = "GPUWATCH_SYNTHETIC_GPUS", default_value_t = 8)]
    pub synthetic_gpus: usize,
    /// Sampling interval of the built-in agent.
    #[arg(long, env = "GPUWATCH_INTERVAL", default_value = "5s")]
    pub interval: HumanDuration,
    /// History simulated at start, so queries and dashboards have data at once (0s for none).
    #[arg(long, env = "GPUWATCH_BACKFILL", default_value = "1h")]
    pub backfill: HumanDuration,
}

/// `--wal-sync`: when the WAL is fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum WalSync {
    /// Before every acknowledgement (group commit: concurrent writes share one fsync).
    Always,
    /// Every `--wal-sync-interval`: a machine crash may lose the last interval's acknowledged
    /// writes (a process crash loses nothing).
    Interval,
}

/// `--role`: what a server does (docs/scale-out.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Ingest, persist, SQL, alerts: everything in one process.
    All,
    /// Takes writes (WAL) and persists them to the shared tables; serves SQL over its buffer
    /// and the tables too.
    Ingest,
    /// No WAL, no writes: serves SQL, Postgres and the console over the tables, refreshed every
    /// `--refresh-interval`.
    Query,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// A listen address that can be turned off (`--pg-addr off`); written as text everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OptionalAddr(pub Option<SocketAddr>);

impl FromStr for OptionalAddr {
    type Err = String;

    /// `HOST:PORT`, or `off` for no listener.
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(OptionalAddr(None));
        }
        t.parse::<SocketAddr>()
            .map(|a| OptionalAddr(Some(a)))
            .map_err(|e| {
                format!("invalid address {s:?} ({e}): use HOST:PORT such as 127.0.0.1:5433, or off")
            })
    }
}

impl fmt::Display for OptionalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("off"),
        }
    }
}

impl Serialize for OptionalAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for OptionalAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl AsRef<ServeSettings> for ServeSettings {
    fn as_ref(&self) -> &ServeSettings {
        self
    }
}

impl AsRef<ServeSettings> for DemoSettings {
    fn as_ref(&self) -> &ServeSettings {
        &self.serve
    }
}
