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

/// Every `job_id` in the table, sorted.
fn every_job(store: &Store) -> Vec<String> {
    let mut all = jobs_of(store, &store.files(Table::JobLedger));
    all.sort();
    all
}

/// The `job_id`s of the files whose first row is in the hour at `hour` (ns).
fn jobs_in(store: &Store, hour: i64) -> Vec<String> {
    let files = store.files(Table::JobLedger);
    let inside: Vec<FileMeta> = files
        .iter()
        .filter(|f| f.min_time >= hour && f.min_time < hour + H)
        .cloned()
        .collect();
    jobs_of(store, &inside)
}

fn jobs_of(store: &Store, inside: &[FileMeta]) -> Vec<String> {
    jobs_of_table(store, Table::JobLedger, inside)
}

/// The `job_id`s of `table`'s rows in the files `inside`, in file order.
fn jobs_of_table(store: &Store, table: Table, inside: &[FileMeta]) -> Vec<String> {
    let b = crate::compact::read_files(store.storage(), table, inside).expect("read");
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
    assert!(matches!(outside, Err(Error::BadRows(_))), "{outside:?}");
    let ingested = store.replace_hour(Table::GpuMetrics, hour, &ledger_rows(&[T0], "e"));
    assert!(matches!(ingested, Err(Error::BadRows(_))), "{ingested:?}");
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

#[test]
fn closed_days_are_merged_and_an_hour_in_a_merged_day_is_replaced_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 3 * H));
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.path())
        },
        clock.clone(),
    )
    .expect("open");
    let hour = T0 / H;
    for (k, job) in ["a", "b", "c"].iter().enumerate() {
        let t = T0 + k as i64 * H;
        store
            .replace_hour(
                Table::JobLedger,
                hour + k as i64,
                &ledger_rows(&[t, t + 1], job),
            )
            .expect("hour");
    }
    // The day is still open: nothing merged.
    store.maintain().expect("maintain");
    assert_eq!(store.files(Table::JobLedger).len(), 3);
    // A day after: one file.
    clock.advance(24 * H);
    store.maintain().expect("maintain");
    let files = store.files(Table::JobLedger);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(every_job(&store), ["a", "a", "b", "b", "c", "c"]);
    // Refolding the middle hour rewrites the day's other rows and adds the new hour.
    store
        .replace_hour(Table::JobLedger, hour + 1, &ledger_rows(&[T0 + H + 9], "z"))
        .expect("replace inside the merged day");
    assert_eq!(every_job(&store), ["a", "a", "c", "c", "z"]);
    assert_eq!(store.files(Table::JobLedger).len(), 2);
    // And the next pass merges the day again.
    store.maintain().expect("maintain");
    assert_eq!(store.files(Table::JobLedger).len(), 1);
    assert_eq!(every_job(&store), ["a", "a", "c", "c", "z"]);
}

#[test]
fn a_day_is_written_as_one_file_and_refused_past_its_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.path())
        },
        Arc::new(ManualClock::new(T0 + 40 * H)),
    )
    .expect("open");
    // T0 is 08:00 UTC: its day began 8 hours before.
    let day = (T0 - 8 * H) / (24 * H);
    let start = day * 24 * H;
    store
        .replace_hour(Table::JobLedger, T0 / H, &ledger_rows(&[T0], "old"))
        .expect("an hour");
    store
        .replace_days(
            Table::JobLedger,
            &[(day, ledger_rows(&[start, T0 + 1, start + 23 * H + 5], "d"))],
        )
        .expect("a day");
    assert_eq!(store.files(Table::JobLedger).len(), 1);
    assert_eq!(
        every_job(&store),
        ["d", "d", "d"],
        "the day's old rows replaced"
    );
    let past = store.replace_days(
        Table::JobLedger,
        &[(day, ledger_rows(&[start + 24 * H], "x"))],
    );
    assert!(matches!(past, Err(Error::BadRows(_))), "{past:?}");
    // An hour of it replaced alone keeps the rest of the day.
    store
        .replace_hour(Table::JobLedger, T0 / H, &ledger_rows(&[T0 + 2], "h"))
        .expect("an hour of the day");
    assert_eq!(every_job(&store), ["d", "d", "h"]);
}

/// The `job_id`s of `table`'s rows, sorted, and its number of files.
fn jobs_and_files(store: &Store, table: Table) -> (Vec<String>, usize) {
    let files = store.files(table);
    let mut jobs = jobs_of_table(store, table, &files);
    jobs.sort();
    (jobs, files.len())
}

