//! The server's own metrics: one registry ([`Metrics::registry`]) that `/metrics` encodes
//! (OpenMetrics text) — the store's (its damage too), the query engine's and the memory
//! ceiling's values read at each scrape ([`samples`], which self-telemetry sends too), the
//! alerting service's, the latency histograms (ingest, queries, WAL fsync, persist), requests by
//! protocol and outcome, `gpuwatch_build_info` and the `process_*` metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::server::sql::error_response;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gpuwatch_common::metrics::prometheus_client::metrics::counter::Counter;
use gpuwatch_common::metrics::prometheus_client::metrics::family::Family;
use gpuwatch_common::metrics::prometheus_client::metrics::histogram::Histogram;
use gpuwatch_common::metrics::{
    Kind, LateHistogram, ProcessCollector, Registry, Sample, SampleCollector, latency_histogram,
};
use gpuwatch_query::memory::CeilingStats;
use gpuwatch_query::{QueryEngine, Status};

use gpuwatch_store::Store;

use super::App;
use super::ingest::Protocol;

type Labels1 = [(&'static str, &'static str); 1];
type Labels2 = [(&'static str, &'static str); 2];

/// The metrics the server's own code records (the others are read at scrape time).
#[derive(Debug, Clone)]
pub(super) struct Metrics {
    ingest_requests: Family<Labels2, Counter>,
    ingest_seconds: Family<Labels1, Histogram, fn() -> Histogram>,
    /// Persist latency (`gpuwatch_persist_duration_seconds`).
    pub persist_seconds: Histogram,
    /// SQL-over-HTTP query latency, planning to the last byte
    /// (`gpuwatch_query_duration_seconds`).
    pub query_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ingest_requests: Family::default(),
            ingest_seconds: Family::new_with_constructor(latency_histogram),
            persist_seconds: latency_histogram(),
            query_seconds: latency_histogram(),
        }
    }
}

impl Metrics {
    /// A write request of `protocol` ended with `outcome` (`ok`, `bad_request`, …) after `took`.
    pub(super) fn ingest(&self, protocol: Protocol, outcome: &'static str, took: Duration) {
        self.ingest_requests
            .get_or_create(&[("protocol", protocol.as_str()), ("outcome", outcome)])
            .inc();
        self.ingest_seconds
            .get_or_create(&[("protocol", protocol.as_str())])
            .observe(took.as_secs_f64());
    }

    /// The registry of everything `/metrics` shows for `app`.
    pub(super) fn registry(&self, app: &App) -> Registry {
        let mut r = Registry::default();
        gpuwatch_common::metrics::build_info(&mut r, "gpuwatch_build", env!("CARGO_PKG_VERSION"));
        r.register_collector(Box::new(ProcessCollector));
        let values = app.clone();
        r.register_collector(Box::new(SampleCollector::new(move || samples(&values))));
        r.register(
            "gpuwatch_ingest_requests",
            "Write requests by protocol and outcome (ok, bad_request, too_large, forbidden, unavailable, disk_full, internal)",
            self.ingest_requests.clone(),
        );
        r.register(
            "gpuwatch_ingest_duration_seconds",
            "Write requests from admission to the WAL fsync, by protocol",
            self.ingest_seconds.clone(),
        );
        r.register(
            "gpuwatch_persist_duration_seconds",
            "Persists of the buffer to the tables",
            self.persist_seconds.clone(),
        );
        r.register(
            "gpuwatch_query_duration_seconds",
            "SQL queries over HTTP, planning to the last byte of the answer",
            self.query_seconds.clone(),
        );
        let store = Arc::clone(&app.store);
        r.register_collector(Box::new(LateHistogram::new(
            "gpuwatch_wal_fsync_duration_seconds",
            "Write-ahead log fsyncs (one is shared by every write waiting for it)",
            move || store.get().map(|s| s.wal_fsync_seconds()),
        )));
        let alerting = Arc::clone(&app.alerting);
        gpuwatch_alerts::metrics::register(&mut r, move || alerting.get().cloned());
        app.remote_write.register(&mut r);
        r
    }
}

/// `GET /metrics`.
pub(super) async fn self_metrics(State(registry): State<Arc<Registry>>) -> Response {
    let text = match gpuwatch_common::metrics::encode(&registry) {
        Ok(t) => t,
        Err(e) => {
            return error_response(Status::Internal, &format!("cannot encode the metrics: {e}"));
        }
    };
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(gpuwatch_common::metrics::OPENMETRICS_CONTENT_TYPE),
    );
    resp
}

