use std::path::Path;
use std::sync::Arc;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::ingest::{Cell, EventRow, GpuRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use std::collections::BTreeMap;

use super::*;
use crate::cost::AdviceConfig;

const T0: i64 = 1_800_000_000_000_000_000;
const S: i64 = 1_000_000_000;
const GIB: i64 = 1 << 30;
/// A job id with SQL metacharacters: it must be a value.
const JOB: &str = "42'; DROP TABLE jobs; --";

fn set(r: &mut GpuRow, name: &str, c: Cell) {
    r.values[value_index(name).unwrap_or_else(|| panic!("{name}"))] = Some(c);
}

/// GPU `idx` of host n1 at `t` seconds, in job `JOB`.
fn sample(t: i64, idx: usize, util: f64, sm: f64, mem: i64, reasons: i64, energy: f64) -> GpuRow {
    let mut r = GpuRow::new(T0 + t * S);
    r.labels[0] = Some("n1".into());
    r.labels[1] = Some(format!("GPU-{idx}"));
    r.labels[2] = Some(idx.to_string());
    r.labels[3] = Some("NVIDIA H100 80GB HBM3".into());
    r.labels[5] = Some(JOB.into());
    r.labels[6] = Some("alice".into());
    r.labels[7] = Some("train".into());
    r.labels[8] = Some("slurm".into());
    for (name, v) in [
        ("job_account", "physics"),
        ("job_partition", "gpu"),
        ("job_time_limit_seconds", "7200"),
    ] {
        let i = gpuwatch_store::schema::LABEL_COLUMNS
            .iter()
            .position(|(c, _)| *c == name)
            .expect(name);
        r.labels[i] = Some(v.into());
    }
    set(&mut r, "hw.gpu.utilization", Cell::F(util));
    set(&mut r, "gpu.sm.active", Cell::F(sm));
    set(&mut r, "gpu.tensor.active", Cell::F(sm / 2.0));
    set(&mut r, "gpu.dram.active", Cell::F(0.3));
    set(&mut r, "hw.gpu.memory.usage", Cell::I(mem));
    set(&mut r, "hw.gpu.memory.limit", Cell::I(80 * GIB));
    set(&mut r, "gpu.clock.event_reasons", Cell::I(reasons));
    set(&mut r, "hw.energy", Cell::F(energy));
    r
}

fn cost() -> CostConfig {
    CostConfig {
        gpu_hour_usd: vec![crate::cost::ModelPrice {
            model: "*H100*".into(),
            usd: 2.5,
        }],
        kwh_usd: 0.12,
        pue: 1.3,
        ..CostConfig::default()
    }
}

/// A 4-GPU job, samples every 10 s for 600 s: GPU 0 busy (XID 79 at 300 s), GPU 1 busy and
/// power-capped in every other sample, GPU 2 idle, GPU 3 busy by utilisation with low SM
/// activity and 4 GiB of 80 used.
async fn crafted(dir: &Path) -> QueryEngine {
    let mut rows = Vec::new();
    for k in 0..=60i64 {
        let t = k * 10;
        let busy_e = 3000.0 * k as f64;
        let idle_e = 600.0 * k as f64;
        rows.push(sample(t, 0, 0.9, 0.8, 60 * GIB, 0, busy_e));
        let reasons = if k % 2 == 0 { 0x4 } else { 0x1 };
        rows.push(sample(t, 1, 0.9, 0.7, 70 * GIB, reasons, busy_e));
        rows.push(sample(t, 2, 0.0, 0.0, GIB / 2, 0x1, idle_e));
        rows.push(sample(t, 3, 0.95, 0.1, 4 * GIB, 0, busy_e));
    }
    let mut batch = WriteBatch::from_rows(&rows, &[]).expect("batch");
    let event = |t: i64, gpu: &str| EventRow {
        time: T0 + t * S,
        host: "n1".into(),
        gpu_uuid: gpu.into(),
        kind: "xid".into(),
        code: Some(79),
        detail: Some("xid 79".into()),
    };
    // One XID inside the job, one long after it (not counted).
    batch
        .add_processes_and_events(&[], &[event(300, "GPU-0"), event(5000, "GPU-0")])
        .expect("events");
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.to_path_buf())
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("store");
    store.write(&batch).expect("write");
    let read: Arc<dyn ReadStore> = Arc::new(store);
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    cost()
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    e
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[tokio::test]
async fn report_equals_the_jobs_table_and_a_hand_computation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = crafted(dir.path()).await;
    let r = job_report(&e, &cost(), &JobsConfig::default(), JOB, T0 + 605 * S)
        .await
        .expect("report")
        .expect("known job");

    // By hand: 4 GPUs x 600 s; GPU 2 idle for all of it; 3 busy GPUs x 60 x 3000 J + 60 x 600 J.
    assert_eq!(r.gpus, 4);
    assert!(close(r.gpu_seconds, 2400.0), "{}", r.gpu_seconds);
    assert!(close(r.idle_gpu_seconds, 600.0));
    assert!(close(r.idle_share, 0.25));
    let joules = 3.0 * 180_000.0 + 36_000.0;
    assert!(close(r.energy_joules, joules));
    let usd_per_j = 0.12 * 1.3 / 3.6e6;
    assert!(close(
        r.cost_usd,
        2400.0 * 2.5 / 3600.0 + joules * usd_per_j
    ));
    assert!(close(
        r.idle_cost_usd,
        600.0 * 2.5 / 3600.0 + 36_000.0 * usd_per_j
    ));
    assert_eq!(r.state, "running");
    assert_eq!(r.sample_interval_s, Some(10.0));
    assert_eq!(r.user.as_deref(), Some("alice"));

    // The same numbers as the jobs table.
    let q = format!(
        "SELECT sum(gpu_seconds) AS g, sum(idle_gpu_seconds) AS i, sum(energy_joules) AS e, sum(cost_usd) AS c, sum(idle_cost_usd) AS ic FROM jobs WHERE job_id = {}",
        sql_str(JOB)
    );
    let j = rows(&e, &q).await.expect("jobs");
    assert_eq!(j.len(), 1);
    let l = rows(
        &e,
        &format!("SELECT limiter FROM jobs WHERE job_id = {}", sql_str(JOB)),
    )
    .await
    .expect("limiter");
    assert_eq!(l[0]["limiter"], "tensor");
    for (k, v) in [
        ("g", r.gpu_seconds),
        ("i", r.idle_gpu_seconds),
        ("e", r.energy_joules),
        ("c", r.cost_usd),
        ("ic", r.idle_cost_usd),
    ] {
        assert!(close(f(&j[0], k).expect(k), v), "{k}: {:?} vs {v}", j[0][k]);
    }
    // Per-GPU seconds add up to the totals.
    let per: f64 = r.per_gpu.iter().map(|g| g.gpu_seconds).sum();
    assert!(close(per, r.gpu_seconds));

    let g = &r.per_gpu;
    assert_eq!(g.len(), 4);
    assert_eq!(g[2].gpu_index, Some(2));
    assert!(close(g[2].idle_minutes, 10.0));
    assert_eq!(g[0].idle_minutes, 0.0);
    assert_eq!(g[0].xid_events, 1, "only the XID inside the job counts");
    assert_eq!(r.events.len(), 1);
    // The SW power cap is never throttling: it is the informational power_capped.
    assert_eq!(g[1].throttled_share, Some(0.0));
    assert!(close(
        g[1].power_capped_share.expect("reasons"),
        31.0 / 61.0
    ));
    assert_eq!(g[0].throttled_share, Some(0.0));
    assert_eq!(
        g[2].throttled_share,
        Some(0.0),
        "0x1 (GPU idle) is not throttling"
    );
    assert!(close(g[3].peak_memory_share.expect("memory"), 0.05));
    assert!(close(g[0].mean_sm_active.expect("sm"), 0.8));
    assert!(close(g[0].mean_tensor_active.expect("tensor"), 0.4));
    assert!(close(g[3].max_utilization.expect("util"), 0.95));

    // Limiters: dense tensor work, idle, tiny kernels (latency); the job's is tensor.
    let limiters: Vec<Option<&str>> = g.iter().map(|g| g.limiter.as_deref()).collect();
    assert_eq!(
        limiters,
        [
            Some("tensor"),
            Some("tensor"),
            Some("idle"),
            Some("latency")
        ]
    );
    assert_eq!(r.limiter.as_deref(), Some("tensor"));
    let weighted: f64 = r.limiter_seconds.values().sum();
    assert!(close(weighted, r.gpu_seconds), "{weighted}");
    assert!(close(r.limiter_seconds["tensor"], 1200.0));
    assert!(close(g[0].limiter_figures["tensor"], 0.4));
    // Roofline: no SM clock in these samples, so the shares are the activities themselves.
    assert_eq!(g[0].roofline.model.as_deref(), Some("H100 SXM5"));
    assert!(close(g[0].roofline.compute_share.expect("compute"), 0.4));
    assert!(close(g[0].roofline.memory_share.expect("dram"), 0.3));
    assert!(g[0].missing_counters.contains(&"fp32_active".to_string()));
    assert!(!g[0].missing_counters.contains(&"sm_active".to_string()));

    let rules: Vec<&str> = r.advice.iter().map(|a| a.rule.as_str()).collect();
    assert_eq!(
        rules,
        [
            "idle_gpus",
            "power_capped",
            "tiny_kernels",
            "low_memory",
            "xid"
        ],
        "{:#?}",
        r.advice
    );
    assert!(r.advice[1].informational);
    assert_eq!(r.advice[1].gpu_index, Some(1));
    assert_eq!(r.advice[1].threshold, Some(0.1));
    assert!(
        r.advice[0].figure.contains("1 of 4 GPUs"),
        "{}",
        r.advice[0].figure
    );
    assert!(r.advice[0].advice.contains("request 3 GPUs"));
    assert!(r.advice[1].figure.contains("51%"), "{}", r.advice[1].figure);
    assert!(r.advice[4].figure.contains("XID 79"));

    // Ended once two intervals pass without a sample.
    let later = job_report(&e, &cost(), &JobsConfig::default(), JOB, T0 + 700 * S)
        .await
        .expect("report")
        .expect("job");
    assert_eq!(later.state, "ended");
    assert!(render_text(&later).contains("request 3 GPUs"));
    // The job's accounting: 600 s of a 2-hour limit, so the ended job gets the time_limit note.
    assert_eq!(later.charge.account.as_deref(), Some("physics"));
    assert_eq!(later.charge.partition.as_deref(), Some("gpu"));
    assert_eq!(later.charge.time_limit_seconds, Some(7200));
    assert!(close(
        later.charge.time_limit_used.expect("used"),
        600.0 / 7200.0
    ));
    let last = later.advice.last().expect("notes");
    assert_eq!(last.rule, "time_limit");
    assert!(
        render_text(&later)
            .contains("account physics  partition gpu  time limit 02:00:00 (used 8%)"),
        "{}",
        render_text(&later)
    );
    assert!(
        !r.advice.iter().any(|a| a.rule == "time_limit"),
        "running: no note"
    );
}

