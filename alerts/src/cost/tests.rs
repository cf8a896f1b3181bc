use std::path::Path;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::ingest::{Cell, GpuRow, MetricRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use super::report::render_text;
use super::*;

const T0: i64 = 1_800_000_000_000_000_000;
const S: i64 = 1_000_000_000;

struct Sample<'a> {
    t: i64,
    host: &'a str,
    gpu: &'a str,
    model: &'a str,
    job: Option<&'a str>,
    util: f64,
    energy: f64,
}

fn row(s: &Sample) -> GpuRow {
    let mut r = GpuRow::new(T0 + s.t * S);
    r.labels[0] = Some(s.host.into());
    r.labels[1] = Some(s.gpu.into());
    r.labels[3] = Some(s.model.into());
    r.labels[5] = s.job.map(str::to_string);
    r.labels[6] = s.job.map(|_| "alice".to_string());
    r.labels[7] = s.job.map(|_| "train".to_string());
    r.labels[8] = s.job.map(|_| "slurm".to_string());
    r.values[value_index("hw.gpu.utilization").expect("util")] = Some(Cell::F(s.util));
    r.values[value_index("hw.energy").expect("energy")] = Some(Cell::F(s.energy));
    r
}

async fn engine(dir: &Path, rows: &[GpuRow], cost: &CostConfig) -> QueryEngine {
    engine_with(dir, rows, &[], cost).await
}

async fn engine_with(
    dir: &Path,
    rows: &[GpuRow],
    metrics: &[MetricRow],
    cost: &CostConfig,
) -> QueryEngine {
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.to_path_buf())
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("store");
    store
        .write(&WriteBatch::from_rows(rows, metrics).expect("batch"))
        .expect("write");
    let read: Arc<dyn ReadStore> = Arc::new(store);
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    cost.register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    e
}

pub(crate) async fn json_rows(
    e: &QueryEngine,
    sql: &str,
) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let r = e
        .query(sql)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"));
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::ArrayWriter::new(&mut buf);
        for b in &r.batches {
            w.write(b).expect("json");
        }
        w.finish().expect("finish");
    }
    if buf.is_empty() {
        return Vec::new();
    }
    serde_json::from_slice(&buf).expect("rows")
}

async fn one_row(e: &QueryEngine, sql: &str) -> serde_json::Map<String, serde_json::Value> {
    let v = json_rows(e, sql).await;
    assert_eq!(v.len(), 1, "{sql}: {v:?}");
    v.into_iter().next().expect("row")
}

fn f(m: &serde_json::Map<String, serde_json::Value>, k: &str) -> f64 {
    m[k].as_f64().unwrap_or_else(|| panic!("{k}: {:?}", m[k]))
}

