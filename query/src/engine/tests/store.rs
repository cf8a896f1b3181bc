//! The engine over a real store (local disk and S3): what queries see of buffer and files.

use super::super::*;
use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use gpuwatch_store::clock::SystemClock;
use gpuwatch_store::ingest::{Cell, GpuRow, MetricRow, WriteBatch};
use gpuwatch_store::{Store, StoreConfig};

fn write(store: &Store, i: i64) {
    let mut row = GpuRow::new(1_800_000_000_000_000_000 + i * 1_000_000_000);
    row.labels[0] = Some("h".into());
    row.labels[1] = Some(format!("GPU-{}", i % 2));
    row.values[11] = Some(Cell::F(i as f64));
    let metric = MetricRow {
        time: row.time,
        metric: "m".into(),
        value: i as f64,
        labels: vec![("k".into(), format!("v{i}"))],
    };
    store
        .write(&WriteBatch::from_rows(&[row], &[metric]).expect("batch"))
        .expect("write");
}

/// Where the store keeps its files.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Local,
    S3,
}

/// A store in `dir` (WAL fsync off) and an engine over it.
fn open(dir: &std::path::Path) -> (Arc<Store>, QueryEngine) {
    open_on(dir, Backend::Local)
}

/// A store in `dir`, with its files on `backend` (a prefix of its own on S3).
fn open_on(dir: &std::path::Path, backend: Backend) -> (Arc<Store>, QueryEngine) {
    let mut config = StoreConfig {
        wal_sync: false,
        ..StoreConfig::new(dir)
    };
    if let Backend::S3 = backend {
        static N: AtomicU64 = AtomicU64::new(0);
        config.object_store = Some(format!(
            "s3://gpuwatch-test/query-{}/t{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        config.object_store_options = [
            ("aws_endpoint", gpuwatch_store::testing::moto_endpoint()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    }
    let store = Arc::new(Store::open(config, Arc::new(SystemClock)).expect("store"));
    let engine = QueryEngine::new(
        Arc::clone(&store) as Arc<dyn ReadStore>,
        EngineConfig::default(),
    )
    .expect("engine");
    (store, engine)
}

async fn count(engine: &QueryEngine, sql: &str) -> i64 {
    let r = engine.query(sql).await.expect("query");
    r.batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test]
async fn queries_see_buffer_and_files_once() {
    queries_see_buffer_and_files_once_on(Backend::Local).await
}

#[tokio::test]
async fn queries_see_buffer_and_files_once_s3() {
    queries_see_buffer_and_files_once_on(Backend::S3).await
}

async fn queries_see_buffer_and_files_once_on(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, engine) = open_on(dir.path(), backend);
    for i in 0..10 {
        write(&store, i);
    }
    assert_eq!(count(&engine, "SELECT count(*) FROM gpu_metrics").await, 10);
    store.persist().expect("persist");
    for i in 10..15 {
        write(&store, i);
    }
    assert_eq!(count(&engine, "SELECT count(*) FROM gpu_metrics").await, 15);
    assert_eq!(
        count(
            &engine,
            "SELECT count(DISTINCT power_watts) FROM gpu_metrics"
        )
        .await,
        15
    );
    assert_eq!(
        count(
            &engine,
            "SELECT count(*) FROM metrics WHERE labels['k'] = 'v12'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &engine,
            "SELECT count(*) FROM gpu_metrics WHERE time >= to_timestamp_seconds(1800000005)"
        )
        .await,
        10
    );
    let err = engine
        .query("DROP TABLE gpu_metrics")
        .await
        .expect_err("refused");
    assert_eq!(err.status(), crate::Status::Forbidden);
    let err = engine
        .query("SELECT * FROM nope")
        .await
        .expect_err("no table");
    assert_eq!(err.status(), crate::Status::BadRequest);
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test]
async fn files_outside_the_time_filter_are_never_scanned() {
    files_outside_the_time_filter_are_never_scanned_on(Backend::Local).await
}

#[tokio::test]
async fn files_outside_the_time_filter_are_never_scanned_s3() {
    files_outside_the_time_filter_are_never_scanned_on(Backend::S3).await
}

async fn files_outside_the_time_filter_are_never_scanned_on(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, engine) = open_on(dir.path(), backend);
    // Three hours, one persist each: three files per table.
    for hour in 0..3i64 {
        for i in 0..4 {
            write(&store, hour * 3600 + i);
        }
        store.persist().expect("persist");
    }
    assert_eq!(store.snapshot(Table::GpuMetrics).files.len(), 3);
    if let Backend::S3 = backend {
        let snap = store.snapshot(Table::GpuMetrics);
        assert!(
            snap.files
                .iter()
                .all(|(l, _)| l.starts_with("s3://gpuwatch-test/query-")),
            "{:?}",
            snap.files
        );
    }
    let scanned = || engine.scan_stats().files_scanned.load(Ordering::Relaxed);
    let pruned = || engine.scan_stats().files_pruned.load(Ordering::Relaxed);
    let t = |s: i64| format!("to_timestamp_seconds({})", 1_800_000_000 + s);
    let cases = [
        (format!("time >= {}", t(3600)), 8, 2),
        (format!("time < {}", t(3600)), 4, 1),
        (format!("time > {}", t(3)), 8, 2),
        (format!("time BETWEEN {} AND {}", t(3600), t(3601)), 2, 1),
        (format!("time >= {} AND time < {}", t(7200), t(9000)), 4, 1),
        (format!("{} <= time", t(7203)), 1, 1),
        (format!("time = {}", t(2)), 1, 1),
        ("time < now() - interval '3650 days'".to_string(), 0, 0),
        ("gpu_uuid = 'GPU-1'".to_string(), 6, 3),
    ];
    for (filter, rows, files) in cases {
        let (s0, p0) = (scanned(), pruned());
        let sql = format!("SELECT count(*) FROM gpu_metrics WHERE {filter}");
        assert_eq!(count(&engine, &sql).await, rows, "{sql}");
        assert_eq!(scanned() - s0, files, "files scanned for {sql}");
        assert_eq!(pruned() - p0, 3 - files, "files pruned for {sql}");
    }
}

async fn sum(engine: &QueryEngine, sql: &str) -> f64 {
    let r = engine.query(sql).await.expect("query");
    r.batches[0]
        .column(0)
        .as_primitive::<arrow::datatypes::Float64Type>()
        .value(0)
}

/// Queries with a memory limit (the server's default) run in a runtime of their own; the
/// Parquet footers read by one are kept for the next, and answers stay right when compaction
/// replaces the files under the cache and when new files arrive.
#[tokio::test]
async fn footers_are_cached_across_queries_and_compaction_keeps_answers_right() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(gpuwatch_store::clock::ManualClock::new(
        1_800_000_000_000_000_000,
    ));
    let store = Arc::new(
        Store::open(
            StoreConfig {
                wal_sync: false,
                ..StoreConfig::new(dir.path())
            },
            Arc::clone(&clock) as Arc<dyn gpuwatch_store::clock::Clock>,
        )
        .expect("store"),
    );
    let engine = QueryEngine::new(
        Arc::clone(&store) as Arc<dyn ReadStore>,
        EngineConfig {
            memory_limit: Some(1 << 30),
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let footers = engine
        .context()
        .runtime_env()
        .cache_manager
        .get_file_metadata_cache();
    // Two persists within one hour: two files.
    for i in 0..4 {
        write(&store, i);
    }
    store.persist().expect("persist");
    for i in 4..8 {
        write(&store, i);
    }
    store.persist().expect("persist");
    let files = || -> Vec<String> {
        store
            .snapshot(Table::GpuMetrics)
            .files
            .into_iter()
            .map(|(l, _)| l)
            .collect()
    };
    let before = files();
    assert_eq!(before.len(), 2);
    const TOTAL: &str = "SELECT sum(power_watts) FROM gpu_metrics";
    assert_eq!(sum(&engine, TOTAL).await, 28.0);
    assert!(
        footers.len() >= 2,
        "the footers of both files are cached, {} entries",
        footers.len()
    );
    assert_eq!(sum(&engine, TOTAL).await, 28.0);

    // The hour closes: compaction merges both files into a new one.
    clock.advance(3 * 3_600_000_000_000);
    store.maintain().expect("maintain");
    let after = files();
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(!before.contains(&after[0]), "{after:?} is a new file");
    assert_eq!(sum(&engine, TOTAL).await, 28.0);
    assert_eq!(count(&engine, "SELECT count(*) FROM gpu_metrics").await, 8);

    // Late rows of the same hour: a new file beside the compacted one.
    for i in 8..10 {
        write(&store, i);
    }
    store.persist().expect("persist");
    assert_eq!(store.snapshot(Table::GpuMetrics).files.len(), 2);
    assert_eq!(sum(&engine, TOTAL).await, 45.0);
    assert_eq!(
        sum(
            &engine,
            "SELECT sum(power_watts) FROM gpu_metrics WHERE gpu_uuid = 'GPU-1'"
        )
        .await,
        25.0
    );
}

/// Strings are string views whether they come from the buffer or from Parquet, and a
/// `GROUP BY` over both groups them together.
#[tokio::test]
async fn strings_are_views_from_buffer_and_files_alike() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, engine) = open(dir.path());
    for i in 0..6 {
        write(&store, i);
    }
    store.persist().expect("persist");
    for i in 6..9 {
        write(&store, i);
    }
    let r = engine
        .query("SELECT gpu_uuid, count(*) AS n, max(host) AS h FROM gpu_metrics GROUP BY gpu_uuid ORDER BY gpu_uuid")
        .await
        .expect("query");
    assert_eq!(r.schema.field(0).data_type(), &DataType::Utf8View);
    assert_eq!(r.schema.field(2).data_type(), &DataType::Utf8View);
    let b = arrow::compute::concat_batches(&r.schema, &r.batches).expect("concat");
    let uuids = b.column(0).as_string_view();
    let n = b.column(1).as_primitive::<Int64Type>();
    let got: Vec<(String, i64)> = (0..b.num_rows())
        .map(|i| (uuids.value(i).to_string(), n.value(i)))
        .collect();
    assert_eq!(
        got,
        vec![("GPU-0".to_string(), 5), ("GPU-1".to_string(), 4)]
    );
    let r = engine
        .query("SELECT metric FROM metrics WHERE labels['k'] = 'v7'")
        .await
        .expect("query");
    assert_eq!(r.schema.field(0).data_type(), &DataType::Utf8View);
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
}

