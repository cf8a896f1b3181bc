//! The agent's own metrics: constant names, bounded label sets, process-wide counters and gauges
//! registered with one `prometheus-client` [`Registry`] (the crate and helpers the server uses,
//! `gpuwatch_common::metrics`). They are served on `/metrics` after the GPU metrics
//! ([`crate::export::prometheus`]), rendered as the Prometheus text format 0.0.4 like the rest of
//! that body, with the standard `process_*` metrics of the agent process.
//!
//! | name | type | meaning |
//! | --- | --- | --- |
//! | `gpuwatch_agent_build_info{version}` | gauge | always 1 |
//! | `gpuwatch_agent_collections_total` | counter | collections done |
//! | `gpuwatch_agent_collection_errors_total` | counter | collections that failed as a whole |
//! | `gpuwatch_agent_collection_duration_seconds` | gauge | time the last collection took |
//! | `gpuwatch_agent_collection_seconds_total` | counter | time spent collecting |
//! | `gpuwatch_agent_gpus` | gauge | GPUs (and MIG instances) read by the last collection |
//! | `gpuwatch_agent_gpu_processes` | gauge | GPU processes seen by the last collection |
//! | `gpuwatch_agent_nvml_errors_total{call}` | counter | NVML calls that failed, by call |
//! | `gpuwatch_agent_exported_requests_total` | counter | requests the endpoint accepted |
//! | `gpuwatch_agent_export_failures_total` | counter | send attempts that failed and will be retried |
//! | `gpuwatch_agent_export_rejected_total` | counter | requests the endpoint refused for good (4xx, or a gRPC code that will not change) |
//! | `gpuwatch_agent_export_auth_refused_total` | counter | send attempts refused for the bearer token (401/403, gRPC `UNAUTHENTICATED`/`PERMISSION_DENIED`); the requests stay queued |
//! | `gpuwatch_agent_export_rejected_points_total` | counter | data points refused in partial-success answers (the rest of those requests was stored) |
//! | `gpuwatch_agent_spool_requests` | gauge | requests waiting in the spool |
//! | `gpuwatch_agent_spool_bytes` | gauge | bytes waiting in the spool |
//! | `gpuwatch_agent_spool_dropped_total` | counter | oldest requests dropped because the spool was full |
//!
//! The NVML call names are the fixed strings the NVML source passes (about 20), so the label set
//! stays bounded.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use gpuwatch_common::metrics::prometheus_client::collector::Collector;
use gpuwatch_common::metrics::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use gpuwatch_common::metrics::prometheus_client::metrics::counter::Counter;
use gpuwatch_common::metrics::prometheus_client::metrics::family::Family;
use gpuwatch_common::metrics::prometheus_client::metrics::gauge::Gauge;
use gpuwatch_common::metrics::{ProcessCollector, Registry, build_info, encode_text_into};

/// The label set of `gpuwatch_agent_nvml_errors_total`: the failed call's fixed name.
type CallLabel = [(&'static str, &'static str); 1];

/// The agent's metrics and the registry that renders them.
#[derive(Debug)]
struct AgentMetrics {
    collections: Counter,
    collection_errors: Counter,
    collection_duration: Gauge<f64, AtomicU64>,
    collection_seconds: Counter<f64, AtomicU64>,
    gpus: Gauge,
    gpu_processes: Gauge,
    nvml_errors: Family<CallLabel, Counter>,
    exported: Counter,
    export_failures: Counter,
    export_rejected: Counter,
    export_auth_refused: Counter,
    export_rejected_points: Counter,
    spool_requests: Gauge,
    spool_bytes: Gauge,
    spool_dropped: Counter,
    registry: Registry,
}

/// Registers a counter under its full name (`…_total`; the registry adds the suffix itself).
fn counter<N, A>(registry: &mut Registry, name: &str, help: &str) -> Counter<N, A>
where
    Counter<N, A>: gpuwatch_common::metrics::prometheus_client::registry::Metric + Clone + Default,
{
    let c = Counter::<N, A>::default();
    let base = name.strip_suffix("_total").unwrap_or(name);
    registry.register(base, help, c.clone());
    c
}

/// Registers a gauge.
fn gauge<N, A>(registry: &mut Registry, name: &str, help: &str) -> Gauge<N, A>
where
    Gauge<N, A>: gpuwatch_common::metrics::prometheus_client::registry::Metric + Clone + Default,
{
    let g = Gauge::<N, A>::default();
    registry.register(name, help, g.clone());
    g
}

