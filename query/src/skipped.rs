//! Answers that skipped data say so.
//!
//! Each query runs with a [`ScanNotes`] in its session: every table scan records the files it
//! reads and the warnings of its snapshot (a damaged data file left out, versions of a damaged
//! Delta log not read). The HTTP answer carries them as `Gpuwatch-Warning` headers, the Postgres
//! wire as `WARNING` notices.
//!
//! When reading fails on a file the store did not know to be damaged, the files the query read
//! are checked whole ([`gpuwatch_store::ReadStore::verify`]): the damaged ones are left out of
//! every later snapshot, and a query that failed before its first row is run again without them
//! (its answer then names them).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use datafusion::error::DataFusionError;
use gpuwatch_store::ReadStore;
use gpuwatch_store::schema::Table;

/// The most warnings an answer carries; past it, one more says how many were left out.
pub const MAX_WARNINGS: usize = 20;

/// What one query's scans read and left out (a DataFusion session extension).
#[derive(Debug, Default)]
pub struct ScanNotes {
    inner: Mutex<Notes>,
}

#[derive(Debug, Default)]
struct Notes {
    warnings: Vec<String>,
    files: BTreeMap<Table, BTreeSet<String>>,
}

impl ScanNotes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Notes> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a scan of `table`: the files it reads and what its snapshot left out.
    pub fn record<'a>(
        &self,
        table: Table,
        warnings: &[String],
        files: impl IntoIterator<Item = &'a String>,
    ) {
        let mut n = self.lock();
        for w in warnings {
            if !n.warnings.contains(w) {
                n.warnings.push(w.clone());
            }
        }
        n.files
            .entry(table)
            .or_default()
            .extend(files.into_iter().cloned());
    }

    /// Adds warnings found after the scans (files found damaged while reading).
    pub fn add(&self, warnings: &[String]) {
        let mut n = self.lock();
        for w in warnings {
            if !n.warnings.contains(w) {
                n.warnings.push(w.clone());
            }
        }
    }

    /// The warnings, at most [`MAX_WARNINGS`] (and one saying how many more there were).
    pub fn warnings(&self) -> Vec<String> {
        let all = &self.lock().warnings;
        let mut out: Vec<String> = all.iter().take(MAX_WARNINGS).cloned().collect();
        if all.len() > MAX_WARNINGS {
            out.push(format!(
                "and {} more warnings: see the server's log or `gpuwatch check`",
                all.len() - MAX_WARNINGS
            ));
        }
        out
    }

    /// The files the scans read, per table.
    pub fn scanned(&self) -> Vec<(Table, Vec<String>)> {
        self.lock()
            .files
            .iter()
            .map(|(t, f)| (*t, f.iter().cloned().collect()))
            .collect()
    }
}

/// True for the errors a damaged data file can cause (reading or decoding a file), as opposed
/// to errors of the SQL itself.
pub fn may_be_damage(e: &DataFusionError) -> bool {
    use arrow::error::ArrowError;
    match e {
        DataFusionError::ParquetError(_)
        | DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_)
        | DataFusionError::External(_) => true,
        DataFusionError::ArrowError(a, _) => matches!(
            a.as_ref(),
            ArrowError::ParquetError(_)
                | ArrowError::IoError(..)
                | ArrowError::ExternalError(_)
                | ArrowError::IpcError(_)
                | ArrowError::InvalidArgumentError(_)
        ),
        DataFusionError::Context(_, inner) => may_be_damage(inner),
        DataFusionError::Shared(inner) => may_be_damage(inner),
        DataFusionError::Diagnostic(_, inner) => may_be_damage(inner),
        DataFusionError::Collection(all) => all.iter().any(may_be_damage),
        _ => false,
    }
}

/// After a read failed: checks the files `notes` says were read, leaves the damaged ones out of
/// later snapshots, adds a warning for each to `notes`, and returns how many were found. Runs
/// on a blocking thread (it reads whole files).
pub async fn verify_scanned(store: &Arc<dyn ReadStore>, notes: &ScanNotes) -> usize {
    let mut found = 0;
    for (table, files) in notes.scanned() {
        let store = Arc::clone(store);
        let checked = tokio::task::spawn_blocking(move || store.verify(table, &files)).await;
        match checked {
            Ok(warnings) => {
                found += warnings.len();
                notes.add(&warnings);
            }
            Err(e) => tracing::warn!(error = %e, "checking a table's files failed"),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_kept_once_and_capped() {
        let notes = ScanNotes::default();
        let w: Vec<String> = (0..25).map(|i| format!("w{i}")).collect();
        notes.record(Table::GpuMetrics, &w[..3], &["a".to_string()]);
        notes.record(Table::GpuMetrics, &w, &["b".to_string()]);
        let got = notes.warnings();
        assert_eq!(got.len(), MAX_WARNINGS + 1);
        assert_eq!(got[0], "w0");
        assert!(got[MAX_WARNINGS].starts_with("and 5 more"), "{got:?}");
        assert_eq!(
            notes.scanned(),
            vec![(Table::GpuMetrics, vec!["a".to_string(), "b".to_string()])]
        );
        let parquet =
            DataFusionError::ParquetError(Box::new(parquet::errors::ParquetError::EOF("x".into())));
        assert!(may_be_damage(&DataFusionError::Context(
            "ctx".into(),
            Box::new(parquet)
        )));
        assert!(!may_be_damage(&DataFusionError::Plan("no".into())));
    }
}