#[tokio::test]
async fn unknown_and_hostile_job_ids_are_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = crafted(dir.path()).await;
    for id in ["nope", "' OR '1'='1", "x\\' OR 1=1 --", "42"] {
        let r = job_report(&e, &cost(), &JobsConfig::default(), id, T0)
            .await
            .expect("no sql error");
        assert!(r.is_none(), "{id}");
    }
    let list = list_jobs(
        &e,
        &ListFilter {
            user: Some("alice' OR 'a'='a".into()),
            since_ns: 0,
            until: None,
            running_only: false,
            limit: 10,
        },
        T0,
    )
    .await
    .expect("list")
    .jobs;
    assert!(list.is_empty());
    let list = list_jobs(
        &e,
        &ListFilter {
            user: Some("alice".into()),
            since_ns: 0,
            until: None,
            running_only: false,
            limit: 10,
        },
        T0 + 605 * S,
    )
    .await
    .expect("list");
    assert!(!list.truncated);
    let list = list.jobs;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].job_id, JOB);
    assert_eq!(list[0].state, "running");
    assert!(close(list[0].gpu_hours, 2400.0 / 3600.0));
    assert!(close(list[0].idle_share, 0.25));
}

/// A busy GPU of `secs` seconds, `idle` of them idle, the rest tensor-limited.
fn gpu(idx: i64, secs: f64, idle: f64) -> GpuReport {
    let mut g = GpuReport {
        host: "n1".into(),
        gpu_uuid: format!("GPU-{idx}"),
        gpu_index: Some(idx),
        gpu_seconds: secs,
        idle_gpu_seconds: idle,
        mean_utilization: Some(0.9),
        mean_sm_active: Some(0.6),
        busy_sm_active: Some(0.6),
        peak_memory_used_bytes: Some(40 * GIB),
        memory_total_bytes: Some(80 * GIB),
        peak_memory_share: Some(0.5),
        throttled_share: Some(0.0),
        power_capped_share: Some(0.0),
        ..GpuReport::default()
    };
    classes(&mut g, &[("tensor", secs - idle), ("idle", idle)]);
    g
}

