//! `gpu_processes` rollups: built when an hour of processes closes, kept past the raw rows.

use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::ingest::{ProcessRow, WriteBatch};

const T0: i64 = 1_800_000_000_000_000_000; // an hour boundary
const S: i64 = 1_000_000_000;
const DAY: i64 = 86_400 * S;

/// Rows of processes 7 and 8 on one GPU, every 10 s from `from` (s after T0) for `secs`.
fn processes(from: i64, secs: i64) -> WriteBatch {
    let mut rows = Vec::new();
    for t in (from..from + secs).step_by(10) {
        for pid in [7, 8] {
            rows.push(ProcessRow {
                time: T0 + t * S,
                host: "n1".into(),
                gpu_uuid: "GPU-1".into(),
                pid,
                process_name: Some(format!("worker-{pid}")),
                job_id: Some("42".into()),
                job_user: Some("ana".into()),
                used_memory_bytes: Some(pid * 1_000 + t),
                sm_utilization: Some(0.25),
            });
        }
    }
    let mut wb = WriteBatch::from_rows(&[], &[]).expect("batch");
    wb.add_processes_and_events(&rows, &[]).expect("rows");
    wb
}

fn open(dir: &std::path::Path, clock: Arc<ManualClock>) -> Store {
    let config = StoreConfig {
        wal_sync: false,
        ..StoreConfig::new(dir)
    };
    Store::open(config, clock).expect("open")
}

fn rows_of(store: &Store, table: Table) -> u64 {
    store.files(table).iter().map(|f| f.rows).sum()
}

#[test]
fn a_closed_hour_of_processes_is_rolled_up_and_outlives_its_raw_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 30 * 60 * S));
    let store = open(dir.path(), clock.clone());
    // The first 30 minutes of an hour, in two persists.
    store.write(&processes(0, 900)).expect("write");
    store.persist().expect("persist");
    store.write(&processes(900, 900)).expect("write");
    store.persist().expect("persist");
    assert_eq!(rows_of(&store, Table::GpuProcesses), 360);
    store.maintain().expect("maintain");
    assert_eq!(
        rows_of(&store, Table::GpuProcesses1m),
        0,
        "the hour is open"
    );
    // The hour closes (its end + 10 min): merged, rolled up per process and minute, per hour.
    clock.advance(41 * 60 * S);
    let r = store.maintain().expect("maintain");
    assert_eq!((r.windows_compacted, r.rollup_files), (1, 2));
    assert_eq!(rows_of(&store, Table::GpuProcesses1m), 2 * 30);
    assert_eq!(rows_of(&store, Table::GpuProcesses1h), 2);
    // A month later the raw rows are gone (30 days), the rollups are not.
    clock.advance(31 * DAY);
    store.maintain().expect("maintain");
    assert_eq!(rows_of(&store, Table::GpuProcesses), 0);
    assert_eq!(rows_of(&store, Table::GpuProcesses1m), 60);
    assert_eq!(rows_of(&store, Table::GpuProcesses1h), 2);
}

/// The sum of the `samples` column of `table`'s rows.
fn samples_of(store: &Store, table: Table) -> i64 {
    let b = crate::compact::read_files(store.storage(), table, &store.files(table)).expect("read");
    let n = arrow::compute::cast(
        b.column_by_name("samples").expect("samples"),
        &arrow::datatypes::DataType::Int64,
    )
    .expect("cast");
    arrow::compute::sum(
        n.as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .expect("i64"),
    )
    .unwrap_or(0)
}

#[test]
fn a_late_hour_of_a_merged_day_replaces_its_rows_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    // T0 is 08:00 UTC: hours 08 and 09 are of one day, which ends at T0 + 16 h.
    let clock = Arc::new(ManualClock::new(T0 + 2 * 3600 * S + 11 * 60 * S));
    let store = open(dir.path(), clock.clone());
    store.write(&processes(0, 7200)).expect("write");
    store.persist().expect("persist");
    store.maintain().expect("maintain");
    assert_eq!(
        store.files(Table::GpuProcesses1h).len(),
        2,
        "a file an hour"
    );
    assert_eq!(rows_of(&store, Table::GpuProcesses1h), 4);
    assert_eq!(samples_of(&store, Table::GpuProcesses1h), 1440);
    // The day ended an hour ago: its hourly rollups are one file.
    clock.advance(15 * 3600 * S - 11 * 60 * S);
    let r = store.maintain().expect("maintain");
    assert!(r.files_merged >= 2, "{r:?}");
    assert_eq!(store.files(Table::GpuProcesses1h).len(), 1);
    assert_eq!(rows_of(&store, Table::GpuProcesses1h), 4);
    // Late rows of the first hour: once quiet, its rollup is built again, replacing that
    // hour's rows of the day file and keeping the other hour's; the same pass merges the day
    // again.
    store.write(&processes(1800, 20)).expect("write");
    store.persist().expect("persist");
    store.maintain().expect("maintain");
    store.maintain().expect("maintain");
    assert_eq!(rows_of(&store, Table::GpuProcesses1h), 4, "no hour twice");
    assert_eq!(samples_of(&store, Table::GpuProcesses1h), 1444);
    assert_eq!(store.files(Table::GpuProcesses1h).len(), 1);
}
