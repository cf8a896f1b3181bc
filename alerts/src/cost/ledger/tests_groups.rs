//! `job_groups` ([`groups`]) against `jobs` grouped the same way: with the groups made of
//! each day's totals, with a day holding a job seen again (read as `jobs` reads it), and the
//! Cost panels' answers from the groups and the edges against their answers from `jobs`.

use super::bounds::Ask;
use super::tests_days::{Rows, same};
use super::tests_totals::{D0, DAY, server, setup, write_hours};
use super::*;
use crate::cost::MEAN_ACTIVITY;
use crate::cost::tests::json_rows as rows;

const ORDER: &str = "ORDER BY day, first_day, job_user, job_account, gpu_model, limiter, job_id";

/// `jobs` grouped as `job_groups` groups it, under `filter`.
async fn want(e: &gpuwatch_query::QueryEngine, filter: &str) -> Rows {
    let sql = groups::group_select("SELECT * FROM jobs");
    rows(
        e,
        &format!("SELECT * FROM ({sql}) g WHERE {filter} {ORDER}"),
    )
    .await
}

async fn got(e: &gpuwatch_query::QueryEngine, filter: &str) -> Rows {
    rows(
        e,
        &format!("SELECT * FROM {} WHERE {filter} {ORDER}", groups::NAME),
    )
    .await
}

/// The questions compared: every group, and groups bounded by their day.
async fn agree(e: &gpuwatch_query::QueryEngine, what: &str) {
    let at = |t: i64| format!("to_timestamp_nanos({t})");
    for filter in [
        "true".to_string(),
        format!("day >= {}", at(D0 + DAY)),
        format!("day < {}", at(D0 + DAY)),
        format!("day BETWEEN {} AND {}", at(D0 + DAY / 2), at(D0 + 2 * DAY)),
        format!("day >= {} AND day <= {}", at(D0 + 2 * DAY), at(D0)),
    ] {
        let want = want(e, &filter).await;
        assert_eq!(want.is_empty(), filter.contains("<="), "{what}: {filter}");
        same(&got(e, &filter).await, &want, &format!("{what}: {filter}"));
    }
}

/// The days a `job_groups` question takes from the groups made (rows, for each) and those it
/// reads as `jobs` does.
async fn split(
    e: &gpuwatch_query::QueryEngine,
    ledger: &JobLedger,
) -> (Vec<usize>, Vec<(i64, i64)>) {
    let snap = ledger.snapshot();
    let state = e.context().state();
    let ask = Ask::default();
    let mut read = ledger
        .read_for(&state, &snap, View::Groups, ask.clone())
        .await
        .expect("read");
    ledger.split_groups(&snap, &mut read, &ask);
    let made = read.made.unwrap_or_default();
    let days = read.totals.and_then(|t| t.days).unwrap_or_default();
    (made.iter().map(|b| b.num_rows()).collect(), days)
}

#[tokio::test]
async fn job_groups_answers_as_jobs_grouped_from_the_days_made_and_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());

    // Before any totals: every group from `jobs`.
    let (e, ledger) = server(&store, &cost, false, now).await;
    assert!(groups::made_days(&ledger).is_empty());
    agree(&e, "no totals").await;

    // The folding server writes the first two days' totals and makes their groups.
    let (e, ledger) = server(&store, &cost, true, now).await;
    assert_eq!(groups::made_days(&ledger), [D0, D0 + DAY]);
    let (made, read) = split(&e, &ledger).await;
    assert_eq!(made.len(), 2, "both days from their groups");
    assert!(made.iter().all(|&n| n > 0), "{made:?}");
    assert!(
        read.is_empty(),
        "no totals day read as jobs reads it: {read:?}"
    );
    agree(&e, "groups made").await;

    // `back` comes back on the fourth day: day 0 (its file) is read as `jobs` reads it, day 1
    // from its groups, until the job's new day is written.
    write_hours(&store, 80..130);
    let (e, ledger) = server(&store, &cost, false, now).await;
    let (made, read) = split(&e, &ledger).await;
    assert_eq!((made.len(), read), (1, vec![(D0, D0 + DAY)]));
    agree(&e, "a job back").await;
    let (e, ledger) = server(&store, &cost, true, now).await;
    assert_eq!(groups::made_days(&ledger).len(), 4, "days 0 to 3");
    let (made, read) = split(&e, &ledger).await;
    assert_eq!((made.len(), read.len()), (4, 0));
    agree(&e, "its new day written").await;
}

