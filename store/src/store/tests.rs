use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::Float64Type;

use super::*;
use crate::clock::ManualClock;
use crate::ingest::{GpuRow, WriteBatch};
use crate::schema::value_index;

const T0: i64 = 1_800_000_000_000_000_000;

/// Where a test's store lives: a temporary data directory, and for the S3 variant a prefix of
/// its own in the S3 server's bucket. The tests below run against both.
pub(super) struct Place {
    dir: tempfile::TempDir,
    s3: Option<(String, Vec<(String, String)>)>,
}

impl Place {
    pub(super) fn local() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            s3: None,
        }
    }

    pub(super) fn s3() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "s3://gpuwatch-test/run-{}/t{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let options = [
            ("aws_endpoint", crate::testing::moto_endpoint()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            s3: Some((prefix, options)),
        }
    }

    /// A new data directory on `other`'s prefix.
    fn s3_at(other: &Place) -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            s3: other.s3.clone(),
        }
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn config(&self) -> StoreConfig {
        let mut c = StoreConfig::new(self.dir.path());
        if let Some((url, options)) = &self.s3 {
            c.object_store = Some(url.clone());
            c.object_store_options = options.clone();
        }
        c
    }
}

/// Runs each named test against local disk (`::local`) and the S3 server (`::s3`).
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn local() {
                super::$name(&super::Place::local())
            }
            #[test]
            fn s3() {
                super::$name(&super::Place::s3())
            }
        }
    )*};
}

on_both!(
    writes_survive_reopen_without_persist,
    writes_survive_restarts_that_write_nothing,
    persist_moves_rows_to_parquet_exactly_once,
    a_file_no_commit_names_is_vacuumed_and_its_rows_come_from_the_wal,
    parquet_files_are_sorted_and_zstd,
    segments_rotate_by_size_and_replay_persists_within_the_buffer_cap,
    compaction_merges_windows_builds_rollups_and_deletes_after_grace,
    an_open_window_never_holds_more_than_the_bound,
    retention_drops_whole_files_per_table,
    readers_never_see_missing_or_doubled_rows_while_compaction_runs,
    compaction_keeps_metrics_labels,
    a_full_buffer_refuses_writes_until_a_persist_frees_it,
    concurrent_writers_share_fsyncs_through_the_store,
);

pub(super) fn open(p: &Place) -> Store {
    Store::open(p.config(), Arc::new(ManualClock::new(T0))).expect("open")
}

fn exists(s: &Store, rel: &str) -> bool {
    s.storage().read(rel).is_ok()
}

pub(super) fn write_of(i: usize) -> WriteBatch {
    let mut row = GpuRow::new(T0 + i as i64 * 1_000_000_000);
    row.labels[0] = Some("h".into());
    row.labels[1] = Some(format!("GPU-{}", i % 3));
    row.values[value_index("hw.power").expect("power")] = Some(crate::ingest::Cell::F(i as f64));
    WriteBatch::from_rows(&[row], &[]).expect("batch")
}

