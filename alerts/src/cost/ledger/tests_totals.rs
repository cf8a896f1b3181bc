//! The ledger's per-job totals ([`totals`]) against its hours: `jobs` answers the same with
//! them, reads them (not the hours) for finished jobs, keeps one row per job when a job comes
//! back after days away, and keeps a job's cost once retention removed its first hours.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::{Clock, ManualClock};
use gpuwatch_store::schema::Table;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use super::table::hour_rows;
use super::tests_days::{Rows, same, usage_row};
use super::*;
use crate::cost::MEAN_ACTIVITY;
use crate::cost::tests::json_rows as rows;

const S: i64 = 1_000_000_000;
/// A day boundary (2027-01-16T00:00:00Z).
pub(super) const D0: i64 = 1_800_057_600 * S;
pub(super) const DAY: i64 = days::DAY;

/// The jobs' usage rows in hour `h` from `D0`: `long` on two GPUs for 60 hours, `done` on the
/// first day, `back` on the first day and again on the fourth, `multi` on two GPU models of
/// one host on the second day, `wide` on two hosts on the second day.
fn hour(h: i64) -> RecordBatch {
    let start = D0 + h * HOUR;
    let usage = |job: &str, host: &str, gpu: &str, model: &str, secs: f64| {
        usage_row((start, h), (job, host, gpu, model), secs)
    };
    let (h100, a100) = ("NVIDIA H100 80GB HBM3", "NVIDIA A100");
    let mut rows = Vec::new();
    if h < 60 {
        rows.push(usage("long", "a", "g0", h100, 3_590.0));
        rows.push(usage("long", "a", "g1", h100, 3_000.0 + h as f64));
    }
    if (2..6).contains(&h) {
        rows.push(usage("done", "c", "g3", a100, 1_800.0));
    }
    if (3..8).contains(&h) || (84..88).contains(&h) {
        rows.push(usage("back", "b", "g2", a100, 2_400.0 + h as f64));
    }
    if (26..30).contains(&h) {
        rows.push(usage("multi", "m", "gm0", h100, 3_600.0));
        rows.push(usage("multi", "m", "gm1", a100, 3_500.0));
    }
    if (30..33).contains(&h) {
        rows.push(usage("wide", "w1", "gw1", h100, 3_600.0));
        rows.push(usage("wide", "w2", "gw2", h100, 1_200.0));
    }
    let samples = rows.len() as u64 * 60 + 1;
    hour_rows(start, &rows, &[], samples).expect("hour rows")
}

pub(super) fn write_hours(store: &Store, hours: std::ops::Range<i64>) {
    let batches: Vec<(i64, RecordBatch)> = hours.map(|h| (D0 / HOUR + h, hour(h))).collect();
    store
        .replace_hours(Table::JobLedger, &batches)
        .expect("ledger hours");
}

fn open(
    dir: &std::path::Path,
    clock: &Arc<ManualClock>,
    keep_ledger: Option<Duration>,
) -> Arc<Store> {
    let mut config = StoreConfig {
        wal_sync: false,
        ..StoreConfig::new(dir.to_path_buf())
    };
    config.retention.job_ledger = keep_ledger;
    Arc::new(Store::open(config, clock.clone()).expect("store"))
}

async fn jobs(e: &QueryEngine) -> Rows {
    rows(e, "SELECT * FROM jobs ORDER BY job_id, host").await
}

/// Each job's sums per host from `job_hours`, which reads the hours alone.
async fn by_hours(e: &QueryEngine) -> Rows {
    rows(
        e,
        "SELECT job_id, host, sum(gpu_seconds) AS gpu_seconds, sum(cost_usd) AS cost_usd, \
         sum(idle_cost_usd) AS idle_cost_usd, sum(energy_joules) AS energy_joules, \
         min(first_seen) AS first_seen, max(last_seen) AS last_seen \
         FROM job_hours GROUP BY job_id, host ORDER BY job_id, host",
    )
    .await
}

/// The same columns of `jobs`.
async fn by_jobs(e: &QueryEngine) -> Rows {
    rows(
        e,
        "SELECT job_id, host, gpu_seconds, cost_usd, idle_cost_usd, energy_joules, first_seen, last_seen \
         FROM jobs ORDER BY job_id, host",
    )
    .await
}