/// The Cost dashboard's "GPU-hours and cost by limiter" over a long range (`new`: the jobs
/// last seen from the range's first midnight to the day before its end from `job_groups`, the
/// range's first day and the days since from `jobs`) and its form over `jobs` alone, for the
/// range `from..to`.
fn limiter_panels(from: &str, to: &str) -> (String, String) {
    let edge = "limiter, CASE WHEN job_host_count = 1 THEN 1 ELSE 0 END AS jobs, \
        CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END AS job_id, gpu_seconds, cost_usd, idle_cost_usd";
    let sums = "sum(gpu_seconds) / 3600 AS gpu_hours, sum(cost_usd) AS cost, sum(idle_cost_usd) AS idle_cost";
    let cut = format!("date_trunc('day', {to}) - INTERVAL '1 day'");
    let new = format!(
        "SELECT coalesce(limiter, '(no GPU time)') AS limiter, sum(jobs) + count(DISTINCT job_id) AS jobs, {sums} FROM (
  SELECT limiter, jobs, job_id, gpu_seconds, cost_usd, idle_cost_usd FROM job_groups
  WHERE day >= {from} AND day < {cut}
  UNION ALL
  SELECT {edge} FROM jobs WHERE last_seen >= {from} AND last_seen < date_trunc('day', {from}) + INTERVAL '1 day'
    AND date_trunc('day', last_seen) < {from} AND first_seen <= {to}
  UNION ALL
  SELECT {edge} FROM jobs WHERE last_seen >= {from} AND last_seen >= {cut}
    AND date_trunc('day', last_seen) >= {from} AND first_seen <= {to}
) j GROUP BY 1 ORDER BY 1"
    );
    let old = format!(
        "SELECT coalesce(limiter, '(no GPU time)') AS limiter,
  count(CASE WHEN job_host_count = 1 THEN 1 END) + count(DISTINCT CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END) AS jobs, {sums}
FROM jobs WHERE last_seen >= {from} AND first_seen <= {to} GROUP BY 1 ORDER BY 1"
    );
    (new, old)
}

/// The Cost dashboard's "GPU-hours by efficiency band" over a long range, cut as
/// [`limiter_panels`] is (the groups' tenths of activity), and over `jobs` alone with each
/// job's mean activity compared with the bands' bounds.
fn band_panels(from: &str, to: &str) -> (String, String) {
    let band = |t: &str| {
        format!(
            "sum(CASE WHEN {t} < 0.1 THEN gpu_seconds END) AS low, \
             sum(CASE WHEN {t} >= 0.1 AND {t} < 0.3 THEN gpu_seconds END) AS poor, \
             sum(CASE WHEN {t} >= 0.3 AND {t} < 0.6 THEN gpu_seconds END) AS fair, \
             sum(CASE WHEN {t} >= 0.6 THEN gpu_seconds END) AS good, \
             sum(CASE WHEN {t} IS NULL THEN gpu_seconds END) AS unread"
        )
    };
    let tenth = groups::activity_tenth_sql(MEAN_ACTIVITY);
    let cut = format!("date_trunc('day', {to}) - INTERVAL '1 day'");
    let new = format!(
        "SELECT {sums} FROM (
  SELECT activity_tenth AS tenth, gpu_seconds FROM job_groups WHERE day >= {from} AND day < {cut}
  UNION ALL
  SELECT {tenth}, gpu_seconds FROM jobs WHERE last_seen >= {from} AND last_seen < date_trunc('day', {from}) + INTERVAL '1 day'
    AND date_trunc('day', last_seen) < {from} AND first_seen <= {to}
  UNION ALL
  SELECT {tenth}, gpu_seconds FROM jobs WHERE last_seen >= {from} AND last_seen >= {cut}
    AND date_trunc('day', last_seen) >= {from} AND first_seen <= {to}
) j",
        sums = band("tenth"),
    );
    let old = format!(
        "SELECT {} FROM jobs WHERE last_seen >= {from} AND first_seen <= {to}",
        band(MEAN_ACTIVITY)
    );
    (new, old)
}

