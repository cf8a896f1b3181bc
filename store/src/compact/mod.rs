//! Compaction, rollups and retention: the background maintenance of the persisted files.
//!
//! - **Compaction.** Files are grouped into windows (table, hour). A window is merged into one
//!   sorted file when it holds `max_files_per_window` files, and once it is closed (its hour
//!   ended `close_after` ago) whatever it holds is merged into one final file. So a window never
//!   holds more than `max_files_per_window` files, and a closed one holds one. Late files that
//!   reopen a closed window are merged in once a whole pass saw no new one (or the bound is
//!   reached), so a backfill streaming into an old hour does not rewrite it at every persist.
//!   In Delta terms: `remove` of the inputs and `add` of the merged file, `dataChange=false`.
//! - **Rollups.** When a closed `gpu_metrics` hour is merged, its `gpu_metrics_1m` and
//!   `gpu_metrics_1h` rows are computed from the merged rows ([`rollup`]) (`gpu_processes`:
//!   `gpu_processes_1m` and `gpu_processes_1h`) and committed to those tables first, replacing any earlier rollup of that hour (late data re-closes the hour); the
//!   raw hour is marked rolled up (its file's `gpuwatch.level` tag is 1) by its own commit after.
//! - **Retention.** Whole files whose newest row is older than their table's retention are
//!   removed from their table (raw `gpu_metrics` and `gpu_processes` only once their hour is
//!   rolled up).
//!
//! Files removed from a table are not deleted at once: a query (here or in another engine) may
//! be reading a version that names them. Vacuum deletes them `grace` later (longer than any
//! query may run), together with files no commit names (left by a failed persist or compaction).

pub mod rollup;

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::delta::schema::from_file_batch;
use crate::persist::{FileMeta, Storage};
use crate::schema::Table;
use crate::{Error, Result};

/// One hour, in ns.
pub const HOUR_NANOS: i64 = 3_600_000_000_000;

/// How compaction runs.
#[derive(Debug, Clone)]
pub struct CompactionConfig {
    /// An open window holding this many files is merged.
    pub max_files_per_window: usize,
    /// A window is closed (merged into one file, rolled up) this long after its hour ends.
    pub close_after: Duration,
    /// Files that left the catalog are deleted this long after (longer than any query runs).
    pub grace: Duration,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            max_files_per_window: 8,
            close_after: Duration::from_secs(10 * 60),
            grace: Duration::from_secs(10 * 60),
        }
    }
}

/// How long each table keeps its files (`None`: forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// `gpu_metrics` (raw samples).
    pub gpu_metrics: Option<Duration>,
    /// `metrics`.
    pub metrics: Option<Duration>,
    /// `gpu_metrics_1m`.
    pub gpu_metrics_1m: Option<Duration>,
    /// `gpu_metrics_1h` and its daily rollups, `gpu_metrics_1d`.
    pub gpu_metrics_1h: Option<Duration>,
    /// `gpu_processes`.
    pub gpu_processes: Option<Duration>,
    /// `gpu_processes_1m`.
    pub gpu_processes_1m: Option<Duration>,
    /// `gpu_processes_1h`.
    pub gpu_processes_1h: Option<Duration>,
    /// `gpu_events`.
    pub gpu_events: Option<Duration>,
    /// `alerts` (the alert history).
    pub alerts: Option<Duration>,
    /// `job_ledger` (what each job used and cost, per GPU and hour), its daily sums,
    /// `job_ledger_1d`, its per-job totals, `job_ledger_totals`, and its daily spend per
    /// account, user and GPU model, `job_ledger_spend`.
    pub job_ledger: Option<Duration>,
}

const DAY: u64 = 24 * 3600;

impl Default for RetentionConfig {
    /// Raw 30 days, 1-minute rollups a year, 1-hour rollups five years; processes 30 days (their
    /// rollups as long as the GPUs', so a job's report reads both at one resolution),
    /// events and alert history a year (they are few, and a GPU's XID history matters when it
    /// is replaced); the job ledger five years (what a job cost is asked about long after it
    /// ran).
    fn default() -> Self {
        Self {
            gpu_metrics: Some(Duration::from_secs(30 * DAY)),
            metrics: Some(Duration::from_secs(30 * DAY)),
            gpu_metrics_1m: Some(Duration::from_secs(365 * DAY)),
            gpu_metrics_1h: Some(Duration::from_secs(5 * 365 * DAY)),
            gpu_processes: Some(Duration::from_secs(30 * DAY)),
            gpu_processes_1m: Some(Duration::from_secs(365 * DAY)),
            gpu_processes_1h: Some(Duration::from_secs(5 * 365 * DAY)),
            gpu_events: Some(Duration::from_secs(365 * DAY)),
            alerts: Some(Duration::from_secs(365 * DAY)),
            job_ledger: Some(Duration::from_secs(5 * 365 * DAY)),
        }
    }
}

impl RetentionConfig {
    /// The retention of `table`, in ns.
    pub fn keep_nanos(&self, table: Table) -> Option<i64> {
        let d = match table {
            Table::GpuMetrics => self.gpu_metrics,
            Table::Metrics => self.metrics,
            Table::GpuMetrics1m => self.gpu_metrics_1m,
            Table::GpuMetrics1h | Table::GpuMetrics1d => self.gpu_metrics_1h,
            Table::GpuProcesses => self.gpu_processes,
            Table::GpuProcesses1m => self.gpu_processes_1m,
            Table::GpuProcesses1h => self.gpu_processes_1h,
            Table::GpuEvents => self.gpu_events,
            Table::Alerts => self.alerts,
            Table::JobLedger
            | Table::JobLedger1d
            | Table::JobLedgerTotals
            | Table::JobLedgerSpend => self.job_ledger,
        }?;
        Some(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Windows merged.
    pub windows_compacted: usize,
    /// Files merged away.
    pub files_merged: usize,
    /// Rollup files written.
    pub rollup_files: usize,
    /// Files dropped by retention.
    pub files_expired: usize,
    /// Files deleted by vacuum (removed from their table more than the grace period ago, or
    /// named by no commit).
    pub files_deleted: usize,
    /// Windows not compacted this pass (a damaged input, or a table whose log is damaged);
    /// every other window went on.
    pub windows_skipped: usize,
}

/// The hour window a file belongs to (files never span hours).
pub fn window_of(file: &FileMeta) -> i64 {
    file.min_time.div_euclid(HOUR_NANOS)
}

/// Reads files of `table` into one batch in the table's SQL schema.
pub fn read_files(storage: &Storage, table: Table, files: &[FileMeta]) -> Result<RecordBatch> {
    let mut batches = Vec::new();
    for f in files {
        let bytes = storage.read(&f.path)?;
        let named = |e: parquet::errors::ParquetError| {
            Error::malformed(
                "parquet file",
                format!("{}: {e}", storage.location(&f.path)),
            )
        };
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(named)?;
        for b in reader {
            let b = b.map_err(|e| named(e.into()))?;
            batches.push(from_file_batch(table, &b).map_err(|e| {
                Error::malformed(
                    "parquet file",
                    format!("{}: {e}", storage.location(&f.path)),
                )
            })?);
        }
    }
    Ok(concat_batches(&table.schema(), &batches)?)
}
