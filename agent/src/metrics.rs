//! The agent's own metrics: constant names, bounded label sets, process-wide counters. They are
//! served on `/metrics` beside the GPU metrics ([`crate::export::prometheus`]).
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

use gpuwatch_common::metrics::TextWriter;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

static COLLECTIONS: AtomicU64 = AtomicU64::new(0);
static COLLECTION_ERRORS: AtomicU64 = AtomicU64::new(0);
static COLLECTION_LAST_NANOS: AtomicU64 = AtomicU64::new(0);
static COLLECTION_TOTAL_NANOS: AtomicU64 = AtomicU64::new(0);
static GPUS: AtomicU64 = AtomicU64::new(0);
static GPU_PROCESSES: AtomicU64 = AtomicU64::new(0);
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static EXPORT_FAILURES: AtomicU64 = AtomicU64::new(0);
static EXPORT_REJECTED: AtomicU64 = AtomicU64::new(0);
static EXPORT_AUTH_REFUSED: AtomicU64 = AtomicU64::new(0);
static EXPORT_REJECTED_POINTS: AtomicU64 = AtomicU64::new(0);
static SPOOL_REQUESTS: AtomicU64 = AtomicU64::new(0);
static SPOOL_BYTES: AtomicU64 = AtomicU64::new(0);
static SPOOL_DROPPED: AtomicU64 = AtomicU64::new(0);
static NVML_ERRORS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// A collection finished in `nanos`, reading `gpus` GPUs and `processes` processes.
pub fn collection_done(nanos: u64, gpus: usize, processes: usize) {
    COLLECTIONS.fetch_add(1, Ordering::Relaxed);
    COLLECTION_LAST_NANOS.store(nanos, Ordering::Relaxed);
    COLLECTION_TOTAL_NANOS.fetch_add(nanos, Ordering::Relaxed);
    GPUS.store(gpus as u64, Ordering::Relaxed);
    GPU_PROCESSES.store(processes as u64, Ordering::Relaxed);
}

/// A collection failed as a whole.
pub fn collection_failed() {
    COLLECTION_ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// An NVML call failed.
pub fn nvml_error(call: &'static str) {
    let mut map = NVML_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(call).or_insert(0) += 1;
}

/// The endpoint accepted a request.
pub fn exported() {
    EXPORTED.fetch_add(1, Ordering::Relaxed);
}

/// A send failed and will be retried.
pub fn export_failed() {
    EXPORT_FAILURES.fetch_add(1, Ordering::Relaxed);
}

/// The endpoint refused a request for good.
pub fn export_rejected() {
    EXPORT_REJECTED.fetch_add(1, Ordering::Relaxed);
}

/// The endpoint refused the bearer token; the requests stay queued.
pub fn export_auth_refused() {
    EXPORT_AUTH_REFUSED.fetch_add(1, Ordering::Relaxed);
}

/// The endpoint accepted a request but refused `points` of its data points.
pub fn export_rejected_points(points: u64) {
    EXPORT_REJECTED_POINTS.fetch_add(points, Ordering::Relaxed);
}

/// The spool's state after a send.
pub fn spool_state(requests: usize, bytes: u64, dropped_total: u64) {
    SPOOL_REQUESTS.store(requests as u64, Ordering::Relaxed);
    SPOOL_BYTES.store(bytes, Ordering::Relaxed);
    SPOOL_DROPPED.store(dropped_total, Ordering::Relaxed);
}

/// Requests dropped by the spool so far (as last reported).
pub fn spool_dropped() -> u64 {
    SPOOL_DROPPED.load(Ordering::Relaxed)
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    TextWriter::new(out).family(name, kind, help);
}

fn one(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    TextWriter::new(out).one(name, kind, help, value);
}

/// One of the agent's own single-value metrics: name, type, help, the value's source and
/// what it is divided by to give the value in its unit.
type Single = (
    &'static str,
    &'static str,
    &'static str,
    &'static AtomicU64,
    f64,
);

/// The collection metrics, written before the NVML errors.
static COLLECTION: [Single; 6] = [
    (
        "gpuwatch_agent_collections_total",
        "counter",
        "collections done",
        &COLLECTIONS,
        1.0,
    ),
    (
        "gpuwatch_agent_collection_errors_total",
        "counter",
        "collections that failed as a whole",
        &COLLECTION_ERRORS,
        1.0,
    ),
    (
        "gpuwatch_agent_collection_duration_seconds",
        "gauge",
        "time the last collection took",
        &COLLECTION_LAST_NANOS,
        1e9,
    ),
    (
        "gpuwatch_agent_collection_seconds_total",
        "counter",
        "time spent collecting",
        &COLLECTION_TOTAL_NANOS,
        1e9,
    ),
    (
        "gpuwatch_agent_gpus",
        "gauge",
        "GPUs and MIG instances read by the last collection",
        &GPUS,
        1.0,
    ),
    (
        "gpuwatch_agent_gpu_processes",
        "gauge",
        "GPU processes seen by the last collection",
        &GPU_PROCESSES,
        1.0,
    ),
];

/// The export and spool metrics, written after the NVML errors.
static EXPORT: [Single; 8] = [
    (
        "gpuwatch_agent_exported_requests_total",
        "counter",
        "requests the endpoint accepted",
        &EXPORTED,
        1.0,
    ),
    (
        "gpuwatch_agent_export_failures_total",
        "counter",
        "send attempts that failed and will be retried",
        &EXPORT_FAILURES,
        1.0,
    ),
    (
        "gpuwatch_agent_export_rejected_total",
        "counter",
        "requests the endpoint refused for good",
        &EXPORT_REJECTED,
        1.0,
    ),
    (
        "gpuwatch_agent_export_auth_refused_total",
        "counter",
        "send attempts refused for the bearer token; the requests stay queued",
        &EXPORT_AUTH_REFUSED,
        1.0,
    ),
    (
        "gpuwatch_agent_export_rejected_points_total",
        "counter",
        "data points the endpoint refused in partial-success answers",
        &EXPORT_REJECTED_POINTS,
        1.0,
    ),
    (
        "gpuwatch_agent_spool_requests",
        "gauge",
        "requests waiting in the spool",
        &SPOOL_REQUESTS,
        1.0,
    ),
    (
        "gpuwatch_agent_spool_bytes",
        "gauge",
        "bytes waiting in the spool",
        &SPOOL_BYTES,
        1.0,
    ),
    (
        "gpuwatch_agent_spool_dropped_total",
        "counter",
        "oldest requests dropped because the spool was full",
        &SPOOL_DROPPED,
        1.0,
    ),
];

fn singles(out: &mut String, list: &[Single]) {
    for (name, kind, help, value, divisor) in list {
        one(
            out,
            name,
            kind,
            help,
            value.load(Ordering::Relaxed) as f64 / divisor,
        );
    }
}

/// Append the agent's own metrics in the Prometheus text format.
pub fn render(out: &mut String) {
    family(
        out,
        "gpuwatch_agent_build_info",
        "gauge",
        "gpuwatch-agent build, always 1",
    );
    TextWriter::new(out).sample(
        "gpuwatch_agent_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    singles(out, &COLLECTION);
    family(
        out,
        "gpuwatch_agent_nvml_errors_total",
        "counter",
        "NVML calls that failed, by call",
    );
    {
        let map = NVML_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
        let mut w = TextWriter::new(out);
        for (call, n) in map.iter() {
            w.sample(
                "gpuwatch_agent_nvml_errors_total",
                &[("call", call)],
                *n as f64,
            );
        }
    }
    singles(out, &EXPORT);
}
