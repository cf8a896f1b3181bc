//! Each rule of the built-in pack against crafted data, with injected time: it fires on the case
//! it is for and stays quiet on its look-alike.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::{Clock, ManualClock};
use gpuwatch_store::ingest::{Cell, GpuRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use crate::cost::CostConfig;
use crate::history::History;
use crate::{EngineSource, RuleEngine, State, builtin_rules};

const S: i64 = 1_000_000_000;
const M: i64 = 60 * S;
const T: i64 = 1_800_000_000 * S;

/// A value as a function of time.
type ValueAt = fn(i64) -> f64;

#[derive(Clone, Default)]
struct Series {
    host: &'static str,
    gpu: &'static str,
    job: Option<(&'static str, &'static str, &'static str)>, // id, user, name
    account: Option<&'static str>,
    from: i64,
    to: i64,
    values: Vec<(&'static str, f64)>,
    /// Values that change over time: (otlp name, f(t) → value).
    varying: Vec<(&'static str, ValueAt)>,
}

fn rows(s: &Series) -> Vec<GpuRow> {
    let mut out = Vec::new();
    let mut t = s.from;
    while t <= s.to {
        let mut r = GpuRow::new(t);
        r.labels[0] = Some(s.host.into());
        r.labels[1] = Some(s.gpu.into());
        r.labels[2] = Some("0".into());
        r.labels[3] = Some("NVIDIA H100 80GB HBM3".into());
        if let Some((id, user, name)) = s.job {
            r.labels[5] = Some(id.into());
            r.labels[6] = Some(user.into());
            r.labels[7] = Some(name.into());
            r.labels[8] = Some("slurm".into());
        }
        if let Some(account) = s.account {
            let i = gpuwatch_store::schema::LABEL_COLUMNS
                .iter()
                .position(|(c, _)| *c == "job_account")
                .expect("job_account");
            r.labels[i] = Some(account.into());
        }
        let mut set = |name: &str, v: f64| {
            let i = value_index(name).unwrap_or_else(|| panic!("no column for {name}"));
            r.values[i] = Some(
                if name.starts_with("hw.")
                    || name.contains("active")
                    || name.contains("utilization")
                {
                    Cell::F(v)
                } else {
                    Cell::I(v as i64)
                },
            );
        };
        for (n, v) in &s.values {
            set(n, *v);
        }
        for (n, f) in &s.varying {
            set(n, f(t));
        }
        out.push(r);
        t += 30 * S;
    }
    out
}

fn busy() -> Vec<(&'static str, f64)> {
    vec![
        ("hw.gpu.utilization", 1.0),
        ("gpu.memory_controller.utilization", 0.4),
        ("gpu.sm.active", 0.9),
    ]
}

fn idle() -> Vec<(&'static str, f64)> {
    vec![
        ("hw.gpu.utilization", 0.0),
        ("gpu.memory_controller.utilization", 0.0),
        ("gpu.sm.active", 0.0),
    ]
}

fn scenario() -> Vec<Series> {
    let end = T + 6 * M;
    let job = |id, user, name| Some((id, user, name));
    let mut v = vec![
        // GpuIdleInJob: idle 40 min (warning) and 150 min (critical); a job busy until 10 min
        // ago (quiet: idle only 10 min).
        Series {
            host: "h1",
            gpu: "GPU-idle40",
            job: job("101", "ann", "notebook"),
            account: Some("chem"),
            from: T - 60 * M,
            to: T - 40 * M,
            values: busy(),
            ..Default::default()
        },
        Series {
            host: "h1",
            gpu: "GPU-idle40",
            job: job("101", "ann", "notebook"),
            account: Some("chem"),
            from: T - 40 * M + 30 * S,
            to: T + 2 * M,
            values: idle(),
            ..Default::default()
        },
        // ... and work resumes 2.5 minutes after the first evaluation.
        Series {
            host: "h1",
            gpu: "GPU-idle40",
            job: job("101", "ann", "notebook"),
            account: Some("chem"),
            from: T + 2 * M + 30 * S,
            to: end,
            values: busy(),
            ..Default::default()
        },
        Series {
            host: "h1",
            gpu: "GPU-idle150",
            job: job("102", "ben", "notebook"),
            from: T - 170 * M,
            to: end,
            values: idle(),
            ..Default::default()
        },
        Series {
            host: "h1",
            gpu: "GPU-busy",
            job: job("103", "cat", "sweep"),
            from: T - 60 * M,
            to: T - 10 * M,
            values: busy(),
            ..Default::default()
        },
        Series {
            host: "h1",
            gpu: "GPU-busy",
            job: job("103", "cat", "sweep"),
            from: T - 10 * M + 30 * S,
            to: end,
            values: idle(),
            ..Default::default()
        },
        // Health: XID counter rising, ECC DBE, remap failure, thermal throttling; look-alikes.
        Series {
            host: "h2",
            gpu: "GPU-xid",
            from: T - 20 * M,
            to: end,
            values: vec![("gpu.ecc.dbe.volatile", 0.0)],
            varying: vec![("gpu.xid.errors", |t| if t >= T - 2 * M { 3.0 } else { 1.0 })],
            ..Default::default()
        },
        Series {
            host: "h2",
            gpu: "GPU-ecc",
            from: T - 20 * M,
            to: end,
            values: vec![
                ("gpu.ecc.dbe.volatile", 2.0),
                ("gpu.xid.errors", 7.0),
                ("gpu.remapped_rows.failure", 0.0),
            ],
            ..Default::default()
        },
        Series {
            host: "h2",
            gpu: "GPU-remap",
            from: T - 20 * M,
            to: end,
            values: vec![("gpu.remapped_rows.failure", 1.0)],
            ..Default::default()
        },
        Series {
            host: "h2",
            gpu: "GPU-hot",
            from: T - 20 * M,
            to: end,
            values: vec![("gpu.clock.event_reasons", 0x40 as f64)],
            ..Default::default()
        },
        Series {
            host: "h2",
            gpu: "GPU-capped",
            from: T - 20 * M,
            to: end,
            values: vec![("gpu.clock.event_reasons", 0x4 as f64)],
            ..Default::default()
        },
        // AgentSilent: h3 stopped 10 minutes ago.
        Series {
            host: "h3",
            gpu: "GPU-gone",
            from: T - 30 * M,
            to: T - 10 * M,
            values: busy(),
            ..Default::default()
        },
        // JobLowEfficiency: 4 GPUs × 20 min at sm_active 0.1 (1.33 GPU-hours); a 1-GPU job at 0.1
        // for 20 min (0.33 GPU-hours: quiet).
        // JobCostOverBudget: dan's budget is 1 USD; at 10 USD/GPU-hour job 201 costs ~13 USD.
        // SpendOverBudget: its account bio's monthly budget is 5 USD (account chem, job 101:
        // under its 1000 USD).
        Series {
            host: "h4",
            gpu: "GPU-l0",
            job: job("201", "dan", "llm-eval"),
            account: Some("bio"),
            from: T - 20 * M,
            to: end,
            values: vec![
                ("hw.gpu.utilization", 0.5),
                ("gpu.memory_controller.utilization", 0.1),
                ("gpu.sm.active", 0.1),
            ],
            ..Default::default()
        },
        Series {
            host: "h4",
            gpu: "GPU-l1",
            job: job("201", "dan", "llm-eval"),
            account: Some("bio"),
            from: T - 20 * M,
            to: end,
            values: vec![
                ("hw.gpu.utilization", 0.5),
                ("gpu.memory_controller.utilization", 0.1),
                ("gpu.sm.active", 0.1),
            ],
            ..Default::default()
        },
        Series {
            host: "h4",
            gpu: "GPU-l2",
            job: job("201", "dan", "llm-eval"),
            account: Some("bio"),
            from: T - 20 * M,
            to: end,
            values: vec![
                ("hw.gpu.utilization", 0.5),
                ("gpu.memory_controller.utilization", 0.1),
                ("gpu.sm.active", 0.1),
            ],
            ..Default::default()
        },
        Series {
            host: "h4",
            gpu: "GPU-l3",
            job: job("201", "dan", "llm-eval"),
            account: Some("bio"),
            from: T - 20 * M,
            to: end,
            values: vec![
                ("hw.gpu.utilization", 0.5),
                ("gpu.memory_controller.utilization", 0.1),
                ("gpu.sm.active", 0.1),
            ],
            ..Default::default()
        },
        Series {
            host: "h4",
            gpu: "GPU-s0",
            job: job("202", "eve", "tiny"),
            from: T - 20 * M,
            to: end,
            values: vec![
                ("hw.gpu.utilization", 0.5),
                ("gpu.memory_controller.utilization", 0.1),
                ("gpu.sm.active", 0.1),
            ],
            ..Default::default()
        },
    ];
    // JobRegression: three earlier `train` runs at sm_active 0.90, 0.92, 0.88; the current one
    // at 0.60 (34% below the median). A `steady` job at 0.91 against the same history is quiet.
    for (i, sm) in [0.90, 0.92, 0.88].iter().enumerate() {
        let id: &'static str = ["301", "302", "303"][i];
        let from = T - (300 - 60 * i as i64) * M;
        v.push(Series {
            host: "h5",
            gpu: "GPU-r",
            job: job(id, "fay", "train"),
            from,
            to: from + 30 * M,
            values: vec![("gpu.sm.active", *sm), ("hw.gpu.utilization", 1.0)],
            ..Default::default()
        });
        let sid: &'static str = ["401", "402", "403"][i];
        v.push(Series {
            host: "h5",
            gpu: "GPU-q",
            job: job(sid, "gus", "steady"),
            from,
            to: from + 30 * M,
            values: vec![("gpu.sm.active", *sm), ("hw.gpu.utilization", 1.0)],
            ..Default::default()
        });
    }
    v.push(Series {
        host: "h5",
        gpu: "GPU-r",
        job: job("304", "fay", "train"),
        from: T - 30 * M,
        to: end,
        values: vec![("gpu.sm.active", 0.6), ("hw.gpu.utilization", 1.0)],
        ..Default::default()
    });
    v.push(Series {
        host: "h5",
        gpu: "GPU-q",
        job: job("404", "gus", "steady"),
        from: T - 30 * M,
        to: end,
        values: vec![("gpu.sm.active", 0.91), ("hw.gpu.utilization", 1.0)],
        ..Default::default()
    });
    v
}

/// rule → sorted list of (a distinguishing label, state)
fn firing(e: &RuleEngine) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in e.alerts() {
        if a.state != State::Firing {
            continue;
        }
        let key = a
            .labels
            .get("gpu_uuid")
            .or_else(|| a.labels.get("job_id"))
            .or_else(|| a.labels.get("host"))
            .or_else(|| a.labels.get("name"))
            .cloned()
            .unwrap_or_default();
        let sev = a.labels.get("severity").cloned().unwrap_or_default();
        out.entry(a.rule.clone())
            .or_default()
            .push(format!("{key}:{sev}"));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pack_rule_fires_on_its_case_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T));
    let store = Arc::new(
        Store::open(
            StoreConfig {
                wal_sync: false,
                ..StoreConfig::new(dir.path().to_path_buf())
            },
            clock.clone(),
        )
        .expect("store"),
    );
    let read: Arc<dyn ReadStore> = store.clone();
    let engine = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let cost: CostConfig = toml::from_str(
        "default_gpu_hour_usd = 10.0\nuser_budgets_usd = { dan = 1.0, fay = 1000.0, gus = 1000.0 }\n\
         account_budgets_usd = { bio = 5.0, chem = 1000.0 }\n",
    )
    .expect("cost");
    cost.register(engine.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    let rules = builtin_rules().expect("pack");
    let e = RuleEngine::new(rules, clock.clone(), None, History::in_memory()).expect("engine");
    let source = EngineSource::new(engine, std::time::Duration::from_secs(60));

    let mut all: Vec<GpuRow> = scenario().iter().flat_map(rows).collect();
    all.sort_by_key(|r| r.time);
    let mut written = 0;
    let mut write_until = |now: i64| {
        let n = all[written..].iter().take_while(|r| r.time <= now).count();
        if n > 0 {
            store
                .write(&WriteBatch::from_rows(&all[written..written + n], &[]).expect("batch"))
                .expect("write");
        }
        written += n;
    };
    let mut at = Vec::new();
    for minute in 0..=5 {
        let now = T + minute * M;
        let cur = clock.now_nanos();
        clock.advance(now - cur);
        write_until(now);
        e.evaluate_all(&source).await.expect("evaluate");
        assert!(e.rule_errors().is_empty(), "{:?}", e.rule_errors());
        at.push(firing(&e));
    }
    let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // At once (rules without `for`).
    let now = &at[0];
    assert_eq!(now.get("GpuXidError"), Some(&v(&["GPU-xid:critical"])));
    assert_eq!(
        now.get("GpuEccUncorrectable"),
        Some(&v(&["GPU-ecc:critical"]))
    );
    assert_eq!(
        now.get("GpuRowRemapFailure"),
        Some(&v(&["GPU-remap:critical"]))
    );
    assert_eq!(now.get("JobCostOverBudget"), Some(&v(&["201:warning"])));
    assert_eq!(now.get("SpendOverBudget"), Some(&v(&["bio:warning"])));
    assert_eq!(now.get("GpuIdleInJob"), None, "for: 1m");
    // After 1 minute.
    assert_eq!(
        at[1].get("GpuIdleInJob"),
        Some(&v(&["GPU-idle150:critical", "GPU-idle40:warning"]))
    );
    // Work resumed on GPU-idle40 at 2.5 minutes: resolved at the next evaluation.
    assert_eq!(
        at[2].get("GpuIdleInJob"),
        Some(&v(&["GPU-idle150:critical", "GPU-idle40:warning"]))
    );
    assert_eq!(
        at[3].get("GpuIdleInJob"),
        Some(&v(&["GPU-idle150:critical"]))
    );
    assert!(e.alerts().iter().any(|a| a.rule == "GpuIdleInJob"
        && a.labels["gpu_uuid"] == "GPU-idle40"
        && a.state == State::Resolved));
    // After 2 minutes: AgentSilent (for: 2m).
    assert_eq!(at[1].get("AgentSilent"), None);
    assert_eq!(at[2].get("AgentSilent"), Some(&v(&["h3:critical"])));
    // After 5 minutes: GpuThrottling, JobLowEfficiency, JobRegression (for: 5m).
    assert_eq!(at[4].get("GpuThrottling"), None);
    let last = &at[5];
    assert_eq!(last.get("GpuThrottling"), Some(&v(&["GPU-hot:warning"])));
    // 201: 4 GPUs at 0.1; 102: the idle notebook (0 over almost 3 GPU-hours) is inefficient too.
    // 101 (0.28 mean), 103 (0.69) and 202 (0.4 GPU-hours) are quiet.
    assert_eq!(
        last.get("JobLowEfficiency"),
        Some(&v(&["102:warning", "201:warning"]))
    );
    assert_eq!(last.get("JobRegression"), Some(&v(&["304:info"])));
    let regression = e
        .alerts()
        .into_iter()
        .find(|a| a.rule == "JobRegression")
        .expect("regression");
    assert!(
        (regression.value - (0.90 - 0.60) / 0.90).abs() < 0.01,
        "{}",
        regression.value
    );
}