#[tokio::test]
async fn job_cost_matches_a_hand_computation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cost: CostConfig = toml::from_str(
        r#"
gpu_hour_usd = [{model = "*H100*", usd = 3.0}, {model = "*A100*", usd = 1.5}]
default_gpu_hour_usd = 0.5
kwh_usd = 0.2
pue = 1.25
max_sample_gap = "60s"
"#,
    )
    .expect("cost");
    let h100 = "NVIDIA H100 80GB HBM3";
    let a100 = "NVIDIA A100-SXM4-40GB";
    let mut rows = Vec::new();
    // GPU a (H100): free at 0 s, job 7 from 10 s: busy 10..30, idle at 40 and 50, a 200 s gap,
    // then at 250 s (billed 60 s), energy counter reset at 260 s.
    for (t, job, util, e) in [
        (0, None, 0.0, 1000.0),
        (10, Some("7"), 0.9, 4000.0),
        (20, Some("7"), 0.9, 11000.0),
        (30, Some("7"), 0.9, 18000.0),
        (40, Some("7"), 0.0, 19000.0),
        (50, Some("7"), 0.0, 20000.0),
        (250, Some("7"), 0.5, 60000.0),
        (260, Some("7"), 0.5, 500.0),
    ] {
        rows.push(row(&Sample {
            t,
            host: "n1",
            gpu: "GPU-a",
            model: h100,
            job,
            util,
            energy: e,
        }));
    }
    // GPU b (A100) in the same job on the same host: two samples 10 s apart.
    for (t, e) in [(100, 0.0), (110, 3600.0)] {
        rows.push(row(&Sample {
            t,
            host: "n1",
            gpu: "GPU-b",
            model: a100,
            job: Some("7"),
            util: 1.0,
            energy: e,
        }));
    }
    let e = engine(dir.path(), &rows, &cost).await;
    let m = one_row(&e, "SELECT * FROM jobs WHERE job_id = '7'").await;

    // GPU a: dt = 10 (0→10), 10, 10, 10 (idle), 10 (idle), 60 (capped), 10 = 120 s
    // GPU b: dt = 0 (first sample), 10 = 10 s
    assert_eq!(f(&m, "gpu_seconds"), 130.0);
    assert_eq!(f(&m, "idle_gpu_seconds"), 20.0);
    // GPU a: ΔE = 3000 + 7000 + 7000 + 1000 + 1000 + 40000 + 500 (reset) = 59500; GPU b: 3600
    assert_eq!(f(&m, "energy_joules"), 63100.0);
    let want = 120.0 * 3.0 / 3600.0 + 10.0 * 1.5 / 3600.0 + 63100.0 / 3.6e6 * 0.2 * 1.25;
    assert!(
        (f(&m, "cost_usd") - want).abs() < 1e-9,
        "{} vs {want}",
        f(&m, "cost_usd")
    );
    let idle_want = 20.0 * 3.0 / 3600.0 + 2000.0 / 3.6e6 * 0.2 * 1.25;
    assert!((f(&m, "idle_cost_usd") - idle_want).abs() < 1e-9);
    assert_eq!(m["gpus"], 2);
    assert_eq!(m["job_user"], "alice");
    assert_eq!(m["scheduler"], "slurm");
    assert_eq!(m["job_name"], "train");
    assert!(
        m["first_seen"]
            .as_str()
            .is_some_and(|s| s.contains("2027-01-15T08:00:10")),
        "{m:?}"
    );

    let b = one_row(&e, "SELECT count(*) AS n FROM budgets").await;
    assert_eq!(b["n"], 0);
}

#[tokio::test]
async fn unmatched_models_use_the_default_price_and_bad_config_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cost = CostConfig {
        default_gpu_hour_usd: 0.5,
        user_budgets_usd: [("alice".to_string(), 10.0)].into_iter().collect(),
        default_budget_usd: Some(1.0),
        ..CostConfig::default()
    };
    let rows: Vec<GpuRow> = [(0, 0.0), (30, 100.0)]
        .iter()
        .map(|(t, e)| {
            row(&Sample {
                t: *t,
                host: "n2",
                gpu: "GPU-c",
                model: "Tesla T4",
                job: Some("9"),
                util: 0.5,
                energy: *e,
            })
        })
        .collect();
    let e = engine(dir.path(), &rows, &cost).await;
    let m = one_row(&e, "SELECT cost_usd FROM jobs").await;
    assert!((f(&m, "cost_usd") - 30.0 * 0.5 / 3600.0).abs() < 1e-12);
    let b = one_row(
        &e,
        "SELECT budget_usd FROM budgets WHERE job_user = 'alice'",
    )
    .await;
    assert_eq!(f(&b, "budget_usd"), 10.0);

    let bad = CostConfig {
        pue: 0.8,
        ..CostConfig::default()
    };
    assert!(bad.validate().expect_err("pue").to_string().contains("pue"));
}

fn counter(t: i64, name: &str, job: &str, instance: &str, value: f64) -> MetricRow {
    MetricRow {
        time: T0 + t * S,
        metric: name.into(),
        value,
        labels: vec![
            ("job.id".into(), job.into()),
            ("service.instance.id".into(), instance.into()),
        ],
    }
}

