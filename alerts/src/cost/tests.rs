use std::path::Path;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::ingest::{Cell, GpuRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

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
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.to_path_buf())
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("store");
    store
        .write(&WriteBatch::from_rows(rows, &[]).expect("batch"))
        .expect("write");
    let read: Arc<dyn ReadStore> = Arc::new(store);
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    cost.register(e.context(), &crate::cost::AdviceConfig::default())
        .await
        .expect("register");
    e
}

async fn one_row(e: &QueryEngine, sql: &str) -> serde_json::Map<String, serde_json::Value> {
    let r = e.query(sql).await.expect("query");
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::ArrayWriter::new(&mut buf);
        for b in &r.batches {
            w.write(b).expect("json");
        }
        w.finish().expect("finish");
    }
    let v: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(&buf).expect("rows");
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