impl AgentMetrics {
    /// Registers every metric, in the order `/metrics` shows them.
    fn new() -> Self {
        let mut r = Registry::default();
        build_info(&mut r, "gpuwatch_agent_build", env!("CARGO_PKG_VERSION"));
        let collections = counter(
            &mut r,
            "gpuwatch_agent_collections_total",
            "collections done",
        );
        let collection_errors = counter(
            &mut r,
            "gpuwatch_agent_collection_errors_total",
            "collections that failed as a whole",
        );
        let collection_duration = gauge(
            &mut r,
            "gpuwatch_agent_collection_duration_seconds",
            "time the last collection took",
        );
        let collection_seconds = counter(
            &mut r,
            "gpuwatch_agent_collection_seconds_total",
            "time spent collecting",
        );
        let gpus = gauge(
            &mut r,
            "gpuwatch_agent_gpus",
            "GPUs and MIG instances read by the last collection",
        );
        let gpu_processes = gauge(
            &mut r,
            "gpuwatch_agent_gpu_processes",
            "GPU processes seen by the last collection",
        );
        let nvml_errors = Family::<CallLabel, Counter>::default();
        r.register_collector(Box::new(NvmlErrors(nvml_errors.clone())));
        let mut m = Self {
            collections,
            collection_errors,
            collection_duration,
            collection_seconds,
            gpus,
            gpu_processes,
            nvml_errors,
            exported: Counter::default(),
            export_failures: Counter::default(),
            export_rejected: Counter::default(),
            export_auth_refused: Counter::default(),
            export_rejected_points: Counter::default(),
            spool_requests: Gauge::default(),
            spool_bytes: Gauge::default(),
            spool_dropped: Counter::default(),
            registry: r,
        };
        m.register_export();
        m.registry.register_collector(Box::new(ProcessCollector));
        m
    }

    /// Registers the export and spool metrics, shown after the collection ones.
    fn register_export(&mut self) {
        let r = &mut self.registry;
        self.exported = counter(
            r,
            "gpuwatch_agent_exported_requests_total",
            "requests the endpoint accepted",
        );
        self.export_failures = counter(
            r,
            "gpuwatch_agent_export_failures_total",
            "send attempts that failed and will be retried",
        );
        self.export_rejected = counter(
            r,
            "gpuwatch_agent_export_rejected_total",
            "requests the endpoint refused for good",
        );
        self.export_auth_refused = counter(
            r,
            "gpuwatch_agent_export_auth_refused_total",
            "send attempts refused for the bearer token; the requests stay queued",
        );
        self.export_rejected_points = counter(
            r,
            "gpuwatch_agent_export_rejected_points_total",
            "data points the endpoint refused in partial-success answers",
        );
        self.spool_requests = gauge(
            r,
            "gpuwatch_agent_spool_requests",
            "requests waiting in the spool",
        );
        self.spool_bytes = gauge(
            r,
            "gpuwatch_agent_spool_bytes",
            "bytes waiting in the spool",
        );
        self.spool_dropped = counter(
            r,
            "gpuwatch_agent_spool_dropped_total",
            "oldest requests dropped because the spool was full",
        );
    }
}

/// `gpuwatch_agent_nvml_errors_total{call}`, its `# HELP` and `# TYPE` written even before the
/// first error (a registry leaves empty families out; dashboards and the e2e test look for it).
#[derive(Debug)]
struct NvmlErrors(Family<CallLabel, Counter>);

impl Collector for NvmlErrors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(
            "gpuwatch_agent_nvml_errors",
            "NVML calls that failed, by call.",
            None,
            self.0.metric_type(),
        )?;
        self.0.encode(metric)
    }
}

static METRICS: LazyLock<AgentMetrics> = LazyLock::new(AgentMetrics::new);

/// A collection finished in `nanos`, reading `gpus` GPUs and `processes` processes.
pub fn collection_done(nanos: u64, gpus: usize, processes: usize) {
    let m = &*METRICS;
    let seconds = nanos as f64 / 1e9;
    m.collections.inc();
    m.collection_duration.set(seconds);
    m.collection_seconds.inc_by(seconds);
    m.gpus.set(gpus as i64);
    m.gpu_processes.set(processes as i64);
}

