//! Tests of the simulated node.

use super::*;
use crate::collect::{GpuEvent, ProcessSample};
use std::collections::{HashMap, HashSet};

const T0: u64 = 1_795_331_484_576_304_098;

/// Collect over `hours` with irregular steps of 1–30 s.
fn run(fleet: &mut Fleet, hours: f64) -> Vec<GpuSample> {
    let mut steps = Rng::new(99);
    let mut t = T0;
    let end = T0 + secs(hours * 3600.0);
    let mut out = Vec::new();
    while t < end {
        out.extend(fleet.collect(t).unwrap());
        t += secs(steps.range(1.0, 30.0));
    }
    out
}

fn ratios(s: &GpuSample) -> [Option<f64>; 9] {
    [
        s.gpu_utilization,
        s.memory_utilization,
        s.sm_active,
        s.sm_occupancy,
        s.tensor_active,
        s.dram_active,
        s.fp64_active,
        s.fp32_active,
        s.fp16_active,
    ]
}

#[test]
fn ratios_in_unit_interval_and_values_present() {
    let mut fleet = Fleet::new(8, 1);
    for s in run(&mut fleet, 3.0) {
        for r in ratios(&s) {
            let r = r.expect("synthetic fills every ratio");
            assert!((0.0..=1.0).contains(&r), "{r} out of range in {s:?}");
        }
        assert_eq!(s.memory_total_bytes, Some(MEMORY_TOTAL_BYTES));
        assert_eq!(s.memory_clock_mhz, Some(2619));
        assert!(s.power_watts.unwrap() > 50.0 && s.power_watts.unwrap() < 720.0);
        assert!(s.memory_used_bytes.unwrap() <= MEMORY_TOTAL_BYTES);
        assert_eq!(s.gpu_model, MODEL);
    }
}

#[test]
fn energy_never_decreases() {
    let mut fleet = Fleet::new(8, 7);
    let mut last: HashMap<String, f64> = HashMap::new();
    for s in run(&mut fleet, 4.0) {
        let e = s.energy_joules.unwrap();
        if let Some(prev) = last.insert(s.gpu_uuid.clone(), e) {
            assert!(
                e >= prev,
                "energy went down on {}: {prev} -> {e}",
                s.gpu_uuid
            );
        }
    }
}

#[test]
fn energy_matches_power() {
    // A free GPU at ~73.5 W for 100 s gains ~7.35 kJ.
    let mut fleet = Fleet::new(8, 3);
    let first = fleet.collect(T0).unwrap();
    let later = fleet.collect(T0 + 100 * SEC).unwrap();
    for (a, b) in first.iter().zip(&later) {
        let de = b.energy_joules.unwrap() - a.energy_joules.unwrap();
        let p = (a.power_watts.unwrap() + b.power_watts.unwrap()) / 2.0;
        if a.job.is_none() && b.job.is_none() {
            assert!((de - p * 100.0).abs() < 0.05 * p * 100.0, "{de} vs {p}");
        }
        assert!(de > 0.0);
    }
}

#[test]
fn jobs_start_and_end() {
    let mut fleet = Fleet::new(8, 11);
    let samples = run(&mut fleet, 4.0);
    let ids: HashSet<String> = samples
        .iter()
        .filter_map(|s| s.job.as_ref().map(|j| j.id.clone()))
        .collect();
    assert!(ids.len() >= 4, "only {} jobs in 4 h: {ids:?}", ids.len());
    assert!(samples.iter().any(|s| s.job.is_none()), "no free gpu ever");
    let mut numeric: Vec<u64> = ids.iter().map(|i| i.parse().unwrap()).collect();
    numeric.sort_unstable();
    assert!(numeric[0] >= 10_000 && numeric[0] < 20_000);
    for s in samples.iter().filter(|s| s.job.is_some()) {
        let job = s.job.as_ref().unwrap();
        assert_eq!(job.scheduler, "slurm");
        assert!(USERS.contains(&job.user.as_str()));
    }
}

#[test]
fn allocated_but_idle_stretch_occurs() {
    for seed in 0..5 {
        let mut fleet = Fleet::new(8, seed);
        let samples = run(&mut fleet, 3.0);
        // Longest run of idle-allocated samples per gpu, in simulated seconds.
        let mut start: HashMap<String, u64> = HashMap::new();
        let mut longest = 0u64;
        for s in &samples {
            let idle = s.job.is_some()
                && s.gpu_utilization.unwrap() < 0.01
                && s.memory_used_bytes.unwrap() > (1u64 << 30) as i64;
            if idle {
                let begun = *start.entry(s.gpu_uuid.clone()).or_insert(s.time_unix_nano);
                longest = longest.max(s.time_unix_nano - begun);
            } else {
                start.remove(&s.gpu_uuid);
            }
        }
        assert!(
            longest >= 30 * MIN,
            "seed {seed}: longest idle-allocated stretch {} s",
            longest / SEC
        );
    }
}