#[tokio::test]
async fn work_done_is_the_jobs_own_count_split_by_gpu_seconds_and_priced_per_unit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cost = CostConfig {
        default_gpu_hour_usd: 3.0,
        ..CostConfig::default()
    };
    // Job 7 holds one GPU on each of two hosts for 60 s; job 8 reports nothing; job 9 holds
    // one GPU and reports its own count.
    let mut rows = Vec::new();
    for (host, gpu, job) in [
        ("n1", "GPU-a", "7"),
        ("n2", "GPU-b", "7"),
        ("n3", "GPU-c", "8"),
        ("n4", "GPU-d", "9"),
    ] {
        for t in (0..=60).step_by(10) {
            rows.push(row(&Sample {
                t,
                host,
                gpu,
                model: "Tesla T4",
                job: Some(job),
                util: 0.9,
                energy: 0.0,
            }));
        }
    }
    let mut metrics = Vec::new();
    // Rank 0 restarts at 40 s: 100 + 150 + 150 + 50 (after the reset) + 150 = 600.
    for (t, v) in [
        (10, 100.0),
        (20, 250.0),
        (30, 400.0),
        (40, 50.0),
        (50, 200.0),
    ] {
        metrics.push(counter(t, "job.samples", "7", "0", v));
    }
    // Rank 1: 80 at its first export, then 400 more.
    for (t, v) in [(10, 80.0), (50, 480.0)] {
        metrics.push(counter(t, "job.samples", "7", "1", v));
    }
    // Steps are reported too, but samples are preferred.
    for (t, v) in [(10, 5.0), (50, 25.0)] {
        metrics.push(counter(t, "job.steps", "7", "0", v));
    }
    // Job 9: 100 at its first export, then 200 more.
    for (t, v) in [(10, 100.0), (50, 300.0)] {
        metrics.push(counter(t, "job.samples", "9", "0", v));
    }
    let e = engine_with(dir.path(), &rows, &metrics, &cost).await;
    let m = one_row(&e, "SELECT * FROM jobs WHERE job_id = '7' AND host = 'n1'").await;
    assert_eq!(m["work_unit"], "job.samples");
    // 1080 samples over the job; each host held the GPU 60 of its 120 GPU-seconds.
    assert_eq!(f(&m, "work_done"), 540.0);
    assert_eq!(f(&m, "work_per_second"), 9.0);
    assert_eq!(f(&m, "work_per_gpu_hour"), 540.0 / (60.0 / 3600.0));
    let usd = 60.0 * 3.0 / 3600.0;
    assert!((f(&m, "cost_usd") - usd).abs() < 1e-12);
    assert!((f(&m, "usd_per_million_units") - usd / 540.0 * 1e6).abs() < 1e-9);
    assert_eq!(m["gpu_model"], "Tesla T4");
    let total = one_row(
        &e,
        "SELECT sum(work_done) AS w FROM jobs WHERE job_id = '7'",
    )
    .await;
    assert_eq!(f(&total, "w"), 1080.0);
    each_jobs_work_is_split_over_its_own_rows(&e).await;
    let none = one_row(
        &e,
        "SELECT work_unit, work_done FROM jobs WHERE job_id = '8'",
    )
    .await;
    // Nulls are left out of the JSON rows.
    assert!(
        none.get("work_unit").is_none() && none.get("work_done").is_none(),
        "{none:?}"
    );
    reports_name_the_work_unit(&e, &cost, usd).await;
}

