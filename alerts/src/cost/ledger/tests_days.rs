//! The ledger's daily sums ([`days`]) against its hours: `jobs` and `job_days` answer the
//! same before and after days are rolled, `job_days` equals `job_hours` summed per day, and a
//! day whose hours change is read by the hour until it is rolled again.

use gpuwatch_query::QueryEngine;
use gpuwatch_store::Store;
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::schema::Table;

use super::table::{UsageRow, hour_rows};
use super::view;
use super::*;
use crate::cost::tests::json_rows as rows;

const S: i64 = 1_000_000_000;
/// A day boundary (2027-01-16T00:00:00Z).
const D0: i64 = 1_800_057_600 * S;

/// One job's use of one GPU in the hour from `start` (the `h`th of a test's history): `secs`
/// GPU-seconds, a seventh of them idle, at 350.5 W.
pub(super) fn usage_row(
    (start, h): (i64, i64),
    (job, host, gpu, model): (&str, &str, &str, &str),
    secs: f64,
) -> UsageRow {
    UsageRow {
        job_id: job.into(),
        host: host.into(),
        gpu_uuid: gpu.into(),
        gpu_model: Some(model.into()),
        scheduler: Some("slurm".into()),
        job_user: Some(format!("user-{}", job.len())),
        job_name: Some(format!("name-{job}")),
        labels: vec![("job_account".into(), format!("acct-{host}"))],
        first_seen: start + 30 * S,
        last_seen: start + HOUR - 30 * S,
        gpu_seconds: secs,
        idle_gpu_seconds: secs / 7.0,
        energy_joules: secs * 350.5,
        idle_energy_joules: secs * 20.25,
        limiter: Some(LIMITERS[(h % 3) as usize].into()),
        samples: 60,
        interval_seconds: 60.0,
        parts: activity_parts(h, job, model),
    }
}

/// The parts of a usage row's mean activity: utilisation that changes with the hour and the
/// job, and SM activity on the H100s only (the others have no GPM counters).
fn activity_parts(h: i64, job: &str, model: &str) -> Vec<(String, f64)> {
    let util = ((h + job.len() as i64) % 11) as f64 / 10.0;
    let mut parts = vec![
        ("utilization_sum".to_string(), util * 60.0),
        ("utilization_n".to_string(), 60.0),
    ];
    if model.contains("H100") {
        parts.push(("sm_active_sum".to_string(), util * 0.7 * 60.0));
        parts.push(("sm_active_n".to_string(), 60.0));
    }
    parts
}

/// Hour `h` (from six hours before `D0`) of three kinds of job: one on two GPUs through all
/// 60 hours, one crossing the first day's end, and one an hour long each hour; `scale`
/// changes the hour's sums (a refold).
fn hour(h: i64, scale: f64) -> RecordBatch {
    let start = D0 - 6 * HOUR + h * HOUR;
    let usage = |job: &str, host: &str, gpu: &str, model: &str, secs: f64| {
        usage_row((start, h), (job, host, gpu, model), secs * scale)
    };
    let mut rows = vec![
        usage("long", "a", "g0", "NVIDIA H100 80GB HBM3", 3_590.0),
        usage(
            "long",
            "a",
            "g1",
            "NVIDIA H100 80GB HBM3",
            3_580.0 + h as f64,
        ),
        usage(&format!("short-{h}"), "c", "g3", "NVIDIA A100", 1_800.0),
    ];
    if (10..40).contains(&h) {
        rows.push(usage(
            "cross",
            "b",
            "g2",
            "NVIDIA A100",
            3_000.0 + 3.0 * h as f64,
        ));
    }
    let samples = rows.len() as u64 * 60 + (scale != 1.0) as u64;
    hour_rows(start, &rows, &[], samples).expect("hour rows")
}

/// A server's engine and ledger on `store`, after one pass (`fold`: the server that writes).
async fn server(
    store: &Arc<Store>,
    cost: &CostConfig,
    fold: bool,
) -> (QueryEngine, Arc<JobLedger>) {
    let (e, ledger, _) = super::tests::server_on(store, cost, fold, D0 + 3 * days::DAY).await;
    (e, ledger)
}

pub(super) type Rows = Vec<serde_json::Map<String, serde_json::Value>>;

/// Equal rows, numbers to a relative 1e-9 (sums in another order).
pub(super) fn same(got: &Rows, want: &Rows, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{what}: columns");
        for (k, a) in w {
            let b = &g[k];
            match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                    "{what}: {k}: {y} where {x} was wanted in {w:?}"
                ),
                _ => assert_eq!(b, a, "{what}: {k} in {w:?}"),
            }
        }
    }
}

