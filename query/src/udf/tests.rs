use std::sync::Arc;

use arrow::array::{Float64Array, RecordBatch, StringArray, TimestampNanosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::catalog::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::*;

const S: i64 = 1_000_000_000;

/// A session with table `c(gpu, time, v)` holding `rows`, spread over `partitions` partitions
/// (so that partial states are merged), and the two aggregates registered.
async fn session(rows: &[(&str, i64, Option<f64>)], partitions: usize) -> SessionContext {
    let schema = Arc::new(Schema::new(vec![
        Field::new("gpu", DataType::Utf8, false),
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("v", DataType::Float64, true),
    ]));
    let mut parts = vec![Vec::new(); partitions];
    for (i, (g, t, v)) in rows.iter().enumerate() {
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from(vec![*g])),
                Arc::new(TimestampNanosecondArray::from(vec![*t]).with_timezone("UTC")),
                Arc::new(Float64Array::from(vec![*v])),
            ],
        )
        .expect("batch");
        parts[i % partitions].push(batch);
    }
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_table(
        "c",
        Arc::new(MemTable::try_new(schema, parts).expect("table")),
    )
    .expect("register");
    ctx.register_udaf(increase());
    ctx.register_udaf(rate());
    ctx
}

async fn answers(ctx: &SessionContext, sql: &str) -> Vec<(String, Option<f64>, Option<f64>)> {
    let batches = ctx
        .sql(sql)
        .await
        .expect("plan")
        .collect()
        .await
        .expect("run");
    let mut out = Vec::new();
    for b in batches {
        let g = b.column(0).as_string::<i32>();
        let inc = b.column(1).as_primitive::<Float64Type>();
        let rate = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let opt = |a: &Float64Array| (!a.is_null(i)).then(|| a.value(i));
            out.push((g.value(i).to_string(), opt(inc), opt(rate)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

const Q: &str = "SELECT gpu, increase(v, time), rate(v, time) FROM c GROUP BY gpu";

#[tokio::test]
async fn a_reset_adds_the_value_after_it() {
    // 100 → 300 (+200), reset to 50 (+50), → 150 (+100): 350 over 30 s.
    let rows = [
        ("a", 0, Some(100.0)),
        ("a", 10 * S, Some(300.0)),
        ("a", 20 * S, Some(50.0)),
        ("a", 30 * S, Some(150.0)),
    ];
    for partitions in [1, 3] {
        let ctx = session(&rows, partitions).await;
        let r = answers(&ctx, Q).await;
        assert_eq!(
            r,
            [("a".to_string(), Some(350.0), Some(350.0 / 30.0))],
            "{partitions} partitions"
        );
    }
}

#[tokio::test]
async fn input_order_does_not_matter() {
    let rows = [
        ("a", 30 * S, Some(150.0)),
        ("a", 0, Some(100.0)),
        ("a", 20 * S, Some(50.0)),
        ("a", 10 * S, Some(300.0)),
        ("b", 5 * S, Some(7.0)),
        ("b", 0, Some(2.0)),
    ];
    let ctx = session(&rows, 4).await;
    let r = answers(&ctx, Q).await;
    assert_eq!(
        r,
        [
            ("a".to_string(), Some(350.0), Some(350.0 / 30.0)),
            ("b".to_string(), Some(5.0), Some(1.0)),
        ]
    );
}

#[tokio::test]
async fn nulls_are_skipped_and_short_groups_give_null() {
    let rows = [
        ("a", 0, Some(10.0)),
        ("a", 5 * S, None),
        ("a", 10 * S, Some(20.0)),
        // One sample: no increase can be told.
        ("single", 0, Some(5.0)),
        // Only NULLs.
        ("nulls", 0, None),
        ("nulls", S, None),
        // Two samples at one time: an increase of 0 but no time to divide by.
        ("same", 3 * S, Some(4.0)),
        ("same", 3 * S, Some(4.0)),
    ];
    let ctx = session(&rows, 2).await;
    let r = answers(&ctx, Q).await;
    assert_eq!(
        r,
        [
            ("a".to_string(), Some(10.0), Some(1.0)),
            ("nulls".to_string(), None, None),
            ("same".to_string(), Some(0.0), None),
            ("single".to_string(), None, None),
        ]
    );
}

#[tokio::test]
async fn works_per_bucket_and_over_an_empty_input() {
    let rows = [
        ("a", 0, Some(0.0)),
        ("a", 30 * S, Some(30.0)),
        ("a", 60 * S, Some(90.0)),
        ("a", 90 * S, Some(100.0)),
    ];
    let ctx = session(&rows, 2).await;
    let batches = ctx
        .sql(
            "SELECT date_bin(INTERVAL '1 minute', time) AS b, increase(v, time) AS inc \
             FROM c GROUP BY 1 ORDER BY 1",
        )
        .await
        .expect("plan")
        .collect()
        .await
        .expect("run");
    let inc: Vec<f64> = batches
        .iter()
        .flat_map(|b| b.column(1).as_primitive::<Float64Type>().values().to_vec())
        .collect();
    // No extrapolation: each bucket counts its own samples only (the step from 30 to 90 that
    // crosses the bucket edge is in neither).
    assert_eq!(inc, [30.0, 10.0]);
    let empty = answers(
        &ctx,
        "SELECT 'x', increase(v, time), rate(v, time) FROM c WHERE v > 1000",
    )
    .await;
    assert_eq!(empty, [("x".to_string(), None, None)]);
}

#[tokio::test]
async fn integer_counters_and_bad_arguments() {
    let ctx = session(&[("a", 0, Some(1.0))], 1).await;
    // An integer value column (xid_errors_total is Int64) is accepted.
    let r = answers(
        &ctx,
        "SELECT 'x', increase(CAST(v AS BIGINT), time), rate(CAST(v AS BIGINT), time) FROM c",
    )
    .await;
    assert_eq!(r, [("x".to_string(), None, None)]);
    for (sql, needle) in [
        ("SELECT increase(v) FROM c", "takes 2 arguments"),
        (
            "SELECT increase(gpu, time) FROM c",
            "value must be a number",
        ),
        ("SELECT rate(v, v) FROM c", "time must be a timestamp"),
    ] {
        let err = match ctx.sql(sql).await {
            Ok(df) => df.collect().await.expect_err(sql).to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(needle), "{sql}: {err}");
    }
}

#[test]
fn counter_increase_by_hand() {
    assert_eq!(counter_increase(&[]), None);
    assert_eq!(counter_increase(&[(0, 1.0)]), None);
    assert_eq!(counter_increase(&[(0, 1.0), (1, 4.0)]), Some(3.0));
    // Reset to exactly 0 adds nothing for that step.
    assert_eq!(counter_increase(&[(0, 5.0), (1, 0.0), (2, 2.0)]), Some(2.0));
}
