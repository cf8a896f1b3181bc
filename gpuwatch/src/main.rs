//! `gpuwatch`: the server and the command line. This crate only wires the pieces: flags in,
//! components built, servers started, shutdown handled.

mod alerts_wiring;
mod config;
mod demo;
mod error;
mod jobs;
mod server;
mod sql;
mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::{
    FileConfig, OptionalAddr, apply, apply_duration, given, parse_duration, parse_optional_addr,
};
use crate::error::{Error, Result};
use crate::server::ServeConfig;

/// gpuwatch: GPU fleet telemetry — ingest, storage, SQL and alerts in one binary.
#[derive(Debug, Parser)]
#[command(name = "gpuwatch", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server: OTLP ingest, WAL, Parquet storage, SQL over HTTP.
    Serve(ServeArgs),
    /// Run the server plus a built-in agent on a simulated fleet (no GPU needed).
    Demo(DemoArgs),
    /// Run a SQL statement against a server and print the answer.
    Sql(SqlArgs),
    /// Alert rules files.
    Rules(RulesArgs),
    /// Print a job's report: GPU use, cost, and notes (docs/jobs.md).
    Job(JobArgs),
    /// List jobs with their GPU-hours, idle share and cost (most recent first).
    Jobs(JobsArgs),
}

#[derive(Debug, Clone, Args)]
struct ClientArgs {
    /// The server to ask.
    #[arg(long, env = "GPUWATCH_SERVER", default_value = "http://127.0.0.1:9500")]
    server: String,
    /// Bearer token with the query scope, for a server started with --auth-tokens.
    #[arg(long, env = "GPUWATCH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: jobs::ReportFormat,
    /// Give up after this long.
    #[arg(long, env = "GPUWATCH_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Clone, Args)]
struct JobArgs {
    /// The job id (Slurm job id, Kubernetes job, ...); exit 1 when no sample carries it.
    job_id: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
struct JobsArgs {
    /// Only this user's jobs.
    #[arg(long, env = "GPUWATCH_USER")]
    user: Option<String>,
    /// Jobs seen within this long (e.g. 7d, 12h).
    #[arg(long, env = "GPUWATCH_SINCE", default_value = "7d")]
    since: String,
    /// Only jobs still running.
    #[arg(long)]
    running: bool,
    /// At most this many jobs.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
struct RulesArgs {
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Debug, Clone, Subcommand)]
enum RulesCommand {
    /// Validate alert rules files: exit 0 when all are valid, 1 with file:line:column errors.
    Check {
        /// The rules files (YAML).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Clone, Args)]
struct ServeArgs {
    /// TOML config file; its keys are the flag names with underscores (flag > env > file > default).
    #[arg(long, env = "GPUWATCH_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Main HTTP listener: SQL API, OTLP/HTTP at /v1/metrics, health, self metrics.
    #[arg(long, env = "GPUWATCH_HTTP_ADDR", default_value = "127.0.0.1:9500")]
    http_addr: SocketAddr,
    /// OTLP/HTTP listener (the same handler as <http-addr>/v1/metrics).
    #[arg(
        long,
        env = "GPUWATCH_OTLP_HTTP_ADDR",
        default_value = "127.0.0.1:4318"
    )]
    otlp_http_addr: SocketAddr,
    /// OTLP/gRPC listener (opentelemetry.proto.collector.metrics.v1.MetricsService).
    #[arg(
        long,
        env = "GPUWATCH_OTLP_GRPC_ADDR",
        default_value = "127.0.0.1:4317"
    )]
    otlp_grpc_addr: SocketAddr,
    /// PostgreSQL wire protocol listener (psql, Grafana's PostgreSQL data source), or `off`.
    #[arg(long, env = "GPUWATCH_PG_ADDR", default_value = "127.0.0.1:5433", value_parser = parse_optional_addr)]
    pg_addr: OptionalAddr,
    /// TLS certificate chain (PEM) for every listener: HTTP, OTLP/HTTP, OTLP/gRPC and Postgres
    /// (needs --tls-key).
    #[arg(long, env = "GPUWATCH_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1) matching --tls-cert.
    #[arg(long, env = "GPUWATCH_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Data directory: WAL, writer id, and the Delta tables (tables/<table>/) unless
    /// --object-store is given [default: ./gpuwatch-data; demo: ./gpuwatch-demo-data].
    #[arg(long, env = "GPUWATCH_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Keep the Delta tables in an object store, s3://bucket/prefix, instead of the data
    /// directory (which keeps the write-ahead log). Credentials and endpoint come from
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP.
    /// Several servers may share a prefix, each with its own data directory (docs/scale-out.md).
    #[arg(long, env = "GPUWATCH_OBJECT_STORE", value_name = "URL")]
    object_store: Option<String>,
    /// What this server does: `all` (ingest, persist, SQL, alerts), `ingest` (takes writes and
    /// persists them to the tables), or `query` (no WAL, takes no writes: serves SQL, Postgres and
    /// the console over the tables, read again every --refresh-interval) (docs/scale-out.md).
    #[arg(long, env = "GPUWATCH_ROLE", value_enum, default_value = "all")]
    role: server::Role,
    /// Run compaction, rollups, retention and vacuum on this server; of the servers sharing one
    /// set of tables exactly one should [default: on with --role all, off otherwise].
    #[arg(long, env = "GPUWATCH_MAINTENANCE", value_enum)]
    maintenance: Option<server::OnOff>,
    /// How often the tables' Delta logs are read for commits of other servers.
    #[arg(long, env = "GPUWATCH_REFRESH_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    refresh_interval: Duration,
    /// How often buffered data is written to Parquet (and the WAL truncated) [default: 5m; demo: 1m].
    #[arg(long, env = "GPUWATCH_PERSIST_INTERVAL", value_parser = parse_duration)]
    persist_interval: Option<Duration>,
    /// Largest request body accepted, before and after decompression (413 above it).
    #[arg(long, env = "GPUWATCH_MAX_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    max_body_bytes: usize,
    /// A query running longer than this is cancelled with 504.
    #[arg(long, env = "GPUWATCH_QUERY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    query_timeout: Duration,
    /// Memory one query may use in bytes (sorts, joins and aggregations spill or fail beyond
    /// it, with an answer); 0 for unbounded.
    #[arg(long, env = "GPUWATCH_QUERY_MEMORY_LIMIT", default_value_t = 2 * 1024 * 1024 * 1024)]
    query_memory_limit: usize,
    /// Queries running at once; one more gets 429 with Retry-After; 0 for unbounded.
    #[arg(long, env = "GPUWATCH_MAX_CONCURRENT_QUERIES", default_value_t = 16)]
    max_concurrent_queries: usize,
    /// Memory ceiling of the whole process, in bytes: the ingest buffer, WAL replay,
    /// compaction and all queries together (queries fail with 503 and writes get 503 +
    /// Retry-After before it is reached); 0 for none [default: 60% of the machine's memory or
    /// of the cgroup's limit, whichever is lower].
    #[arg(long, env = "GPUWATCH_MEMORY_LIMIT")]
    memory_limit: Option<usize>,
    /// The largest value a SQL function may build, in bytes (repeat, lpad, array_repeat,
    /// string_agg, array_agg, range, ...); a query that would build a larger one gets 400.
    #[arg(long, env = "GPUWATCH_MAX_VALUE_BYTES", default_value_t = 16 * 1024 * 1024)]
    max_value_bytes: usize,
    /// The largest answer sent, in bytes: 413 when the first part is already larger, otherwise
    /// the answer is cut with an error at its end; 0 for unbounded.
    #[arg(long, env = "GPUWATCH_MAX_ANSWER_BYTES", default_value_t = 1024 * 1024 * 1024)]
    max_answer_bytes: usize,
    /// Allow listening on non-loopback addresses without authentication.
    #[arg(long, env = "GPUWATCH_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// When the write-ahead log is fsynced: `always` before every acknowledgement (concurrent
    /// writes share one fsync), or `interval` every --wal-sync-interval, which is weaker: a
    /// machine crash (not a process crash) may lose the last interval's acknowledged writes.
    #[arg(long, env = "GPUWATCH_WAL_SYNC", value_enum, default_value = "always")]
    wal_sync: server::WalSync,
    /// With --wal-sync interval: how often the write-ahead log is fsynced.
    #[arg(long, env = "GPUWATCH_WAL_SYNC_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    wal_sync_interval: Duration,
    /// Cap of the in-memory write buffer, in bytes: at half of it the buffer is persisted early;
    /// when it is full, writes get 503 with Retry-After until a persist frees it.
    #[arg(long, env = "GPUWATCH_MAX_BUFFER_BYTES", default_value_t = 1 << 30)]
    max_buffer_bytes: usize,
    /// How often persisted files are compacted (small files of an hour merged, rollups of
    /// closed hours built) and retention applied.
    #[arg(long, env = "GPUWATCH_COMPACTION_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    compaction_interval: Duration,
    /// Bearer tokens with scopes ingest, query, admin (TOML, see docs/http-api.md); without it
    /// every endpoint is open and only loopback addresses may be bound.
    #[arg(long, env = "GPUWATCH_AUTH_TOKENS", value_name = "FILE")]
    auth_tokens: Option<PathBuf>,
    /// Log filter (error, warn, info, debug, trace, or a tracing directive).
    #[arg(long, env = "GPUWATCH_LOG_LEVEL", default_value = "info")]
    log_level: String,
    /// Send the server's own traces and metrics over OTLP/HTTP to this base URL (`/v1/traces`,
    /// `/v1/metrics`), or `self` for its own OTLP endpoint (metrics land in the `metrics` table).
    #[arg(long, env = "GPUWATCH_SELF_TELEMETRY_ENDPOINT", value_name = "URL")]
    self_telemetry_endpoint: Option<String>,
    /// How often the server's own metrics are sent to --self-telemetry-endpoint.
    #[arg(long, env = "GPUWATCH_SELF_TELEMETRY_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    self_telemetry_interval: Duration,
    /// Alert rules file (YAML; repeat for several; env: comma-separated). Receivers, routes and
    /// prices are the [alerting] and [cost] sections of --config (docs/alerts.md, docs/cost.md).
    #[arg(
        long,
        env = "GPUWATCH_RULES",
        value_name = "FILE",
        value_delimiter = ','
    )]
    rules: Vec<PathBuf>,
}

