//! The ledger-backed `jobs` view against the plain view's SQL ([`CostConfig::jobs_sql`]) on the
//! same samples: before any fold, after folding closed hours, with live samples after the
//! watermark, after late samples for a folded hour; then the table read back by a restarted
//! server and by a query node, and the view, statements and reports unchanged after retention
//! removed every raw sample.

use std::collections::BTreeMap;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::{Clock, ManualClock};
use gpuwatch_store::ingest::{Cell, GpuRow, ProcessRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use super::*;

const T0: i64 = 1_800_000_000_000_000_000; // an hour boundary
const S: i64 = 1_000_000_000;
const H: i64 = 3_600 * S;

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Samples of 3 hosts x 2 GPUs from `from` to `to` (ns after T0): 10 s apart with jitter,
/// jobs that change every ~40 minutes, free spells, idle spells, data gaps (some across hour
/// boundaries and longer than the sample gap), counter resets, missing energy and utilisation,
/// and one GPU shared by two jobs part of the time.
fn samples(
    rng: &mut Lcg,
    from: i64,
    to: i64,
    energy: &mut BTreeMap<(usize, usize), f64>,
) -> Vec<GpuRow> {
    let mut rows = Vec::new();
    for host in 0..3 {
        for gpu in 0..2 {
            let mut t = from + rng.below(10) as i64 * S;
            while t < to {
                let e = energy.entry((host, gpu)).or_insert(1_000.0);
                *e += 300.0 * 10.0 * (rng.below(100) as f64 / 100.0);
                if rng.below(400) == 0 {
                    *e = rng.below(50) as f64; // counter reset
                }
                let slot = (t - T0) / (40 * 60 * S) + host as i64;
                let job = (slot % 4 != 3).then(|| format!("{}", 100 + slot * 3 + gpu as i64 % 2));
                let mut r = GpuRow::new(t);
                r.labels[0] = Some(format!("n{host}"));
                r.labels[1] = Some(format!("GPU-{host}-{gpu}"));
                r.labels[3] = Some(
                    if host == 2 {
                        "NVIDIA A100"
                    } else {
                        "NVIDIA H100"
                    }
                    .into(),
                );
                if let Some(j) = &job {
                    r.labels[5] = Some(j.clone());
                    r.labels[6] = Some(format!("user{}", slot % 3));
                    r.labels[7] = Some("train".into());
                    r.labels[8] = Some("slurm".into());
                    // A shared GPU: one job that only ever shares it, shares that change, a
                    // pair that does not parse.
                    if host == 1 && gpu == 1 && slot % 3 == 0 {
                        let mine = 0.5 + ((t / S) % 5) as f64 / 10.0;
                        r.job_shares = Some(format!("{j}={mine},9{slot}={:.1},bad", 1.0 - mine));
                    }
                }
                let util = if slot % 5 == 1 {
                    0.0
                } else if slot % 4 < 2 {
                    // Jobs that keep their GPUs busy.
                    0.75 + rng.below(25) as f64 / 100.0
                } else {
                    rng.below(100) as f64 / 100.0
                };
                if rng.below(50) != 0 {
                    r.values[value_index("hw.gpu.utilization").expect("util")] =
                        Some(Cell::F(util));
                }
                if rng.below(60) != 0 {
                    r.values[value_index("hw.energy").expect("energy")] = Some(Cell::F(*e));
                }
                // GPM readings on the H100s, so that the samples fall in several limiter
                // classes (each job keeps a character: dense tensor work, memory-bound
                // copies, tiny kernels or input stalls).
                if host != 2 {
                    let fill = [0.95, 0.9, 0.2, 0.9][(slot % 4) as usize];
                    let set = |r: &mut GpuRow, name: &str, v: f64| {
                        r.values[value_index(name).expect(name)] = Some(Cell::F(v));
                    };
                    set(&mut r, "gpu.sm.active", util * fill);
                    set(
                        &mut r,
                        "gpu.tensor.active",
                        if slot % 2 == 0 { 0.8 } else { 0.05 },
                    );
                    set(
                        &mut r,
                        "gpu.dram.active",
                        if slot % 2 == 0 { 0.2 } else { 0.7 },
                    );
                }
                rows.push(r);
                t += if rng.below(200) == 0 {
                    // A data gap: up to 25 minutes.
                    rng.below(1_500) as i64 * S
                } else {
                    10 * S + rng.below(3) as i64 * S
                };
            }
        }
    }
    rows
}

use crate::cost::tests::json_rows as rows;

/// The ledger-backed view and the plain view's SQL give the same rows.
async fn same_as_plain_view(e: &QueryEngine, cost: &CostConfig, what: &str) -> usize {
    let order = " ORDER BY job_id, host";
    let got = rows(e, &format!("SELECT * FROM jobs{order}")).await;
    let want = rows(
        e,
        &format!(
            "SELECT * FROM ({}) j{order}",
            cost.jobs_sql(&crate::cost::JobsConfig::default())
        ),
    )
    .await;
    assert_eq!(got.len(), want.len(), "{what}: row count");
    assert!(!got.is_empty(), "{what}: no jobs");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.keys().collect::<Vec<_>>(),
            w.keys().collect::<Vec<_>>(),
            "{what}: columns"
        );
        for (k, wv) in w {
            let gv = &g[k];
            match (gv.as_f64(), wv.as_f64()) {
                (Some(a), Some(b)) => assert!(
                    (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                    "{what}: {k} of job {} on {}: {a} vs {b}",
                    w["job_id"],
                    w["host"]
                ),
                _ => assert_eq!(gv, wv, "{what}: {k} of job {}", w["job_id"]),
            }
        }
    }
    hours_add_up(e, what).await;
    bounded_questions_agree(e, cost, what).await;
    got.len()
}

