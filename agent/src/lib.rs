//! `gpuwatch-agent`: reads the GPUs of one host and streams them to a gpuwatch server.
//!
//! # Data flow
//!
//! ```text
//!  flags / GPUWATCH_* env / TOML file ──► config::load ──► AgentOptions
//!                                                             │
//!        every --interval (tokio interval, wall clock)        ▼
//!  ┌──────────────────────┐  Vec<GpuSample>  ┌──────────────────┐  ExportMetricsServiceRequest
//!  │ collect::Source      │ ───────────────► │ export::otlp     │ ─────────────────────────┐
//!  │  nvml::NvmlSource    │                  │  encode()        │                          │
//!  │  synthetic::Fleet    │                  └──────────────────┘                          ▼
//!  └──────────────────────┘                               ┌────────────────────────────────────┐
//!                                                         │ export::Exporter                   │
//!                                                         │  protobuf → gzip → export::Spool   │
//!                                                         │  (memory or disk, bounded, oldest  │
//!                                                         │   dropped) → batches, oldest first │
//!                                                         │  → POST /v1/metrics (http) or      │
//!                                                         │    MetricsService/Export (grpc)    │
//!                                                         │  failures: retried with backoff    │
//!                                                         │  bearer token: --auth-token-file   │
//!                                                         └────────────────────────────────────┘
//! ```
//!
//! A [`Source`] turns "now" into one [`GpuSample`] per GPU, plus the GPU processes
//! ([`ProcessSample`]) and events ([`collect::GpuEvent`]) it saw; the time is passed in, so tests
//! and the server's `demo` (which backfills history) drive it with any clock. The
//! [`attribute::Attributor`] then labels GPUs and processes with their jobs (Slurm job mapping
//! dir, `/proc/<pid>/environ` and cgroup). [`export::otlp::encode_collection`] turns it all into
//! one OTLP request following docs/schema.md (the collection loop writes the same request
//! straight to protobuf with [`export::otlp::encode_collection_to`]); the [`Exporter`] sends it
//! (OTLP/HTTP or OTLP/gRPC,
//! [`Protocol`]) and keeps what fails in
//! a [`export::Spool`]: in memory, or the crash-safe disk spool of `--buffer-dir`
//! ([`buffer::DiskSpool`]). The last collection is also served on `/metrics` under
//! dcgm-exporter's names ([`export::prometheus`]) with the agent's own counters ([`metrics`]).
//! [`run`] ties them together until its shutdown future resolves.
//!
//! # Use from the server's `demo`
//!
//! ```no_run
//! # async fn demo() -> gpuwatch_agent::Result<()> {
//! use gpuwatch_agent::{AgentOptions, Exporter, Fleet, Source, encode, resource_attributes};
//! let opts = AgentOptions::synthetic("http://127.0.0.1:4318", "sim-node-1", 8, 1);
//! let mut fleet = Fleet::new(opts.synthetic_gpus, opts.seed);
//! let resource = resource_attributes(&opts, true);
//! let mut exporter = Exporter::new(&opts.endpoint)?;
//! let now = gpuwatch_agent::now_unix_nano();
//! // Backfill the last hour, 5 s apart …
//! for step in (0..720u64).rev() {
//!     let samples = fleet.collect(now - step * 5_000_000_000)?;
//!     exporter.send(&encode(&samples, &resource)).await?;
//! }
//! // … then run live on the same fleet.
//! gpuwatch_agent::run_with_source(&opts, Box::new(fleet), std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod attribute;
pub mod buffer;
pub mod collect;
pub mod config;
pub mod error;
pub mod export;
pub mod hostname;
pub mod metrics;

use std::future::Future;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::MissedTickBehavior;
use tracing::{debug, info, warn};

pub use collect::nvml::NvmlSource;
pub use collect::synthetic::{Fleet, NodeOptions, StandingJob};
pub use collect::{GpuSample, JobExtra, JobLabels, ProcessSample, Source};
pub use config::{AgentOptions, Protocol, Settings, SourceKind};
pub use error::{Error, Result};
pub use export::{Exporter, encode};

/// Where processes are read from.
pub const PROC_ROOT: &str = "/proc";

