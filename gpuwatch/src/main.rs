//! `gpuwatch`: the server and the command line. This crate only wires the pieces: settings
//! in (`config`), components built, servers started, shutdown handled; the command line's client
//! subcommands (`client`, `sql`, `jobs`) and the offline `check` and `repair` (`check`).

mod alerts_wiring;
mod check;
mod client;
mod config;
mod cost;
mod demo;
mod error;
mod jobs;
mod server;
mod sql;
mod telemetry;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use gpuwatch_common::logging::LogFormat;
use gpuwatch_common::settings::{self, Loaded};

use crate::client::ClientArgs;
use crate::config::{DemoSettings, ServeConfig, ServeSettings};
use crate::error::{Error, Result};

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
    Serve(ServeSettings),
    /// Run the server plus a built-in agent on a simulated fleet (no GPU needed).
    Demo(DemoSettings),
    /// Run a SQL statement against a server and print the answer.
    Sql(SqlArgs),
    /// Alert rules files.
    Rules(RulesArgs),
    /// Print a job's report: GPU use, cost, and notes (docs/jobs.md).
    Job(JobArgs),
    /// List jobs with their GPU-hours, idle share and cost (most recent first).
    Jobs(JobsArgs),
    /// A monthly cost statement: GPU-hours, idle GPU-hours, energy, cost and work done per
    /// account, user, namespace, partition or pod label, and GPU model (docs/cost.md).
    Cost(CostArgs),
    /// Check a stopped server's data (WAL, Delta logs, data files, alerting state) offline:
    /// list every damaged item with what it holds; exit 1 when anything is damaged.
    Check(check::CheckArgs),
    /// Repair a stopped server's data offline: rebuild what can be rebuilt and move the rest to
    /// quarantine/, never deleting anything. A dry run unless --apply is given.
    Repair(check::RepairArgs),
}

#[derive(Debug, Clone, Args)]
struct JobArgs {
    /// The job id (Slurm job id, Kubernetes job, ...); exit 1 when no sample carries it.
    job_id: String,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: jobs::ReportFormat,
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
    /// The next page: jobs last seen before this instant (RFC 3339 or nanoseconds), as the
    /// page before printed.
    #[arg(long)]
    until: Option<String>,
    /// The next page: with --until, jobs last seen at that instant list after this job id.
    #[arg(long, requires = "until")]
    after: Option<String>,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: jobs::ReportFormat,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
struct CostArgs {
    /// Group by account, user, namespace, partition or label:NAME (a pod label).
    #[arg(long, default_value = "account")]
    by: String,
    /// The calendar month, UTC, as YYYY-MM [default: this month].
    #[arg(long)]
    month: Option<String>,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: cost::CostFormat,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Clone, Args)]
