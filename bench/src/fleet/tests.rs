//! The fleet's shape: determinism, counters and ranges, and each phase at the trace's levels
//! (docs/benchmarks.md's table, from `h100-trace-a.csv`).

use super::*;
use std::collections::HashSet;

fn fleet(seed: u64) -> Fleet {
    Fleet::new(FleetConfig {
        hosts: 4,
        gpus_per_host: 8,
        interval_ms: 10_000,
        start_ms: 1_790_000_000_000,
        seed,
        job_hosts: 0,
    })
}

fn run(f: &mut Fleet, rounds: u64) -> Vec<Vec<Vec<Sample>>> {
    let mut all = vec![Vec::new(); f.hosts()];
    let mut out = Vec::new();
    for k in 0..rounds {
        for (h, per_host) in all.iter_mut().enumerate() {
            f.scrape(h, k, &mut out);
            per_host.push(out.clone());
        }
    }
    all
}

#[test]
fn the_multi_host_job_holds_every_gpu_of_its_hosts_all_the_time() {
    let mut f = Fleet::new(FleetConfig {
        job_hosts: 2,
        ..fleet(3).config
    });
    // A day at 10 s: the job never ends, the other hosts' jobs come and go.
    let all = run(&mut f, 8640);
    for per_host in &all[..2] {
        assert!(per_host.iter().flatten().all(|s| s.job == Some(BIG_JOB_ID)));
    }
    let others: HashSet<Option<u64>> = all[2..].iter().flatten().flatten().map(|s| s.job).collect();
    assert!(others.len() > 2 && !others.contains(&Some(BIG_JOB_ID)));
    // Job ids are unique across hosts: each host's ids lie in its own range.
    for (h, per_host) in all.iter().enumerate().skip(2) {
        let first = FIRST_JOB_ID + h as u64 * JOB_IDS_PER_HOST;
        for id in per_host.iter().flatten().filter_map(|s| s.job) {
            assert!(
                (first..first + JOB_IDS_PER_HOST).contains(&id),
                "host {h}: {id}"
            );
        }
    }
}

#[test]
fn same_seed_same_samples_and_other_seed_differs() {
    let a = run(&mut fleet(7), 50);
    let b = run(&mut fleet(7), 50);
    let c = run(&mut fleet(8), 50);
    let vals = |x: &Vec<Vec<Vec<Sample>>>| {
        x.iter()
            .flatten()
            .flatten()
            .flat_map(|s| s.values.to_vec())
            .collect::<Vec<f64>>()
    };
    assert_eq!(vals(&a), vals(&b));
    assert_ne!(vals(&a), vals(&c));
}

#[test]
fn counters_are_monotone_and_values_in_range() {
    let all = run(&mut fleet(3), 2000);
    for host in &all {
        for gpu in 0..8 {
            let series: Vec<&Sample> = host.iter().map(|round| &round[gpu]).collect();
            for w in series.windows(2) {
                assert!(w[1].time_ms > w[0].time_ms, "time goes forward");
                let dt = w[1].time_ms - w[0].time_ms;
                assert!((9_984..=10_016).contains(&dt), "interval {dt}");
                assert!(w[1].values[ENERGY] > w[0].values[ENERGY], "energy grows");
                assert!(w[1].values[ECC_SBE] >= w[0].values[ECC_SBE]);
            }
            for s in &series {
                for i in [SM_ACTIVE, SM_OCCUPANCY, TENSOR, DRAM, FP64, FP32, FP16] {
                    let v = s.values[i];
                    assert!((0.0..=1.0).contains(&v), "{} {v}", FIELDS[i]);
                }
                assert!((0.0..=100.0).contains(&s.values[GPU_UTIL]));
                assert!(s.values[POWER] >= 50.0 && s.values[POWER] <= 710.0);
                assert!(s.values[FB_USED] <= s.values[FB_TOTAL]);
                assert_eq!(s.values[FB_TOTAL], FB_TOTAL_MIB);
            }
        }
    }
}

/// The samples of a few hours of `seed`'s fleet, flattened.
fn hours_of(seed: u64, rounds: u64) -> Vec<Sample> {
    run(&mut fleet(seed), rounds)
        .into_iter()
        .flatten()
        .flatten()
        .collect()
}