/// Sets the GPU's seconds per limiter class (the rest zero).
fn classes(g: &mut GpuReport, seconds: &[(&str, f64)]) {
    g.limiter_seconds = crate::cost::limiter::LIMITERS
        .iter()
        .map(|c| (c.to_string(), 0.0))
        .collect();
    for (c, v) in seconds {
        g.limiter_seconds.insert(c.to_string(), *v);
    }
    g.limiter = crate::cost::limiter::argmax(&g.limiter_seconds);
}

fn report(per_gpu: Vec<GpuReport>) -> JobReport {
    JobReport {
        job_id: "1".into(),
        scheduler: None,
        user: None,
        name: None,
        hosts: vec!["n1".into()],
        gpus: per_gpu.len() as i64,
        first_seen: String::new(),
        last_seen: String::new(),
        first_seen_ns: 0,
        last_seen_ns: 0,
        state: "ended".into(),
        sample_interval_s: None,
        gpu_seconds: 0.0,
        idle_gpu_seconds: 0.0,
        gpu_hours: 0.0,
        idle_gpu_hours: 0.0,
        idle_share: 0.0,
        energy_joules: 0.0,
        energy_kwh: 0.0,
        cost_usd: 0.0,
        idle_cost_usd: 0.0,
        mean_utilization: None,
        limiter: None,
        limiter_seconds: BTreeMap::new(),
        work: None,
        charge: JobCharge::default(),
        per_gpu,
        events: Vec::new(),
        processes: Vec::new(),
        processes_left_out: false,
        advice: Vec::new(),
    }
}