/// Questions the views bound by the jobs' hours ([`spans`]: since a time, one job, a range of
/// hours) give the rows the unbounded answers give.
async fn bounded_questions_agree(e: &QueryEngine, cost: &CostConfig, what: &str) {
    let plain = cost.jobs_sql(&crate::cost::JobsConfig::default());
    let order = " ORDER BY job_id, host";
    // One job each: the first by id, the last seen (raw samples after the watermark) and the
    // first to end (none: its question reads no raw samples).
    let mut one_job = Vec::new();
    for q in [
        "SELECT min(job_id) AS j FROM jobs",
        "SELECT job_id AS j FROM jobs ORDER BY last_seen DESC, job_id LIMIT 1",
        "SELECT job_id AS j FROM jobs ORDER BY last_seen, job_id LIMIT 1",
    ] {
        let j = rows(e, q).await[0]["j"].clone();
        one_job.push(format!("job_id = '{}'", j.as_str().expect("a job")));
    }
    let mut asks: Vec<String> = (0..7)
        .map(|k| {
            format!(
                "last_seen >= to_timestamp_nanos({})",
                T0 + k * H + 17 * 60 * S
            )
        })
        .collect();
    asks.extend(one_job);
    asks.push(format!(
        "last_seen BETWEEN to_timestamp_nanos({}) AND to_timestamp_nanos({}) AND first_seen <= to_timestamp_nanos({})",
        T0 + 2 * H,
        T0 + 4 * H,
        T0 + 3 * H
    ));
    for ask in &asks {
        let got = rows(e, &format!("SELECT * FROM jobs WHERE {ask}{order}")).await;
        let want = rows(e, &format!("SELECT * FROM ({plain}) j WHERE {ask}{order}")).await;
        let pack = |r: Vec<serde_json::Map<String, serde_json::Value>>| {
            serde_json::Value::Array(r.into_iter().map(serde_json::Value::Object).collect())
        };
        if let Err(diff) = agree(&pack(got), &pack(want), ask) {
            panic!("{what}: jobs WHERE {ask}: {diff}");
        }
    }
    for (from, to) in [(0, 2), (2, 4), (3, 7), (5, 6)] {
        let (from, to) = (T0 + from * H, T0 + to * H);
        let cols = "hour, job_id, host, gpu_model, gpu_seconds, cost_usd, work_done";
        let hour_order = " ORDER BY hour, job_id, host, gpu_model";
        let got = rows(
            e,
            &format!(
                "SELECT {cols} FROM job_hours WHERE hour >= to_timestamp_nanos({from}) AND hour < to_timestamp_nanos({to}){hour_order}"
            ),
        )
        .await;
        // A filter the view cannot read bounds from: every hour is read.
        let want = rows(
            e,
            &format!(
                "SELECT {cols} FROM job_hours WHERE date_part('epoch', hour) >= {} AND date_part('epoch', hour) < {}{hour_order}",
                from / S,
                to / S
            ),
        )
        .await;
        let pack = |r: Vec<serde_json::Map<String, serde_json::Value>>| {
            serde_json::Value::Array(r.into_iter().map(serde_json::Value::Object).collect())
        };
        assert!(
            !want.is_empty() || to > T0 + 6 * H,
            "{what}: no hours in {from}..{to}"
        );
        if let Err(diff) = agree(&pack(got), &pack(want), "job_hours") {
            panic!("{what}: job_hours of hours {from}..{to}: {diff}");
        }
    }
}

