//! `Store::replace_hour`: an hour of a table ingest does not write, replaced as one file.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, TimestampNanosecondArray};

use super::*;
use crate::clock::ManualClock;

const T0: i64 = 1_800_000_000_000_000_000; // an hour boundary
const H: i64 = 3_600_000_000_000;

/// `job_ledger` rows (its key columns: this process declares no others) at `times` for `job`.
fn ledger_rows(times: &[i64], job: &str) -> RecordBatch {
    let n = times.len();
    let text = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v; n])) };
    RecordBatch::try_new(
        Table::JobLedger.schema(),
        vec![
            Arc::new(TimestampNanosecondArray::from(times.to_vec()).with_timezone("UTC")),
            text(job),
            text("n1"),
            text("GPU-1"),
        ],
    )
    .expect("batch")
}

fn jobs_in(store: &Store, hour: i64) -> Vec<String> {
    let files = store.files(Table::JobLedger);
    let inside: Vec<FileMeta> = files
        .iter()
        .filter(|f| f.min_time >= hour && f.min_time < hour + H)
        .cloned()
        .collect();
    let b = crate::compact::read_files(store.storage(), Table::JobLedger, &inside).expect("read");
    let a = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Utf8).expect("text");
    a.as_any()
        .downcast_ref::<StringArray>()
        .map(|s| s.iter().map(|v| v.unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn an_hour_is_replaced_whole_and_nothing_else_moves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 3 * H));
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.path())
        },
        clock,
    )
    .expect("open");
    let hour = T0 / H;
    store
        .replace_hour(Table::JobLedger, hour, &ledger_rows(&[T0, T0 + 5], "a"))
        .expect("first");
    store
        .replace_hour(Table::JobLedger, hour + 1, &ledger_rows(&[T0 + H], "b"))
        .expect("next hour");
    assert_eq!(jobs_in(&store, T0), ["a", "a"]);
    store
        .replace_hour(Table::JobLedger, hour, &ledger_rows(&[T0 + 7], "c"))
        .expect("again");
    assert_eq!(jobs_in(&store, T0), ["c"], "the hour's rows replaced");
    assert_eq!(jobs_in(&store, T0 + H), ["b"], "the next hour untouched");
    assert_eq!(store.files(Table::JobLedger).len(), 2);

    // Rows outside the hour, a table that ingest writes: refused, nothing written.
    let outside = store.replace_hour(Table::JobLedger, hour, &ledger_rows(&[T0 + H], "d"));
    assert!(matches!(outside, Err(Error::DeltaSchema(_))), "{outside:?}");
    let ingested = store.replace_hour(Table::GpuMetrics, hour, &ledger_rows(&[T0], "e"));
    assert!(
        matches!(ingested, Err(Error::DeltaSchema(_))),
        "{ingested:?}"
    );
    assert_eq!(jobs_in(&store, T0), ["c"]);
    assert_eq!(store.files(Table::JobLedger).len(), 2);

    // The replaced hour's files are in the log as removed: a reopened store reads the same.
    drop(store);
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ingest: false,
            ..StoreConfig::new(dir.path())
        },
        Arc::new(ManualClock::new(T0 + 3 * H)),
    )
    .expect("reopen");
    assert_eq!(jobs_in(&store, T0), ["c"]);
    assert!(matches!(
        store.replace_hour(Table::JobLedger, hour, &ledger_rows(&[T0], "f")),
        Err(Error::ReadOnly)
    ));
}