fn notes(g: GpuReport) -> Vec<Advice> {
    advise(&report(vec![g]), &AdviceConfig::default())
}

fn rules(r: &JobReport) -> Vec<String> {
    advise(r, &AdviceConfig::default())
        .into_iter()
        .map(|a| a.rule)
        .collect()
}

fn rules_of(g: GpuReport) -> Vec<String> {
    rules(&report(vec![g]))
}

#[test]
fn a_healthy_job_gets_no_notes() {
    assert!(rules(&report(vec![gpu(0, 3600.0, 60.0), gpu(1, 3600.0, 0.0)])).is_empty());
}

/// A report of an ended job that ran `ran` seconds with a time limit of `limit`.
fn limited(ran: i64, limit: i64) -> JobReport {
    let mut r = report(vec![gpu(0, 3600.0, 0.0)]);
    r.last_seen_ns = ran * S;
    r.charge = JobCharge::of(&[], ran as f64);
    r.charge.time_limit_seconds = Some(limit);
    r.charge.time_limit_used = Some(ran as f64 / limit as f64);
    r
}

#[test]
fn time_limit_note_needs_an_ended_job_under_its_share_with_an_hour_unused() {
    let t = AdviceConfig::default();
    // 1 h of 24 h: 4%, 23 h unused.
    let a = advise(&limited(3600, 86_400), &t);
    assert_eq!(rules(&limited(3600, 86_400)), ["time_limit"]);
    assert!(
        a[0].figure
            .contains("used 4% of the requested time (01:00:00 of 1-00:00:00)"),
        "{}",
        a[0].figure
    );
    assert!(a[0].advice.contains("--time=01:12:00"), "{}", a[0].advice);
    assert_eq!(
        (a[0].value, a[0].threshold),
        (Some(3600.0 / 86_400.0), Some(0.4))
    );
    // 40% and more: quiet; under 40% but less than an hour unused: quiet.
    assert!(rules(&limited(4 * 3600, 10 * 3600)).is_empty());
    assert!(rules(&limited(600, 3600)).is_empty());
    // Still running: quiet.
    let mut running = limited(3600, 86_400);
    running.state = "running".into();
    assert!(rules(&running).is_empty());
    // No limit known: quiet.
    assert!(rules(&report(vec![gpu(0, 3600.0, 0.0)])).is_empty());
    let strict = AdviceConfig {
        time_limit_share: 0.5,
        ..AdviceConfig::default()
    };
    assert_eq!(
        advise(&limited(4 * 3600, 10 * 3600), &strict)[0].rule,
        "time_limit"
    );
}

