use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int32Array, RecordBatch, StringArray,
    StringViewArray, TimestampNanosecondArray, UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use proptest::prelude::*;

use super::{RunAggregateExec, RunAggregateRule, mark_changes};

/// One run of rows that share their keys.
#[derive(Debug, Clone)]
struct Run {
    host: usize,
    gpu: usize,
    job: Option<usize>,
    index: Option<i32>,
    flag: bool,
    len: usize,
}

fn run() -> impl Strategy<Value = Run> {
    (
        0usize..3,
        0usize..6,
        proptest::option::of(0usize..4),
        proptest::option::of(0i32..3),
        any::<bool>(),
        1usize..40,
    )
        .prop_map(|(host, gpu, job, index, flag, len)| Run {
            host,
            gpu,
            job,
            index,
            flag,
            len,
        })
}

/// A value from a seed: quarters (sums are exact in any order), with NaN, -0.0 and null.
fn value(seed: usize) -> Option<f64> {
    match seed % 23 {
        0 => None,
        1 => Some(f64::NAN),
        2 => Some(-0.0),
        3 => Some(0.0),
        k => Some(k as f64 / 4.0),
    }
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("host", DataType::Utf8View, false),
        Field::new("gpu_uuid", DataType::Utf8View, false),
        Field::new("job_id", DataType::Utf8View, true),
        Field::new("gpu_index", DataType::Int32, true),
        Field::new("flag", DataType::Boolean, false),
        Field::new("plain", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
        Field::new("w", DataType::Float64, true),
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
    ]))
}

/// Label values as a scan of a dictionary-encoded Parquet column gives them: views into one
/// buffer, equal values with equal views.
fn labels(values: &[String], picks: &[Option<usize>]) -> ArrayRef {
    let dictionary = StringViewArray::from_iter_values(values);
    let idx = UInt32Array::from(
        picks
            .iter()
            .map(|p| p.map(|p| p as u32))
            .collect::<Vec<_>>(),
    );
    take(&dictionary, &idx, None).expect("take labels")
}

fn batch(runs: &[Run], first_row: usize) -> RecordBatch {
    let hosts: Vec<String> = (0..3).map(|h| format!("node-{h:02}")).collect();
    let gpus: Vec<String> = (0..6)
        .map(|g| format!("GPU-{g:08x}-5a1c-8e33-0c1f-4b2d7e9a{g:04x}"))
        .collect();
    let jobs: Vec<String> = (0..4).map(|j| format!("{}", 4_100_000 + j)).collect();
    let mut host = Vec::new();
    let mut gpu = Vec::new();
    let mut job = Vec::new();
    let mut index = Vec::new();
    let mut flag = Vec::new();
    let mut plain = Vec::new();
    let mut v = Vec::new();
    let mut w = Vec::new();
    let mut time = Vec::new();
    let mut row = first_row;
    for r in runs {
        for _ in 0..r.len {
            host.push(Some(r.host));
            gpu.push(Some(r.gpu));
            job.push(r.job);
            index.push(r.index);
            flag.push(r.flag);
            // A string column that is not a view: long values, built row by row.
            plain.push(
                r.job
                    .map(|j| format!("a label longer than twelve bytes {j}")),
            );
            v.push(value(row * 7 + r.gpu));
            // min and max of floats with NaN, or with both zeros, depend on the order rows
            // arrive in (DataFusion's own answer changes from run to run): they get a column
            // without NaN and -0.0.
            w.push(
                value(row * 7 + r.gpu)
                    .filter(|x| !x.is_nan())
                    .map(|x| if x == 0.0 { 0.0 } else { x }),
            );
            time.push(1_700_000_000_000_000_000i64 + (row as i64) * 10_000_000_000);
            row += 1;
        }
    }
    RecordBatch::try_new(
        schema(),
        vec![
            labels(&hosts, &host),
            labels(&gpus, &gpu),
            labels(&jobs, &job),
            Arc::new(Int32Array::from(index)),
            Arc::new(BooleanArray::from(flag)),
            Arc::new(StringArray::from(plain)),
            Arc::new(Float64Array::from(v)),
            Arc::new(Float64Array::from(w)),
            Arc::new(TimestampNanosecondArray::from(time).with_timezone("UTC")),
        ],
    )
    .expect("batch")
}

/// The table `t`: the runs spread over `partitions` partitions of batches of `batch_rows` runs.
fn table(runs: &[Run], partitions: usize, batch_runs: usize) -> Arc<MemTable> {
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions];
    let mut first_row = 0;
    for (i, chunk) in runs.chunks(batch_runs.max(1)).enumerate() {
        parts[i % partitions].push(batch(chunk, first_row));
        first_row += chunk.iter().map(|r| r.len).sum::<usize>();
    }
    Arc::new(MemTable::try_new(schema(), parts).expect("table"))
}

fn context(table: Arc<MemTable>, with_rule: bool, memory_limit: Option<usize>) -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(3)
        .with_batch_size(64);
    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = memory_limit {
        runtime = runtime.with_memory_limit(limit, 1.0);
    }
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.build_arc().expect("runtime"))
        .with_default_features();
    if with_rule {
        state = state.with_physical_optimizer_rule(Arc::new(RunAggregateRule));
    }
    let ctx = SessionContext::new_with_state(state.build());
    ctx.register_table("t", table).expect("register");
    ctx
}