/// Resource attribute set on simulated data.
pub const SIMULATED_ATTRIBUTE: &str = "gpuwatch.simulated";

/// The wall clock as Unix nanoseconds (0 before 1970).
pub fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Build the source `opts` asks for. `auto` and `nvml` both need NVML and fail with
/// [`Error::NvmlUnavailable`] without it: there is no silent fallback to simulated data.
pub fn build_source(opts: &AgentOptions) -> Result<Box<dyn Source>> {
    match opts.source {
        SourceKind::Synthetic => Ok(Box::new(Fleet::new(opts.synthetic_gpus, opts.seed))),
        SourceKind::Fake => Ok(Box::new(
            collect::fake::FakeNvml::new(
                u32::try_from(opts.synthetic_gpus).unwrap_or(u32::MAX),
                &opts.fake_dev_dir,
                std::path::Path::new(PROC_ROOT),
            )
            .with_mig(opts.fake_mig),
        )),
        SourceKind::Nvml | SourceKind::Auto => {
            let source = NvmlSource::with_slow_interval(opts.slow_interval)?;
            if opts.source == SourceKind::Auto {
                info!("source auto: libnvidia-ml.so.1 loaded, using nvml");
            }
            Ok(Box::new(source))
        }
    }
}

/// The resource attributes of every request: `host.name`, the static labels, and
/// `gpuwatch.simulated = true` for simulated data.
pub fn resource_attributes(opts: &AgentOptions, simulated: bool) -> Vec<(String, String)> {
    let mut attrs = vec![("host.name".to_string(), opts.host.clone())];
    attrs.extend(opts.labels.iter().cloned());
    if simulated {
        attrs.push((SIMULATED_ATTRIBUTE.to_string(), "true".to_string()));
    }
    attrs
}

/// Run the agent until `shutdown` resolves: build the source from `opts`, then every
/// `opts.interval` collect, encode and export. With `opts.once`, collect once, print the samples
/// as JSON to stdout and return without sending anything.
pub async fn run(opts: AgentOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    // A bad token file stops the agent before anything else, --once included (a dry run of the
    // configuration).
    if let Some(path) = &opts.auth_token_file {
        export::TokenFile::load(path)?;
    }
    if opts.once {
        // One look for debugging: every counter read fresh, none estimated.
        let opts = AgentOptions {
            slow_interval: Duration::ZERO,
            ..opts
        };
        let source = build_source(&opts)?;
        return print_once(&opts, source).await;
    }
    let source = build_source(&opts)?;
    run_with_source(&opts, source, shutdown).await
}