struct SqlArgs {
    /// The statement (SELECT, WITH, EXPLAIN, SHOW or DESCRIBE).
    sql: String,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: sql::OutputFormat,
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

/// The Delta libraries log every snapshot load at `info`; they are kept at `warn` unless the
/// filter names them.
const QUIET_TARGETS: &[&str] = &["buoyant_kernel", "buoyant_kernel_engine", "deltalake_core"];

fn init_tracing(level: &str, format: LogFormat) -> Result<telemetry::OtelHandle> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = gpuwatch_common::logging::filter(level, QUIET_TARGETS)?;
    // The OpenTelemetry layer is empty until --self-telemetry-endpoint starts its exporter.
    let (otel, handle) = tracing_subscriber::reload::Layer::new(None);
    tracing_subscriber::registry()
        .with(otel)
        .with(filter)
        .with(gpuwatch_common::logging::stderr_layer(format))
        .try_init()
        .map_err(gpuwatch_common::Error::from)?;
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

/// Reads the environment of this process.
fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// The merged settings of `serve` or `demo`, checked: flags, variables, the file and its
/// sections.
fn serve_config<S>(
    cmd: &clap::Command,
    matches: clap::ArgMatches,
    demo: bool,
) -> Result<(S, ServeConfig)>
where
    S: clap::FromArgMatches
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + AsRef<ServeSettings>,
{
    let loaded: Loaded<S> = settings::resolve(cmd, matches, config::sources(&process_env))?;
    let sections = config::sections(&loaded)?;
    let serve = loaded.settings.as_ref().clone();
    Ok((loaded.settings, serve.validate(sections, demo)?))
}

async fn serve(cmd: &clap::Command, matches: clap::ArgMatches) -> Result<()> {
    let (_, mut config) = serve_config::<ServeSettings>(cmd, matches, false)?;
    let telemetry = config.settings.telemetry.clone();
    let otel = init_tracing(&telemetry.log_level, telemetry.log_format)?;
    let queries = QueryRuntime::start()?;
    config.executor = queries.executor.clone();
    let running = server::start(config.clone()).await?;
    let exporters = self_telemetry(
        telemetry.self_telemetry_endpoint.as_deref(),
        telemetry.self_telemetry_interval.get(),
        otel,
        &running,
    );
    let pg = running
        .pg_addr
        .map_or_else(|| "off".to_string(), |a| a.to_string());
    tracing::info!(http = %running.http_addr, otlp_http = %running.otlp_http_addr, otlp_grpc = %running.otlp_grpc_addr, pg = %pg, data_dir = %config.data_dir.display(), object_store = config.settings.storage.object_store.as_deref().unwrap_or("none (files in the data directory)"), "gpuwatch serving");
    shutdown_signal().await;
    tracing::info!("shutting down: persisting buffered data");
    running.shutdown().await;
    let exporters = exporters.lock().ok().and_then(|mut s| s.take());
    if let Some(t) = exporters {
        let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
    }
    Ok(())
}

async fn demo(cmd: &clap::Command, matches: clap::ArgMatches) -> Result<()> {
    let (settings, mut config) = serve_config::<DemoSettings>(cmd, matches, true)?;
    let telemetry = &config.settings.telemetry;
    let _otel = init_tracing(&telemetry.log_level, telemetry.log_format)?;
    let queries = QueryRuntime::start()?;
    config.executor = queries.executor.clone();
    let fleet = settings.fleet;
    let options = demo::DemoOptions {
        hosts: fleet.synthetic_hosts,
        gpus: fleet.synthetic_gpus,
        interval: fleet.interval.get(),
        backfill: fleet.backfill.get(),
    };
    demo::run(config, options, shutdown_signal()).await
}

async fn run() -> Result<()> {
    let cmd = Cli::command();
    let matches = match settings::parse(&cmd, std::env::args_os().collect(), &process_env) {
        Ok(m) => m,
        // --help and --version print to stdout and exit 0; usage errors print, exit 2.
        Err(gpuwatch_common::Error::Usage(e)) => e.exit(),
        Err(e) => return Err(e.into()),
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| Error::Config(e.to_string()))?;
    let out = match cli.command {
        Command::Serve(_) => return serve(&cmd, matches).await,
        Command::Demo(_) => return demo(&cmd, matches).await,
        Command::Rules(RulesArgs {
            command: RulesCommand::Check { files },
        }) => alerts_wiring::check(&files)?.into_bytes(),
        Command::Job(args) => jobs::job(&args.client.client()?, &args.job_id, args.format)
            .await?
            .into_bytes(),
        Command::Jobs(args) => {
            let filter = jobs::ListArgs {
                user: args.user.as_deref(),
                since: &args.since,
                running: args.running,
                limit: args.limit,
                until: args.until.as_deref(),
                after: args.after.as_deref(),
            };
            jobs::jobs(&args.client.client()?, &filter, args.format)
                .await?
                .into_bytes()
        }
        Command::Cost(args) => {
            cost::statement(
                &args.client.client()?,
                &args.by,
                args.month.as_deref(),
                args.format,
            )
            .await?
        }
        // The report is printed whether or not it finds damage; damage is exit code 1.
        Command::Check(args) => return check::check(&args),
        Command::Repair(args) => return check::repair(&args),
        Command::Sql(args) => sql::run(&args.client.client()?, &args.sql, args.format).await?,
    };
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(&out);
    Ok(())
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
        let (runtime, executor) =
            gpuwatch_query::executor::Executor::dedicated(threads).map_err(|source| Error::Io {
                what: "start the query runtime",
                source,
            })?;
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
    // The job ledger's table has the cost accounting's columns: declared before any store opens.
    if let Err(e) = gpuwatch_alerts::cost::declare_ledger_table() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
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