#[test]
fn phases_look_like_the_trace() {
    let mut fleet = Fleet::new(8, 5);
    let samples = run(&mut fleet, 4.0);
    let busy: Vec<&GpuSample> = samples
        .iter()
        .filter(|s| s.tensor_active.unwrap() > 0.8)
        .collect();
    assert!(!busy.is_empty(), "no tensor-bound samples");
    for s in &busy {
        assert!(s.gpu_utilization.unwrap() >= 0.95);
    }
    // Power lags its target by ~1 s, so a sample just after a phase change may be lower.
    let hot = busy
        .iter()
        .filter(|s| s.power_watts.unwrap() > 550.0)
        .count();
    assert!(
        hot * 100 >= busy.len() * 95,
        "{hot} of {} above 550 W",
        busy.len()
    );
    assert!(
        busy.iter()
            .any(|s| s.clock_event_reasons == Some(REASON_SW_POWER_CAP))
    );
    let copy = samples.iter().find(|s| s.dram_active.unwrap() > 0.8);
    let copy = copy.expect("no memory-bound samples");
    assert_eq!(copy.tensor_active, Some(0.0));
    let small = samples
        .iter()
        .find(|s| s.gpu_utilization == Some(0.03))
        .expect("no small-kernel samples");
    assert!(small.sm_active.unwrap() < 0.03);
    let free: Vec<&GpuSample> = samples.iter().filter(|s| s.job.is_none()).collect();
    let cool = free
        .iter()
        .filter(|s| s.power_watts.unwrap() < 140.0)
        .count();
    assert!(
        cool * 100 >= free.len() * 98,
        "{cool} of {} below 140 W",
        free.len()
    );
    assert!(
        free.iter()
            .all(|s| s.memory_used_bytes == Some(MEMORY_FREE_BYTES))
    );
    let idle = samples
        .iter()
        .filter(|s| s.job.is_none() && s.sm_clock_mhz == Some(SM_CLOCK_IDLE_MHZ))
        .count();
    assert!(idle > 0);
    assert!(
        samples
            .iter()
            .filter(|s| s.sm_clock_mhz == Some(SM_CLOCK_IDLE_MHZ))
            .all(|s| s.clock_event_reasons == Some(REASON_GPU_IDLE))
    );
}

#[test]
fn clock_stays_high_after_a_job_ends() {
    let mut fleet = Fleet::new(8, 2);
    let mut t = T0;
    fleet.collect(t).unwrap();
    // Step 1 s at a time until some gpu is released, then look at the next seconds.
    let mut seen = false;
    for _ in 0..(6 * 3600) {
        t += SEC;
        let samples = fleet.collect(t).unwrap();
        for (i, s) in samples.iter().enumerate() {
            if let Some(r) = fleet.gpus[i].released_at
                && s.job.is_none()
            {
                let since = t - r;
                if since < 2 * SEC {
                    assert_eq!(s.sm_clock_mhz, Some(SM_CLOCK_MAX_MHZ));
                    seen = true;
                } else if since >= 5 * SEC {
                    assert_eq!(s.sm_clock_mhz, Some(SM_CLOCK_IDLE_MHZ));
                }
            }
        }
        if seen && t > T0 + 3600 * SEC {
            break;
        }
    }
    assert!(seen, "no job ended in 6 h");
}

#[test]
fn deterministic_by_seed() {
    let a = run(&mut Fleet::new(4, 42), 1.0);
    let b = run(&mut Fleet::new(4, 42), 1.0);
    assert_eq!(a, b);
    let c = run(&mut Fleet::new(4, 43), 1.0);
    assert_ne!(a, c);
    assert_ne!(Fleet::new(4, 42).uuids(), Fleet::new(4, 43).uuids());
}

#[test]
fn schedule_does_not_depend_on_sampling_rate() {
    // Same seed and start, sampled every 5 s or every 60 s: the same jobs at the same times.
    let mut fine = Fleet::new(8, 9);
    let mut coarse = Fleet::new(8, 9);
    let mut t = T0;
    while t <= T0 + 2 * 3600 * SEC {
        let f = fine.collect(t).unwrap();
        if (t - T0).is_multiple_of(60 * SEC) {
            let c = coarse.collect(t).unwrap();
            let jobs = |v: &[GpuSample]| v.iter().map(|s| s.job.clone()).collect::<Vec<_>>();
            assert_eq!(jobs(&f), jobs(&c));
            for (x, y) in f.iter().zip(&c) {
                let (ex, ey) = (x.energy_joules.unwrap(), y.energy_joules.unwrap());
                assert!((ex - ey).abs() < 1e-3 * ex, "{ex} vs {ey}");
            }
        }
        t += 5 * SEC;
    }
}