/// `job_hours` summed over hours and GPU models gives `jobs`, each of its rows lies within its
/// hour, and jobs longer than an hour have several.
async fn hours_add_up(e: &QueryEngine, what: &str) {
    let sums = [
        "gpu_seconds",
        "idle_gpu_seconds",
        "energy_joules",
        "cost_usd",
        "idle_cost_usd",
        "work_done",
    ];
    let summed: Vec<String> = sums.iter().map(|c| format!("sum({c}) AS {c}")).collect();
    let got = rows(
        e,
        &format!(
            "SELECT job_id, host, count(*) AS hours, {} FROM job_hours GROUP BY job_id, host ORDER BY job_id, host",
            summed.join(", ")
        ),
    )
    .await;
    let want = rows(
        e,
        &format!(
            "SELECT job_id, host, {} FROM jobs ORDER BY job_id, host",
            sums.join(", ")
        ),
    )
    .await;
    assert_eq!(got.len(), want.len(), "{what}: job_hours' jobs");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            (&g["job_id"], &g["host"]),
            (&w["job_id"], &w["host"]),
            "{what}"
        );
        for c in sums {
            let (a, b) = (
                g.get(c).and_then(|v| v.as_f64()),
                w.get(c).and_then(|v| v.as_f64()),
            );
            match (a, b) {
                (Some(a), Some(b)) => assert!(
                    (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                    "{what}: job_hours' {c} of job {}: {a} vs {b}",
                    w["job_id"]
                ),
                _ => assert_eq!(a, b, "{what}: job_hours' {c} of job {}", w["job_id"]),
            }
        }
    }
    assert!(
        got.iter().any(|r| r["hours"].as_i64() > Some(1)),
        "{what}: no job spans two hours"
    );
    let outside = rows(
        e,
        "SELECT count(*) AS n FROM job_hours WHERE hour <> date_trunc('hour', hour) \
         OR first_seen < hour OR last_seen >= hour + interval '1 hour'",
    )
    .await;
    assert_eq!(outside[0]["n"], 0, "{what}: rows outside their hour");
}

/// Whether two JSON values agree, numbers to 1e-9 relative (`sample_interval_s`, the median of
/// hourly medians once hours are folded, to 10%); the first difference otherwise.
fn agree(got: &serde_json::Value, want: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            let tol = if path.ends_with("sample_interval_s") {
                0.1
            } else {
                1e-9
            };
            if (a - b).abs() <= tol * b.abs().max(1.0) {
                Ok(())
            } else {
                Err(format!("{path}: {a} vs {b}"))
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .try_for_each(|(i, (x, y))| agree(x, y, &format!("{path}[{i}]"))),
        (Value::Object(a), Value::Object(b))
            if a.keys().collect::<Vec<_>>() == b.keys().collect::<Vec<_>>() =>
        {
            b.iter()
                .try_for_each(|(k, y)| agree(&a[k], y, &format!("{path}.{k}")))
        }
        _ if got == want => Ok(()),
        _ => Err(format!("{path}: {got} vs {want}")),
    }
}

/// A process per sample of a GPU held by a job (one per job and GPU), with its SM share in one
/// sample of three: what retention leaves of them is the hourly rollup, which the report reads.
fn processes_of(rows: &[GpuRow]) -> Vec<ProcessRow> {
    rows.iter()
        .filter_map(|r| {
            let job = r.labels[5].clone()?;
            let secs = r.time / S;
            Some(ProcessRow {
                time: r.time,
                host: r.labels[0].clone()?,
                gpu_uuid: r.labels[1].clone()?,
                pid: 1_000 + job.parse::<i64>().unwrap_or(0),
                process_name: Some("train".into()),
                job_id: Some(job),
                job_user: r.labels[6].clone(),
                used_memory_bytes: Some(secs % 1_000 * 1_000_000),
                sm_utilization: (secs % 3 == 0).then(|| (secs % 7) as f64 / 10.0),
            })
        })
        .collect()
}