/// Queries the run aggregation takes over, with every key type and aggregate it handles.
const TAKEN: &[&str] = &[
    "SELECT host, gpu_uuid, job_id, min(time), max(time), count(*), count(v), sum(v), avg(v), max(plain), min(job_id)
     FROM t GROUP BY host, gpu_uuid, job_id",
    "SELECT gpu_uuid, max(CASE WHEN v > 2 THEN time END) AS last_busy, min(w), max(w) FROM t GROUP BY gpu_uuid",
    "SELECT gpu_index, flag, sum(v) FILTER (WHERE flag), count(*) FILTER (WHERE v > 1) FROM t GROUP BY gpu_index, flag",
    "SELECT date_bin(INTERVAL '1 minute', time) AS b, host, avg(v), count(*) FROM t GROUP BY 1, host",
    "SELECT v, count(*) FROM t GROUP BY v",
    // Few groups in short runs: rows go to the group table one by one.
    "SELECT v > 2 AS high, count(*), sum(v), min(w) FROM t GROUP BY v > 2",
    // A group per row: past the probe, rows pass on as states.
    "SELECT time, host, count(*), sum(v), min(w), max(plain), count(job_id) FILTER (WHERE flag) FROM t GROUP BY time, host",
    "SELECT plain, job_id, count(*), min(w) FROM t GROUP BY plain, job_id",
    "WITH w AS (
       SELECT host, gpu_uuid, gpu_index, job_id, max(job_id) AS j, min(time) AS first, max(time) AS last,
         max(CASE WHEN v >= 1 OR flag THEN time END) AS busy
       FROM t WHERE job_id IS NOT NULL GROUP BY host, gpu_uuid, gpu_index, job_id)
     SELECT host, gpu_uuid, job_id, CAST(last AS BIGINT) - CAST(coalesce(busy, first) AS BIGINT) AS idle
     FROM w WHERE last > first",
    // Planned as two aggregations, both over plain keys.
    "SELECT host, count(DISTINCT gpu_uuid) FROM t GROUP BY host",
];

/// Queries it must leave to DataFusion.
const LEFT: &[&str] = &[
    "SELECT host, array_agg(v ORDER BY time) FROM t GROUP BY host",
    "SELECT host, gpu_uuid, count(*) FROM t GROUP BY ROLLUP (host, gpu_uuid)",
    "SELECT count(*), min(time) FROM t",
];

/// The rows of a query's answer as sorted text lines.
async fn answer(ctx: &SessionContext, sql: &str) -> Vec<String> {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let batches = df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let text = arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>().join("|"))
        .collect();
    lines.sort();
    lines
}

async fn plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    ctx.sql(sql)
        .await
        .expect("plan")
        .create_physical_plan()
        .await
        .expect("physical plan")
}

fn count_runs(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let here = usize::from(plan.downcast_ref::<RunAggregateExec>().is_some());
    here + plan.children().iter().map(|c| count_runs(c)).sum::<usize>()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every query gives the same rows with the run aggregation as with DataFusion's own.
    #[test]
    fn answers_equal_datafusions(
        runs in proptest::collection::vec(run(), 1..60),
        partitions in 1usize..4,
        batch_runs in 1usize..8,
    ) {
        let table = table(&runs, partitions, batch_runs);
        let with = context(Arc::clone(&table), true, None);
        let without = context(table, false, None);
        runtime().block_on(async {
            // A short probe, so that inputs with few runs also pass rows on.
            for ctx in [&with, &without] {
                ctx.sql("SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 50")
                    .await
                    .expect("set the probe");
            }
            for sql in TAKEN.iter().chain(LEFT) {
                prop_assert_eq!(answer(&with, sql).await, answer(&without, sql).await, "{}", sql);
            }
            Ok(())
        })?;
    }
}

#[test]
fn takes_the_aggregations_it_can_and_leaves_the_others() {
    let runs = vec![
        Run {
            host: 0,
            gpu: 1,
            job: Some(2),
            index: Some(1),
            flag: true,
            len: 5,
        };
        4
    ];
    let ctx = context(table(&runs, 2, 1), true, None);
    runtime().block_on(async {
        for sql in TAKEN {
            assert!(count_runs(&plan(&ctx, sql).await) >= 1, "{sql}");
        }
        for sql in LEFT {
            assert_eq!(count_runs(&plan(&ctx, sql).await), 0, "{sql}");
        }
        let explain = answer(&ctx, &format!("EXPLAIN {}", TAKEN[0]))
            .await
            .join("\n");
        assert!(
            explain.contains("RunAggregateExec: mode=Partial, gby=[host@0 as host"),
            "{explain}"
        );
    });
}