#[test]
fn idle_gpus_rule_fires_at_its_threshold_only() {
    let t = AdviceConfig::default();
    // 79% idle: below the 80% threshold.
    assert!(rules(&report(vec![gpu(0, 1000.0, 790.0), gpu(1, 1000.0, 0.0)])).is_empty());
    let r = report(vec![gpu(0, 1000.0, 800.0), gpu(1, 1000.0, 0.0)]);
    let a = advise(&r, &t);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].rule, "idle_gpus");
    assert!(
        a[0].figure.contains("GPU 0 on n1 idle 80%"),
        "{}",
        a[0].figure
    );
    assert_eq!((a[0].value, a[0].threshold), (Some(0.8), Some(0.8)));
    assert!(
        a[0].advice.contains("request 1 GPU instead of 2"),
        "{}",
        a[0].advice
    );
    // Every GPU idle: a different advice.
    let all = advise(&report(vec![gpu(0, 1000.0, 1000.0)]), &t);
    assert!(all[0].advice.contains("sat idle most of the job"));
    // Too short a job to judge.
    assert!(rules(&report(vec![gpu(0, 200.0, 200.0)])).is_empty());
    // A site that judges only GPUs held 10 minutes.
    let strict = AdviceConfig {
        min_gpu_seconds: 1200.0,
        ..AdviceConfig::default()
    };
    assert!(advise(&report(vec![gpu(0, 1000.0, 1000.0)]), &strict).is_empty());
}

#[test]
fn limiter_notes_speak_from_a_third_of_the_busy_time() {
    // 1000 s held, 100 s idle: the busy time is 900 s, its 30% is 270 s.
    for (class, rule) in [
        ("input", "input_stall"),
        ("fp32", "no_tensor_cores"),
        ("fp16", "no_tensor_cores"),
        ("fp64", "no_tensor_cores"),
        ("host_transfer", "host_transfer_bound"),
        ("latency", "low_utilization"),
    ] {
        let mut g = gpu(0, 1000.0, 100.0);
        classes(
            &mut g,
            &[(class, 270.0), ("tensor", 630.0), ("idle", 100.0)],
        );
        let a = notes(g.clone());
        assert_eq!(a.len(), 1, "{class}: {a:#?}");
        assert_eq!(a[0].rule, rule, "{class}");
        assert!(close(a[0].value.expect("value"), 0.3), "{class}");
        assert_eq!(a[0].threshold, Some(0.3));
        assert_eq!(a[0].gpu_uuid.as_deref(), Some("GPU-0"));
        classes(
            &mut g,
            &[(class, 260.0), ("tensor", 640.0), ("idle", 100.0)],
        );
        assert!(rules_of(g).is_empty(), "{class} below its threshold");
    }
    // The advice names the pipe.
    let mut g = gpu(0, 1000.0, 0.0);
    classes(&mut g, &[("fp32", 800.0), ("tensor", 200.0)]);
    g.limiter_figures.insert("fp32".into(), 0.77);
    let a = notes(g);
    assert!(a[0].figure.contains("FP32 pipe in 80%"), "{}", a[0].figure);
    assert!(a[0].figure.contains("pipe 77% busy"), "{}", a[0].figure);
    assert!(a[0].advice.contains("TF32"));
    // A GPU idle most of the job gets idle_gpus, not a lecture about its few busy seconds.
    let mut g = gpu(0, 1000.0, 900.0);
    classes(&mut g, &[("input", 100.0), ("idle", 900.0)]);
    assert_eq!(rules_of(g), ["idle_gpus"]);
}

#[test]
fn memory_bound_needs_half_the_bandwidth_too() {
    let mut g = gpu(0, 1000.0, 0.0);
    classes(&mut g, &[("memory", 900.0), ("tensor", 100.0)]);
    g.limiter_figures.insert("memory".into(), 0.5);
    let a = notes(g.clone());
    assert_eq!(a[0].rule, "memory_bound");
    assert!(a[0].figure.contains("DRAM 50% busy"), "{}", a[0].figure);
    g.limiter_figures.insert("memory".into(), 0.38);
    assert!(rules_of(g).is_empty(), "DRAM below half its bandwidth");
}

