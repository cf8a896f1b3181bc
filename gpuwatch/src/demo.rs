//! `gpuwatch demo`: the server plus a built-in agent on a simulated fleet.
//!
//! Every simulated host is named `sim-node-NN` and its data carries `gpuwatch.simulated = true`,
//! so it is never mistaken for real telemetry. At start the fleet's recent history (`--backfill`)
//! is simulated and written (GPU samples, the jobs' processes and the simulated XID and ECC
//! events), so queries and dashboards have data at once; then each host samples live.

use std::future::Future;
use std::time::Duration;

use gpuwatch_agent::export::otlp::encode_collection;
use gpuwatch_agent::{
    AgentOptions, Exporter, Fleet, Source, SourceKind, now_unix_nano, resource_attributes,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use tokio::sync::watch;

use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::server;

/// What the demo simulates.
#[derive(Debug, Clone)]
pub(crate) struct DemoOptions {
    /// Simulated hosts.
    pub hosts: usize,
    /// GPUs per host.
    pub gpus: usize,
    /// Live sampling interval.
    pub interval: Duration,
    /// History simulated at start.
    pub backfill: Duration,
}

/// Samples of the backfill are this far apart (or the live interval, if longer).
const BACKFILL_STEP: Duration = Duration::from_secs(10);
/// Backfill steps sent per request.
const STEPS_PER_REQUEST: usize = 30;

/// Runs the demo until `shutdown` resolves.
pub(crate) async fn run(
    config: ServeConfig,
    opts: DemoOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    if opts.hosts == 0 || opts.gpus == 0 {
        return Err(Error::Config(
            "--synthetic-hosts and --synthetic-gpus must be at least 1".into(),
        ));
    }
    if opts.interval.is_zero() {
        return Err(Error::Config("--interval must be above zero".into()));
    }
    if config.tls.is_some() {
        return Err(Error::Config(
            "gpuwatch demo runs without TLS (its built-in agent talks plain HTTP to the server): \
             drop --tls-cert/--tls-key, or use gpuwatch serve"
                .into(),
        ));
    }
    let running = server::start(config.clone()).await?;
    running.ready().await;
    let endpoint = format!("http://{}", running.http_addr);

    let mut hosts: Vec<(AgentOptions, Fleet)> = (0..opts.hosts)
        .map(|h| {
            let agent = AgentOptions {
                endpoint: endpoint.clone(),
                interval: opts.interval,
                source: SourceKind::Synthetic,
                synthetic_gpus: opts.gpus,
                host: format!("sim-node-{:02}", h + 1),
                seed: h as u64 + 1,
                // Every collection is sent at once: the demo shows data as it comes.
                flush_interval: std::time::Duration::ZERO,
                ..AgentOptions::default()
            };
            let fleet = Fleet::new(opts.gpus, agent.seed);
            (agent, fleet)
        })
        .collect();

    if !opts.backfill.is_zero() {
        let started = std::time::Instant::now();
        let rows = backfill(
            &mut hosts,
            &endpoint,
            opts.backfill,
            opts.interval.max(BACKFILL_STEP),
        )
        .await?;
        tracing::info!(
            rows,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "simulated history written"
        );
    }

    let (stop, agents) = spawn_agents(hosts);

    print_banner(&config, &running, &opts);
    shutdown.await;
    tracing::info!("shutting down: stopping the simulated agents and persisting buffered data");
    let _ = stop.send(true);
    for a in agents {
        let _ = tokio::time::timeout(Duration::from_secs(15), a).await;
    }
    running.shutdown().await;
    Ok(())
}

/// Starts one simulated agent per host; they stop when the sender says so.
fn spawn_agents(
    hosts: Vec<(AgentOptions, Fleet)>,
) -> (watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>) {
    let (stop, stop_rx) = watch::channel(false);
    let mut agents = Vec::new();
    for (agent, fleet) in hosts {
        let mut rx = stop_rx.clone();
        agents.push(tokio::spawn(async move {
            let stopped = async move {
                let _ = rx.changed().await;
            };
            if let Err(e) = gpuwatch_agent::run_with_source(&agent, Box::new(fleet), stopped).await
            {
                tracing::error!(host = %agent.host, error = %e, "simulated agent failed");
            }
        }));
    }
    (stop, agents)
}

/// Simulates `span` of history for every host and writes it. Returns the GPU samples written.
async fn backfill(
    hosts: &mut [(AgentOptions, Fleet)],
    endpoint: &str,
    span: Duration,
    step: Duration,
) -> Result<usize> {
    let now = now_unix_nano();
    let step_ns = u64::try_from(step.as_nanos()).unwrap_or(u64::MAX).max(1);
    let span_ns = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
    let start = now.saturating_sub(span_ns);
    let mut exporter = Exporter::new(endpoint)?;
    let resources: Vec<Vec<(String, String)>> = hosts
        .iter()
        .map(|(a, _)| resource_attributes(a, true))
        .collect();
    let mut t = start;
    let mut written = 0usize;
    while t < now {
        let mut request = ExportMetricsServiceRequest::default();
        for _ in 0..STEPS_PER_REQUEST {
            if t >= now {
                break;
            }
            for ((_, fleet), resource) in hosts.iter_mut().zip(&resources) {
                let samples = fleet.collect(t)?;
                // As the agent's loop does: the processes and events go with the samples.
                let processes = fleet.processes();
                let events = fleet.events();
                written += samples.len();
                request.resource_metrics.extend(
                    encode_collection(&samples, &processes, &events, resource).resource_metrics,
                );
            }
            t += step_ns;
        }
        exporter.send(&request).await.map_err(|e| {
            tracing::error!(error = %e, "writing the simulated history failed");
            e
        })?;
    }
    Ok(written)
}

fn print_banner(config: &ServeConfig, running: &server::Running, opts: &DemoOptions) {
    let exe = std::env::args().next().unwrap_or_else(|| "gpuwatch".into());
    let url = format!("http://{}", running.http_addr);
    let server_flag = if running.http_addr.to_string() == "127.0.0.1:9500" {
        String::new()
    } else {
        format!(" --server {url}")
    };
    println!(
        r#"gpuwatch console: {url}/   (open it in a browser: fleet, jobs, alerts, SQL)

gpuwatch demo: a SIMULATED fleet of {hosts} hosts x {gpus} GPUs (sim-node-01..{last:02}), sampled every {interval}, {backfill} of history backfilled.
Simulated data carries gpuwatch.simulated=true and host names sim-node-NN.

  SQL API, OTLP/HTTP, health   {url}   (/api/v1/sql, /v1/metrics, /healthz, /readyz, /metrics)
  OTLP/HTTP                    http://{otlp}/v1/metrics
  PostgreSQL wire (psql)       {pg}
  data directory               {data}

Try:
  {exe} sql{server_flag} "SELECT host, gpu_index, job_id, job_user, round(avg(gpu_utilization), 2) AS util, round(avg(power_watts)) AS watts FROM gpu_metrics WHERE time > now() - interval '5 minutes' GROUP BY 1, 2, 3, 4 ORDER BY 1, 2"

  {exe} sql{server_flag} "SELECT host, gpu_index, job_id, job_user, job_name, max(gpu_utilization) AS max_util FROM gpu_metrics WHERE time > now() - interval '15 minutes' AND job_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5 HAVING max(gpu_utilization) < 0.01 ORDER BY 1, 2"

  curl -sG {url}/api/v1/sql --data-urlencode format=csv --data-urlencode "q=SELECT job_user, job_id, round(sum(d) / 3.6e6, 3) AS kwh FROM (SELECT job_user, job_id, energy_joules - lag(energy_joules) OVER (PARTITION BY gpu_uuid ORDER BY time) AS d FROM gpu_metrics) WHERE job_id IS NOT NULL GROUP BY 1, 2 ORDER BY kwh DESC LIMIT 10"

Job reports (docs/jobs.md): how each job used its GPUs, what it cost, and advice:
  {exe} jobs{server_flag} --since 1h
  {exe} job{server_flag} <JOB_ID>

Alerts: the built-in rule pack (deploy/rules/*.yaml) runs every minute; an idle GPU held by a
simulated notebook fires GpuIdleInJob within about two minutes:
  curl -s {url}/api/v1/alerts
  {exe} sql{server_flag} "SELECT time, rule, state, labels['host'] AS host, labels['job_id'] AS job, value FROM alerts ORDER BY time DESC LIMIT 10"
  {exe} sql{server_flag} "SELECT job_id, job_user, job_name, host, gpus, round(gpu_seconds / 3600, 2) AS gpu_hours, round(idle_gpu_seconds / 3600, 2) AS idle_hours, round(energy_joules / 3.6e6, 2) AS kwh FROM jobs ORDER BY gpu_seconds DESC LIMIT 10"

Health: each simulated host has a board with wearing memory (ECC errors, remapped rows, XIDs), an
overheating board and power-brake episodes, and some jobs end with application XIDs, all SIMULATED
and far more frequent than on a real fleet (GpuXidError and GpuEccUncorrectable fire for them):
  {exe} sql{server_flag} "SELECT time, host, gpu_uuid, kind, code, detail FROM gpu_events ORDER BY time DESC LIMIT 10"

Costs in the jobs table use example prices (USD 2.50 per H100 GPU-hour, USD 0.12 per kWh, PUE 1.3)
unless the --config file has a [cost] section (docs/cost.md).

Ctrl-C stops the demo (buffered data is persisted first).
"#,
        hosts = opts.hosts,
        gpus = opts.gpus,
        last = opts.hosts,
        interval = humantime::format_duration(opts.interval),
        backfill = humantime::format_duration(opts.backfill),
        otlp = running.otlp_http_addr,
        pg = running.pg_addr.map_or_else(
            || "off (--pg-addr off)".to_string(),
            |a| format!(
                "psql \"host={} port={} dbname=gpuwatch\" -c '\\dt'",
                a.ip(),
                a.port()
            )
        ),
        data = config.data_dir.display(),
    );
}