/// Every job's report through the ledger (`e`) equals its report from raw samples only (`raw`,
/// an engine without the `jobs` view and so without a ledger).
async fn same_reports(e: &QueryEngine, raw: &QueryEngine, cost: &CostConfig, what: &str) {
    let jobs = crate::cost::JobsConfig::default();
    use crate::cost::report::ledger_of;
    assert!(
        ledger_of(e).await.is_some(),
        "{what}: the report finds the ledger"
    );
    assert!(
        ledger_of(raw).await.is_none(),
        "{what}: no ledger without the view"
    );
    let ids = rows(e, "SELECT DISTINCT job_id FROM jobs ORDER BY job_id").await;
    assert!(ids.len() > 10, "{what}: {} jobs", ids.len());
    let now = T0 + 7 * H;
    for id in ids.iter().filter_map(|r| r["job_id"].as_str()) {
        let report = |engine| crate::cost::report::job_report(engine, cost, &jobs, id, now);
        let got = report(e).await.expect("report").expect("known job");
        let want = report(raw).await.expect("report").expect("known job");
        let (got, want) = (
            serde_json::to_value(&got).expect("json"),
            serde_json::to_value(&want).expect("json"),
        );
        if let Err(diff) = agree(&got, &want, "report") {
            panic!("{what}: job {id}: {diff}");
        }
    }
    same_lists(e, raw, cost, what).await;
}

