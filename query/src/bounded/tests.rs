use super::*;

/// A session with the bounded functions at `max` bytes.
fn session(max: usize) -> SessionContext {
    let ctx = SessionContext::new();
    register(&ctx, max);
    ctx
}

async fn run(ctx: &SessionContext, sql: &str) -> DfResult<Vec<arrow::array::RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

/// The refusal raised by `sql`, which must be one.
async fn refusal(ctx: &SessionContext, sql: &str) -> ValueTooLarge {
    let err = run(ctx, sql).await.expect_err(sql);
    match ValueTooLarge::find(&err) {
        Some(v) => v.clone(),
        None => panic!("{sql}: expected a value-size refusal, got {err}"),
    }
}

#[tokio::test]
async fn values_over_the_limit_are_refused_before_they_are_built() {
    let ctx = session(1 << 20);
    for (sql, function) in [
        ("SELECT repeat('x', 2000000000)", "repeat"),
        ("SELECT lpad('x', 2000000000)", "lpad"),
        ("SELECT rpad('x', 2000000000, 'ab')", "rpad"),
        ("SELECT array_repeat(1, 2000000000)", "array_repeat"),
        ("SELECT array_repeat('abc', 1000000)", "array_repeat"),
        ("SELECT range(0, 1000000000000)", "range"),
        (
            "SELECT generate_series(1, 1000000000000, 1)",
            "generate_series",
        ),
        (
            "SELECT range(TIMESTAMP '1970-01-01T00:00:00', TIMESTAMP '2100-01-01T00:00:00', INTERVAL '1 second')",
            "range",
        ),
        (
            "SELECT range(DATE '0001-01-01', DATE '9999-01-01', INTERVAL '1 minute')",
            "range",
        ),
        ("SELECT array_resize([1], 1000000000)", "array_resize"),
        (
            "SELECT replace(repeat('a', 1000), 'a', repeat('b', 10000))",
            "replace",
        ),
        (
            "SELECT regexp_replace(repeat('a', 1000), '', repeat('b', 2000), 'g')",
            "regexp_replace",
        ),
    ] {
        let refused = refusal(&ctx, sql).await;
        assert_eq!(refused.function, function, "{sql}");
        assert!(refused.bytes > refused.limit, "{sql}: {refused:?}");
        let text = refused.to_string();
        assert!(
            text.starts_with(function) && text.contains("--max-value-bytes"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn values_under_the_limit_are_unchanged() {
    let ctx = session(1 << 20);
    let plain = SessionContext::new();
    for sql in [
        "SELECT repeat('ab', 1000) AS v",
        "SELECT lpad('7', 5, '0') AS v",
        "SELECT rpad('x', 3) AS v",
        "SELECT concat('a', 'b', NULL, 'c') AS v",
        "SELECT concat_ws('-', 'a', 'b') AS v",
        "SELECT array_repeat(2, 3) AS v",
        "SELECT range(1, 10, 3) AS v",
        "SELECT generate_series(1, 4) AS v",
        "SELECT array_resize([1, 2], 4, 0) AS v",
        "SELECT replace('a-b-c', '-', '+') AS v",
        "SELECT regexp_replace('GPU-1234', '([A-Z]+)-(\\d+)', '$2:$1') AS v",
        "SELECT translate('abc', 'ab', 'xy') AS v",
        "SELECT make_array(1, 2, 3) AS v",
        "SELECT string_agg(x, ',') AS v FROM (VALUES ('a'), ('b')) t(x)",
        "SELECT array_agg(x ORDER BY x DESC) AS v FROM (VALUES (1), (3), (2)) t(x)",
        "SELECT k, string_agg(x, ',') AS v FROM (VALUES (1, 'a'), (1, 'b'), (2, 'c')) t(k, x) GROUP BY k ORDER BY k",
    ] {
        let bounded = run(&ctx, sql).await.expect(sql);
        let expected = run(&plain, sql).await.expect(sql);
        assert_eq!(
            arrow::util::pretty::pretty_format_batches(&bounded)
                .expect("format")
                .to_string(),
            arrow::util::pretty::pretty_format_batches(&expected)
                .expect("format")
                .to_string(),
            "{sql}"
        );
    }
}

#[tokio::test]
async fn per_row_arguments_are_checked_row_by_row() {
    let ctx = session(1 << 20);
    // Small counts pass; one large count among them is refused.
    run(
        &ctx,
        "SELECT repeat('x', n) FROM (VALUES (1), (10), (100)) t(n)",
    )
    .await
    .expect("small counts");
    let refused = refusal(
        &ctx,
        "SELECT repeat('x', n) FROM (VALUES (1), (10), (5000000)) t(n)",
    )
    .await;
    assert_eq!(refused.function, "repeat");
    assert_eq!(refused.bytes, 5_000_000);
}

#[tokio::test]
async fn a_batch_of_values_is_bounded_as_a_whole() {
    // Each value is under the limit; the batch of them is over 4 x the limit.
    let ctx = session(1000);
    let refused = refusal(
        &ctx,
        "SELECT repeat('x', 900 + value % 2) FROM generate_series(1, 100)",
    )
    .await;
    assert_eq!(refused.kind, TooLarge::Batch, "{refused:?}");
    assert_eq!(refused.limit, 4000);
}

#[tokio::test]
async fn aggregates_that_concatenate_are_bounded() {
    let ctx = session(1 << 16);
    for (sql, function) in [
        (
            "SELECT string_agg(repeat('x', 100), ',') FROM generate_series(1, 100000)",
            "string_agg",
        ),
        (
            "SELECT array_agg(value) FROM generate_series(1, 1000000)",
            "array_agg",
        ),
        (
            "SELECT value % 2, array_agg(value) FROM generate_series(1, 1000000) GROUP BY 1",
            "array_agg",
        ),
    ] {
        assert_eq!(refusal(&ctx, sql).await.function, function, "{sql}");
    }
}

#[tokio::test]
async fn long_regular_expressions_are_refused() {
    let ctx = session(1 << 20);
    let pattern = "(a|b)".repeat(10_000);
    for function in [
        "regexp_like",
        "regexp_match",
        "regexp_count",
        "regexp_replace",
    ] {
        let extra = if function == "regexp_replace" {
            ", 'x'"
        } else {
            ""
        };
        let sql = format!("SELECT {function}('a', '{pattern}'{extra})");
        let refused = refusal(&ctx, &sql).await;
        assert_eq!(refused.function, function);
        assert_eq!(refused.kind, TooLarge::Pattern);
    }
    run(&ctx, "SELECT regexp_like('GPU-12', '^GPU-[0-9]+$')")
        .await
        .expect("a short pattern");
}

#[tokio::test]
async fn aliases_are_bounded_too() {
    let ctx = session(1 << 20);
    assert_eq!(
        refusal(&ctx, "SELECT list_repeat(1, 2000000000)")
            .await
            .function,
        "array_repeat"
    );
}

#[test]
fn registering_twice_wraps_once() {
    let ctx = session(100);
    register(&ctx, 100);
    let udf = ctx.state().udf("repeat").expect("repeat");
    let bounded = (udf.inner().as_ref() as &dyn Any)
        .downcast_ref::<BoundedScalar>()
        .expect("bounded");
    assert!(
        !(bounded.inner.inner().as_ref() as &dyn Any).is::<BoundedScalar>(),
        "wrapped twice"
    );
}