/// One value read at scrape time: name, kind, help, and how to read it from its component.
type Entry<T> = (&'static str, Kind, &'static str, fn(&T) -> u64);

const MEMORY: &[Entry<CeilingStats>] = &[
    (
        "gpuwatch_memory_limit_bytes",
        Kind::Gauge,
        "The process's memory ceiling (--memory-limit)",
        |m| m.limit as u64,
    ),
    (
        "gpuwatch_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory at the last reading",
        |m| m.resident as u64,
    ),
    (
        "gpuwatch_resident_memory_peak_bytes",
        Kind::Gauge,
        "Peak resident memory of the process",
        |m| m.peak as u64,
    ),
    (
        "gpuwatch_query_memory_reserved_bytes",
        Kind::Gauge,
        "Bytes reserved by running queries in the pool they share",
        |m| m.query_reserved as u64,
    ),
    (
        "gpuwatch_memory_pressure",
        Kind::Gauge,
        "1 while queries are refused because resident memory is near the ceiling",
        |m| u64::from(m.pressure),
    ),
    (
        "gpuwatch_queries_stopped_memory_total",
        Kind::Counter,
        "Running queries stopped because resident memory neared the ceiling",
        |m| m.queries_stopped,
    ),
    (
        "gpuwatch_queries_refused_memory_total",
        Kind::Counter,
        "Queries refused because resident memory was near the ceiling",
        |m| m.queries_refused,
    ),
    (
        "gpuwatch_writes_refused_memory_total",
        Kind::Counter,
        "Writes refused with 503 because resident memory was at the ceiling",
        |m| m.writes_refused,
    ),
    (
        "gpuwatch_decode_memory_reserved_bytes",
        Kind::Gauge,
        "Bytes reserved by writes being inflated and decoded",
        |m| m.decode_reserved as u64,
    ),
    (
        "gpuwatch_writes_refused_decode_memory_total",
        Kind::Counter,
        "Writes refused (503 or 413) because their decode found no room under the ceiling",
        |m| m.decodes_refused,
    ),
];

const STORE: &[Entry<Store>] = &[
    (
        "gpuwatch_writes_total",
        Kind::Counter,
        "Writes acknowledged",
        |st| st.stats().writes.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_rows_written_total",
        Kind::Counter,
        "Rows acknowledged",
        |st| st.stats().rows.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_wal_bytes_total",
        Kind::Counter,
        "Bytes appended to the write-ahead log",
        |st| st.stats().wal_bytes.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_persists_total",
        Kind::Counter,
        "Persists to the tables completed",
        |st| st.stats().persists.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_persist_failures_total",
        Kind::Counter,
        "Persists to the tables failed",
        |st| st.stats().persist_failures.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_persisted_rows_total",
        Kind::Counter,
        "Rows written to Parquet",
        |st| st.stats().persisted_rows.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_compactions_total",
        Kind::Counter,
        "Hour windows compacted",
        |st| st.stats().compactions.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_retention_expired_files_total",
        Kind::Counter,
        "Files dropped by retention",
        |st| st.stats().retention_deleted_files.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_wal_fsyncs_total",
        Kind::Counter,
        "Write-ahead log fsyncs (one is shared by every write waiting for it)",
        |st| st.wal_fsyncs(),
    ),
    (
        "gpuwatch_writes_rejected_buffer_full_total",
        Kind::Counter,
        "Writes refused with 503 because the write buffer was full",
        |st| st.stats().rejected_buffer_full.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_writes_rejected_disk_full_total",
        Kind::Counter,
        "Writes refused with 503 because the disk was full",
        |st| st.stats().rejected_disk_full.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_wal_replayed_records_total",
        Kind::Counter,
        "WAL records replayed at start",
        |st| st.stats().replayed_records.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_buffer_rows",
        Kind::Gauge,
        "Rows buffered in memory",
        |st| st.buffered().0 as u64,
    ),
    (
        "gpuwatch_buffer_bytes",
        Kind::Gauge,
        "Bytes buffered in memory",
        |st| st.buffered().1 as u64,
    ),
    (
        "gpuwatch_parquet_files",
        Kind::Gauge,
        "Data files of the tables in this server's view",
        |st| st.file_count() as u64,
    ),
    (
        "gpuwatch_persistence_stopped",
        Kind::Gauge,
        "1 when another process commits under this server's writer id and persistence stopped",
        |st| u64::from(st.fenced().is_some()),
    ),
    (
        "gpuwatch_ingest",
        Kind::Gauge,
        "1 when this server takes writes (--role all or ingest), 0 on a query node",
        |st| u64::from(st.ingests()),
    ),
    (
        "gpuwatch_delta_commits_total",
        Kind::Counter,
        "Delta commits made by this server (persists, compaction, rollups, retention)",
        |st| st.stats().delta_commits.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_delta_conflicts_total",
        Kind::Counter,
        "Delta commits that met a concurrent commit they conflict with (nothing written, retried)",
        |st| st.stats().delta_conflicts.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_table_refreshes_total",
        Kind::Counter,
        "Refreshes of the tables that found other servers' commits",
        |st| st.stats().refreshes.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_vacuumed_files_total",
        Kind::Counter,
        "Files deleted by vacuum (removed from a table past the grace period, or named by no commit)",
        |st| st.stats().vacuumed_files.load(Ordering::Relaxed),
    ),
];