/// Every job at once (no job filter to narrow the view's rows): each job's work is split over
/// its own rows only.
async fn each_jobs_work_is_split_over_its_own_rows(e: &QueryEngine) {
    let all = json_rows(
        e,
        "SELECT job_id, host, work_done FROM jobs WHERE work_done IS NOT NULL ORDER BY job_id, host",
    )
    .await;
    let got: Vec<(String, f64)> = all
        .iter()
        .map(|r| (format!("{}/{}", r["job_id"], r["host"]), f(r, "work_done")))
        .collect();
    assert_eq!(
        got,
        [
            (r#""7"/"n1""#.to_string(), 540.0),
            (r#""7"/"n2""#.to_string(), 540.0),
            (r#""9"/"n4""#.to_string(), 300.0)
        ]
    );
}

/// Job 7's report: a site counter named in [jobs.work] is preferred over the standard ones,
/// and the standard ones give its samples and their price (`usd` a host's cost).
async fn reports_name_the_work_unit(e: &QueryEngine, cost: &CostConfig, usd: f64) {
    let jobs = JobsConfig {
        work: WorkConfig {
            counters: vec!["job.steps".into()],
        },
        ..JobsConfig::default()
    };
    let r = report::job_report(e, cost, &jobs, "7", T0 + 60 * S)
        .await
        .expect("report")
        .expect("job 7");
    let w = r.work.expect("work");
    assert_eq!((w.unit.as_str(), w.done), ("job.steps", 25.0));
    assert_eq!(w.per_second, Some(25.0 / 60.0));
    let r = report::job_report(e, cost, &JobsConfig::default(), "7", T0 + 60 * S)
        .await
        .expect("report")
        .expect("job 7");
    let w = r.work.clone().expect("work");
    assert_eq!((w.unit.as_str(), w.done), ("job.samples", 1080.0));
    assert!((w.usd_per_million_units.expect("usd") - 2.0 * usd / 1080.0 * 1e6).abs() < 1e-9);
    assert!(
        render_text(&r).contains("work done 1080.0 job.samples"),
        "{}",
        render_text(&r)
    );
}

/// Sets label column `name` of `r`.
fn label(r: &mut GpuRow, name: &str, value: &str) {
    let i = gpuwatch_store::schema::LABEL_COLUMNS
        .iter()
        .position(|(c, _)| *c == name)
        .unwrap_or_else(|| panic!("no label {name}"));
    r.labels[i] = Some(value.into());
}

#[tokio::test]
async fn monthly_statements_split_jobs_at_the_month_and_add_up_to_the_jobs_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cost: CostConfig = toml::from_str(
        "gpu_hour_usd = [{model = \"*H100*\", usd = 3.0}, {model = \"*A100*\", usd = 1.5}]\n\
         default_gpu_hour_usd = 0.5\nkwh_usd = 0.2\n",
    )
    .expect("cost");
    // 2027-02-01T00:00:00Z, in seconds after T0 (2027-01-15T08:00:00Z).
    let feb = 1_801_440_000 - T0 / S;
    let mut rows = Vec::new();
    let mut push =
        |t: i64, gpu: &str, model: &str, job: &str, energy: f64, labels: &[(&str, &str)]| {
            let mut r = row(&Sample {
                t: feb + t,
                host: "n1",
                gpu,
                model,
                job: Some(job),
                util: 0.5,
                energy,
            });
            for (k, v) in labels {
                label(&mut r, k, v);
            }
            rows.push(r);
        };
    let physics = [
        ("job_account", "physics"),
        ("k8s_namespace", "ml"),
        ("job_labels", "team=vision"),
    ];
    // Job 7 (physics, H100) crosses the month: 10 s in January, 30 s in February.
    for (t, e) in [
        (-20, 0.0),
        (-10, 1000.0),
        (0, 2000.0),
        (10, 3000.0),
        (20, 4000.0),
    ] {
        push(t, "GPU-a", "NVIDIA H100", "7", e, &physics);
    }
    // Job 8 (chem, A100): 60 s in February. Job 9 (no account, unpriced model): 10 s.
    for (t, e) in [(0, 0.0), (30, 9000.0), (60, 18000.0)] {
        push(
            t,
            "GPU-b",
            "NVIDIA A100",
            "8",
            e,
            &[
                ("job_account", "chem"),
                ("job_labels", "project=x,team=nlp"),
            ],
        );
    }
    for (t, e) in [(100, 0.0), (110, 500.0)] {
        push(t, "GPU-c", "Tesla T4", "9", e, &[]);
    }
    let e = engine(dir.path(), &rows, &cost).await;
    let st = |by: &str, month: &str| statement::Statement {
        by: by.parse().expect("by"),
        month: month.parse().expect("month"),
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let feb_rows = json_rows(&e, &st("account", "2027-02").sql()).await;
    assert_eq!(feb_rows.len(), 3, "{feb_rows:?}");
    // Most costly first: chem 60 s × 1.5 $/h + 18000 J; physics 30 s × 3 $/h + 3000 J; none.
    let (chem, phys, none) = (&feb_rows[0], &feb_rows[1], &feb_rows[2]);
    assert_eq!(
        (chem["account"].as_str(), chem["month"].as_str()),
        (Some("chem"), Some("2027-02"))
    );
    assert!(close(f(chem, "gpu_hours"), 60.0 / 3600.0));
    assert!(close(f(chem, "energy_kwh"), 18000.0 / 3.6e6));
    assert!(close(
        f(chem, "cost_usd"),
        60.0 * 1.5 / 3600.0 + 18000.0 / 3.6e6 * 0.2
    ));
    assert_eq!(phys["account"], "physics");
    assert!(close(
        f(phys, "cost_usd"),
        30.0 * 3.0 / 3600.0 + 3000.0 / 3.6e6 * 0.2
    ));
    // The JSON writer leaves nulls out.
    assert!(!none.contains_key("account"), "{none:?}");
    assert!(close(
        f(none, "cost_usd"),
        10.0 * 0.5 / 3600.0 + 500.0 / 3.6e6 * 0.2
    ));
    assert_eq!(f(none, "idle_gpu_hours"), 0.0);
    // January holds job 7's first 10 s only.
    let jan = json_rows(&e, &st("account", "2027-01").sql()).await;
    assert_eq!(jan.len(), 1, "{jan:?}");
    assert!(close(
        f(&jan[0], "cost_usd"),
        10.0 * 3.0 / 3600.0 + 1000.0 / 3.6e6 * 0.2
    ));
    // Both months add up to the jobs view, to the cent and below.
    let total = |rows: &[serde_json::Map<String, serde_json::Value>]| {
        rows.iter().map(|r| f(r, "cost_usd")).sum::<f64>()
    };
    let jobs = one_row(&e, "SELECT sum(cost_usd) AS c FROM jobs").await;
    assert!(close(total(&jan) + total(&feb_rows), f(&jobs, "c")));
    // By pod label and by namespace.
    let teams = json_rows(&e, &st("label:team", "2027-02").sql()).await;
    let names: Vec<_> = teams
        .iter()
        .map(|r| r.get("label:team").cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            serde_json::json!("nlp"),
            serde_json::json!("vision"),
            serde_json::Value::Null
        ]
    );
    let ns = json_rows(&e, &st("namespace", "2027-02").sql()).await;
    let ml = Some(&serde_json::json!("ml"));
    assert_eq!(ns.iter().filter(|r| r.get("namespace") == ml).count(), 1);
    assert!(
        json_rows(&e, &st("account", "2027-03").sql())
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn a_shared_gpu_is_split_by_share_and_its_jobs_add_up_to_one_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cost: CostConfig =
        toml::from_str("gpu_hour_usd = [{model = \"*H100*\", usd = 3.0}]\nkwh_usd = 0.2\n")
            .expect("cost");
    // GPU s, labelled with job a; job b shares it at 10, 20 and 40 s. 1000 J per 10 s.
    let mut rows = Vec::new();
    for (t, shares) in [
        (0, None),
        (10, Some("a=0.75,b=0.25")),
        (20, Some("a=0.5,b=0.5")),
        (30, None),
        (40, Some("a=0.25,b=0.75")),
    ] {
        let mut r = row(&Sample {
            t,
            host: "n1",
            gpu: "GPU-s",
            model: "NVIDIA H100",
            job: Some("a"),
            util: 0.9,
            energy: 100.0 * t as f64,
        });
        r.job_shares = shares.map(String::from);
        rows.push(r);
    }
    let e = engine(dir.path(), &rows, &cost).await;
    let job = |id: &'static str| {
        let e = &e;
        async move { one_row(e, &format!("SELECT * FROM jobs WHERE job_id = '{id}'")).await }
    };
    let (a, b) = (job("a").await, job("b").await);
    // By hand: a 7.5 + 5 + 10 + 2.5 = 25 s of the 40 s it was seen for; b 2.5 + 5 + 7.5 = 15 s
    // of 30 s; energy the same shares of 1000 J a sample.
    let usd = |secs: f64, joules: f64| secs * 3.0 / 3600.0 + joules / 3.6e6 * 0.2;
    let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
    assert!(close(f(&a, "gpu_seconds"), 25.0), "{a:?}");
    assert!(close(f(&b, "gpu_seconds"), 15.0), "{b:?}");
    assert!(close(f(&a, "energy_joules"), 2500.0));
    assert!(close(f(&b, "energy_joules"), 1500.0));
    assert!(close(f(&a, "share"), 25.0 / 40.0));
    assert!(close(f(&b, "share"), 0.5));
    assert!(close(f(&a, "cost_usd"), usd(25.0, 2500.0)));
    assert!(close(f(&b, "cost_usd"), usd(15.0, 1500.0)));
    // The GPU's cost, exactly once: its 40 s and 4000 J.
    let total = one_row(
        &e,
        "SELECT sum(cost_usd) AS c, sum(gpu_seconds) AS s FROM jobs",
    )
    .await;
    assert!(close(f(&total, "c"), usd(40.0, 4000.0)), "{total:?}");
    assert!(close(f(&total, "s"), 40.0));
    // b's labels are its own, not a's (it has no row of its own here); the scheduler is the GPU's.
    assert!(!b.contains_key("job_user"), "{b:?}");
    assert_eq!(b["scheduler"], "slurm");
    assert_eq!(a["job_user"], "alice");
    // The report of a job that only shared the GPU finds it, with the same figures.
    let report = report::job_report(&e, &cost, &JobsConfig::default(), "b", T0 + 100 * S)
        .await
        .expect("report")
        .expect("b is known");
    assert!(close(report.gpu_seconds, 15.0), "{}", report.gpu_seconds);
    assert!(close(report.cost_usd, usd(15.0, 1500.0)));
    assert_eq!(report.gpus, 1);
}