/// "Spend by account"'s jobs per account over the hours billed (from the hour holding `from`
/// to the end of the hour holding `to`), both ways, cut as [`limiter_panels`] is.
fn account_jobs(from: &str, to: &str) -> (String, String) {
    let (lo, hi) = (
        format!("date_trunc('hour', {from})"),
        format!("(date_trunc('hour', {to}) + INTERVAL '1 hour')"),
    );
    let edge = "coalesce(job_account, '(none)') AS account, CASE WHEN job_host_count = 1 THEN 1 ELSE 0 END AS jobs, \
        CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END AS job_id";
    let cut = format!("date_trunc('day', {to}) - INTERVAL '1 day'");
    let new = format!(
        "SELECT account, sum(jobs) + count(DISTINCT job_id) AS jobs FROM (
  SELECT coalesce(job_account, '(none)') AS account, jobs, job_id FROM job_groups
  WHERE day >= {lo} AND day < {cut}
  UNION ALL
  SELECT {edge} FROM jobs WHERE last_seen >= {lo} AND last_seen < date_trunc('day', {lo}) + INTERVAL '1 day'
    AND date_trunc('day', last_seen) < {lo} AND first_seen < {hi}
  UNION ALL
  SELECT {edge} FROM jobs WHERE last_seen >= {lo} AND last_seen >= {cut}
    AND date_trunc('day', last_seen) >= {lo} AND first_seen < {hi}
) j GROUP BY 1 ORDER BY 1"
    );
    let old = format!(
        "SELECT coalesce(job_account, '(none)') AS account,
  count(CASE WHEN job_host_count = 1 THEN 1 END) + count(DISTINCT CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END) AS jobs
FROM jobs WHERE last_seen >= {lo} AND first_seen < {hi} GROUP BY 1 ORDER BY 1"
    );
    (new, old)
}

/// The Cost dashboard's "Most idle cost" over the jobs last seen in `from..to` (`new`: the jobs
/// with rows of their own in `groups` for whole days, the edges from `jobs`), and its earlier
/// form over `jobs` alone.
fn most_idle_panels(from: &str, to: &str, groups: &str, jobs: &str) -> (String, String) {
    let cols =
        "job_id, job_user, job_name, gpus, idle_cost_usd, cost_usd, idle_gpu_seconds, gpu_seconds";
    let head = "SELECT job_id, max(job_user) AS job_user, max(job_name) AS name, sum(gpus) AS gpus, \
        sum(idle_cost_usd) AS idle_cost, sum(cost_usd) AS cost, \
        sum(idle_gpu_seconds) / nullif(sum(gpu_seconds), 0) AS idle_share";
    let tail = "GROUP BY job_id ORDER BY idle_cost DESC, job_id LIMIT 20";
    let seen = format!("last_seen BETWEEN {from} AND {to}");
    let new = format!(
        "{head} FROM (
  SELECT {cols} FROM {groups} WHERE job_id IS NOT NULL AND day >= {from} AND day <= {to} - INTERVAL '1 day'
  UNION ALL
  SELECT {cols} FROM {jobs} WHERE {seen} AND last_seen < date_trunc('day', {from}) + INTERVAL '1 day'
    AND date_trunc('day', last_seen) < {from}
  UNION ALL
  SELECT {cols} FROM {jobs} WHERE {seen} AND last_seen > {to} - INTERVAL '1 day'
    AND date_trunc('day', last_seen) >= {from} AND date_trunc('day', last_seen) > {to} - INTERVAL '1 day'
) j {tail}"
    );
    let old = format!("{head} FROM (SELECT j.* FROM {jobs} j WHERE {seen}) j {tail}");
    (new, old)
}

/// 300 jobs over three days and two users, with ties in idle cost, every tenth on two hosts,
/// as `jobs` rows.
const MANY_JOBS: &str = "SELECT 'j' || lpad(CAST(i AS VARCHAR), 3, '0') AS job_id, h AS host,
    to_timestamp_nanos(1800057600000000000 + (i % 3) * 86400000000000 + (i % 23) * 3600000000000) AS last_seen,
    to_timestamp_nanos(1800057600000000000 + (i % 3) * 86400000000000 - 7200000000000) AS first_seen,
    'u' || CAST(i % 2 AS VARCHAR) AS job_user, 'acct' AS job_account, 'H100' AS gpu_model,
    'compute' AS limiter, CASE WHEN i % 10 = 0 THEN 2 ELSE 1 END AS job_host_count,
    'n' || CAST(i AS VARCHAR) AS job_name, 1 AS gpus, CAST(i * 100 AS DOUBLE) AS gpu_seconds,
    CAST(i * 10 AS DOUBLE) AS idle_gpu_seconds, 1.0 AS energy_joules,
    CAST((i * 7) % 23 AS DOUBLE) + 10.0 AS cost_usd, CAST((i * 7) % 23 AS DOUBLE) AS idle_cost_usd,
    CASE WHEN i % 17 = 0 THEN NULL ELSE CAST(i % 11 AS DOUBLE) / 10.0 END AS mean_activity
  FROM unnest(range(1, 301)) AS t(i) CROSS JOIN unnest(['h1', 'h2']) AS u(h)
  WHERE h = 'h1' OR i % 10 = 0";

