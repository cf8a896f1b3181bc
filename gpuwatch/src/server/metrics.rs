//! The server's own metrics: `/metrics` (Prometheus text) and the samples self-telemetry sends.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::App;

/// One of the server's own metrics, as `/metrics` and self-telemetry give it.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Its name (Prometheus style).
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// Its value now.
    pub value: u64,
}

pub(super) async fn self_metrics(State(app): State<App>) -> Response {
    let mut out = String::new();
    for Sample {
        name,
        kind,
        help,
        value,
    } in samples(&app)
    {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    if let Some(a) = app.alerting.get() {
        out.push_str(&gpuwatch_alerts::metrics::render(a));
    }
    app.remote_write.render(&mut out);
    let mut resp = (StatusCode::OK, out).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}

/// The server's own metrics now (those of the store, the query engine and the memory ceiling).
pub(super) fn samples(app: &App) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut line = |name: &'static str, kind: &'static str, help: &'static str, value: u64| {
        out.push(Sample {
            name,
            kind,
            help,
            value,
        });
    };
    line(
        "gpuwatch_up",
        "gauge",
        "1 when the store is open",
        u64::from(app.store.get().is_some()),
    );
    if let Some(c) = &app.ceiling {
        let m = c.stats();
        line(
            "gpuwatch_memory_limit_bytes",
            "gauge",
            "The process's memory ceiling (--memory-limit)",
            m.limit as u64,
        );
        line(
            "gpuwatch_resident_memory_bytes",
            "gauge",
            "Resident memory at the last reading",
            m.resident as u64,
        );
        line(
            "gpuwatch_resident_memory_peak_bytes",
            "gauge",
            "Peak resident memory of the process",
            m.peak as u64,
        );
        line(
            "gpuwatch_query_memory_reserved_bytes",
            "gauge",
            "Bytes reserved by running queries in the pool they share",
            m.query_reserved as u64,
        );
        line(
            "gpuwatch_memory_pressure",
            "gauge",
            "1 while queries are refused because resident memory is near the ceiling",
            u64::from(m.pressure),
        );
        line(
            "gpuwatch_queries_stopped_memory_total",
            "counter",
            "Running queries stopped because resident memory neared the ceiling",
            m.queries_stopped,
        );
        line(
            "gpuwatch_queries_refused_memory_total",
            "counter",
            "Queries refused because resident memory was near the ceiling",
            m.queries_refused,
        );
        line(
            "gpuwatch_writes_refused_memory_total",
            "counter",
            "Writes refused with 503 because resident memory was at the ceiling",
            m.writes_refused,
        );
    }
    if let Some(store) = app.store.get() {
        let s = store.stats();
        line(
            "gpuwatch_writes_total",
            "counter",
            "Writes acknowledged",
            s.writes.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_rows_written_total",
            "counter",
            "Rows acknowledged",
            s.rows.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_wal_bytes_total",
            "counter",
            "Bytes appended to the write-ahead log",
            s.wal_bytes.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_persists_total",
            "counter",
            "Persists to the tables completed",
            s.persists.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_persist_failures_total",
            "counter",
            "Persists to the tables failed",
            s.persist_failures.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_persisted_rows_total",
            "counter",
            "Rows written to Parquet",
            s.persisted_rows.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_compactions_total",
            "counter",
            "Hour windows compacted",
            s.compactions.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_retention_expired_files_total",
            "counter",
            "Files dropped by retention",
            s.retention_deleted_files.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_wal_fsyncs_total",
            "counter",
            "Write-ahead log fsyncs (one is shared by every write waiting for it)",
            store.wal_fsyncs(),
        );
        line(
            "gpuwatch_writes_rejected_buffer_full_total",
            "counter",
            "Writes refused with 503 because the write buffer was full",
            s.rejected_buffer_full.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_writes_rejected_disk_full_total",
            "counter",
            "Writes refused with 503 because the disk was full",
            s.rejected_disk_full.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_wal_replayed_records_total",
            "counter",
            "WAL records replayed at start",
            s.replayed_records.load(Ordering::Relaxed),
        );
        let (rows, bytes) = store.buffered();
        line(
            "gpuwatch_buffer_rows",
            "gauge",
            "Rows buffered in memory",
            rows as u64,
        );
        line(
            "gpuwatch_buffer_bytes",
            "gauge",
            "Bytes buffered in memory",
            bytes as u64,
        );
        line(
            "gpuwatch_parquet_files",
            "gauge",
            "Data files of the tables in this server's view",
            store.file_count() as u64,
        );
        line(
            "gpuwatch_persistence_stopped",
            "gauge",
            "1 when another process commits under this server's writer id and persistence stopped",
            u64::from(store.fenced().is_some()),
        );
        line(
            "gpuwatch_ingest",
            "gauge",
            "1 when this server takes writes (--role all or ingest), 0 on a query node",
            u64::from(store.ingests()),
        );
        line(
            "gpuwatch_delta_commits_total",
            "counter",
            "Delta commits made by this server (persists, compaction, rollups, retention)",
            s.delta_commits.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_delta_conflicts_total",
            "counter",
            "Delta commits that met a concurrent commit they conflict with (nothing written, retried)",
            s.delta_conflicts.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_table_refreshes_total",
            "counter",
            "Refreshes of the tables that found other servers' commits",
            s.refreshes.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_vacuumed_files_total",
            "counter",
            "Files deleted by vacuum (removed from a table past the grace period, or named by no commit)",
            s.vacuumed_files.load(Ordering::Relaxed),
        );
        damage_samples(store, &mut line);
    }
    if let Some(engine) = app.engine.get() {
        let s = engine.scan_stats();
        line(
            "gpuwatch_query_files_scanned_total",
            "counter",
            "Parquet files read by queries",
            s.files_scanned.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_query_files_pruned_total",
            "counter",
            "Parquet files skipped by queries because their time range cannot match",
            s.files_pruned.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_query_answers_with_skipped_data_total",
            "counter",
            "Answers that left damaged data out and said so (a Gpuwatch-Warning header, a Postgres notice)",
            s.answers_with_skipped_data.load(Ordering::Relaxed),
        );
        line(
            "gpuwatch_query_retried_after_damage_total",
            "counter",
            "Queries run again without a data file their read found damaged",
            s.retried_after_damage.load(Ordering::Relaxed),
        );
    }
    out
}