pub(super) fn powers(store: &Store) -> Vec<f64> {
    let snap = store.snapshot(Table::GpuMetrics);
    let mut out = Vec::new();
    for b in &snap.batches {
        out.extend(
            b.column_by_name("power_watts")
                .expect("col")
                .as_primitive::<Float64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    for (_, meta) in &snap.files {
        let f = store.storage().read(&meta.path).expect("file");
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .expect("parquet")
            .build()
            .expect("reader");
        for b in r {
            let b = b.expect("batch");
            out.extend(
                b.column_by_name("power_watts")
                    .expect("col")
                    .as_primitive::<Float64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

pub(super) fn expected(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

fn writes_survive_reopen_without_persist(p: &Place) {
    {
        let s = open(p);
        for i in 0..10 {
            s.write(&write_of(i)).expect("write");
        }
        assert_eq!(powers(&s), expected(10));
        // Dropped without persisting: as after kill -9, only the WAL has the data.
    }
    let s = open(p);
    assert_eq!(powers(&s), expected(10));
    assert_eq!(s.stats().replayed_records.load(Ordering::Relaxed), 10);
}

/// A start that is killed before it writes anything leaves an empty segment after the one holding
/// rows not yet committed: the next replay retires the empty one only, so a third start still
/// finds every row (the crash-stress case: kill -9 while starting).
fn writes_survive_restarts_that_write_nothing(p: &Place) {
    {
        let s = open(p);
        for i in 0..10 {
            s.write(&write_of(i)).expect("write");
        }
    }
    for start in 0..3 {
        let s = open(p);
        assert_eq!(powers(&s), expected(10), "start {start}");
        // Dropped without writing or persisting.
    }
}

fn persist_moves_rows_to_parquet_exactly_once(p: &Place) {
    {
        let s = open(p);
        for i in 0..5 {
            s.write(&write_of(i)).expect("write");
        }
        let report = s.persist().expect("persist").expect("something persisted");
        assert_eq!(report.rows, 5);
        assert!(s.persist().expect("noop").is_none());
        for i in 5..8 {
            s.write(&write_of(i)).expect("write");
        }
        let snap = s.snapshot(Table::GpuMetrics);
        assert_eq!(snap.files.len(), 1);
        assert_eq!(powers(&s), expected(8));
    }
    let s = open(p);
    assert_eq!(
        powers(&s),
        expected(8),
        "no row lost or doubled across persist and restart"
    );
    // Only the segment written after the persist (and the new one) remain.
    let segs = wal::list_segments(&p.path().join("wal")).expect("list");
    assert!(segs.len() <= 2, "{segs:?}");
}

fn a_file_no_commit_names_is_vacuumed_and_its_rows_come_from_the_wal(p: &Place) {
    let orphan = {
        let s = open(p);
        for i in 0..4 {
            s.write(&write_of(i)).expect("write");
        }
        // As if a persist wrote its file and crashed before its commit.
        let snap = s.snapshot(Table::GpuMetrics);
        persist::write_table(s.storage(), Table::GpuMetrics, &snap.batches, "p1", 0)
            .expect("file")
            .remove(0)
            .meta
    };
    let s = open(p);
    assert_eq!(powers(&s), expected(4));
    assert_eq!(s.file_count(), 0);
    assert!(exists(&s, &orphan.path));
    // The test clock is in the future of the file's modification time: past the grace period.
    let r = s.maintain().expect("maintain");
    assert_eq!(r.files_deleted, 1, "{r:?}");
    assert!(!exists(&s, &orphan.path));
    assert_eq!(powers(&s), expected(4));
}

fn parquet_files_are_sorted_and_zstd(p: &Place) {
    let s = open(p);
    for i in (0..9).rev() {
        s.write(&write_of(i)).expect("write");
    }
    let report = s.persist().expect("persist").expect("report");
    let f = s.storage().read(&report.files[0].path).expect("file");
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).expect("parquet");
    let meta = builder.metadata().clone();
    let col = meta.row_group(0).column(0);
    assert!(
        matches!(col.compression(), parquet::basic::Compression::ZSTD(_)),
        "{:?}",
        col.compression()
    );
    let batch = builder
        .build()
        .expect("reader")
        .next()
        .expect("one batch")
        .expect("batch");
    let uuids = batch
        .column_by_name("gpu_uuid")
        .expect("uuid")
        .as_string::<i32>();
    let times = batch
        .column(0)
        .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
    for i in 1..batch.num_rows() {
        let a = (uuids.value(i - 1), times.value(i - 1));
        let b = (uuids.value(i), times.value(i));
        assert!(a <= b, "rows out of order at {i}: {a:?} > {b:?}");
    }
}

fn segments_rotate_by_size_and_replay_persists_within_the_buffer_cap(p: &Place) {
    let small = |p: &Place| StoreConfig {
        wal_segment_bytes: 4096,
        max_buffer_bytes: 64 * 1024,
        ..p.config()
    };
    let n = 300;
    {
        let s = Store::open(
            StoreConfig {
                // Large enough that nothing is refused while writing.
                max_buffer_bytes: 1 << 30,
                ..small(p)
            },
            Arc::new(ManualClock::new(T0)),
        )
        .expect("open");
        for i in 0..n {
            s.write(&write_of(i)).expect("write");
        }
    }
    let segs = wal::list_segments(&p.path().join("wal")).expect("list");
    assert!(segs.len() > 10, "rotated by size: {} segments", segs.len());
    let s = Store::open(small(p), Arc::new(ManualClock::new(T0))).expect("reopen");
    assert!(
        s.file_count() > 0,
        "replay persisted on the way instead of holding everything"
    );
    assert!(s.buffered().1 < 64 * 1024, "{:?}", s.buffered());
    assert!(s.stats().persists.load(Ordering::Relaxed) > 1);
    assert_eq!(powers(&s), expected(n));
    drop(s);
    let s = Store::open(small(p), Arc::new(ManualClock::new(T0))).expect("reopen");
    assert_eq!(
        powers(&s),
        expected(n),
        "nothing doubled by a second replay"
    );
}

fn a_full_buffer_refuses_writes_until_a_persist_frees_it(p: &Place) {
    let s = Store::open(
        StoreConfig {
            max_buffer_bytes: 32 * 1024,
            ..p.config()
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("open");
    let mut acked = 0;
    let err = loop {
        match s.write(&write_of(acked)) {
            Ok(()) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 10_000, "the cap never applied");
    };
    assert!(matches!(err, Error::BufferFull { .. }), "{err}");
    assert!(err.to_string().contains("--max-buffer-bytes"), "{err}");
    assert!(s.buffered().1 <= 32 * 1024);
    s.persist().expect("persist");
    s.write(&write_of(acked)).expect("room again");
    assert_eq!(powers(&s), expected(acked + 1));
}

fn concurrent_writers_share_fsyncs_through_the_store(p: &Place) {
    let s = Arc::new(open(p));
    std::thread::scope(|scope| {
        for w in 0..8 {
            let s = Arc::clone(&s);
            scope.spawn(move || {
                for i in 0..25 {
                    s.write(&write_of(w * 25 + i)).expect("write");
                }
            });
        }
    });
    assert_eq!(powers(&s), expected(200));
    eprintln!(
        "group commit: {} fsyncs for 200 writes by 8 writers",
        s.wal_fsyncs()
    );
    assert!(
        s.wal_fsyncs() < 200,
        "{} fsyncs for 200 writes",
        s.wal_fsyncs()
    );
}

pub(super) fn write_at(i: usize, step_secs: i64) -> WriteBatch {
    let mut row = GpuRow::new(T0 + i as i64 * step_secs * 1_000_000_000);
    row.labels[0] = Some("h".into());
    row.labels[1] = Some(format!("GPU-{}", i % 3));
    row.values[value_index("hw.power").expect("power")] = Some(crate::ingest::Cell::F(i as f64));
    WriteBatch::from_rows(&[row], &[]).expect("batch")
}

fn files_of(s: &Store, table: Table) -> Vec<FileMeta> {
    s.files(table).as_ref().clone()
}

fn compaction_merges_windows_builds_rollups_and_deletes_after_grace(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::open(p.config(), clock.clone()).expect("open");
    // 240 samples 30 s apart (two hours), persisted in 12 slices: 6 files per hour.
    for slice in 0..12 {
        for i in slice * 20..(slice + 1) * 20 {
            s.write(&write_at(i, 30)).expect("write");
        }
        s.persist().expect("persist");
    }
    assert_eq!(files_of(&s, Table::GpuMetrics).len(), 12);
    // Both hours still open: 6 < 8 files each, nothing to do.
    assert_eq!(s.maintain().expect("maintain").windows_compacted, 0);
    // The first hour closes (its end + 10 min): merged into one file, rolled up.
    let before = files_of(&s, Table::GpuMetrics);
    clock.advance(3_600_000_000_000 + 11 * 60_000_000_000);
    let r = s.maintain().expect("maintain");
    assert_eq!(
        (r.windows_compacted, r.files_merged, r.rollup_files),
        (1, 6, 2)
    );
    assert_eq!(files_of(&s, Table::GpuMetrics).len(), 7);
    assert_eq!(powers(&s), expected(240), "no row lost or doubled");
    let m1 = files_of(&s, Table::GpuMetrics1m);
    assert_eq!(m1.len(), 1);
    // Two samples a minute, of two different GPUs (i % 3): 120 groups in the hour.
    assert_eq!(m1[0].rows, 120);
    assert_eq!(files_of(&s, Table::GpuMetrics1h)[0].rows, 3);
    // Replaced files stay on disk for the grace period, then go.
    let retired: Vec<FileMeta> = before
        .iter()
        .filter(|f| !files_of(&s, Table::GpuMetrics).contains(f))
        .cloned()
        .collect();
    assert_eq!(retired.len(), 6);
    assert!(retired.iter().all(|r| exists(&s, &r.path)));
    clock.advance(11 * 60_000_000_000);
    let r = s.maintain().expect("maintain");
    assert_eq!(r.files_deleted, 6);
    assert!(retired.iter().all(|r| !exists(&s, &r.path)));
    // Late data for the closed hour re-closes it: one file again, rollups replaced.
    s.write(&write_at(240, 0)).expect("late write");
    s.persist().expect("persist");
    clock.advance(3_600_000_000_000);
    let r = s.maintain().expect("maintain");
    // The second hour closes now; the reopened first one waits a pass for more late files.
    assert_eq!(r.windows_compacted, 1);
    assert_eq!(files_of(&s, Table::GpuMetrics).len(), 3);
    assert_eq!(s.maintain().expect("maintain").windows_compacted, 1);
    let raw = files_of(&s, Table::GpuMetrics);
    assert_eq!(raw.len(), 2, "one file per closed hour: {raw:?}");
    assert_eq!(files_of(&s, Table::GpuMetrics1m).len(), 2);
    assert_eq!(files_of(&s, Table::GpuMetrics1h).len(), 2);
    let mut want = expected(241);
    want.sort_by(f64::total_cmp);
    assert_eq!(powers(&s), want);
    // And all of it survives a restart.
    drop(s);
    let s = Store::open(p.config(), clock.clone()).expect("reopen");
    assert_eq!(powers(&s), want);
}

fn an_open_window_never_holds_more_than_the_bound(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::open(p.config(), clock).expect("open");
    for i in 0..30 {
        s.write(&write_of(i)).expect("write");
        s.persist().expect("persist");
        s.maintain().expect("maintain");
        assert!(files_of(&s, Table::GpuMetrics).len() < 8);
    }
    assert_eq!(powers(&s), expected(30));
}

fn retention_drops_whole_files_per_table(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0));
    let config = StoreConfig {
        retention: crate::RetentionConfig {
            gpu_metrics: Some(std::time::Duration::from_secs(2 * 3600)),
            ..Default::default()
        },
        ..p.config()
    };
    let s = Store::open(config, clock.clone()).expect("open");
    for i in 0..240 {
        s.write(&write_at(i, 30)).expect("write");
    }
    s.persist().expect("persist");
    clock.advance(2 * 3_600_000_000_000 + 11 * 60_000_000_000);
    s.maintain().expect("maintain");
    assert_eq!(files_of(&s, Table::GpuMetrics).len(), 2);
    // Three hours after the first hour ended, it is past its 2 h: raw goes, rollups stay.
    clock.advance(3_600_000_000_000);
    let r = s.maintain().expect("maintain");
    assert_eq!(r.files_expired, 1);
    assert_eq!(files_of(&s, Table::GpuMetrics).len(), 1);
    assert_eq!(files_of(&s, Table::GpuMetrics1m).len(), 2);
    assert_eq!(powers(&s), (120..240).map(|i| i as f64).collect::<Vec<_>>());
}

fn readers_never_see_missing_or_doubled_rows_while_compaction_runs(p: &Place) {
    let clock = Arc::new(ManualClock::new(T0));
    let s = Arc::new(
        Store::open(
            StoreConfig {
                compaction: crate::CompactionConfig {
                    max_files_per_window: 3,
                    // The clock jumps 5 minutes at each maintenance while a reader may still
                    // hold an older snapshot: retired files must outlive the whole run here, as
                    // in production they outlive any query (the default grace is 10 minutes of
                    // real time; grace deletion itself is tested elsewhere).
                    grace: std::time::Duration::from_secs(24 * 3600),
                    ..Default::default()
                },
                ..p.config()
            },
            clock.clone(),
        )
        .expect("open"),
    );
    let written = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|scope| {
        for _ in 0..2 {
            let (s, written, started, done) = (
                Arc::clone(&s),
                Arc::clone(&written),
                Arc::clone(&started),
                Arc::clone(&done),
            );
            scope.spawn(move || {
                let mut checks = 0;
                while !done.load(Ordering::SeqCst) || checks == 0 {
                    // Rows written before the snapshot must all be there, once each.
                    let before = written.load(Ordering::SeqCst) as usize;
                    let got = powers(&s);
                    let after = started.load(Ordering::SeqCst) as usize;
                    let mut sorted = got.clone();
                    sorted.dedup();
                    assert_eq!(sorted.len(), got.len(), "a row seen twice");
                    assert!(
                        got.len() >= before && got.len() <= after,
                        "{} rows, {before}..{after} written",
                        got.len()
                    );
                    assert_eq!(got, expected(got.len()));
                    checks += 1;
                }
            });
        }
        for i in 0..120 {
            started.store(i as u64 + 1, Ordering::SeqCst);
            s.write(&write_at(i, 60)).expect("write");
            written.store(i as u64 + 1, Ordering::SeqCst);
            if i % 5 == 4 {
                s.persist().expect("persist");
                clock.advance(5 * 60_000_000_000);
                s.maintain().expect("maintain");
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    assert!(s.stats().compactions.load(Ordering::Relaxed) > 5);
}

fn compaction_keeps_metrics_labels(p: &Place) {
    use crate::ingest::MetricRow;
    use arrow::array::Array;
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::open(p.config(), clock.clone()).expect("open");
    for i in 0..4i64 {
        let row = MetricRow {
            time: T0 + i * 1_000_000_000,
            metric: "node_load1".into(),
            value: i as f64,
            labels: vec![("instance".into(), format!("n{i}"))],
        };
        s.write(&WriteBatch::from_rows(&[], &[row]).expect("batch"))
            .expect("write");
        s.persist().expect("persist");
    }
    clock.advance(2 * 3_600_000_000_000);
    assert_eq!(s.maintain().expect("maintain").windows_compacted, 1);
    let files = files_of(&s, Table::Metrics);
    assert_eq!(files.len(), 1);
    let batch = crate::compact::read_files(s.storage(), Table::Metrics, &files)
        .expect("read back the merged file");
    assert_eq!(batch.num_rows(), 4);
    let labels = batch
        .column_by_name("labels")
        .expect("labels")
        .as_map()
        .clone();
    assert_eq!(labels.null_count(), 0, "labels survived the merge");
    let values = labels.values().as_string::<i32>();
    let mut got: Vec<&str> = (0..values.len()).map(|i| values.value(i)).collect();
    got.sort();
    assert_eq!(got, vec!["n0", "n1", "n2", "n3"]);
}

/// A second store on `a`'s prefix, with a data directory (and so a WAL and writer id) of its own.
fn sharing(a: &Place) -> Place {
    Place::s3_at(a)
}

#[test]
fn two_writers_on_one_prefix_append_to_the_same_tables_and_lose_nothing() {
    let a_place = Place::s3();
    let b_place = sharing(&a_place);
    let a = open(&a_place);
    let b = open(&b_place);
    std::thread::scope(|scope| {
        for (store, base) in [(&a, 0), (&b, 1000)] {
            scope.spawn(move || {
                for round in 0..4 {
                    for i in 0..5 {
                        store.write(&write_of(base + round * 5 + i)).expect("write");
                    }
                    store.persist().expect("persist");
                }
            });
        }
    });
    let mut want: Vec<f64> = (0..20).chain(1000..1020).map(|i| i as f64).collect();
    want.sort_by(f64::total_cmp);
    for s in [&a, &b] {
        s.refresh().expect("refresh");
        assert_eq!(powers(s), want, "each sees both writers' rows once");
    }
    // Each writer's coverage is its own `txn` in the table.
    let gm = Table::GpuMetrics;
    assert!(a.txn_version(gm, &a.storage().writer().id).expect("txn") > 0);
    assert!(b.txn_version(gm, &b.storage().writer().id).expect("txn") > 0);
    // A restart of one replays only its own unpersisted rows.
    b.write(&write_of(2000)).expect("write");
    drop(b);
    let b = open(&b_place);
    want.push(2000.0);
    assert_eq!(powers(&b), want);
    // A query node on the prefix sees the persisted rows, takes no writes.
    let q = Store::open(
        StoreConfig {
            ingest: false,
            ..sharing(&a_place).config()
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("query node");
    want.retain(|v| *v != 2000.0);
    assert_eq!(powers(&q), want);
    assert!(matches!(q.write(&write_of(1)), Err(Error::ReadOnly)));
    assert!(q.persist().expect("nothing to persist").is_none());
    b.persist().expect("persist");
    assert_eq!(q.refresh().expect("refresh"), 1);
    want.push(2000.0);
    assert_eq!(powers(&q), want);
}

#[test]
fn a_copied_data_directory_is_stopped_and_loses_nothing() {
    let a_place = Place::s3();
    let a = open(&a_place);
    a.write(&write_of(0)).expect("write");
    a.persist().expect("persist");
    // A second server on a copy of A's data directory: same writer id.
    let copy = sharing(&a_place);
    std::fs::copy(
        a_place.path().join(persist::storage::WRITER_ID_FILE),
        copy.path().join(persist::storage::WRITER_ID_FILE),
    )
    .expect("copy the writer id");
    let b = open(&copy);
    for i in 1..4 {
        a.write(&write_of(i)).expect("write a");
    }
    a.persist().expect("persist a");
    b.write(&write_of(100)).expect("acknowledged by b's wal");
    let err = b.persist().expect_err("fenced");
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    assert!(err.to_string().contains("writer id"), "{err}");
    // B's rows stay in its buffer and WAL.
    assert!(powers(&b).contains(&100.0));
    assert!(b.fenced().is_some());
    assert!(matches!(b.write(&write_of(101)), Err(Error::Fenced(_))));
    // A goes on untouched.
    a.write(&write_of(4)).expect("write a");
    a.persist().expect("persist a");
    assert_eq!(powers(&a), expected(5));
    assert!(a.fenced().is_none());
}

#[test]
fn a_second_maintainer_conflicts_writes_nothing_and_the_first_goes_on() {
    let a_place = Place::s3();
    let b_place = sharing(&a_place);
    let clock = Arc::new(ManualClock::new(T0));
    let a = Store::open(a_place.config(), clock.clone()).expect("open a");
    let b = Store::open(b_place.config(), clock.clone()).expect("open b");
    for slice in 0..4 {
        for i in slice * 30..(slice + 1) * 30 {
            a.write(&write_at(i, 30)).expect("write");
        }
        a.persist().expect("persist");
    }
    b.refresh().expect("refresh");
    // Both see the same closed hours and race to compact them: B took its view of the tables
    // before A's maintenance commits, so its own commits meet A's maintenance `txn`.
    clock.advance(2 * 3_600_000_000_000 + 11 * 60_000_000_000);
    let r = a.maintain().expect("a maintains");
    assert_eq!(r.windows_compacted, 1, "{r:?}");
    let b_pass = b.maintain_without_refresh();
    assert!(
        matches!(b_pass, Err(Error::DeltaConflict { .. })),
        "{b_pass:?}"
    );
    assert!(b.stats().delta_conflicts.load(Ordering::Relaxed) >= 1);
    b.refresh().expect("refresh");
    assert_eq!(powers(&b), expected(120), "nothing doubled or lost");
    assert_eq!(files_of(&b, Table::GpuMetrics1m).len(), 1);
    assert_eq!(files_of(&b, Table::GpuMetrics).len(), 1);
    // A later pass of B sees A's work and has nothing to do.
    assert_eq!(b.maintain().expect("b").windows_compacted, 0);
}

#[test]
fn an_earlier_release_data_directory_is_converted_once_and_nothing_is_lost_or_doubled() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/pre-delta/local/data");
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture, dir.path());
    let expected = pre_delta_rows("local");
    let clock = Arc::new(ManualClock::new(T0));
    let config = || StoreConfig {
        retention: crate::RetentionConfig {
            gpu_metrics: None,
            gpu_processes: None,
            gpu_processes_1m: None,
            gpu_processes_1h: None,
            gpu_events: None,
            metrics: None,
            gpu_metrics_1m: None,
            gpu_metrics_1h: None,
            alerts: None,
            job_ledger: None,
        },
        ..StoreConfig::new(dir.path())
    };
    let s = Store::open(config(), clock.clone()).expect("open converts");
    assert!(!dir.path().join("catalog.json").exists());
    for (table, n) in &expected {
        assert_eq!(rows_of(&s, *table), *n, "{}", table.name());
    }
    assert!(
        s.files(Table::GpuMetrics)
            .iter()
            .all(|f| f.path.contains("/date=")),
        "rewritten in the Delta layout"
    );
    s.persist().expect("persist the replayed rows");
    drop(s);
    let s = Store::open(config(), clock).expect("reopen");
    for (table, n) in &expected {
        assert_eq!(rows_of(&s, *table), *n, "{} after a restart", table.name());
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Rows per table the earlier release answered for the fixture (its `expected.jsonl`).
fn pre_delta_rows(which: &str) -> Vec<(Table, usize)> {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
        format!("../tests/fixtures/pre-delta/{which}/expected.jsonl"),
    ))
    .expect("expected.jsonl");
    text.lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let table = Table::from_name(v["t"].as_str()?)?;
            // The alert history was not a store table then.
            (table != Table::Alerts).then(|| (table, v["n"].as_u64().unwrap_or(0) as usize))
        })
        .collect()
}

#[test]
fn a_create_only_put_that_meets_its_own_bytes_succeeds_and_other_bytes_fail() {
    let p = Place::s3();
    let s = open(&p);
    let st = s.storage();
    let rel = "tables/x/date=2027-01-01/a.parquet";
    st.put_new(rel, bytes::Bytes::from_static(b"one"))
        .expect("first");
    st.put_new(rel, bytes::Bytes::from_static(b"one"))
        .expect("a retry that meets its own bytes");
    let err = st
        .put_new(rel, bytes::Bytes::from_static(b"two"))
        .expect_err("never overwritten");
    assert!(err.to_string().contains("never overwritten"), "{err}");
    assert_eq!(st.read(rel).expect("read").as_ref(), b"one");
}

fn process_and_event_write(i: usize) -> WriteBatch {
    use crate::ingest::{EventRow, ProcessRow};
    let time = T0 + i as i64 * 60_000_000_000;
    let mut wb = WriteBatch::default();
    wb.add_processes_and_events(
        &[ProcessRow {
            time,
            host: "h".into(),
            gpu_uuid: "GPU-0".into(),
            pid: 1000 + i as i64,
            process_name: Some("python3".into()),
            job_id: Some("7".into()),
            job_user: Some("alice".into()),
            used_memory_bytes: Some(i as i64),
            sm_utilization: None,
        }],
        &[EventRow {
            time,
            host: "h".into(),
            gpu_uuid: "GPU-0".into(),
            kind: "xid".into(),
            code: Some(i as i64),
            detail: None,
        }],
    )
    .expect("batch");
    wb
}

fn rows_of(s: &Store, table: Table) -> usize {
    let snap = s.snapshot(table);
    let buffered: usize = snap.batches.iter().map(|b| b.num_rows()).sum();
    buffered
        + snap
            .files
            .iter()
            .map(|(_, m)| m.rows as usize)
            .sum::<usize>()
}

#[test]
fn processes_and_events_are_persisted_compacted_and_expired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let config = || StoreConfig {
        retention: crate::RetentionConfig {
            gpu_processes: Some(std::time::Duration::from_secs(2 * 3600)),
            gpu_events: Some(std::time::Duration::from_secs(3 * 3600)),
            ..Default::default()
        },
        ..StoreConfig::new(dir.path())
    };
    let s = Store::open(config(), clock.clone()).expect("open");
    // 120 one-minute writes (two hours), persisted in 4 slices: 2 files per table and hour.
    for slice in 0..4 {
        for i in slice * 30..(slice + 1) * 30 {
            s.write(&process_and_event_write(i)).expect("write");
        }
        s.persist().expect("persist");
    }
    for t in [Table::GpuProcesses, Table::GpuEvents] {
        assert_eq!(files_of(&s, t).len(), 4, "{}", t.name());
        assert_eq!(rows_of(&s, t), 120, "{}", t.name());
    }
    // Both hours close: each table's hour is merged into one file; the processes' hours are
    // rolled up (a 1-minute and a 1-hour file each), the events' are not.
    clock.advance(2 * 3_600_000_000_000 + 11 * 60_000_000_000);
    let r = s.maintain().expect("maintain");
    assert_eq!((r.windows_compacted, r.rollup_files), (4, 4));
    for t in [Table::GpuProcesses, Table::GpuEvents] {
        assert_eq!(files_of(&s, t).len(), 2, "{}", t.name());
        assert_eq!(rows_of(&s, t), 120, "{}", t.name());
    }
    // A reopened store reads them back.
    drop(s);
    let s = Store::open(config(), clock.clone()).expect("reopen");
    assert_eq!(rows_of(&s, Table::GpuProcesses), 120);
    // Processes keep 2 h: the first hour is past it. Events keep 3 h: both hours stay.
    clock.advance(3_600_000_000_000);
    s.maintain().expect("maintain");
    assert_eq!(files_of(&s, Table::GpuProcesses).len(), 1);
    assert_eq!(rows_of(&s, Table::GpuProcesses), 60);
    assert_eq!(
        files_of(&s, Table::GpuProcesses1h).len(),
        2,
        "rollups outlive raw rows"
    );
    assert_eq!(files_of(&s, Table::GpuEvents).len(), 2);
    assert_eq!(rows_of(&s, Table::GpuEvents), 120);
}

#[test]
fn checkpoints_keep_the_log_short_and_a_reopen_reads_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s =
        Store::open(StoreConfig::new(dir.path()), Arc::new(ManualClock::new(T0))).expect("open");
    // Version 0 creates the table; 100 persists make versions 1..=100; Delta checkpoints every
    // 100 commits (`delta.checkpointInterval`), at version 99.
    for i in 0..100 {
        s.write(&write_of(i)).expect("write");
        s.persist().expect("persist");
    }
    let log = dir.path().join("tables/gpu_metrics/_delta_log");
    assert!(
        log.join("00000000000000000099.checkpoint.parquet").exists(),
        "{:?}",
        std::fs::read_dir(&log)
            .expect("log")
            .map(|e| e.expect("entry").file_name())
            .collect::<Vec<_>>()
    );
    assert!(log.join("_last_checkpoint").exists());
    drop(s);
    let s =
        Store::open(StoreConfig::new(dir.path()), Arc::new(ManualClock::new(T0))).expect("reopen");
    assert_eq!(powers(&s), expected(100));
    assert_eq!(s.file_count(), 100);
    assert_eq!(
        s.txn_version(Table::GpuMetrics, &s.storage().writer().id)
            .expect("txn"),
        100,
        "the WAL coverage survives the checkpoint"
    );
    // A damaged checkpoint is read around: the commits it summed up are read instead, nothing
    // is lost, and the table takes commits.
    drop(s);
    std::fs::write(
        log.join("00000000000000000099.checkpoint.parquet"),
        b"PAR1 not really",
    )
    .expect("damage");
    let s =
        Store::open(StoreConfig::new(dir.path()), Arc::new(ManualClock::new(T0))).expect("reopen");
    let health = s.log_health(Table::GpuMetrics);
    assert_eq!(health.lost(), None, "{health:?}");
    assert_eq!(health.checkpoint, None);
    assert_eq!(
        health.bad.iter().map(|b| b.kind).collect::<Vec<_>>(),
        vec![
            crate::delta::guard::EntryKind::Checkpoint,
            crate::delta::guard::EntryKind::LastCheckpoint
        ],
        "{health:?}"
    );
    assert_eq!(powers(&s), expected(100));
    s.write(&write_of(100)).expect("write");
    let r = s.persist().expect("persist").expect("report");
    assert!(r.held_back.is_empty());
    assert_eq!(powers(&s), expected(101));
}