/// The rows of `sql` in `ctx`, as JSON objects.
async fn rows_of(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Rows {
    let batches = ctx.sql(sql).await.expect("plan").collect().await;
    let batches = batches.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut w = arrow::json::ArrayWriter::new(Vec::new());
    for b in &batches {
        w.write(b).expect("json");
    }
    w.finish().expect("json");
    let out = w.into_inner();
    if out.is_empty() {
        return Vec::new();
    }
    serde_json::from_slice(&out).expect("rows")
}

#[tokio::test]
async fn the_jobs_with_the_most_idle_cost_of_a_range_are_among_their_days_own_rows() {
    let ctx = datafusion::prelude::SessionContext::new();
    rows_of(&ctx, &format!("CREATE TABLE j AS {MANY_JOBS}")).await;
    let groups = groups::group_select("SELECT * FROM j");
    rows_of(&ctx, &format!("CREATE TABLE g AS {groups}")).await;
    let one = |sql: &'static str| {
        let ctx = ctx.clone();
        async move { rows_of(&ctx, sql).await[0]["n"].as_i64() }
    };
    // 50 jobs on one host per day and user: 20 with rows of their own; those on two hosts too.
    let own = "SELECT count(DISTINCT job_id) AS n FROM g WHERE job_id IN \
        (SELECT job_id FROM j WHERE job_host_count = 1)";
    assert_eq!(one(own).await, Some(3 * 2 * 20));
    let two = "SELECT count(DISTINCT job_id) AS n FROM g WHERE job_id IN \
        (SELECT job_id FROM j WHERE job_host_count = 2)";
    assert_eq!(one(two).await, Some(30));
    let all = "SELECT sum(jobs) + count(DISTINCT job_id) AS n FROM g";
    assert_eq!(one(all).await, Some(300));
    let at = |t: i64| format!("to_timestamp_nanos({t})");
    const H: i64 = HOUR;
    for (from, to) in [
        (D0, D0 + 3 * DAY),
        (D0 + 5 * H + 1, D0 + 2 * DAY + 7 * H),
        (D0 + DAY, D0 + 2 * DAY),
        (D0 + DAY + 3 * H, D0 + DAY + 4 * H),
    ] {
        let (new, old) = most_idle_panels(&at(from), &at(to), "g", "j");
        let want = rows_of(&ctx, &old).await;
        assert!(!want.is_empty(), "{from}..{to}");
        same(
            &rows_of(&ctx, &new).await,
            &want,
            &format!("most idle {from}..{to}"),
        );
        // One user's.
        let user = |sql: &str| sql.replace(" WHERE ", " WHERE job_user = 'u1' AND ");
        let want = rows_of(&ctx, &user(&old)).await;
        same(
            &rows_of(&ctx, &user(&new)).await,
            &want,
            &format!("one user {from}..{to}"),
        );
    }
}

#[tokio::test]
async fn the_cost_panels_answer_from_the_groups_as_from_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());
    write_hours(&store, 80..130);
    let (e, ledger) = server(&store, &cost, true, now).await;
    assert!(groups::made_days(&ledger).len() >= 3);
    const H: i64 = HOUR;
    let at = |t: i64| format!("to_timestamp_nanos({t})");
    // Ranges inside a day, across midnights, on midnights, and wider than the history.
    for (from, to) in [
        (D0 + 25 * H + 10, D0 + 26 * H),
        (D0 + H + 7, D0 + 80 * H + 30),
        (D0, D0 + 2 * DAY),
        (D0 + 30 * H + 1_800_000_000_000, D0 + 60 * H),
        (D0 + DAY - 1, D0 + 3 * DAY + 1),
        (D0 - 5 * DAY, D0 + 10 * DAY),
    ] {
        let (from, to) = (at(from), at(to));
        for (what, (new, old)) in [
            ("limiter", limiter_panels(&from, &to)),
            ("accounts", account_jobs(&from, &to)),
            ("efficiency bands", band_panels(&from, &to)),
            (
                "most idle",
                most_idle_panels(&from, &to, groups::NAME, "jobs"),
            ),
        ] {
            let want = rows(&e, &old).await;
            if what == "efficiency bands" && to.contains(&(D0 + 10 * DAY).to_string()) {
                let bands = want[0].values().filter(|v| v.as_f64().is_some()).count();
                assert!(bands >= 2, "the jobs fall in several bands: {want:?}");
            }
            same(
                &rows(&e, &new).await,
                &want,
                &format!("{what} {from}..{to}"),
            );
        }
    }
}