/// A collection failed as a whole.
pub fn collection_failed() {
    METRICS.collection_errors.inc();
}

/// An NVML call failed.
pub fn nvml_error(call: &'static str) {
    METRICS.nvml_errors.get_or_create(&[("call", call)]).inc();
}

/// The endpoint accepted a request.
pub fn exported() {
    METRICS.exported.inc();
}

/// A send failed and will be retried.
pub fn export_failed() {
    METRICS.export_failures.inc();
}

/// The endpoint refused a request for good.
pub fn export_rejected() {
    METRICS.export_rejected.inc();
}

/// The endpoint refused the bearer token; the requests stay queued.
pub fn export_auth_refused() {
    METRICS.export_auth_refused.inc();
}

/// The endpoint accepted a request but refused `points` of its data points.
pub fn export_rejected_points(points: u64) {
    METRICS.export_rejected_points.inc_by(points);
}

/// The spool's state after a send; `dropped_total` only grows, so the counter follows it.
pub fn spool_state(requests: usize, bytes: u64, dropped_total: u64) {
    let m = &*METRICS;
    m.spool_requests.set(requests as i64);
    m.spool_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    let seen = m.spool_dropped.get();
    if dropped_total > seen {
        m.spool_dropped.inc_by(dropped_total - seen);
    }
}

/// Requests dropped by the spool so far (as last reported).
pub fn spool_dropped() -> u64 {
    METRICS.spool_dropped.get()
}

/// Appends the agent's own metrics in the Prometheus text format 0.0.4.
pub fn render(out: &mut String) {
    if let Err(e) = encode_text_into(out, &METRICS.registry) {
        // Writing into a `String` does not fail, and the collectors only read `/proc`.
        tracing::warn!(error = %e, "could not render the agent's own metrics");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_metrics_keep_their_names_types_and_labels() {
        collection_done(1_500_000_000, 8, 3);
        nvml_error("nvmlDeviceGetPowerUsage");
        spool_state(2, 4096, 5);
        spool_state(2, 4096, 5);
        let mut text = String::new();
        render(&mut text);
        for (name, kind) in [
            ("gpuwatch_agent_build_info", "gauge"),
            ("gpuwatch_agent_collections_total", "counter"),
            ("gpuwatch_agent_collection_errors_total", "counter"),
            ("gpuwatch_agent_collection_duration_seconds", "gauge"),
            ("gpuwatch_agent_collection_seconds_total", "counter"),
            ("gpuwatch_agent_gpus", "gauge"),
            ("gpuwatch_agent_gpu_processes", "gauge"),
            ("gpuwatch_agent_nvml_errors_total", "counter"),
            ("gpuwatch_agent_exported_requests_total", "counter"),
            ("gpuwatch_agent_export_failures_total", "counter"),
            ("gpuwatch_agent_export_rejected_total", "counter"),
            ("gpuwatch_agent_export_auth_refused_total", "counter"),
            ("gpuwatch_agent_export_rejected_points_total", "counter"),
            ("gpuwatch_agent_spool_requests", "gauge"),
            ("gpuwatch_agent_spool_bytes", "gauge"),
            ("gpuwatch_agent_spool_dropped_total", "counter"),
        ] {
            assert!(
                text.contains(&format!("\n# TYPE {name} {kind}\n")),
                "no {kind} {name}:\n{text}"
            );
        }
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!(
            "gpuwatch_agent_build_info{{version=\"{version}\"}} 1\n"
        )));
        assert!(
            text.contains("gpuwatch_agent_nvml_errors_total{call=\"nvmlDeviceGetPowerUsage\"} ")
        );
        // Other tests of this process move the same metrics: the dropped count only grows.
        let dropped: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("gpuwatch_agent_spool_dropped_total "))
            .and_then(|v| v.parse().ok())
            .expect("a spool_dropped_total sample");
        assert!(dropped >= 5.0, "{text}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn the_nvml_errors_family_is_shown_before_any_error() {
        let mut r = Registry::default();
        r.register_collector(Box::new(NvmlErrors(Family::default())));
        let mut text = String::new();
        encode_text_into(&mut text, &r).expect("encode");
        assert_eq!(
            text,
            "# HELP gpuwatch_agent_nvml_errors_total NVML calls that failed, by call.\n\
             # TYPE gpuwatch_agent_nvml_errors_total counter\n"
        );
    }
}
