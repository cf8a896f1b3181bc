//! Conversion of an earlier release's data to Delta tables, once, at the first start of a server
//! that writes (`--role all` or `ingest`).
//!
//! Earlier releases kept a catalog (`catalog.json`, or `catalog/<version>.json` versions on an
//! object store) naming hour-partitioned Parquet files with nanosecond times. Each table's files
//! are read back, written again in the Delta layout (microsecond times, `date=` directories,
//! statistics), and added to the new table in its first commit, together with a `txn` per writer
//! holding the last WAL segment the old catalog said those files cover, so the WAL replay that
//! follows keeps exactly the rows no file holds. A table whose Delta log already exists is
//! skipped, so an interrupted conversion resumes where it stopped; the old catalog and files are
//! deleted only once every table exists.

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use deltalake_core::kernel::{Action, Transaction};

use super::DeltaTables;
use crate::Result;
use crate::compact;
use crate::persist::legacy::{LegacyCatalog, LegacyFile};
use crate::persist::{self, FileMeta, Storage};
use crate::schema::Table;

/// True when an earlier release's catalog is still there.
pub fn pending(storage: &Storage) -> Result<bool> {
    Ok(!LegacyCatalog::catalog_objects(storage)?.is_empty())
}

fn legacy_meta(table: Table, f: &LegacyFile) -> FileMeta {
    FileMeta {
        table: table.name().to_string(),
        path: f.path.clone(),
        min_time: f.min_time,
        max_time: f.max_time,
        rows: f.rows,
        bytes: 0,
        level: f.level,
    }
}

/// The file's name without directories and extension, kept in the new name.
fn stem(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".parquet").unwrap_or(name).to_string()
}

/// Converts the earlier release's catalog and files under `storage`, if any.
pub fn run(storage: &Storage, now_millis: i64) -> Result<()> {
    let Some(catalog) = LegacyCatalog::load(storage)? else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    tracing::info!(root = %storage.describe(), files = catalog.files.len(),
        "converting an earlier release's catalog and files to Delta tables");
    let mut coverage: BTreeMap<String, u64> = catalog.wal_persisted_by.clone();
    if !storage.is_object_store() {
        coverage.insert(storage.writer().id.clone(), catalog.wal_persisted_through);
    }
    let txns: Vec<Transaction> = coverage
        .iter()
        .map(|(writer, through)| {
            Transaction::new_with_last_update(
                writer.clone(),
                i64::try_from(*through).unwrap_or(i64::MAX),
                Some(now_millis),
            )
        })
        .collect();
    let mut rows = 0u64;
    for table in Table::ALL {
        if DeltaTables::exists(storage, table)? {
            continue;
        }
        let mut adds = Vec::new();
        for f in catalog.files.iter().filter(|f| f.table == table.name()) {
            let meta = legacy_meta(table, f);
            let batch = compact::read_files(storage, table, std::slice::from_ref(&meta))?;
            let batch: RecordBatch = crate::buffer::to_micros(&batch)?;
            if batch.num_rows() == 0 {
                continue;
            }
            let sorted = persist::sort_batch(table, &batch)?;
            let hour = f.min_time.div_euclid(compact::HOUR_NANOS);
            let name = format!("m{}", stem(&f.path));
            let written =
                persist::write_file(storage, table, &sorted, hour, &name, f.level, now_millis)?;
            rows += written.meta.rows;
            adds.push(Action::Add(written.add));
        }
        create(storage, table, adds, &txns)?;
    }
    // Every table exists: the old catalog and files can go.
    for f in catalog
        .files
        .iter()
        .map(|f| f.path.as_str())
        .chain(catalog.retired.iter().map(|r| r.path.as_str()))
    {
        if let Err(e) = storage.delete(f) {
            tracing::warn!(file = f, error = %e, "could not delete a converted file; vacuum removes it later");
        }
    }
    for c in LegacyCatalog::catalog_objects(storage)? {
        storage.delete(&c)?;
    }
    tracing::info!(root = %storage.describe(), rows, elapsed_ms = started.elapsed().as_millis() as u64,
        "converted to Delta tables");
    Ok(())
}

fn create(storage: &Storage, table: Table, adds: Vec<Action>, txns: &[Transaction]) -> Result<()> {
    // The first commit holds the files and every writer's coverage. `create_with` takes one
    // `txn` through the commit properties; the others ride along as actions.
    let mut actions = adds;
    let mut txns = txns.iter().cloned();
    let first = txns.next();
    actions.extend(txns.map(Action::Txn));
    DeltaTables::create_with(storage, table, actions, first)
}