#[tokio::test]
async fn csv_flattens_maps_and_json_keeps_nulls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, engine) = open(dir.path());
    write(&store, 1);
    let r = engine
        .query("SELECT metric, labels FROM metrics")
        .await
        .expect("query");
    let csv =
        String::from_utf8(crate::format::encode(&r, crate::format::Format::Csv).expect("csv"))
            .expect("utf8");
    assert_eq!(csv, "metric,labels\nm,{k: v1}\n");
    let r = engine
        .query("SELECT gpu_uuid, job_id FROM gpu_metrics")
        .await
        .expect("query");
    let json =
        String::from_utf8(crate::format::encode(&r, crate::format::Format::Json).expect("json"))
            .expect("utf8");
    assert_eq!(json, "[{\"gpu_uuid\":\"GPU-1\",\"job_id\":null}]");
    let empty = engine
        .query("SELECT gpu_uuid FROM gpu_metrics WHERE false")
        .await
        .expect("query");
    assert_eq!(
        crate::format::encode(&empty, crate::format::Format::Json).expect("json"),
        b"[]"
    );
    let csv = crate::format::encode(&empty, crate::format::Format::Csv).expect("csv");
    assert_eq!(csv, b"gpu_uuid\n");
}

#[tokio::test]
async fn a_damaged_file_costs_only_its_rows_and_the_answer_says_so() {
    a_damaged_file_costs_only_its_rows_and_the_answer_says_so_on(Backend::Local).await
}