pub(super) async fn server(
    store: &Arc<Store>,
    cost: &CostConfig,
    fold: bool,
    now: i64,
) -> (QueryEngine, Arc<JobLedger>) {
    let (e, ledger, _) = super::tests::server_on(store, cost, fold, now).await;
    (e, ledger)
}

/// The totals' rows: job, host, model, GPUs, models on the host, the job's hosts, file day.
async fn totals_rows(e: &QueryEngine) -> Vec<String> {
    rows(
        e,
        &format!(
            "SELECT job_id, host, gpu_model, gpus, host_models, job_host_count, CAST(time AS BIGINT) AS t FROM {} \
             WHERE job_id IS NOT NULL ORDER BY job_id, host, gpu_model",
            totals::NAME
        ),
    )
    .await
    .iter()
    .map(|r| {
        let day = (r["t"].as_i64().unwrap_or(0) - D0) / DAY;
        format!(
            "{} {} {} {} {} {} day {day}",
            r["job_id"].as_str().unwrap_or("?"),
            r["host"].as_str().unwrap_or("?"),
            r["gpu_model"].as_str().unwrap_or("?"),
            r["gpus"],
            r["host_models"],
            r["job_host_count"]
        )
    })
    .collect()
}

/// Each job asked for alone (the totals then read only the file of its last day) has the rows
/// it has among all.
async fn each_job_alone(e: &QueryEngine, want: &Rows) {
    let mut ids: Vec<&str> = want.iter().filter_map(|r| r["job_id"].as_str()).collect();
    ids.dedup();
    for id in ids {
        let alone = rows(
            e,
            &format!("SELECT * FROM jobs WHERE job_id = '{id}' ORDER BY job_id, host"),
        )
        .await;
        let among: Rows = want.iter().filter(|r| r["job_id"] == id).cloned().collect();
        same(&alone, &among, &format!("job {id} alone"));
    }
}

/// A store with the ledger's first 80 hours, its clock, and prices.
pub(super) fn setup(dir: &std::path::Path) -> (Arc<Store>, CostConfig, i64) {
    let clock = Arc::new(ManualClock::new(D0 + 10 * DAY));
    table::declare().expect("declare");
    let store = open(dir, &clock, None);
    write_hours(&store, 0..80);
    let cost: CostConfig =
        toml::from_str("gpu_hour_usd = [{model = \"*H100*\", usd = 3.0}]\nkwh_usd = 0.2\n")
            .expect("cost");
    (store, cost, clock.now_nanos())
}

/// The Cost dashboard's "Budgets and spend": each user's spend and most expensive job,
/// grouping only the jobs on several hosts, as grouping every job gives them (`wide`, on two
/// hosts, costs more than any of its rows and than `done`).
async fn budgets_plan(e: &QueryEngine) {
    let of = "FROM jobs WHERE job_id IN ('wide', 'done')";
    let grouped = format!(
        "SELECT job_user, sum(cost) AS spend, max(cost) AS top FROM \
         (SELECT job_user, job_id, sum(cost_usd) AS cost {of} GROUP BY job_user, job_id) c \
         GROUP BY job_user"
    );
    let panel = |top: &str| {
        format!(
            "SELECT job_user, sum(cost) AS spend, max({top}) AS top FROM \
             (SELECT job_user, multi, sum(cost_usd) AS cost, max(cost_usd) AS top_row FROM \
              (SELECT *, CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END AS multi {of}) j \
              GROUP BY job_user, multi) c GROUP BY job_user"
        )
    };
    let want_budgets = rows(e, &grouped).await;
    let top = "CASE WHEN multi IS NULL THEN top_row ELSE cost END";
    same(&rows(e, &panel(top)).await, &want_budgets, "budgets");
    assert_ne!(
        rows(e, &panel("top_row")).await,
        want_budgets,
        "the largest row is not the most expensive job"
    );
}