#[test]
fn tiny_kernels_needs_busy_utilisation_and_low_sm_activity() {
    let mut g = gpu(0, 1000.0, 0.0);
    g.mean_sm_active = Some(0.2);
    g.busy_sm_active = Some(0.2);
    classes(&mut g, &[("latency", 1000.0)]);
    // tiny_kernels speaks for the latency-bound time: no low_utilization beside it.
    assert_eq!(rules_of(g.clone()), ["tiny_kernels"]);
    let a = notes(g.clone());
    assert!(
        a[0].figure.contains("utilisation 90% but SM activity 20%"),
        "{}",
        a[0].figure
    );
    g.mean_utilization = Some(0.4);
    assert_eq!(rules_of(g.clone()), ["low_utilization"]);
    // No GPM: no opinion.
    g.mean_utilization = Some(0.9);
    g.mean_sm_active = None;
    g.busy_sm_active = None;
    classes(&mut g, &[("unknown", 1000.0)]);
    assert!(rules_of(g).is_empty());
}

#[test]
fn throttling_blames_only_what_the_job_cannot_control() {
    let mut g = gpu(0, 1000.0, 0.0);
    // The SW power cap in every sample, 1390 of 1980 MHz: informational only.
    g.power_capped_share = Some(1.0);
    g.power_capped_sm_clock_mhz = Some(1390.0);
    g.sm_clock_max_mhz = Some(1980.0);
    let a = notes(g.clone());
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].rule, "power_capped");
    assert!(a[0].informational);
    assert!(
        a[0].figure
            .contains("SM clock 1390 of 1980 MHz (70% of its maximum, 30% lost)"),
        "{}",
        a[0].figure
    );
    assert!(!a[0].advice.contains("tell the administrators"));
    g.power_capped_share = Some(0.09);
    assert!(rules_of(g.clone()).is_empty());
    // HW thermal slowdown in 10% of the samples: throttled.
    g.throttled_share = Some(0.1);
    g.throttle_reasons.insert("HW thermal slowdown".into(), 0.1);
    let a = notes(g.clone());
    assert_eq!(a[0].rule, "throttled");
    assert!(
        a[0].figure.contains("HW thermal slowdown 10%"),
        "{}",
        a[0].figure
    );
    assert!(a[0].advice.contains("tell the administrators"));
    g.throttled_share = Some(0.09);
    assert!(rules_of(g).is_empty());
}

#[test]
fn low_memory_xid_and_ecc_rules() {
    let mut g = gpu(0, 1000.0, 0.0);
    g.peak_memory_used_bytes = Some(8 * GIB);
    g.peak_memory_share = Some(0.1);
    g.busy_sm_active = Some(0.3);
    g.xid_events = 2;
    g.ecc_events = 1;
    let mut r = report(vec![g.clone()]);
    for code in [79, 48] {
        r.events.push(JobEvent {
            time: String::new(),
            host: "n1".into(),
            gpu_uuid: "GPU-0".into(),
            kind: "xid".into(),
            code: Some(code),
            detail: None,
        });
    }
    assert_eq!(rules(&r), ["low_memory", "xid", "ecc"]);
    let a = advise(&r, &AdviceConfig::default());
    assert!(
        a[0].figure.contains("8.0 GiB of 80.0 GiB (10%)"),
        "{}",
        a[0].figure
    );
    assert!(
        a[1].figure.contains("2 XID events (XID 79, 48)"),
        "{}",
        a[1].figure
    );
    assert_eq!((a[1].value, a[1].unit.as_str()), (Some(2.0), "events"));
    // SMs busy half the time: the job needs the whole GPU whatever memory it uses.
    let mut busy = g.clone();
    busy.busy_sm_active = Some(0.5);
    busy.xid_events = 0;
    busy.ecc_events = 0;
    assert!(rules_of(busy).is_empty());
    // Below the thresholds; an XID speaks even in a short job.
    g.peak_memory_share = Some(0.2);
    g.gpu_seconds = 10.0;
    g.ecc_events = 0;
    assert_eq!(rules(&report(vec![g])), ["xid"]);
}

#[test]
fn the_text_report_shows_the_limiter_roofline_and_missing_counters() {
    let mut g = gpu(0, 1000.0, 0.0);
    g.gpu_model = Some("NVIDIA A100-PCIE-40GB".into());
    g.missing_counters = vec!["sm_active".into()];
    g.roofline = super::roofline::build(
        g.gpu_model.as_deref(),
        &super::roofline::Measured {
            tensor: Some(0.5),
            dram: Some(0.25),
            ..Default::default()
        },
    );
    let mut r = report(vec![g]);
    r.limiter = Some("tensor".into());
    r.limiter_seconds.insert("tensor".into(), 1000.0);
    let text = render_text(&r);
    assert!(
        text.contains("limiter tensor   (GPU time: tensor 100%)"),
        "{text}"
    );
    assert!(text.contains("tensor 50% (156.0 TFLOP/s)"), "{text}");
    assert!(text.contains("[peaks of A100 40GB]"), "{text}");
    assert!(text.contains("not read on this GPU: sm_active"), "{text}");
}