#[tokio::test]
async fn a_damaged_file_costs_only_its_rows_and_the_answer_says_so_s3() {
    a_damaged_file_costs_only_its_rows_and_the_answer_says_so_on(Backend::S3).await
}

async fn a_damaged_file_costs_only_its_rows_and_the_answer_says_so_on(backend: Backend) {
    use datafusion::object_store::ObjectStoreExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, engine) = open_on(dir.path(), backend);
    for i in 0..4 {
        write(&store, i);
    }
    store.persist().expect("persist");
    for i in 7200..7203 {
        write(&store, i);
    }
    store.persist().expect("persist");
    write(&store, 9000);
    let mut files = store.files(Table::GpuMetrics).as_ref().clone();
    files.sort_by_key(|f| f.min_time);
    let bad = files[0].clone();
    // Same size, other bytes: only reading it shows the damage.
    let key = store.storage().key(&bad.path).expect("key");
    let root = store.storage().root_store();
    let garbage = vec![0x42u8; bad.bytes as usize];
    store
        .storage()
        .block(async move { root.put(&key, garbage.into()).await })
        .expect("runtime")
        .expect("garble");
    const ALL: &str = "SELECT count(*) FROM gpu_metrics";
    let r = engine.query(ALL).await.expect("the rest still answers");
    let n = r.batches[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n, 3 + 1, "the other file's rows and the buffered one");
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains(&bad.path) && r.warnings[0].contains("(4 rows)"),
        "{:?}",
        r.warnings
    );
    assert_eq!(
        engine
            .scan_stats()
            .retried_after_damage
            .load(Ordering::Relaxed),
        1
    );
    // Later queries leave it out from the start, and still say so.
    let r = engine.query(ALL).await.expect("query");
    assert_eq!(
        r.batches[0].column(0).as_primitive::<Int64Type>().value(0),
        4
    );
    assert_eq!(r.warnings.len(), 1);
    assert_eq!(
        engine
            .scan_stats()
            .retried_after_damage
            .load(Ordering::Relaxed),
        1
    );
    assert_eq!(
        engine
            .scan_stats()
            .answers_with_skipped_data
            .load(Ordering::Relaxed),
        2
    );
    // A query the damaged file cannot matter to has nothing to say.
    let r = engine
        .query("SELECT count(*) FROM gpu_metrics WHERE time >= to_timestamp_seconds(1800007000)")
        .await
        .expect("query");
    assert_eq!(
        r.batches[0].column(0).as_primitive::<Int64Type>().value(0),
        4
    );
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}