#[derive(Debug, Clone, Args)]
struct DemoArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Simulated hosts.
    #[arg(long, env = "GPUWATCH_SYNTHETIC_HOSTS", default_value_t = 4)]
    synthetic_hosts: usize,
    /// Simulated GPUs per host.
    #[arg(long, env = "GPUWATCH_SYNTHETIC_GPUS", default_value_t = 8)]
    synthetic_gpus: usize,
    /// Sampling interval of the built-in agent.
    #[arg(long, env = "GPUWATCH_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    interval: Duration,
    /// History simulated at start, so queries and dashboards have data at once (0s for none).
    #[arg(long, env = "GPUWATCH_BACKFILL", default_value = "1h", value_parser = parse_duration)]
    backfill: Duration,
}

#[derive(Debug, Clone, Args)]
struct SqlArgs {
    /// The statement (SELECT, WITH, EXPLAIN, SHOW or DESCRIBE).
    sql: String,
    /// The server to ask.
    #[arg(long, env = "GPUWATCH_SERVER", default_value = "http://127.0.0.1:9500")]
    server: String,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: sql::OutputFormat,
    /// Give up after this long.
    #[arg(long, env = "GPUWATCH_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,
}

/// Resolves the serve flags against the config file.
fn serve_config(
    args: &mut ServeArgs,
    m: &clap::ArgMatches,
    file: FileConfig,
    demo: bool,
) -> Result<ServeConfig> {
    apply(m, "http_addr", &mut args.http_addr, file.http_addr);
    apply(
        m,
        "otlp_http_addr",
        &mut args.otlp_http_addr,
        file.otlp_http_addr,
    );
    apply(
        m,
        "otlp_grpc_addr",
        &mut args.otlp_grpc_addr,
        file.otlp_grpc_addr,
    );
    if let Some(text) = &file.pg_addr {
        let addr = parse_optional_addr(text)
            .map_err(|e| Error::Config(format!("config key pg_addr: {e}")))?;
        apply(m, "pg_addr", &mut args.pg_addr, Some(addr));
    }
    apply(
        m,
        "max_body_bytes",
        &mut args.max_body_bytes,
        file.max_body_bytes,
    );
    apply(
        m,
        "insecure_no_auth",
        &mut args.insecure_no_auth,
        file.insecure_no_auth,
    );
    apply(m, "log_level", &mut args.log_level, file.log_level);
    apply(m, "wal_sync", &mut args.wal_sync, file.wal_sync);
    apply(
        m,
        "max_buffer_bytes",
        &mut args.max_buffer_bytes,
        file.max_buffer_bytes,
    );
    apply_duration(
        m,
        "wal_sync_interval",
        &mut args.wal_sync_interval,
        file.wal_sync_interval,
    )?;
    apply_duration(
        m,
        "compaction_interval",
        &mut args.compaction_interval,
        file.compaction_interval.clone(),
    )?;
    if args.compaction_interval.is_zero() {
        return Err(Error::Config(
            "--compaction-interval must be above zero".into(),
        ));
    }
    apply(m, "role", &mut args.role, file.role);
    if let (false, Some(v)) = (given(m, "maintenance"), file.maintenance) {
        args.maintenance = Some(v);
    }
    apply_duration(
        m,
        "refresh_interval",
        &mut args.refresh_interval,
        file.refresh_interval.clone(),
    )?;
    if args.refresh_interval.is_zero() {
        return Err(Error::Config(
            "--refresh-interval must be above zero".into(),
        ));
    }
    let maintenance = match args.maintenance {
        Some(v) => v == server::OnOff::On,
        None => args.role == server::Role::All,
    };
    let retention = match &file.retention {
        Some(r) => r.resolve()?,
        None => gpuwatch_store::RetentionConfig::default(),
    };
    if args.wal_sync_interval.is_zero() {
        return Err(Error::Config(
            "--wal-sync-interval must be above zero".into(),
        ));
    }
    apply_duration(
        m,
        "query_timeout",
        &mut args.query_timeout,
        file.query_timeout,
    )?;
    let data_dir = args.data_dir.clone().or(file.data_dir).unwrap_or_else(|| {
        PathBuf::from(if demo {
            "./gpuwatch-demo-data"
        } else {
            "./gpuwatch-data"
        })
    });
    let object_store = args.object_store.clone().or(file.object_store);
    if let Some(url) = &object_store {
        gpuwatch_store::persist::storage::ObjectStoreUrl::parse(url)
            .map_err(|e| Error::Config(format!("--object-store: {e}")))?;
    }
    let persist_interval = match (args.persist_interval, file.persist_interval) {
        (Some(d), _) => d,
        (None, Some(text)) => parse_duration(&text)
            .map_err(|e| Error::Config(format!("config key persist_interval: {e}")))?,
        (None, None) => Duration::from_secs(if demo { 60 } else { 300 }),
    };
    let rules = if given(m, "rules") {
        args.rules.clone()
    } else {
        file.rules.clone().unwrap_or_default()
    };
    if args.role == server::Role::Query && !rules.is_empty() {
        return Err(Error::Config(
            "--rules needs --role all or ingest: alert transitions are written to the alerts table, and a query node takes no writes (run the rules on one ingest node; docs/scale-out.md)".into(),
        ));
    }
    let alerts = crate::alerts_wiring::AlertsConfig {
        rules,
        builtin_rules: demo,
        alerting: file.alerting.clone().unwrap_or_default(),
        cost: match (file.cost.clone(), demo) {
            (Some(cost), _) => cost,
            (None, true) => demo_prices(),
            (None, false) => Default::default(),
        },
        jobs: file.jobs.clone().unwrap_or_default(),
    };
    if persist_interval.is_zero() {
        return Err(Error::Config(
            "--persist-interval must be above zero".into(),
        ));
    }
    let tls = match (
        args.tls_cert.clone().or(file.tls_cert),
        args.tls_key.clone().or(file.tls_key),
    ) {
        (Some(cert), Some(key)) => Some(server::tls::Tls::load(&cert, &key)?),
        (None, None) => None,
        (Some(_), None) => {
            return Err(Error::Config(
                "--tls-cert needs --tls-key (the certificate's private key, PEM)".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(Error::Config(
                "--tls-key needs --tls-cert (the certificate chain, PEM)".into(),
            ));
        }
    };
    let auth_tokens = match args.auth_tokens.clone().or(file.auth_tokens) {
        Some(path) => Some(std::sync::Arc::new(server::auth::Tokens::load(&path)?)),
        None => None,
    };
    apply(
        m,
        "query_memory_limit",
        &mut args.query_memory_limit,
        file.query_memory_limit,
    );
    apply(
        m,
        "max_concurrent_queries",
        &mut args.max_concurrent_queries,
        file.max_concurrent_queries,
    );
    apply(
        m,
        "max_value_bytes",
        &mut args.max_value_bytes,
        file.max_value_bytes,
    );
    apply(
        m,
        "max_answer_bytes",
        &mut args.max_answer_bytes,
        file.max_answer_bytes,
    );
    if args.max_value_bytes == 0 {
        return Err(Error::Config("--max-value-bytes must be above zero".into()));
    }
    let memory_limit = match args.memory_limit.or(file.memory_limit) {
        Some(0) => None,
        Some(n) => Some(n),
        None => gpuwatch_query::memory::default_limit(),
    };
    Ok(ServeConfig {
        memory_limit,
        max_value_bytes: args.max_value_bytes,
        max_answer_bytes: (args.max_answer_bytes > 0).then_some(args.max_answer_bytes),
        executor: gpuwatch_query::executor::Executor::current(),
        tls,
        auth_tokens,
        query_memory_limit: (args.query_memory_limit > 0).then_some(args.query_memory_limit),
        max_concurrent_queries: (args.max_concurrent_queries > 0)
            .then_some(args.max_concurrent_queries),
        http_addr: args.http_addr,
        otlp_http_addr: args.otlp_http_addr,
        otlp_grpc_addr: args.otlp_grpc_addr,
        pg_addr: args.pg_addr.0,
        data_dir,
        object_store,
        persist_interval,
        max_body_bytes: args.max_body_bytes,
        query_timeout: args.query_timeout,
        insecure_no_auth: args.insecure_no_auth,
        wal_sync: args.wal_sync,
        wal_sync_interval: args.wal_sync_interval,
        max_buffer_bytes: args.max_buffer_bytes,
        compaction_interval: args.compaction_interval,
        retention,
        alerts,
        role: args.role,
        maintenance,
        refresh_interval: args.refresh_interval,
    })
}

/// Example prices the demo uses when the config file has no `[cost]` section, so that its `jobs`
/// table shows costs: USD 2.50 per H100 GPU-hour, USD 0.12 per kWh, PUE 1.3.
fn demo_prices() -> gpuwatch_alerts::cost::CostConfig {
    gpuwatch_alerts::cost::CostConfig {
        gpu_hour_usd: vec![gpuwatch_alerts::cost::ModelPrice {
            model: "*H100*".into(),
            usd: 2.50,
        }],
        default_gpu_hour_usd: 1.00,
        kwh_usd: 0.12,
        pue: 1.3,
        ..Default::default()
    }
}

/// The Delta libraries log every snapshot load at `info`; they are kept at `warn` unless the
/// filter names them.
fn quiet_libraries(level: &str) -> String {
    let mut filter = level.to_string();
    for target in ["buoyant_kernel", "buoyant_kernel_engine", "deltalake_core"] {
        if !level.contains(target) {
            filter.push_str(&format!(",{target}=warn"));
        }
    }
    filter
}

fn init_tracing(level: &str) -> Result<telemetry::OtelHandle> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_new(quiet_libraries(level))
        .map_err(|e| Error::Config(format!("invalid --log-level {level:?}: {e}")))?;
    // The OpenTelemetry layer is empty until --self-telemetry-endpoint starts its exporter.
    let (otel, handle) = tracing_subscriber::reload::Layer::new(None);
    tracing_subscriber::registry()
        .with(otel)
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init()
        .map_err(|e| Error::Other(format!("cannot set up logging: {e}")))?;
    Ok(handle)
}

/// Starts self-telemetry (`--self-telemetry-endpoint`) once the store is open, in the
/// background; the returned slot holds the exporters for their shutdown.
fn self_telemetry(
    endpoint: Option<&str>,
    interval: Duration,
    handle: telemetry::OtelHandle,
    running: &server::Running,
) -> std::sync::Arc<std::sync::Mutex<Option<telemetry::SelfTelemetry>>> {
    let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
    let Some(endpoint) = endpoint else {
        return slot;
    };
    let base = telemetry::base_url(endpoint, running);
    let sampler = running.sampler();
    let ready = running.sampler();
    let out = std::sync::Arc::clone(&slot);
    tokio::spawn(async move {
        // Instruments are made for the metrics there are once the store is open.
        while !ready().iter().any(|s| s.name == "gpuwatch_writes_total") {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match telemetry::start(&base, interval, &handle, sampler) {
            Ok(t) => {
                tracing::info!(endpoint = %base, "self-telemetry: traces and metrics over OTLP/HTTP");
                if let Ok(mut s) = out.lock() {
                    *s = Some(t);
                }
            }
            Err(e) => tracing::error!(error = %e, "self-telemetry not started"),
        }
    });
    slot
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn client(args: &ClientArgs) -> jobs::Client {
    jobs::Client {
        server: args.server.clone(),
        token: args.token.clone().filter(|t| !t.is_empty()),
        timeout: args.timeout,
    }
}

async fn run() -> Result<()> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Error::Config(e.to_string()))?;
    match cli.command {
        Command::Serve(mut args) => {
            let m = matches
                .subcommand_matches("serve")
                .ok_or_else(|| Error::Other("no serve matches".into()))?;
            let file = match &args.config {
                Some(p) => FileConfig::load(p)?,
                None => FileConfig::default(),
            };
            apply(
                m,
                "self_telemetry_endpoint",
                &mut args.self_telemetry_endpoint,
                file.self_telemetry_endpoint.clone().map(Some),
            );
            apply_duration(
                m,
                "self_telemetry_interval",
                &mut args.self_telemetry_interval,
                file.self_telemetry_interval.clone(),
            )?;
            let mut config = serve_config(&mut args, m, file, false)?;
            let otel = init_tracing(&args.log_level)?;
            let queries = QueryRuntime::start()?;
            config.executor = queries.executor.clone();
            let running = server::start(config.clone()).await?;
            let exporters = self_telemetry(
                args.self_telemetry_endpoint.as_deref(),
                args.self_telemetry_interval,
                otel,
                &running,
            );
            let pg = running
                .pg_addr
                .map_or_else(|| "off".to_string(), |a| a.to_string());
            tracing::info!(http = %running.http_addr, otlp_http = %running.otlp_http_addr, otlp_grpc = %running.otlp_grpc_addr, pg = %pg, data_dir = %config.data_dir.display(), object_store = config.object_store.as_deref().unwrap_or("none (files in the data directory)"), "gpuwatch serving");
            shutdown_signal().await;
            tracing::info!("shutting down: persisting buffered data");
            running.shutdown().await;
            let exporters = exporters.lock().ok().and_then(|mut s| s.take());
            if let Some(t) = exporters {
                let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
            }
            Ok(())
        }
        Command::Demo(mut args) => {
            let m = matches
                .subcommand_matches("demo")
                .ok_or_else(|| Error::Other("no demo matches".into()))?;
            let file = match &args.serve.config {
                Some(p) => FileConfig::load(p)?,
                None => FileConfig::default(),
            };
            apply(
                m,
                "synthetic_hosts",
                &mut args.synthetic_hosts,
                file.synthetic_hosts,
            );
            apply(
                m,
                "synthetic_gpus",
                &mut args.synthetic_gpus,
                file.synthetic_gpus,
            );
            apply_duration(m, "interval", &mut args.interval, file.interval.clone())?;
            apply_duration(m, "backfill", &mut args.backfill, file.backfill.clone())?;
            let mut config = serve_config(&mut args.serve, m, file, true)?;
            let _otel = init_tracing(&args.serve.log_level)?;
            let queries = QueryRuntime::start()?;
            config.executor = queries.executor.clone();
            demo::run(
                config,
                demo::DemoOptions {
                    hosts: args.synthetic_hosts,
                    gpus: args.synthetic_gpus,
                    interval: args.interval,
                    backfill: args.backfill,
                },
                shutdown_signal(),
            )
            .await
        }
        Command::Rules(RulesArgs {
            command: RulesCommand::Check { files },
        }) => {
            let out = alerts_wiring::check(&files)?;
            print!("{out}");
            Ok(())
        }
        Command::Job(args) => {
            let out = jobs::job(&client(&args.client), &args.job_id, args.client.format).await?;
            print!("{out}");
            Ok(())
        }
        Command::Jobs(args) => {
            let out = jobs::jobs(
                &client(&args.client),
                args.user.as_deref(),
                &args.since,
                args.running,
                args.limit,
                args.client.format,
            )
            .await?;
            print!("{out}");
            Ok(())
        }
        Command::Sql(args) => {
            let out = sql::run(&args.server, &args.sql, args.format, args.timeout).await?;
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(&out);
            Ok(())
        }
    }
}

/// The runtime queries run on ([`gpuwatch_query::executor`]), shut down when dropped.
struct QueryRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    executor: gpuwatch_query::executor::Executor,
}

impl QueryRuntime {
    /// As many threads as the machine has cores.
    fn start() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let (runtime, executor) = gpuwatch_query::executor::Executor::dedicated(threads)
            .map_err(|e| Error::Other(format!("cannot start the query runtime: {e}")))?;
        Ok(Self {
            runtime: Some(runtime),
            executor,
        })
    }
}

impl Drop for QueryRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run()) {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
