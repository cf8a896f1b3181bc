use super::*;
use gpuwatch_store::ingest::{MetricRow, WriteBatch};

#[derive(Debug)]
struct Fixed(Vec<RecordBatch>);

impl ReadStore for Fixed {
    fn snapshot(&self, table: Table) -> TableSnapshot {
        TableSnapshot {
            batches: if table == Table::Metrics {
                self.0.clone()
            } else {
                Vec::new()
            },
            files: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

fn engine(config: EngineConfig) -> QueryEngine {
    let rows: Vec<MetricRow> = (0..200_000i64)
        .map(|i| MetricRow {
            time: i,
            metric: format!("m{}", i % 1000),
            value: (i * 7919 % 100_003) as f64,
            labels: vec![("k".to_string(), format!("v{i}"))],
        })
        .collect();
    let wb = WriteBatch::from_rows(&[], &rows).expect("batch");
    let batches = wb.batches.into_iter().map(|(_, b)| b).collect();
    QueryEngine::new(Arc::new(Fixed(batches)), config).expect("engine")
}

/// The engine's runtime, which every query's own runtime shares, caches Parquet metadata up to
/// its share of the memory ceiling.
#[test]
fn the_metadata_cache_is_sized_by_the_ceiling() {
    let ceiling = crate::memory::Ceiling::new(16 << 30);
    let want = crate::memory::metadata_cache_bytes(Some(&ceiling));
    let engine = QueryEngine::new(
        Arc::new(Fixed(Vec::new())),
        EngineConfig {
            ceiling: Some(ceiling),
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let runtime = engine.context().runtime_env();
    assert_eq!(runtime.cache_manager.get_metadata_cache_limit(), want);
    assert_ne!(want, crate::memory::METADATA_CACHE_MIN);
}

const HEAVY: &str = "SELECT metric, array_agg(labels['k'] ORDER BY value) AS ks FROM metrics GROUP BY metric ORDER BY metric";

#[tokio::test]
async fn the_memory_limit_gives_an_answer_not_an_oom() {
    let limited = engine(EngineConfig {
        memory_limit: Some(64 * 1024),
        ..EngineConfig::default()
    });
    let err = limited.query(HEAVY).await.expect_err("over the limit");
    assert!(matches!(err, Error::ResourcesExhausted(_)), "{err:?}");
    assert!(err.to_string().contains("--query-memory-limit"), "{err}");
    // The same query fits without the limit, and small queries fit within it.
    let free = engine(EngineConfig::default());
    let r = free.query(HEAVY).await.expect("fits");
    assert_eq!(r.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1000);
    let small = limited
        .query("SELECT count(*) FROM metrics")
        .await
        .expect("small query fits");
    assert_eq!(small.batches[0].num_rows(), 1);
}

#[tokio::test]
async fn one_query_too_many_is_refused_at_once() {
    let e = engine(EngineConfig {
        max_concurrent_queries: Some(1),
        ..EngineConfig::default()
    });
    let held = e.try_slot().expect("first slot");
    let err = e.query("SELECT 1").await.expect_err("busy");
    assert!(matches!(err, Error::Busy(1)), "{err:?}");
    assert_eq!(err.status(), crate::Status::TooManyRequests);
    // The HTTP front end answers it 429 with Retry-After (gpuwatch/src/server/sql.rs).
    assert_eq!(err.status().code(), 429);
    drop(held);
    assert!(e.query("SELECT 1").await.is_ok(), "the slot is free again");
}

/// The engine over a real store (local disk and S3).
mod store;