#[test]
fn handles_time_going_backwards_and_big_jumps() {
    let mut fleet = Fleet::new(2, 1);
    let a = fleet.collect(T0).unwrap();
    let b = fleet.collect(T0 - 10 * SEC).unwrap();
    assert_eq!(a[0].energy_joules, b[0].energy_joules);
    let c = fleet.collect(T0 + 3 * 24 * 3600 * SEC).unwrap();
    assert!(c[0].energy_joules.unwrap() > a[0].energy_joules.unwrap());
}

#[test]
fn uuid_format() {
    let fleet = Fleet::new(3, 0);
    let uuids = fleet.uuids();
    assert_eq!(uuids.iter().collect::<HashSet<_>>().len(), 3);
    for u in uuids {
        assert_eq!(
            u.len(),
            "GPU-d853f77f-20d8-fea5-b52e-db4f7c0749c4".len(),
            "{u}"
        );
        assert!(u.starts_with("GPU-"));
    }
}

#[test]
fn zero_and_one_gpu() {
    assert!(Fleet::new(0, 1).collect(T0).unwrap().is_empty());
    let samples = run(&mut Fleet::new(1, 1), 2.0);
    assert!(samples.iter().all(|s| s.gpu_index == 0));
}

/// Collect every `step` for `hours`, returning the samples, processes and events of each call.
fn run_all(
    fleet: &mut Fleet,
    hours: f64,
    step: u64,
) -> (Vec<GpuSample>, Vec<ProcessSample>, Vec<GpuEvent>) {
    let (mut samples, mut procs, mut events) = (Vec::new(), Vec::new(), Vec::new());
    let mut t = T0;
    while t < T0 + secs(hours * 3600.0) {
        samples.extend(fleet.collect(t).unwrap());
        procs.extend(fleet.processes());
        events.extend(fleet.events());
        t += step;
    }
    (samples, procs, events)
}

#[test]
fn each_job_gpu_has_its_process() {
    let mut fleet = Fleet::new(8, 4);
    let mut pids: HashMap<(String, String), u32> = HashMap::new();
    let mut t = T0;
    for _ in 0..2000 {
        let samples = fleet.collect(t).unwrap();
        let procs = fleet.processes();
        assert_eq!(
            procs,
            fleet.processes(),
            "processes are those of the last collect"
        );
        let busy: Vec<&GpuSample> = samples.iter().filter(|s| s.job.is_some()).collect();
        assert_eq!(procs.len(), busy.len());
        for (p, s) in procs.iter().zip(&busy) {
            assert_eq!(p.time_unix_nano, t);
            assert_eq!(p.gpu_uuid, s.gpu_uuid);
            assert_eq!(p.job, s.job);
            let used = p.used_memory_bytes.unwrap();
            assert_eq!(used, s.memory_used_bytes.unwrap() - 512_557_056);
            assert!(used > 0);
            assert_eq!(p.sm_utilization, s.gpu_utilization);
            let job = s.job.as_ref().unwrap();
            let name = p.process_name.as_deref().unwrap();
            match job.name.as_str() {
                "render-batch" => assert_eq!(name, "blender"),
                "md-sim" => assert_eq!(name, "gmx"),
                _ => assert_eq!(name, "python"),
            }
            // A job's process on a GPU keeps its pid; its ranks have distinct pids.
            let key = (job.id.clone(), p.gpu_uuid.clone());
            assert_eq!(*pids.entry(key).or_insert(p.pid), p.pid);
            assert!(p.pid >= 1000 && p.pid < 4_194_304);
        }
        let mut seen = HashSet::new();
        assert!(
            procs.iter().all(|p| seen.insert(p.pid)),
            "pid used twice at once"
        );
        t += 10 * SEC;
    }
    assert!(pids.len() > 10, "{} job processes", pids.len());
}

const XIDS: [i64; 12] = [13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95];