/// The answers compared: every job, the jobs seen since the second day's noon, `job_days`,
/// and `job_hours` summed per day (which never reads the daily sums).
async fn answers(e: &QueryEngine) -> [Rows; 5] {
    let sums = "sum(gpu_seconds) AS gpu_seconds, sum(idle_gpu_seconds) AS idle_gpu_seconds, \
        sum(energy_joules) AS energy_joules, sum(cost_usd) AS cost_usd, sum(idle_cost_usd) AS idle_cost_usd, \
        min(first_seen) AS first_seen, max(last_seen) AS last_seen, max(gpus) AS gpus, max(job_account) AS job_account";
    let key = "job_id, host, gpu_model";
    [
        rows(e, "SELECT * FROM jobs ORDER BY job_id, host").await,
        rows(
            e,
            &format!(
                "SELECT * FROM jobs WHERE last_seen >= to_timestamp_nanos({}) ORDER BY job_id, host",
                D0 + days::DAY + 12 * HOUR
            ),
        )
        .await,
        rows(
            e,
            &format!("SELECT day, {key}, {sums} FROM job_days GROUP BY day, {key} ORDER BY day, {key}"),
        )
        .await,
        rows(
            e,
            &format!(
                "SELECT date_trunc('day', hour) AS day, {key}, {sums} FROM job_hours \
                 GROUP BY 1, {key} ORDER BY day, {key}"
            ),
        )
        .await,
        rows(
            e,
            "SELECT * FROM jobs WHERE job_id IN ('short-40', 'cross', 'short-8') ORDER BY job_id, host",
        )
        .await,
    ]
}

/// `spend_days` answers as `job_days` grouped by day, account, user and model, over every day
/// and over one.
async fn spend_agrees(e: &QueryEngine, what: &str) {
    let key = "day, job_account, job_user, gpu_model";
    let sums = "sum(gpu_seconds) AS gpu_seconds, sum(idle_gpu_seconds) AS idle_gpu_seconds, \
        sum(energy_joules) AS energy_joules, sum(cost_usd) AS cost_usd, sum(idle_cost_usd) AS idle_cost_usd, \
        min(first_seen) AS first_seen, max(last_seen) AS last_seen";
    let one_day = format!(
        "day >= to_timestamp_nanos({}) AND day < to_timestamp_nanos({})",
        D0 + days::DAY,
        D0 + 2 * days::DAY
    );
    for filter in ["true".to_string(), one_day] {
        let ask = |from: &str, jobs: &str| {
            format!(
                "SELECT {key}, {jobs} AS jobs, {sums} FROM {from} WHERE {filter} GROUP BY {key} ORDER BY {key}"
            )
        };
        let got = rows(e, &ask("spend_days", "sum(jobs)")).await;
        let want = rows(e, &ask("job_days", "count(DISTINCT job_id)")).await;
        assert!(want.len() >= 3, "{what}: {want:?}");
        same(&got, &want, &format!("{what}: spend_days where {filter}"));
    }
}

/// Day `day`'s spend no longer matches its hours (a marker of other samples, as a day an
/// earlier release rolled has none).
fn stale_spend(store: &Arc<Store>, day: i64) {
    let schema = Table::JobLedgerSpend.schema();
    let marker = RecordBatch::try_from_iter([(
        "samples",
        Arc::new(arrow::array::Int64Array::from(vec![-1_i64])) as arrow::array::ArrayRef,
    )])
    .expect("marker");
    let batch = days::conformed(&schema, day, &marker).expect("conform");
    store
        .replace_days(Table::JobLedgerSpend, &[(day.div_euclid(days::DAY), batch)])
        .expect("replace");
}

/// Once the folding server rolled the days, `spend_days` reads them from their spend; a day
/// without it (rolled by an earlier release) is read by the hour until that server rolls it
/// again.
async fn the_daily_spend_answers_as_job_days(
    e: &QueryEngine,
    ledger: &JobLedger,
    store: &Arc<Store>,
    cost: &CostConfig,
) {
    assert_eq!(
        ledger.snapshot().grouped_days,
        vec![(D0, D0 + 2 * days::DAY)]
    );
    spend_agrees(e, "from the daily spend").await;
    stale_spend(store, D0);
    let (e, ledger) = server(store, cost, false).await;
    assert_eq!(ledger.snapshot().days, vec![(D0, D0 + 2 * days::DAY)]);
    assert_eq!(
        ledger.snapshot().grouped_days,
        vec![(D0 + days::DAY, D0 + 2 * days::DAY)]
    );
    spend_agrees(&e, "a day without its spend").await;
    let (e, ledger) = server(store, cost, true).await;
    assert_eq!(
        ledger.snapshot().grouped_days,
        vec![(D0, D0 + 2 * days::DAY)]
    );
    spend_agrees(&e, "rolled again").await;
}

async fn day_rows(e: &QueryEngine) -> i64 {
    rows(e, &format!("SELECT count(*) AS n FROM {}", days::NAME)).await[0]["n"]
        .as_i64()
        .unwrap_or(-1)
}