/// The jobs list through the ledger (its means from the ledger's parts before the watermark)
/// equals the list from raw samples for every job the raw samples name as their own (a job
/// that only ever shares a GPU has no raw row of its own: the ledger gives it means too).
async fn same_lists(e: &QueryEngine, raw: &QueryEngine, cost: &CostConfig, what: &str) {
    use crate::cost::report::{ListFilter, list_jobs};
    // A `jobs` view whose ledger never folds: every figure from raw samples.
    let raw = QueryEngine::new(raw.store().clone(), EngineConfig::default()).expect("engine");
    cost.register(raw.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    let filter = ListFilter {
        user: None,
        since_ns: 0,
        until: None,
        running_only: false,
        limit: 1000,
    };
    let list = |engine| list_jobs(engine, &filter, T0 + 7 * H);
    let (got, want) = (
        list(e).await.expect("list"),
        list(&raw).await.expect("list"),
    );
    assert_eq!(got.jobs.len(), want.jobs.len(), "{what}: jobs listed");
    for (g, w) in got.jobs.iter().zip(&want.jobs) {
        if w.mean_utilization.is_none() {
            continue;
        }
        let (g, w) = (
            serde_json::to_value(g).expect("json"),
            serde_json::to_value(w).expect("json"),
        );
        if let Err(diff) = agree(&g, &w, "list") {
            panic!("{what}: {diff}");
        }
    }
    // Pages of four, each from the cursor of the one before, list the same jobs.
    let mut paged = Vec::new();
    let mut until = None;
    loop {
        let page = ListFilter {
            until: until.clone(),
            limit: 4,
            ..filter.clone()
        };
        let list = list_jobs(e, &page, T0 + 7 * H).await.expect("page");
        assert!(list.jobs.len() <= 4, "{what}: page of {}", list.jobs.len());
        paged.extend(
            list.jobs
                .into_iter()
                .map(|j| serde_json::to_value(j).expect("json")),
        );
        match list.next {
            Some(next) => until = Some(next),
            None => break,
        }
    }
    let whole: Vec<serde_json::Value> = got
        .jobs
        .iter()
        .map(|j| serde_json::to_value(j).expect("json"))
        .collect();
    if let Err(diff) = agree(
        &serde_json::Value::Array(paged),
        &serde_json::Value::Array(whole),
        "pages",
    ) {
        panic!("{what}: the list by pages: {diff}");
    }
}

#[tokio::test]
async fn folded_hours_plus_live_samples_equal_the_plain_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 5 * H + 20 * 60 * S));
    let store = open_store(dir.path(), &clock);
    let write = |rows: &[GpuRow]| {
        let mut wb = WriteBatch::from_rows(rows, &[]).expect("batch");
        wb.add_processes_and_events(&processes_of(rows), &[])
            .expect("processes");
        store.write(&wb).expect("write");
    };
    let cost: CostConfig = toml::from_str(
        r#"
gpu_hour_usd = [{model = "*H100*", usd = 3.0}]
default_gpu_hour_usd = 1.25
kwh_usd = 0.2
pue = 1.3
max_sample_gap = "60s"
"#,
    )
    .expect("cost");
    let mut rng = Lcg(7);
    let mut energy = BTreeMap::new();
    write(&samples(
        &mut rng,
        T0,
        T0 + 5 * H + 15 * 60 * S,
        &mut energy,
    ));
    store.persist().expect("persist");
    store.maintain().expect("maintain");

    let read: Arc<dyn ReadStore> = store.clone();
    let e = QueryEngine::new(read.clone(), EngineConfig::default()).expect("engine");
    let raw = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let ledger = cost
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    assert_eq!(ledger.snapshot().watermark, None);
    let n = same_as_plain_view(&e, &cost, "nothing folded").await;
    same_reports(&e, &raw, &cost, "nothing folded").await;
    assert!(n > 10, "{n} jobs");

    // Hours 0..5 are closed 15 minutes after hour 5 ends; the last hour's samples stay live.
    let folded = ledger
        .step(e.context(), &store, true, clock.now_nanos())
        .await
        .expect("step");
    assert_eq!(folded, 5);
    assert_eq!(ledger.snapshot().watermark, Some(T0 + 5 * H));
    reads_are_bounded(&e, &ledger).await;
    same_as_plain_view(&e, &cost, "five hours folded").await;
    same_reports(&e, &raw, &cost, "five hours folded").await;
    assert_eq!(
        ledger
            .step(e.context(), &store, true, clock.now_nanos())
            .await
            .expect("step"),
        0
    );

    // Live samples after the watermark, never persisted.
    write(&samples(
        &mut rng,
        T0 + 5 * H + 15 * 60 * S,
        T0 + 5 * H + 40 * 60 * S,
        &mut energy,
    ));
    same_as_plain_view(&e, &cost, "live samples").await;
    same_reports(&e, &raw, &cost, "live samples").await;

    // Late samples for hour 2, after it was folded: the store rebuilds that hour's rollup, the
    // ledger sees the count differ and refolds hours 2..5.
    let mut late = samples(
        &mut Lcg(99),
        T0 + 2 * H + 30 * 60 * S,
        T0 + 2 * H + 33 * 60 * S,
        &mut BTreeMap::new(),
    );
    for r in &mut late {
        // GPUs of their own: two series of one GPU would tie on time, where the order of the
        // samples (and so the previous sample) is not defined.
        r.labels[1] = r.labels[1].take().map(|g| format!("{g}-late"));
    }
    write(&late);
    store.persist().expect("persist");
    store.maintain().expect("maintain");
    store.maintain().expect("maintain");
    let refolded = ledger
        .step(e.context(), &store, true, clock.now_nanos())
        .await
        .expect("step");
    assert_eq!(refolded, 3, "hours 2, 3 and 4 refolded");
    same_as_plain_view(&e, &cost, "late samples").await;
    same_reports(&e, &raw, &cost, "late samples").await;

    // The next hour closes.
    clock.advance(H);
    assert_eq!(
        ledger
            .step(e.context(), &store, true, clock.now_nanos())
            .await
            .expect("step"),
        1
    );
    assert_eq!(ledger.snapshot().watermark, Some(T0 + 6 * H));
    same_as_plain_view(&e, &cost, "six hours folded").await;
    same_reports(&e, &raw, &cost, "six hours folded").await;
    let job_rows = rows(&e, "SELECT count(*) AS n FROM jobs WHERE gpu_seconds > 0").await;
    assert!(job_rows[0]["n"].as_i64().unwrap_or(0) > 10);
    // The limiter column holds several classes, among them the unknown of the A100s (no GPM).
    let limiters = rows(
        &e,
        "SELECT DISTINCT limiter FROM jobs WHERE limiter IS NOT NULL",
    )
    .await;
    let names: Vec<&str> = limiters
        .iter()
        .filter_map(|r| r["limiter"].as_str())
        .collect();
    for want in ["tensor", "memory", "unknown"] {
        assert!(names.contains(&want), "{want} not among {names:?}");
    }

    // What the view, a month's statement and every report say now, to compare after a restart
    // and after retention.
    let before = Answers::of(&e, &cost).await;
    drop((e, raw, ledger));
    let store = restarted(store, dir.path(), &clock);
    read_back(&store, &cost, &clock, &before).await;
    retention_keeps_every_cost(&store, &cost, &clock, &before).await;
}