#[test]
fn faults_are_rare_known_and_counted() {
    let mut fleet = Fleet::new(8, 6);
    let (samples, _, events) = run_all(&mut fleet, 48.0, 30 * SEC);
    assert!(!events.is_empty());
    let mut xids: HashMap<i64, usize> = HashMap::new();
    for e in &events {
        match e.kind.as_str() {
            "xid" => {
                assert!(XIDS.contains(&e.code), "{e:?}");
                assert!(e.detail.starts_with(&format!("xid {}: ", e.code)), "{e:?}");
                *xids.entry(e.code).or_default() += 1;
            }
            "ecc_sbe" | "ecc_dbe" => assert_eq!(e.code, 0),
            other => panic!("unexpected kind {other}"),
        }
        assert_eq!(fleet.uuids()[e.gpu_index as usize], e.gpu_uuid);
    }
    // Mostly application faults; hardware ones are rarer.
    let app: usize = [13, 31, 43, 45]
        .iter()
        .map(|c| xids.get(c).unwrap_or(&0))
        .sum();
    let hw: usize = [48, 63, 64, 79, 94, 95]
        .iter()
        .map(|c| xids.get(c).unwrap_or(&0))
        .sum();
    assert!(app > hw, "app {app}, hardware {hw}: {xids:?}");
    assert!(app > 0 && hw > 0, "{xids:?}");
    // Rates: a few XIDs per node-hour at most (the degraded board makes them visible).
    let per_hour = xids.values().sum::<usize>() as f64 / 48.0;
    assert!(per_hour < 8.0, "{per_hour} XIDs per hour");

    // The counters only increase, and the XID counter of each GPU equals its XID events.
    let mut last: HashMap<String, [i64; 5]> = HashMap::new();
    for s in &samples {
        let c = [
            s.ecc_sbe_volatile_total.unwrap(),
            s.ecc_dbe_volatile_total.unwrap(),
            s.remapped_rows_uncorrectable.unwrap(),
            s.remapped_rows_failure.unwrap(),
            s.xid_errors_total.unwrap(),
        ];
        if let Some(prev) = last.insert(s.gpu_uuid.clone(), c) {
            assert!(
                prev.iter().zip(&c).all(|(a, b)| a <= b),
                "{prev:?} -> {c:?}"
            );
        }
    }
    for (uuid, c) in &last {
        let n = events
            .iter()
            .filter(|e| e.kind == "xid" && &e.gpu_uuid == uuid)
            .count() as i64;
        assert_eq!(c[4], n, "{uuid}");
    }
    // Only the degraded board has memory errors.
    let with_ecc: HashSet<&String> = last
        .iter()
        .filter(|(_, c)| c[0] > 0 || c[1] > 0)
        .map(|(u, _)| u)
        .collect();
    assert_eq!(with_ecc.len(), 1, "{last:?}");
}

#[test]
fn hot_board_and_power_brake_set_clock_event_reasons() {
    let mut fleet = Fleet::new(8, 3);
    let (samples, _, _) = run_all(&mut fleet, 24.0, 10 * SEC);
    let thermal: Vec<&GpuSample> = samples
        .iter()
        .filter(|s| s.clock_event_reasons.unwrap() & 0x20 != 0)
        .collect();
    assert!(!thermal.is_empty(), "no thermal slowdown in 24 h");
    for s in &thermal {
        assert!(s.temperature_celsius.unwrap() >= 84.0, "{s:?}");
        assert!(s.sm_clock_mhz.unwrap() <= 1155, "{s:?}");
        assert!(s.job.is_some());
    }
    let hot: HashSet<&String> = thermal.iter().map(|s| &s.gpu_uuid).collect();
    assert_eq!(hot.len(), 1, "one hot board");
    assert!(
        samples
            .iter()
            .any(|s| s.clock_event_reasons.unwrap() & 0x40 != 0)
    );
    let braked: Vec<&GpuSample> = samples
        .iter()
        .filter(|s| s.clock_event_reasons.unwrap() & 0x80 != 0)
        .collect();
    assert!(!braked.is_empty(), "no power brake in 24 h");
    assert!(braked.iter().all(|s| s.sm_clock_mhz.unwrap() <= 1095));
    // The power-capped compute phase still shows the SW power cap alone on the other boards.
    assert!(
        samples
            .iter()
            .any(|s| s.clock_event_reasons == Some(REASON_SW_POWER_CAP))
    );
}

#[test]
fn faults_do_not_depend_on_sampling_rate() {
    let until = |v: Vec<GpuEvent>| -> Vec<GpuEvent> {
        v.into_iter()
            .filter(|e| e.time_unix_nano < T0 + 11 * 3600 * SEC)
            .collect()
    };
    let fine = until(run_all(&mut Fleet::new(8, 8), 12.0, 5 * SEC).2);
    let coarse = until(run_all(&mut Fleet::new(8, 8), 12.0, 60 * SEC).2);
    assert!(fine.len() > 10, "{} events", fine.len());
    assert!(fine == coarse, "events differ with the sampling rate");
    let again = until(run_all(&mut Fleet::new(8, 8), 12.0, 5 * SEC).2);
    assert_eq!(fine, again);
}