/// Past the memory limit, the partial aggregation emits what it holds and starts again: it
/// emits more rows than there are groups, and its partial states add up to the answer.
#[test]
fn emits_early_under_the_memory_limit() {
    // 6000 distinct (host, GPU, job, index) keys, each in two runs far apart.
    let runs: Vec<Run> = (0..12000)
        .map(|i| i % 6000)
        .map(|i| Run {
            host: i % 3,
            gpu: (i / 3) % 6,
            job: Some((i / 18) % 4),
            index: Some((i / 72) as i32),
            flag: i % 2 == 0,
            len: 2,
        })
        .collect();
    let sql = "SELECT host, gpu_uuid, job_id, gpu_index, count(*), min(time), max(w) FROM t
               GROUP BY host, gpu_uuid, job_id, gpu_index";
    let table = table(&runs, 1, 50);
    let unlimited = context(Arc::clone(&table), false, None);
    let limited = context(table, true, Some(256 * 1024));
    runtime().block_on(async {
        let expected = answer(&unlimited, sql).await;
        assert_eq!(expected.len(), 6000);
        // The partial aggregation alone, in the limited pool.
        let plan = plan(&limited, sql).await;
        let partial = find_run(&plan).expect("a run aggregation in the plan");
        let batches = collect(Arc::clone(&partial), limited.task_ctx())
            .await
            .expect("partial aggregation within the limit");
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert!(rows > 6000, "{rows} partial rows for 6000 groups");
        let emitted = partial.metrics().and_then(|m| m.output_rows());
        assert_eq!(emitted, Some(rows));
        // Merge the states: count, min, max.
        let fields: Vec<String> = batches[0]
            .schema()
            .fields()
            .iter()
            .map(|f| format!("\"{}\"", f.name()))
            .collect();
        let merge = format!(
            "SELECT {k}, sum({c}), min({t}), max({v}) FROM t GROUP BY {k}",
            k = fields[..4].join(", "),
            c = fields[4],
            t = fields[5],
            v = fields[6],
        );
        let ctx = context(table_of(&batches), false, None);
        assert_eq!(answer(&ctx, &merge).await, expected);
    });
}

fn find_run(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.downcast_ref::<RunAggregateExec>().is_some() {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find_run)
}

fn table_of(batches: &[RecordBatch]) -> Arc<MemTable> {
    let schema = batches[0].schema();
    Arc::new(MemTable::try_new(schema, vec![batches.to_vec()]).expect("table"))
}

fn changes(array: &dyn Array) -> Vec<bool> {
    let mut same = vec![true; array.len()];
    same[0] = false;
    mark_changes(array, &mut same).expect("mark");
    same
}

#[test]
fn finds_runs_in_views_values_and_nulls() {
    let long = "GPU-00000001-5a1c-8e33-0c1f-4b2d7e9a0001";
    // Equal long values with different views (built row by row), equal views, inline values.
    let views = StringViewArray::from(vec![
        Some(long),
        Some(long),
        None,
        None,
        Some("short"),
        Some("short"),
        Some("shorT"),
        Some(""),
        None,
    ]);
    assert_eq!(
        changes(&views),
        [false, true, false, true, false, true, false, false, false]
    );
    let ints = Int32Array::from(vec![Some(1), Some(1), None, Some(0), Some(0), Some(2)]);
    assert_eq!(changes(&ints), [false, true, false, false, true, false]);
    let floats = Float64Array::from(vec![0.0, -0.0, f64::NAN, f64::NAN, 1.5, 1.5]);
    assert_eq!(changes(&floats), [false, false, false, true, false, true]);
    let sliced = ints.slice(3, 3);
    assert_eq!(changes(&sliced), [false, true, false]);
}

/// With about as many groups as rows, the partial aggregation passes rows on as states of
/// their own after the probe, as DataFusion's does, and the answer stays the same.
#[test]
fn passes_rows_on_when_nearly_every_row_is_a_group() {
    // Every row its own run and its own group (the time is part of the key).
    let runs: Vec<Run> = (0..3000)
        .map(|i| Run {
            host: i % 3,
            gpu: i % 6,
            job: Some(i % 4),
            index: Some(0),
            flag: true,
            len: 1,
        })
        .collect();
    let sql = "SELECT time, gpu_uuid, count(*), sum(v), max(w) FROM t GROUP BY time, gpu_uuid";
    let table = table(&runs, 1, 40);
    let without = context(Arc::clone(&table), false, None);
    let with = context(table, true, None);
    runtime().block_on(async {
        with.sql("SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 500")
            .await
            .expect("set the probe");
        let expected = answer(&without, sql).await;
        assert_eq!(expected.len(), 3000);
        let plan = plan(&with, sql).await;
        let partial = find_run(&plan).expect("a run aggregation in the plan");
        let batches = collect(Arc::clone(&plan), with.task_ctx())
            .await
            .expect("query");
        assert_eq!(
            batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
            3000
        );
        // Past the probe (500 rows in each partition), rows passed on.
        let skipped = partial
            .metrics()
            .and_then(|m| m.sum_by_name("skipped_aggregation_rows"))
            .map(|v| v.as_usize())
            .unwrap_or_default();
        assert!((1000..3000).contains(&skipped), "{skipped} rows passed on");
        assert_eq!(answer(&with, sql).await, expected);
    });
}