#[test]
fn state_is_running_within_two_intervals() {
    assert_eq!(state(100 * S, 81 * S, Some(10.0)), "running");
    assert_eq!(state(100 * S, 79 * S, Some(10.0)), "ended");
    assert_eq!(state(1000 * S, 0, None), "ended");
}

#[tokio::test]
async fn totals_equal_the_jobs_view_when_gpus_are_shared_with_other_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();
    let mut push = |t: i64, gpu: &str, job: Option<&str>, util: f64, energy: f64| {
        let mut r = GpuRow::new(T0 + t * S);
        r.labels[0] = Some("n1".into());
        r.labels[1] = Some(gpu.into());
        r.labels[3] = Some("NVIDIA H100 80GB HBM3".into());
        r.labels[5] = job.map(str::to_string);
        set(&mut r, "hw.gpu.utilization", Cell::F(util));
        set(&mut r, "hw.energy", Cell::F(energy));
        rows.push(r);
    };
    // GPU a: free, then job A after a gap (capped), then job B; energy counter reset in job B.
    for (t, job, util, e) in [
        (0, None, 0.0, 100.0),
        (500, Some("A"), 0.9, 9000.0),
        (510, Some("A"), 0.0, 9500.0),
        (520, Some("B"), 0.5, 9700.0),
        (530, Some("B"), 0.5, 50.0),
    ] {
        push(t, "GPU-a", job, util, e);
    }
    // GPU b: job B only.
    for (t, e) in [(515, 10.0), (525, 20.0), (535, 30.0)] {
        push(t, "GPU-b", Some("B"), 1.0, e);
    }
    // GPU c: a free sample, then job A more than an hour later (the report looks further back
    // than its first hour for the sample before the job's first).
    for (t, job, e) in [
        (0, None, 100.0),
        (5000, Some("A"), 900.0),
        (5010, Some("A"), 950.0),
    ] {
        push(t, "GPU-c", job, 0.9, e);
    }
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.path().to_path_buf())
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("store");
    store
        .write(&WriteBatch::from_rows(&rows, &[]).expect("batch"))
        .expect("write");
    let read: Arc<dyn ReadStore> = Arc::new(store);
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    cost()
        .register(e.context(), &crate::cost::JobsConfig::default())
        .await
        .expect("register");
    for job in ["A", "B"] {
        let r = job_report(&e, &cost(), &JobsConfig::default(), job, T0)
            .await
            .expect("report")
            .expect("job");
        let j = super::rows(
            &e,
            &format!(
                "SELECT sum(gpu_seconds) AS g, sum(idle_gpu_seconds) AS i, sum(energy_joules) AS e, \
                 sum(cost_usd) AS c, sum(idle_cost_usd) AS ic FROM jobs WHERE job_id = '{job}'"
            ),
        )
        .await
        .expect("jobs");
        for (k, v) in [
            ("g", r.gpu_seconds),
            ("i", r.idle_gpu_seconds),
            ("e", r.energy_joules),
            ("c", r.cost_usd),
            ("ic", r.idle_cost_usd),
        ] {
            assert!(
                close(f(&j[0], k).expect(k), v),
                "job {job} {k}: {:?} vs {v}",
                j[0][k]
            );
        }
        let per: f64 = r.per_gpu.iter().map(|g| g.gpu_seconds).sum();
        assert!(close(per, r.gpu_seconds), "job {job}");
    }
    // Job A by hand: GPU a 60 s (gap capped) + 10 s, 8900 J + 500 J; GPU c the same 60 s + 10 s,
    // 800 J + 50 J (the energy counter covers the hole).
    let a = job_report(&e, &cost(), &JobsConfig::default(), "A", T0)
        .await
        .expect("report")
        .expect("job");
    assert_eq!(a.gpus, 2);
    assert!(close(a.gpu_seconds, 140.0), "{}", a.gpu_seconds);
    assert!(close(a.idle_gpu_seconds, 10.0));
    assert!(close(a.energy_joules, 10_250.0), "{}", a.energy_joules);
}