/// Collect once and print pretty JSON to stdout. A real source is read twice, one second apart,
/// so that GPM ratios (computed between two samples) are filled.
async fn print_once(opts: &AgentOptions, mut source: Box<dyn Source>) -> Result<()> {
    if !source.simulated() {
        source.collect(now_unix_nano())?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut samples = source.collect(now_unix_nano())?;
    let mut processes = source.processes();
    if source.attributable() {
        Attribution::new(opts)?
            .apply(&mut samples, &mut processes)
            .await;
    }
    let events = source.events();
    #[derive(serde::Serialize)]
    struct Once<'a> {
        gpus: &'a [GpuSample],
        processes: &'a [ProcessSample],
        events: &'a [collect::GpuEvent],
    }
    let once = Once {
        gpus: &samples,
        processes: &processes,
        events: &events,
    };
    let text = serde_json::to_string_pretty(&once).map_err(|e| Error::Encode(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        // `gpuwatch-agent --once | head` is fine.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// The collection loop over a given source (the server's `demo` passes the same [`Fleet`] it
/// used to backfill history). Ends when `shutdown` resolves, after one last best-effort attempt
/// to send what is queued.
pub async fn run_with_source(
    opts: &AgentOptions,
    mut source: Box<dyn Source>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let resource = resource_attributes(opts, source.simulated());
    let mut exporter = build_exporter(opts)?;
    info!(
        source = source.name(),
        host = %opts.host,
        url = exporter.url(),
        protocol = ?opts.protocol,
        auth_token_file = opts.auth_token_file.as_ref().map(|p| p.display().to_string()),
        interval = %humantime::format_duration(opts.interval),
        simulated = source.simulated(),
        "agent started"
    );
    let expo: export::prometheus::SharedExposition =
        std::sync::Arc::new(std::sync::Mutex::new(export::prometheus::Exposition {
            host: opts.host.clone(),
            ..Default::default()
        }));
    let metrics_task = serve_metrics(opts, &expo).await;
    let mut attributor = match source.attributable() {
        true => Some(Attribution::new(opts)?),
        false => None,
    };
    let mut ticker = tokio::time::interval(opts.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown);
    // The collections waiting for --flush-interval, concatenated: protobuf messages append, so
    // this is one ExportMetricsServiceRequest holding all their resource metrics, in order.
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_since: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let collected = tokio::select! {
            () = &mut shutdown => break,
            c = tick(source.as_mut(), attributor.as_mut(), &resource, &expo, &mut pending) => c,
        };
        if collected {
            pending_since.get_or_insert_with(std::time::Instant::now);
        }
        if flush_due(
            pending_since,
            pending.len(),
            opts.interval,
            opts.flush_interval,
        ) {
            let batch = std::mem::take(&mut pending);
            pending_since = None;
            // The send is polled first, so the batch is in the exporter's hands (sent, in
            // flight or spooled) before shutdown can end the wait; the exporter is cancel-safe
            // (a request leaves its queue only once answered).
            tokio::select! {
                biased;
                () = send(&mut exporter, &batch) => {}
                () = &mut shutdown => break,
            }
        }
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    send_before_exit(&mut exporter, &pending).await;
    info!(
        dropped = exporter.dropped(),
        rejected = exporter.rejected(),
        lost = exporter.queued(),
        "agent stopped"
    );
    Ok(())
}

/// The exporter `opts` describes: its protocol and endpoint, the disk spool of `--buffer-dir`
/// (or the in-memory queue), and the bearer token of `--auth-token-file`.
fn build_exporter(opts: &AgentOptions) -> Result<Exporter> {
    let spool: Box<dyn export::Spool> = match &opts.buffer_dir {
        Some(dir) => Box::new(buffer::DiskSpool::open(dir, opts.buffer_max_bytes)?),
        None => Box::new(export::MemoryQueue::default()),
    };
    let mut exporter = Exporter::with_options(opts.protocol, &opts.endpoint, spool, &opts.export)?;
    if let Some(path) = &opts.auth_token_file {
        exporter.set_token_file(export::TokenFile::load(path)?);
    }
    Ok(exporter)
}

/// Serves `/metrics` on `--metrics-addr`, when set; the agent goes on without it (logged) when
/// the address cannot be bound.
async fn serve_metrics(
    opts: &AgentOptions,
    expo: &export::prometheus::SharedExposition,
) -> Option<tokio::task::JoinHandle<()>> {
    let addr = opts.metrics_addr?;
    match export::prometheus::serve(addr, expo.clone()).await {
        Ok(task) => Some(task),
        Err(e) => {
            warn!(%addr, error = %e, "cannot serve /metrics: going on without it; free the address or set --metrics-addr");
            None
        }
    }
}

/// At shutdown, one last best-effort attempt, bounded in time, to send the collections still
/// waiting (`pending`) and what is queued; what cannot go stays in the spool.
async fn send_before_exit(exporter: &mut Exporter, pending: &[u8]) {
    if pending.is_empty() && exporter.queued() == 0 {
        return;
    }
    info!(
        queued = exporter.queued(),
        waiting_bytes = pending.len(),
        "shutting down: sending what is queued"
    );
    let deadline = export::http::REQUEST_TIMEOUT + Duration::from_secs(1);
    let last = async {
        if !pending.is_empty() {
            // Sent, or kept in the spool for the next start when the endpoint is down.
            let _ = exporter.send_protobuf(pending).await;
        }
        exporter.flush().await
    };
    match tokio::time::timeout(deadline, last).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "could not send everything before exiting"),
        Err(_) => warn!(
            queued = exporter.queued(),
            "gave up sending the queue before exiting"
        ),
    }
}

/// Job attribution: Slurm (mapping dir, `/proc`) and Kubernetes (the kubelet's pod resources,
/// and its pods' labels with `--pod-label`).
struct Attribution {
    attributor: attribute::Attributor,
    pods: attribute::kubernetes::PodResources,
    labels: Option<attribute::kubelet::PodLabelSource>,
}

impl Attribution {
    fn new(opts: &AgentOptions) -> Result<Self> {
        Ok(Attribution {
            attributor: attribute::Attributor::new(
                &opts.job_mapping_dir,
                std::path::Path::new(PROC_ROOT),
            ),
            pods: attribute::kubernetes::PodResources::new(&opts.pod_resources_socket),
            labels: attribute::kubelet::PodLabelSource::new(&opts.kubelet)?,
        })
    }

    /// Labels `samples` and `processes` with their jobs, asking the kubelet first.
    async fn apply(&mut self, samples: &mut [GpuSample], processes: &mut [ProcessSample]) {
        self.pods.refresh().await;
        if let Some(labels) = self.labels.as_mut()
            && !self.pods.devices().is_empty()
        {
            labels.refresh().await;
            self.attributor.set_pod_labels(labels.labels().clone());
        }
        self.attributor.set_pod_devices(self.pods.devices().clone());
        self.attributor.apply(samples, processes);
    }
}

/// Most bytes of collections kept waiting for `--flush-interval`; beyond, they are sent at once.
const MAX_PENDING_BYTES: usize = 1 << 20;

/// Whether the waiting collections go out now: the oldest would be older than `flush_interval`
/// by the next tick, or they fill [`MAX_PENDING_BYTES`]. A flush interval no longer than the
/// collection interval sends every collection at once.
fn flush_due(
    since: Option<std::time::Instant>,
    bytes: usize,
    interval: Duration,
    flush_interval: Duration,
) -> bool {
    let Some(since) = since else {
        return false;
    };
    bytes >= MAX_PENDING_BYTES || since.elapsed() + interval >= flush_interval
}

/// One export of encoded collections. Failures are logged; the loop goes on (the exporter
/// keeps what it could not send).
async fn send(exporter: &mut Exporter, protobuf: &[u8]) {
    match exporter.send_protobuf(protobuf).await {
        Ok(()) => debug!(bytes = protobuf.len(), "sent"),
        Err(e @ Error::ExportRetry { .. }) => warn!(error = %e, "export failed"),
        // Rejections and refused tokens are logged by the exporter with the response body.
        Err(Error::ExportRejected { .. } | Error::ExportRefused { .. }) => {}
        Err(e) => warn!(error = %e, "export failed"),
    }
}

/// One collection: read, attribute, encode it at the end of `pending` (the collections waiting to
/// be sent), and show it on `/metrics`. `false` when nothing could be read (logged; the loop
/// goes on).
async fn tick(
    source: &mut dyn Source,
    attribution: Option<&mut Attribution>,
    resource: &[(String, String)],
    expo: &export::prometheus::SharedExposition,
    pending: &mut Vec<u8>,
) -> bool {
    let started = std::time::Instant::now();
    let mut samples = match source.collect(now_unix_nano()) {
        Ok(s) => s,
        Err(e) => {
            metrics::collection_failed();
            warn!(source = source.name(), error = %e, "collection failed");
            return false;
        }
    };
    if samples.is_empty() {
        debug!("no gpus read this tick");
    }
    let mut processes = source.processes();
    if let Some(a) = attribution {
        a.apply(&mut samples, &mut processes).await;
    }
    let events = source.events();
    export::otlp::encode_collection_to(pending, &samples, &processes, &events, resource);
    metrics::collection_done(
        u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
        samples.len(),
        processes.len(),
    );
    {
        let mut e = expo.lock().unwrap_or_else(|p| p.into_inner());
        e.samples = samples;
        e.note_events(&events);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_has_host_labels_and_simulated_flag() {
        let mut opts = AgentOptions::synthetic("http://x:1", "sim-n1", 2, 1);
        opts.labels = vec![("cluster".into(), "prod".into())];
        let attrs = resource_attributes(&opts, true);
        assert_eq!(
            attrs,
            vec![
                ("host.name".to_string(), "sim-n1".to_string()),
                ("cluster".to_string(), "prod".to_string()),
                ("gpuwatch.simulated".to_string(), "true".to_string()),
            ]
        );
        assert_eq!(resource_attributes(&opts, false).len(), 2);
    }

    #[test]
    fn synthetic_source_is_built_and_simulated() {
        let opts = AgentOptions::synthetic("http://x:1", "sim-n1", 3, 5);
        let mut source = build_source(&opts).unwrap();
        assert!(source.simulated());
        assert_eq!(source.name(), "synthetic");
        assert_eq!(source.collect(now_unix_nano()).unwrap().len(), 3);
    }

    #[test]
    fn nvml_never_falls_back_to_synthetic() {
        for kind in [SourceKind::Auto, SourceKind::Nvml] {
            let opts = AgentOptions {
                source: kind,
                ..AgentOptions::default()
            };
            match build_source(&opts) {
                // A machine with an NVIDIA driver: real GPUs.
                Ok(source) => assert!(!source.simulated()),
                Err(e) => {
                    assert!(matches!(e, Error::NvmlUnavailable { .. }), "{e}");
                    assert_eq!(e.exit_code(), 2);
                }
            }
        }
    }

    #[test]
    fn collections_wait_for_the_flush_interval() {
        let now = std::time::Instant::now();
        let s = Duration::from_secs;
        let ago = |d: Duration| now.checked_sub(d).unwrap();
        // Nothing waits: nothing to send.
        assert!(!flush_due(None, 0, s(1), s(10)));
        // 1 s collections, 10 s flush: the tenth collection goes out with the nine before it.
        assert!(!flush_due(Some(now), 100, s(1), s(10)));
        assert!(!flush_due(Some(ago(s(8))), 900, s(1), s(10)));
        assert!(flush_due(Some(ago(s(9))), 1000, s(1), s(10)));
        // A flush interval no longer than the collection interval sends every collection.
        assert!(flush_due(Some(now), 100, s(5), s(5)));
        assert!(flush_due(Some(now), 100, s(1), Duration::ZERO));
        // Too many bytes waiting: sent at once.
        assert!(flush_due(Some(now), MAX_PENDING_BYTES, s(1), s(10)));
    }

    #[test]
    fn concatenated_collections_are_one_request_with_all_of_them() {
        use prost::Message;
        let opts = AgentOptions::synthetic("http://x:1", "sim-n1", 2, 5);
        let mut source = build_source(&opts).unwrap();
        let resource = resource_attributes(&opts, true);
        let mut pending = Vec::new();
        let mut each = Vec::new();
        for i in 0..3u64 {
            let samples = source.collect(now_unix_nano() + i * 1_000_000_000).unwrap();
            let mut one = Vec::new();
            export::otlp::encode_collection_to(&mut one, &samples, &[], &[], &resource);
            pending.extend_from_slice(&one);
            each.push(
                opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::decode(one.as_slice()).unwrap(),
            );
        }
        let merged =
            opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest::decode(pending.as_slice()).unwrap();
        let expected: Vec<_> = each.into_iter().flat_map(|r| r.resource_metrics).collect();
        assert_eq!(merged.resource_metrics.len(), 3);
        assert_eq!(merged.resource_metrics, expected);
    }

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn futures_can_be_spawned() {
        // The server spawns these on a multi-threaded runtime.
        let opts = AgentOptions::synthetic("http://x:1", "sim-n1", 1, 1);
        let run_future = run(opts.clone(), async {});
        assert_send(&run_future);
        let source_future = run_with_source(&opts, Box::new(Fleet::new(1, 1)), async {});
        assert_send(&source_future);
        let mut exporter = Exporter::new("http://x:1").unwrap();
        let req = encode(&[], &[]);
        let send_future = exporter.send(&req);
        assert_send(&send_future);
    }

    #[tokio::test]
    async fn run_stops_on_shutdown_and_keeps_failures_queued() {
        // Nothing listens on the endpoint: ticks fail, the loop goes on, shutdown ends it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let mut opts = AgentOptions::synthetic(&endpoint, "sim-t", 2, 1);
        opts.interval = Duration::from_millis(100);
        let shutdown = tokio::time::sleep(Duration::from_millis(350));
        tokio::time::timeout(Duration::from_secs(20), run(opts, shutdown))
            .await
            .expect("run did not stop")
            .unwrap();
    }
}