/// Aggregates over `jobs` as the Cost dashboard's panels run them (`want`: the view's rows).
async fn aggregates_plan(e: &QueryEngine, want: &Rows) {
    // The Cost dashboard's "Most idle cost": the GPUs of each job, through an aggregate.
    let gpus = rows(
        e,
        "SELECT job_id, sum(gpus) AS gpus FROM (SELECT j.* FROM jobs j) j GROUP BY job_id ORDER BY job_id",
    )
    .await;
    let gpus: Vec<String> = gpus
        .iter()
        .map(|r| format!("{} {}", r["job_id"], r["gpus"]))
        .collect();
    assert_eq!(
        gpus,
        [
            "\"back\" 1",
            "\"done\" 1",
            "\"long\" 2",
            "\"multi\" 2",
            "\"wide\" 2"
        ]
    );
    // The Cost dashboard's "by limiter": the jobs of each row's limiter, through an aggregate,
    // as the view without totals gave it; counted distinct, and as the panel counts them (a job
    // on one host is one row).
    let mut jobs_of: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for r in want {
        jobs_of
            .entry(r["limiter"].as_str().unwrap_or("?").to_string())
            .or_default()
            .insert(r["job_id"].to_string());
    }
    let counts: BTreeMap<String, i64> = jobs_of
        .into_iter()
        .map(|(l, j)| (l, j.len() as i64))
        .collect();
    for n in [
        "count(DISTINCT job_id)",
        "count(CASE WHEN job_host_count = 1 THEN 1 END) \
         + count(DISTINCT CASE WHEN job_host_count = 1 THEN NULL ELSE job_id END)",
    ] {
        let sql = format!("SELECT limiter, {n} AS n FROM jobs GROUP BY limiter ORDER BY limiter");
        let got: BTreeMap<String, i64> = rows(e, &sql)
            .await
            .iter()
            .map(|r| {
                (
                    r["limiter"].as_str().unwrap_or("?").to_string(),
                    r["n"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        assert_eq!(got, counts, "{n}");
    }
    budgets_plan(e).await;
    // Every column of the view through an aggregate (the totals' rows and the summed rows must
    // agree on each column's type and nullability for that to plan).
    for c in want[0].keys() {
        let sql = format!("SELECT {c} AS v, count(*) AS n FROM jobs GROUP BY 1");
        assert!(!rows(e, &sql).await.is_empty(), "{sql}");
    }
}

#[tokio::test]
async fn finished_jobs_are_read_from_their_totals_and_answer_as_their_hours_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());

    // Before any totals: the hours (and days) alone.
    let (e, _) = server(&store, &cost, false, now).await;
    let want = jobs(&e).await;
    assert_eq!(want.len(), 6, "{want:?}");
    let hosts: Vec<String> = want
        .iter()
        .map(|r| format!("{} {} {}", r["job_id"], r["host"], r["job_host_count"]))
        .collect();
    assert_eq!(
        hosts,
        [
            "\"back\" \"b\" 1",
            "\"done\" \"c\" 1",
            "\"long\" \"a\" 1",
            "\"multi\" \"m\" 1",
            "\"wide\" \"w1\" 2",
            "\"wide\" \"w2\" 2"
        ],
        "each job's hosts, summed from the hours"
    );

    // The folding server writes the first two days' totals (the third is not followed by a
    // folded day): the jobs last seen there, one row per host and model.
    let (e, ledger) = server(&store, &cost, true, now).await;
    let t = ledger.snapshot().totals.clone().expect("totals read");
    assert_eq!(t.end, D0 + 2 * DAY);
    assert_eq!(super::strings(&t.recent, 0).expect("ids").value(0), "long");
    assert!(t.overlap.is_empty());
    assert_eq!(
        totals_rows(&e).await,
        [
            "back b NVIDIA A100 1 1 1 day 0",
            "done c NVIDIA A100 1 1 1 day 0",
            "multi m NVIDIA A100 1 2 1 day 1",
            "multi m NVIDIA H100 80GB HBM3 1 2 1 day 1",
            "wide w1 NVIDIA H100 80GB HBM3 1 1 2 day 1",
            "wide w2 NVIDIA H100 80GB HBM3 1 1 2 day 1",
        ]
    );
    same(&jobs(&e).await, &want, "jobs from the totals");
    each_job_alone(&e, &want).await;
    let multi: Vec<_> = want.iter().filter(|r| r["job_id"] == "multi").collect();
    assert_eq!(multi[0]["gpus"], 2, "both models' GPUs: {multi:?}");
    aggregates_plan(&e, &want).await;

    // Finished jobs are read from the totals, not the hours: hours changed without changing
    // their samples (which no refold does) show in job_hours but not in jobs.
    let forged = hour(3).slice(0, hour(3).num_rows());
    let mut changed = forged.clone();
    let col = changed.schema().index_of("gpu_seconds").expect("column");
    let mut columns = changed.columns().to_vec();
    columns[col] = Arc::new(arrow::array::Float64Array::from(vec![
        Some(1.0);
        changed.num_rows()
    ]));
    changed = RecordBatch::try_new(changed.schema(), columns).expect("batch");
    store
        .replace_hour(Table::JobLedger, D0 / HOUR + 3, &changed)
        .expect("forge");
    let (e, _) = server(&store, &cost, false, now).await;
    same(&jobs(&e).await, &want, "jobs read from the totals");
    assert!(
        by_hours(&e).await != by_jobs(&e).await,
        "job_hours reads the forged hour"
    );
    store
        .replace_hour(Table::JobLedger, D0 / HOUR + 3, &forged)
        .expect("restore");
}

#[tokio::test]
async fn a_job_seen_again_days_later_keeps_one_row_with_all_its_hours() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());
    let _ = server(&store, &cost, true, now).await;

    // `back` comes back on the fourth day: once that day's totals are written it has one
    // row, there, with all its hours.
    write_hours(&store, 80..130);
    let (e, ledger) = server(&store, &cost, false, now).await;
    let overlap = ledger.snapshot().totals.as_ref().map(|t| t.overlap.clone());
    assert_eq!(
        overlap,
        Some(vec!["back".to_string()]),
        "back is in day 0's totals and seen again"
    );
    let want = by_hours(&e).await;
    same(
        &by_jobs(&e).await,
        &want,
        "jobs with a job back, before its totals",
    );
    each_job_alone(&e, &jobs(&e).await).await;
    let (e, ledger) = server(&store, &cost, true, now).await;
    assert_eq!(
        ledger.snapshot().totals.as_ref().map(|t| t.end),
        Some(D0 + 4 * DAY)
    );
    let rows_now = totals_rows(&e).await;
    assert_eq!(
        rows_now
            .iter()
            .filter(|r| r.starts_with("back"))
            .collect::<Vec<_>>(),
        ["back b NVIDIA A100 1 1 1 day 3"]
    );
    each_job_alone(&e, &jobs(&e).await).await;
    assert!(rows_now.contains(&"long a NVIDIA H100 80GB HBM3 2 1 1 day 2".to_string()));
    same(
        &by_jobs(&e).await,
        &want,
        "jobs from the totals, a job back",
    );
    same(&by_hours(&e).await, &want, "job_hours unchanged");
}