/// The damage the store knows of (docs/operations.md).
const DAMAGE: &[Entry<Store>] = &[
    (
        "gpuwatch_wal_damaged_segments_total",
        Kind::Counter,
        "Write-ahead log segments found damaged at replay (every valid record in them replayed)",
        |st| st.stats().wal_damaged_segments.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_wal_skipped_bytes_total",
        Kind::Counter,
        "Write-ahead log bytes skipped at replay because they held no valid record",
        |st| st.stats().wal_skipped_bytes.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_wal_quarantined_segments_total",
        Kind::Counter,
        "Damaged write-ahead log segments moved to quarantine once their valid records were committed",
        |st| st.stats().wal_quarantined_segments.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_damaged_files",
        Kind::Gauge,
        "Data files left out of answers and maintenance because they are missing, empty or unreadable",
        |st| st.damaged_files().len() as u64,
    ),
    (
        "gpuwatch_damaged_table_logs",
        Kind::Gauge,
        "Tables whose Delta log has versions that cannot be read (no commit or vacuum runs on them)",
        |st| {
            gpuwatch_store::schema::Table::ALL
                .iter()
                .filter(|t| st.log_health(**t).blocks())
                .count() as u64
        },
    ),
    (
        "gpuwatch_persists_held_back_total",
        Kind::Counter,
        "Persists that kept a table's rows buffered and in the write-ahead log because its Delta log is damaged",
        |st| st.stats().persists_held_back.load(Ordering::Relaxed),
    ),
];

const ENGINE: &[Entry<QueryEngine>] = &[
    (
        "gpuwatch_query_files_scanned_total",
        Kind::Counter,
        "Parquet files read by queries",
        |e| e.scan_stats().files_scanned.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_query_files_pruned_total",
        Kind::Counter,
        "Parquet files skipped by queries because their time range cannot match",
        |e| e.scan_stats().files_pruned.load(Ordering::Relaxed),
    ),
    (
        "gpuwatch_query_answers_with_skipped_data_total",
        Kind::Counter,
        "Answers that left damaged data out and said so (a Gpuwatch-Warning header, a Postgres notice)",
        |e| {
            e.scan_stats()
                .answers_with_skipped_data
                .load(Ordering::Relaxed)
        },
    ),
    (
        "gpuwatch_query_retried_after_damage_total",
        Kind::Counter,
        "Queries run again without a data file their read found damaged",
        |e| e.scan_stats().retried_after_damage.load(Ordering::Relaxed),
    ),
];

/// The server's own metrics now (those of the store, the query engine and the memory ceiling).
pub(super) fn samples(app: &App) -> Vec<Sample> {
    fn read<T>(out: &mut Vec<Sample>, table: &[Entry<T>], from: &T) {
        for (name, kind, help, get) in table {
            out.push(Sample::new(name, *kind, help, get(from) as f64));
        }
    }
    let mut out = vec![Sample::new(
        "gpuwatch_up",
        Kind::Gauge,
        "1 when the store is open",
        f64::from(u8::from(app.store.get().is_some())),
    )];
    if let Some(c) = &app.ceiling {
        read(&mut out, MEMORY, &c.stats());
    }
    if let Some(store) = app.store.get() {
        read(&mut out, STORE, store.as_ref());
        read(&mut out, DAMAGE, store.as_ref());
    }
    if let Some(engine) = app.engine.get() {
        read(&mut out, ENGINE, engine);
    }
    out
}