/// The damage the store knows of (docs/operations.md).
fn damage_samples(
    store: &gpuwatch_store::Store,
    line: &mut impl FnMut(&'static str, &'static str, &'static str, u64),
) {
    let s = store.stats();
    line(
        "gpuwatch_wal_damaged_segments_total",
        "counter",
        "Write-ahead log segments found damaged at replay (every valid record in them replayed)",
        s.wal_damaged_segments.load(Ordering::Relaxed),
    );
    line(
        "gpuwatch_wal_skipped_bytes_total",
        "counter",
        "Write-ahead log bytes skipped at replay because they held no valid record",
        s.wal_skipped_bytes.load(Ordering::Relaxed),
    );
    line(
        "gpuwatch_wal_quarantined_segments_total",
        "counter",
        "Damaged write-ahead log segments moved to quarantine once their valid records were committed",
        s.wal_quarantined_segments.load(Ordering::Relaxed),
    );
    line(
        "gpuwatch_damaged_files",
        "gauge",
        "Data files left out of answers and maintenance because they are missing, empty or unreadable",
        store.damaged_files().len() as u64,
    );
    let tables = gpuwatch_store::schema::Table::ALL;
    line(
        "gpuwatch_damaged_table_logs",
        "gauge",
        "Tables whose Delta log has versions that cannot be read (no commit or vacuum runs on them)",
        tables
            .iter()
            .filter(|t| store.log_health(**t).blocks())
            .count() as u64,
    );
    line(
        "gpuwatch_persists_held_back_total",
        "counter",
        "Persists that kept a table's rows buffered and in the write-ahead log because its Delta log is damaged",
        s.persists_held_back.load(Ordering::Relaxed),
    );
}