#[tokio::test]
async fn a_jobs_cost_outlives_its_first_hours_in_the_ledger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(D0 + 6 * DAY));
    table::declare().expect("declare");
    let store = open(dir.path(), &clock, Some(Duration::from_secs(4 * 24 * 3600)));
    write_hours(&store, 0..130);
    let cost = CostConfig::default();
    let (e, _) = server(&store, &cost, true, clock.now_nanos()).await;
    let before = by_jobs(&e).await;
    let back: Vec<_> = before
        .iter()
        .filter(|r| r["job_id"] == "back")
        .cloned()
        .collect();
    assert_eq!(back.len(), 1);

    // Four days of ledger retention, half a day later: the ledger's first two days and a half
    // are gone (with the totals of the jobs last seen in them); `back`, last seen on the
    // fourth day, lost its first hours.
    clock.advance(12 * HOUR);
    store.maintain().expect("maintain");
    store.maintain().expect("maintain");
    let read: Arc<dyn ReadStore> = store.clone();
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let left = rows(&e, "SELECT min(time) AS t FROM job_ledger").await;
    assert!(
        left[0]["t"].as_str().is_some_and(|t| t >= "2027-01-18"),
        "retention left {left:?}"
    );
    let (e, _) = server(&store, &cost, true, clock.now_nanos()).await;
    let after = by_jobs(&e).await;
    same(
        &after
            .iter()
            .filter(|r| r["job_id"] == "back")
            .cloned()
            .collect(),
        &back,
        "back's cost, its first hours gone",
    );
    let hours_left = by_hours(&e).await;
    let partial = hours_left
        .iter()
        .find(|r| r["job_id"] == "back")
        .expect("back's hours");
    assert!(
        partial["gpu_seconds"].as_f64() < back[0]["gpu_seconds"].as_f64(),
        "retention removed some of back's hours: {partial:?}"
    );
}