/// The demo's fleets (defaults: 4 hosts of 8 GPUs, seeds 1..=4; the dashboards test: 3 hosts of
/// 4) show XID and ECC events in every hour of their first day, so a dashboard over the last
/// hour of a demo has some.
#[test]
fn demo_fleets_have_events_every_hour() {
    for (hosts, gpus) in [(4u64, 8usize), (3, 4)] {
        let mut events = Vec::new();
        for seed in 1..=hosts {
            events.extend(run_all(&mut Fleet::new(gpus, seed), 26.0, 60 * SEC).2);
        }
        let mut start = T0;
        while start + 3600 * SEC <= T0 + 26 * 3600 * SEC {
            let inside = |e: &&GpuEvent| (start..start + 3600 * SEC).contains(&e.time_unix_nano);
            let xid = events
                .iter()
                .filter(inside)
                .filter(|e| e.kind == "xid")
                .count();
            let ecc = events
                .iter()
                .filter(inside)
                .filter(|e| e.kind.starts_with("ecc"))
                .count();
            assert!(
                xid > 0 && ecc > 0,
                "{hosts}x{gpus}: hour from +{} s: {xid} XID, {ecc} ECC events",
                (start - T0) / SEC
            );
            start += 10 * 60 * SEC;
        }
    }
}

/// Job ids, their number and lengths over `hours` of a node built with `options`.
fn jobs_seen(options: NodeOptions, hours: f64) -> (Vec<u64>, Vec<GpuSample>) {
    let mut fleet = Fleet::with_options(8, 21, options);
    let samples = run(&mut fleet, hours);
    let mut ids: Vec<u64> = samples
        .iter()
        .filter_map(|s| s.job.as_ref().map(|j| j.id.parse().unwrap()))
        .collect::<HashSet<u64>>()
        .into_iter()
        .collect();
    ids.sort_unstable();
    (ids, samples)
}

#[test]
fn a_standing_job_holds_every_gpu_all_the_time() {
    let options = NodeOptions {
        standing_job: Some(StandingJob {
            id: 777,
            user: "alice",
        }),
        first_job_id: Some(5_000),
        ..NodeOptions::default()
    };
    let (ids, samples) = jobs_seen(options, 6.0);
    assert_eq!(ids, vec![777]);
    for s in &samples {
        let job = s.job.as_ref().unwrap();
        assert_eq!(
            (job.user.as_str(), job.name.as_str()),
            ("alice", "train-llm")
        );
    }
    // It works, with the training job's phases, and never hangs for long.
    assert!(samples.iter().any(|s| s.tensor_active.unwrap() > 0.8));
    assert!(samples.iter().any(|s| s.dram_active.unwrap() > 0.8));
    let compute = samples
        .iter()
        .filter(|s| s.tensor_active.unwrap() > 0.8)
        .count();
    assert!(
        compute * 2 > samples.len(),
        "{compute} of {}",
        samples.len()
    );
}

#[test]
fn options_set_job_ids_lengths_and_start_without_demo_jobs() {
    let quiet = NodeOptions {
        demo_jobs: false,
        first_job_id: Some(4_200_000),
        ..NodeOptions::default()
    };
    // Without demo jobs the node starts free and fills as jobs arrive.
    let mut fresh = Fleet::with_options(8, 21, quiet.clone());
    assert!(fresh.collect(T0).unwrap().iter().all(|s| s.job.is_none()));
    let (short, _) = jobs_seen(quiet.clone(), 12.0);
    assert!(short[0] >= 4_200_000, "{short:?}");
    let slow = NodeOptions {
        job_time_scale: 6.0,
        ..quiet
    };
    let (long, _) = jobs_seen(slow, 12.0);
    assert!(
        long.len() * 3 < short.len(),
        "jobs six times longer, so fewer: {} vs {}",
        long.len(),
        short.len()
    );
}

#[test]
fn fault_rate_scale_thins_the_faults() {
    let events = |scale: f64| {
        let mut fleet = Fleet::with_options(
            8,
            4,
            NodeOptions {
                fault_rate_scale: scale,
                ..NodeOptions::default()
            },
        );
        run(&mut fleet, 6.0);
        fleet.events().len()
    };
    let (demo, healthy) = (events(1.0), events(0.01));
    assert!(demo > 50 && healthy * 3 < demo, "{demo} vs {healthy}");
}