#[tokio::test]
async fn daily_sums_answer_as_the_hours_do_and_stale_days_are_read_by_the_hour() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(D0 + 3 * days::DAY));
    table::declare().expect("declare");
    let store = super::tests::open_store(dir.path(), &clock);
    let hours: Vec<(i64, RecordBatch)> = (0..60)
        .map(|h| ((D0 - 6 * HOUR) / HOUR + h, hour(h, 1.0)))
        .collect();
    store
        .replace_hours(Table::JobLedger, &hours)
        .expect("ledger hours");
    let cost: CostConfig =
        toml::from_str("gpu_hour_usd = [{model = \"*H100*\", usd = 3.0}]\nkwh_usd = 0.2\n")
            .expect("cost");

    // A query node reads the hours: no day is rolled yet.
    let (e, ledger) = server(&store, &cost, false).await;
    assert!(ledger.snapshot().days.is_empty());
    let want = answers(&e).await;
    assert_eq!(want[0].len(), 62, "two jobs over days, sixty of an hour");
    spend_agrees(&e, "by the hour").await;
    same(
        &want[2],
        &want[3],
        "job_days against job_hours, by the hour",
    );

    // The server that folds rolls the two whole days (not the partial first and last).
    let (e, ledger) = server(&store, &cost, true).await;
    assert_eq!(ledger.snapshot().days, vec![(D0, D0 + 2 * days::DAY)]);
    assert!(day_rows(&e).await > 0);
    let got = answers(&e).await;
    let names = [
        "jobs",
        "jobs since",
        "job_days",
        "job_hours by day",
        "three jobs",
    ];
    for (i, what) in names.iter().enumerate() {
        same(&got[i], &want[i], &format!("{what}, from the daily sums"));
    }
    the_daily_spend_answers_as_job_days(&e, &ledger, &store, &cost).await;

    // An hour of the first whole day changes (a refold): every server reads that day by the
    // hour until the folding server rolls it again.
    store
        .replace_hour(Table::JobLedger, (D0 + 5 * HOUR) / HOUR, &hour(11, 0.5))
        .expect("refold");
    let (e, ledger) = server(&store, &cost, false).await;
    assert_eq!(
        ledger.snapshot().days,
        vec![(D0 + days::DAY, D0 + 2 * days::DAY)],
        "the changed day is not read from its old sums"
    );
    let changed = answers(&e).await;
    assert_eq!(
        ledger.snapshot().grouped_days,
        vec![(D0 + days::DAY, D0 + 2 * days::DAY)],
        "the changed day's spend is not read"
    );
    spend_agrees(&e, "a day stale").await;
    same(
        &changed[2],
        &changed[3],
        "job_days against job_hours, a day stale",
    );
    assert!(changed[0] != want[0], "the refold changed the jobs");
    let (e, ledger) = server(&store, &cost, true).await;
    assert_eq!(ledger.snapshot().days, vec![(D0, D0 + 2 * days::DAY)]);
    let again = answers(&e).await;
    for i in 0..names.len() {
        same(
            &again[i],
            &changed[i],
            &format!("{}, rolled again", names[i]),
        );
    }
}

#[test]
fn a_bounded_read_takes_only_the_days_it_overlaps_from_the_daily_sums() {
    let w = D0 + 3 * days::DAY;
    let runs = [(D0 - days::DAY, D0 + 2 * days::DAY)];
    let read = |hours| view::LedgerRead {
        hours,
        ..Default::default()
    };
    let (hours, on_days) = read(Some((D0 + 30 * HOUR, D0 + 35 * HOUR))).condition(Some(w), &runs);
    let on_days = on_days.expect("a day is read from the sums");
    let day = |d: i64| format!("to_timestamp_nanos({})", D0 + d * days::DAY);
    assert!(
        on_days.contains(&format!("time >= {}", day(1))),
        "{on_days}"
    );
    assert!(on_days.contains(&format!("time < {}", day(2))), "{on_days}");
    assert_eq!(
        hours, "false",
        "the hours are all in the day read from the sums"
    );
    let (hours, on_days) = read(Some((D0 + 40 * HOUR, D0 + 60 * HOUR))).condition(Some(w), &runs);
    assert!(on_days.is_some_and(|d| d.contains(&day(1))));
    let at = |h: i64| format!("to_timestamp_nanos({})", D0 + h * HOUR);
    assert_eq!(
        hours,
        format!("time >= {} AND time < {}", at(48), at(60)),
        "the hours after the day, as a range"
    );
    let (_, none) = read(Some((D0 + 50 * HOUR, D0 + 60 * HOUR))).condition(Some(w), &runs);
    assert_eq!(none, None, "hours after the rolled days");
    let all = view::LedgerRead {
        jobs: Some(Vec::new()),
        ..Default::default()
    };
    assert_eq!(
        all.condition(Some(w), &runs),
        ("false".into(), None),
        "no job"
    );
}