/// Once the ledger loaded, a question about recent jobs or one job reads only their hours.
async fn reads_are_bounded(e: &QueryEngine, ledger: &JobLedger) {
    assert!(ledger.spans_ready(), "the jobs' hours are indexed");
    assert!(
        ledger.spans_len() > 10,
        "{} jobs indexed",
        ledger.spans_len()
    );
    let state = e.context().state();
    let snap = ledger.snapshot();
    let w = snap.watermark.expect("folded");
    let recent = bounds::Ask {
        low: Some(w - 30 * 60 * S),
        ..bounds::Ask::default()
    };
    let read = ledger
        .read_for(&state, &snap, View::Hours, recent)
        .await
        .expect("read");
    let (from, to) = read.hours.expect("bounded");
    assert!(from > T0 && to == w, "{from}..{to}: not bounded");
    let old = rows(
        e,
        "SELECT job_id FROM job_hours ORDER BY hour, job_id LIMIT 1",
    )
    .await;
    let id = old[0]["job_id"].as_str().expect("a job").to_string();
    let one = bounds::Ask {
        jobs: Some(vec![id]),
        ..bounds::Ask::default()
    };
    let read = ledger
        .read_for(&state, &snap, View::Hours, one)
        .await
        .expect("read");
    let (from, to) = read.hours.expect("bounded");
    assert!(
        from == T0 && to <= T0 + 2 * H,
        "{from}..{to}: the first job's hours"
    );
    ends_before_the_raw_samples(e, ledger, w).await;
}

/// A question that ends before the watermark's hour reads no raw samples (its rows are the
/// same: `bounded_questions_agree` asks such hours of `job_hours`); one that reaches it does.
async fn ends_before_the_raw_samples(e: &QueryEngine, ledger: &JobLedger, w: i64) {
    let raw = rows(
        e,
        &format!("SELECT count(*) AS n FROM gpu_metrics WHERE time >= to_timestamp_nanos({w})"),
    )
    .await;
    assert!(
        raw[0]["n"].as_i64().unwrap_or(0) > 0,
        "raw samples after the watermark"
    );
    let snap = ledger.snapshot();
    for (high, skips) in [(w - H - 1, true), (w - 1, true), (w, false)] {
        let ask = bounds::Ask {
            high: Some(high),
            ..bounds::Ask::default()
        };
        let read = ledger
            .read_for(&e.context().state(), &snap, View::Hours, ask)
            .await
            .expect("read");
        assert_eq!(read.skip_raw, skips, "hours up to {high}, watermark {w}");
    }
}

/// What is compared across a restart and retention.
struct Answers {
    jobs: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Jobs seen in the last hours, and two hours of `job_hours`: answers bounded by the
    /// jobs' hours.
    recent: Vec<serde_json::Map<String, serde_json::Value>>,
    window: Vec<serde_json::Map<String, serde_json::Value>>,
    hours: Vec<serde_json::Map<String, serde_json::Value>>,
    reports: Vec<serde_json::Value>,
}

impl Answers {
    async fn of(e: &QueryEngine, cost: &CostConfig) -> Self {
        let jobs = rows(e, "SELECT * FROM jobs ORDER BY job_id, host").await;
        let hours = rows(
            e,
            "SELECT * FROM job_hours ORDER BY hour, job_id, host, gpu_model",
        )
        .await;
        let recent = rows(
            e,
            &format!(
                "SELECT * FROM jobs WHERE last_seen >= to_timestamp_nanos({}) ORDER BY job_id, host",
                T0 + 3 * H + 20 * 60 * S
            ),
        )
        .await;
        let window = rows(
            e,
            &format!(
                "SELECT * FROM job_hours WHERE hour >= to_timestamp_nanos({}) AND hour < to_timestamp_nanos({}) ORDER BY hour, job_id, host, gpu_model",
                T0 + 2 * H,
                T0 + 4 * H
            ),
        )
        .await;
        let mut reports = Vec::new();
        let config = crate::cost::JobsConfig::default();
        for id in jobs.iter().filter_map(|r| r["job_id"].as_str()) {
            let r = crate::cost::report::job_report(e, cost, &config, id, T0 + 7 * H)
                .await
                .expect("report")
                .expect("known job");
            reports.push(serde_json::to_value(&r).expect("json"));
        }
        Self {
            jobs,
            recent,
            window,
            hours,
            reports,
        }
    }