#[test]
fn fleet_shows_every_state_jobs_change_and_idle_jobs_exist() {
    let samples = hours_of(11, 3000);
    let jobs: HashSet<u64> = samples.iter().filter_map(|s| s.job).collect();
    assert!(jobs.len() > 8, "jobs start and end: {}", jobs.len());
    assert!(
        samples.iter().any(|s| s.job.is_none()),
        "some GPUs are free"
    );
    // Most GPUs are busy: a production cluster.
    let held = samples.iter().filter(|s| s.job.is_some()).count();
    assert!(
        held * 100 > samples.len() * 60,
        "{held} of {}",
        samples.len()
    );
    // Tensor-bound, memory-bound, FP32, FP64, light and allocated-but-idle samples all occur.
    assert!(samples.iter().any(|s| s.values[TENSOR] > 0.8));
    assert!(samples.iter().any(|s| s.values[DRAM] > 0.8));
    assert!(samples.iter().any(|s| s.values[FP32] > 0.4));
    assert!(samples.iter().any(|s| s.values[FP64] > 0.4));
    assert!(samples.iter().any(|s| s.values[GPU_UTIL] == 3.0));
    assert!(
        samples
            .iter()
            .any(|s| s.job.is_some() && s.values[GPU_UTIL] == 0.0 && s.values[FB_USED] > 10_000.0)
    );
    // Flat columns stay flat, noisy ones are noisy.
    let distinct = |i: usize| {
        samples
            .iter()
            .map(|s| s.values[i].to_bits())
            .collect::<HashSet<_>>()
            .len()
    };
    assert_eq!(distinct(MEM_CLOCK), 1);
    assert_eq!(distinct(FB_TOTAL), 1);
    assert!(distinct(POWER) > samples.len() / 4);
}

/// Median of field `i` over the samples that `pick` keeps (a sample just after a phase change
/// still shows the power of the one before), and how many there were.
fn median(samples: &[Sample], pick: impl Fn(&Sample) -> bool, i: usize) -> (f64, usize) {
    let mut kept: Vec<f64> = samples
        .iter()
        .filter(|s| pick(s))
        .map(|s| s.values[i])
        .collect();
    kept.sort_by(f64::total_cmp);
    (
        kept.get(kept.len() / 2).copied().unwrap_or(f64::NAN),
        kept.len(),
    )
}

#[test]
fn each_state_is_at_the_traces_levels() {
    let samples = hours_of(5, 2000);
    let near = |(m, n): (f64, usize), want: f64, tol: f64, what: &str| {
        assert!(n > 0, "no {what} samples");
        assert!((m - want).abs() <= tol, "{what}: median {m}, trace {want}");
    };
    // Free: 73.5 W, 480 MiB, idle clocks with the GPU-idle reason, nothing busy.
    let free = |s: &Sample| s.job.is_none() && s.values[SM_CLOCK] == 345.0;
    near(median(&samples, free, POWER), 73.5, 3.0, "free power");
    near(
        median(&samples, free, FB_USED),
        FB_FREE_GPU_MIB,
        0.0,
        "free memory",
    );
    near(median(&samples, free, REASONS), 1.0, 0.0, "free reasons");
    near(median(&samples, free, GPU_UTIL), 0.0, 0.0, "free util");
    // Tensor-bound compute (`matmul`): util 100, tensor ~0.93, power-capped near 697 W.
    let matmul = |s: &Sample| s.values[TENSOR] > 0.88;
    near(
        median(&samples, matmul, GPU_UTIL),
        100.0,
        1.0,
        "matmul util",
    );
    near(
        median(&samples, matmul, SM_ACTIVE),
        0.96,
        0.03,
        "matmul sm active",
    );
    near(median(&samples, matmul, POWER), 690.0, 25.0, "matmul power");
    near(
        median(&samples, matmul, REASONS),
        4.0,
        0.5,
        "matmul reasons",
    );
    // Memory-bound (`copy`): DRAM ~0.90, no tensor work, ~400 W at boost clock.
    let copy = |s: &Sample| s.values[DRAM] > 0.85;
    near(median(&samples, copy, TENSOR), 0.0, 0.0, "copy tensor");
    near(
        median(&samples, copy, MEM_UTIL),
        100.0,
        1.0,
        "copy mem util",
    );
    near(median(&samples, copy, POWER), 398.0, 15.0, "copy power");
    near(median(&samples, copy, SM_CLOCK), 1980.0, 0.0, "copy clock");
    // Light kernels (`small`): util 3 %, ~127 W.
    let small = |s: &Sample| s.job.is_some() && s.values[GPU_UTIL] == 3.0;
    near(
        median(&samples, small, SM_ACTIVE),
        0.019,
        0.003,
        "small sm active",
    );
    near(median(&samples, small, POWER), 127.0, 6.0, "small power");
    // Held, no work (`hold`): util 0, ~126 W, memory allocated.
    let hold = |s: &Sample| s.job.is_some() && s.values[GPU_UTIL] == 0.0 && s.values[POWER] < 140.0;
    near(median(&samples, hold, POWER), 126.0, 6.0, "hold power");
    assert!(median(&samples, hold, FB_USED).0 > 4_000.0, "hold memory");
}