/// Replaces `table`'s file of day `day` with `columns` (a select list) of its rows, as an
/// earlier release would have written it.
async fn as_earlier(e: &QueryEngine, store: &Store, table: Table, day: i64, columns: &str) {
    let sql = format!(
        "SELECT {columns} FROM {} WHERE time >= to_timestamp_nanos({day}) AND time < to_timestamp_nanos({})",
        table.name(),
        day + DAY,
    );
    let batches = e.context().sql(&sql).await.expect("plan");
    let batches = batches.collect().await.expect("rows");
    let schema = table.schema();
    let parts: Vec<RecordBatch> = batches
        .iter()
        .map(|b| days::conformed(&schema, day, b).expect("conformed"))
        .collect();
    let earlier = arrow::compute::concat_batches(&schema, &parts).expect("concat");
    store
        .replace_days(table, &[(day / DAY, earlier)])
        .expect("earlier file");
}

#[tokio::test]
async fn totals_of_an_earlier_release_gain_their_jobs_host_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());
    let (e, _) = server(&store, &cost, true, now).await;
    let written = totals_rows(&e).await;
    let want = jobs(&e).await;

    // Day 1's file as a release before the column wrote it: no host counts.
    let hosts = table::JOB_HOST_COUNT;
    let columns = format!("* EXCLUDE ({hosts}), CAST(NULL AS BIGINT) AS {hosts}");
    as_earlier(&e, &store, Table::JobLedgerTotals, D0 + DAY, &columns).await;
    let (e, _) = server(&store, &cost, false, now).await;
    let wide: Vec<_> = jobs(&e)
        .await
        .iter()
        .filter(|r| r["job_id"] == "wide")
        .map(|r| r.get(table::JOB_HOST_COUNT).cloned())
        .collect();
    assert_eq!(wide, [None, None], "read from the earlier file");

    // The folding server gives the file its counts, and nothing else changes.
    let (e, _) = server(&store, &cost, true, now).await;
    assert_eq!(totals_rows(&e).await, written);
    same(&jobs(&e).await, &want, "jobs once the counts are back");
}

#[tokio::test]
async fn day_and_totals_files_without_the_activity_parts_are_read_by_the_hour_and_written_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, cost, now) = setup(dir.path());
    let (e, ledger) = server(&store, &cost, true, now).await;
    let want = jobs(&e).await;
    let activities: Vec<_> = want.iter().map(|r| r[MEAN_ACTIVITY].as_f64()).collect();
    assert!(
        activities.iter().all(Option::is_some) && activities.windows(2).any(|w| w[0] != w[1]),
        "{activities:?}"
    );
    let days_before = ledger.snapshot().days.clone();
    let end_before = ledger.snapshot().totals_end();
    let has_day_1 = |days: &[(i64, i64)]| days.iter().any(|&(a, b)| a <= D0 + DAY && D0 + DAY < b);
    assert!(has_day_1(&days_before), "{days_before:?}");
    assert!(end_before > Some(D0 + DAY), "{end_before:?}");

    // Day 1's daily sums and totals as a release before the parts wrote them: no parts, and
    // markers without the layout.
    let mut nulls: Vec<String> = table::ACTIVITY_PARTS
        .iter()
        .map(|c| format!("CAST(NULL AS DOUBLE) AS {c}"))
        .collect();
    nulls.push(format!("CAST(NULL AS BIGINT) AS {}", days::FORMAT_COLUMN));
    let mut excluded: Vec<&str> = table::ACTIVITY_PARTS.to_vec();
    excluded.push(days::FORMAT_COLUMN);
    let columns = format!("* EXCLUDE ({}), {}", excluded.join(", "), nulls.join(", "));
    for t in [Table::JobLedger1d, Table::JobLedgerTotals] {
        as_earlier(&e, &store, t, D0 + DAY, &columns).await;
    }
    let (e, ledger) = server(&store, &cost, false, now).await;
    let snap = ledger.snapshot();
    assert!(!has_day_1(&snap.days), "{:?}", snap.days);
    assert_eq!(
        snap.totals_end(),
        Some(D0 + DAY),
        "the totals stop at the earlier file"
    );
    same(
        &jobs(&e).await,
        &want,
        "jobs with a day of an earlier layout",
    );

    // The folding server writes both again.
    let (e, ledger) = server(&store, &cost, true, now).await;
    assert_eq!(ledger.snapshot().days, days_before);
    assert_eq!(ledger.snapshot().totals_end(), end_before);
    same(&jobs(&e).await, &want, "jobs once written again");
}