    fn assert_same(&self, other: &Answers, what: &str) {
        let pack = |rows: &[serde_json::Map<String, serde_json::Value>]| {
            serde_json::Value::Array(
                rows.iter()
                    .map(|r| serde_json::Value::Object(r.clone()))
                    .collect(),
            )
        };
        for (name, got, want) in [
            ("jobs", pack(&other.jobs), pack(&self.jobs)),
            ("job_hours", pack(&other.hours), pack(&self.hours)),
            ("recent jobs", pack(&other.recent), pack(&self.recent)),
            (
                "two hours of job_hours",
                pack(&other.window),
                pack(&self.window),
            ),
            (
                "reports",
                serde_json::Value::Array(other.reports.clone()),
                serde_json::Value::Array(self.reports.clone()),
            ),
        ] {
            if let Err(diff) = agree(&got, &want, name) {
                panic!("{what}: {diff}");
            }
        }
    }
}

/// `store` closed and opened again on `dir`.
fn restarted(store: Arc<Store>, dir: &std::path::Path, clock: &Arc<ManualClock>) -> Arc<Store> {
    drop(
        Arc::try_unwrap(store)
            .map_err(|_| ())
            .expect("the store's last user"),
    );
    open_store(dir, clock)
}

/// A store on `dir` read at `clock`'s time, without syncing its write-ahead log.
pub(super) fn open_store(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Arc<Store> {
    Arc::new(
        Store::open(
            StoreConfig {
                wal_sync: false,
                ..StoreConfig::new(dir.to_path_buf())
            },
            clock.clone(),
        )
        .expect("store"),
    )
}

/// A server's engine and ledger on `store` after one pass at `now` (`fold`: the server that
/// writes), and the hours that pass folded.
pub(super) async fn server_on(
    store: &Arc<Store>,
    cost: &CostConfig,
    fold: bool,
    now: i64,
) -> (QueryEngine, Arc<JobLedger>, usize) {
    let read: Arc<dyn ReadStore> = store.clone();
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let ledger = cost
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    let folded = ledger
        .step(e.context(), store, fold, now)
        .await
        .expect("step");
    (e, ledger, folded)
}

/// A restarted server folds nothing again, and a query node (which never folds) reads the
/// same table: both answer as before.
async fn read_back(store: &Arc<Store>, cost: &CostConfig, clock: &ManualClock, before: &Answers) {
    for (fold, what) in [(true, "restarted"), (false, "query node")] {
        let (e, ledger, folded) = server_on(store, cost, fold, clock.now_nanos()).await;
        assert_eq!(folded, 0, "{what}: hours folded again");
        assert_eq!(ledger.snapshot().watermark, Some(T0 + 6 * H), "{what}");
        before.assert_same(&Answers::of(&e, cost).await, what);
        same_as_plain_view(&e, cost, what).await;
    }
}

/// A year and a day later retention has removed every raw sample and every 1-minute rollup
/// (30 days and a year by default): the jobs, their hours and reports are what they were the
/// day after they ran, read from the ledger's table (and the hourly rollups) alone.
async fn retention_keeps_every_cost(
    store: &Arc<Store>,
    cost: &CostConfig,
    clock: &ManualClock,
    before: &Answers,
) {
    clock.advance(366 * 24 * H);
    store.maintain().expect("maintain");
    store.maintain().expect("maintain");
    let read: Arc<dyn ReadStore> = store.clone();
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    for table in [
        "gpu_metrics",
        "gpu_processes",
        "gpu_metrics_1m",
        "gpu_processes_1m",
    ] {
        let left = rows(&e, &format!("SELECT count(*) AS n FROM {table}")).await;
        assert_eq!(left[0]["n"], 0, "retention left rows in {table}");
    }
    let hourly = rows(&e, "SELECT count(*) AS n FROM gpu_processes_1h").await;
    assert!(
        hourly[0]["n"].as_i64().unwrap_or(0) > 0,
        "the hourly rollups outlive a year"
    );
    assert!(
        before
            .reports
            .iter()
            .any(|r| r["processes"].as_array().is_some_and(|p| !p.is_empty())),
        "no report listed processes"
    );
    let ledger = cost
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    ledger
        .step(e.context(), store, true, clock.now_nanos())
        .await
        .expect("step");
    assert_eq!(ledger.snapshot().watermark, Some(T0 + 6 * H));
    before.assert_same(&Answers::of(&e, cost).await, "after retention");
}

/// History written as ledger rows (`table::hour_rows`, what a benchmark or an import writes) is
/// read by the view like folded hours, older than any raw sample; bad names are refused.
#[tokio::test]
async fn written_history_is_read_by_the_view_and_bad_names_are_refused() {
    table::declare().expect("declare");
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 3 * H));
    let store = open_store(dir.path(), &clock);
    let row = |hour: i64, idle: f64| table::UsageRow {
        job_id: "h-1".into(),
        host: "n1".into(),
        gpu_uuid: "GPU-1".into(),
        gpu_model: Some("NVIDIA H100".into()),
        job_user: Some("ada".into()),
        labels: vec![("job_account".into(), "physics".into())],
        first_seen: hour,
        last_seen: hour + H - 10 * S,
        gpu_seconds: 3_600.0,
        idle_gpu_seconds: idle,
        energy_joules: 1.8e6,
        limiter: Some("tensor".into()),
        samples: 360,
        interval_seconds: 10.0,
        parts: vec![("price_secs".into(), 3_600.0 * 3.0)],
        ..table::UsageRow::default()
    };
    let gpus = [(
        "n1".to_string(),
        "GPU-1".to_string(),
        T0 + H - 10 * S,
        Some(5e6),
    )];
    let hours: Vec<(i64, RecordBatch)> = (0..2)
        .map(|k| {
            let hour = T0 + k * H;
            let b =
                table::hour_rows(hour, &[row(hour, 600.0 * k as f64)], &gpus, 360).expect("rows");
            (hour / H, b)
        })
        .collect();
    store
        .replace_hours(gpuwatch_store::schema::Table::JobLedger, &hours)
        .expect("write");
    let read: Arc<dyn ReadStore> = store.clone();
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let cost: CostConfig = toml::from_str(
        "gpu_hour_usd = [{model = \"*H100*\", usd = 3.0}]\nkwh_usd = 0.2\npue = 1.0\n",
    )
    .expect("cost");
    let ledger = cost
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    assert_eq!(
        ledger
            .step(e.context(), &store, true, clock.now_nanos())
            .await
            .expect("step"),
        0,
        "no raw samples: nothing to fold"
    );
    assert_eq!(ledger.snapshot().watermark, Some(T0 + 2 * H));
    let got = rows(
        &e,
        "SELECT gpu_seconds, idle_gpu_seconds, cost_usd, job_account, limiter FROM jobs",
    )
    .await;
    let usd = 7_200.0 * 3.0 / 3600.0 + 3.6e6 * 0.2 / 3.6e6;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["gpu_seconds"].as_f64(), Some(7_200.0));
    assert_eq!(got[0]["idle_gpu_seconds"].as_f64(), Some(600.0));
    assert!(
        (got[0]["cost_usd"].as_f64().unwrap_or(0.0) - usd).abs() < 1e-9,
        "{got:?}"
    );
    assert_eq!(got[0]["job_account"], "physics");
    assert_eq!(got[0]["limiter"], "tensor");
    let report = crate::cost::report::job_report(
        &e,
        &cost,
        &crate::cost::JobsConfig::default(),
        "h-1",
        T0 + 3 * H,
    )
    .await
    .expect("report")
    .expect("known job");
    let report = serde_json::to_value(&report).expect("json");
    assert_eq!(report["gpu_seconds"].as_f64(), Some(7_200.0), "{report}");

    for (bad, what) in [
        (
            table::UsageRow {
                limiter: Some("warp".into()),
                ..row(T0, 0.0)
            },
            "limiter",
        ),
        (
            table::UsageRow {
                labels: vec![("job_colour".into(), "x".into())],
                ..row(T0, 0.0)
            },
            "chargeback",
        ),
        (
            table::UsageRow {
                parts: vec![("nope".into(), 1.0)],
                ..row(T0, 0.0)
            },
            "part",
        ),
    ] {
        let e = table::hour_rows(T0, &[bad], &gpus, 1)
            .expect_err(what)
            .to_string();
        assert!(e.contains(what), "{what}: {e}");
    }
}