/// A store at 40 days past T0 (2027-01-15 08:00 UTC) and the day of T0: days 0..3 after it are
/// in January, 17 and 18 in February.
fn spend_store(dir: &std::path::Path) -> (Store, i64) {
    let clock = Arc::new(ManualClock::new(T0 + 40 * 24 * H));
    let config = StoreConfig {
        wal_sync: false,
        ..StoreConfig::new(dir)
    };
    let store = Store::open(config, clock).expect("open");
    (store, (T0 - 8 * H) / (24 * H))
}

/// Writes day `first + k` of the daily spend as one row of `job`.
fn write_spend(store: &Store, first: i64, k: i64, job: &str) {
    let t = (first + k) * 24 * H + H;
    let b = ledger_rows(&[t], job);
    let b = RecordBatch::try_new(Table::JobLedgerSpend.schema(), b.columns().to_vec())
        .expect("spend rows");
    store
        .replace_days(Table::JobLedgerSpend, &[(first + k, b)])
        .expect("a day");
}

#[test]
fn the_daily_spend_is_merged_a_month_to_a_file_and_a_day_in_it_is_replaced_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, first) = spend_store(dir.path());
    let write = |k: i64, job: &str| write_spend(&store, first, k, job);
    for (k, job) in [(0, "a"), (1, "b"), (2, "c"), (17, "f1"), (18, "f2")] {
        write(k, job);
    }
    assert_eq!(jobs_and_files(&store, Table::JobLedgerSpend).1, 5);
    store.maintain().expect("maintain");
    let (jobs, files) = jobs_and_files(&store, Table::JobLedgerSpend);
    assert_eq!(files, 2, "January and February, a file each");
    assert_eq!(jobs, ["a", "b", "c", "f1", "f2"]);
    // A day of January written again: the rest of the month is kept beside it.
    write(1, "z");
    let (jobs, files) = jobs_and_files(&store, Table::JobLedgerSpend);
    assert_eq!(jobs, ["a", "c", "f1", "f2", "z"]);
    assert_eq!(files, 3);
    store.maintain().expect("maintain");
    assert_eq!(
        jobs_and_files(&store, Table::JobLedgerSpend),
        (["a", "c", "f1", "f2", "z"].map(String::from).to_vec(), 2)
    );
    // The job ledger's own days stay a file a day.
    for k in [0, 1] {
        let t = (first + k) * 24 * H + H;
        store
            .replace_days(Table::JobLedger, &[(first + k, ledger_rows(&[t], "j"))])
            .expect("a ledger day");
    }
    store.maintain().expect("maintain");
    assert_eq!(store.files(Table::JobLedger).len(), 2);
}

#[test]
fn a_damaged_spend_file_is_left_out_of_its_months_merge_and_the_other_month_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, first) = spend_store(dir.path());
    for (k, job) in [(0, "a"), (1, "b"), (2, "c"), (17, "f1"), (18, "f2")] {
        write_spend(&store, first, k, job);
    }
    let table = Table::JobLedgerSpend;
    let mut files = store.files(table).as_ref().clone();
    files.sort_by_key(|f| f.min_time);
    let bad = files[0].clone();
    super::tests_damage::clobber(&store, &bad.path, &vec![0u8; bad.bytes as usize]);
    let r = store
        .maintain()
        .expect("a damaged file never fails the pass");
    assert_eq!((r.windows_compacted, r.windows_skipped), (1, 1), "{r:?}");
    let damaged: Vec<String> = store.damaged_files().into_iter().map(|d| d.path).collect();
    assert_eq!(damaged, std::slice::from_ref(&bad.path));
    let february = (first + 17) * 24 * H;
    let later = |s: &Store| {
        s.files(table)
            .iter()
            .filter(|f| f.min_time >= february)
            .count()
    };
    assert_eq!(later(&store), 1, "February merged in the same pass");
    // The next pass merges January's other days, and the damaged file stays named.
    let r = store.maintain().expect("maintain");
    assert_eq!(r.windows_compacted, 1, "{r:?}");
    let files = store.files(table);
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files.iter().any(|f| f.path == bad.path), "never removed");
    let mut jobs = jobs_of_table(&store, table, &store.readable_files(table));
    jobs.sort();
    assert_eq!(jobs, ["b", "c", "f1", "f2"]);
}
