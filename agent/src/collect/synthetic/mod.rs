//! A simulated node of NVIDIA H100s running Slurm-like jobs, calibrated on a real H100 trace
//! (`shared/data/h100-trace-a.csv`; the figures are in agent/README.md).
//!
//! # Model
//!
//! The node is a discrete-event simulation. Jobs arrive at random (exponential gaps), take
//! 1..=N GPUs (often all), run for minutes to tens of minutes and end; a GPU between jobs is
//! free. While a job runs, all its GPUs share one *phase*:
//!
//! | phase | what runs | util | sm_active | tensor | dram | power |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | compute | bf16 matrix products (or fp32 / fp64 work, by job kind) | 1.0 | 0.97 | 0.94 | 0.24 | 697 W, power-capped |
//! | copy | device-to-device copies | 1.0 | 0.99 | 0 | 0.90 | 398 W |
//! | small | tiny kernels with sleeps | 0.03 | 0.019 | 0 | 0 | 127 W |
//! | hold | memory allocated, no work | 0 | 0 | 0 | 0 | 126 W |
//!
//! A free GPU draws 73.5 W with 480 MiB used, SM clock 345 MHz and the GPU-idle clock-event bit.
//! When a job ends the GPU keeps its SM clock at 1980 MHz and ~130 W for 2.5 s, as in the trace.
//! Some jobs hold their GPUs without using them for long stretches: abandoned notebooks and
//! training jobs that hang. That is the case gpuwatch exists to find.
//!
//! Power follows its target with a 0.8 s time constant; energy is the exact integral of that
//! power, so it only ever increases. Temperatures have a fast part proportional to power and a
//! slow part that lags it (30–40 s). Noise is added where the real counters are noisy (power,
//! utilisation, activity ratios, PCIe and NVLink rates) and not where they are flat (memory
//! total, memory clock, idle clocks, ECC and remapped-row counters).
//!
//! # Processes and faults
//!
//! Each GPU of a running job holds one process of it (a rank: consecutive pids from a base taken
//! from the job id; `python`, or `blender` / `gmx` for render and molecular-dynamics jobs). Its
//! memory is the GPU's used memory less the 489 MiB the CUDA context takes outside it and its SM
//! share is the GPU's utilisation, both as in the trace.
//!
//! Faults (`health.rs`) are simulated at rates far above a healthy fleet's, so that a demo's
//! health views are never empty. A quarter of the jobs end with an application fault (XID 13,
//! 31 or 43 on one GPU, XID 45 on its others). One board of each node has wearing HBM: a
//! corrected ECC error every 5 minutes on average (XID 92 at each 20 more), an uncorrectable
//! one every 6 hours (XID 48, XID 94 or rarely 95 when a job runs there, then XID 63 as the row
//! is remapped, XID 64 once its spare rows are used up). Each node sees an NVLink error (XID 74)
//! about every 12 hours, a GPU fall off the bus (XID 79) about once a week (an event only: the
//! GPU stays), and a 20–90 s power-brake episode every 2 hours (HW power brake bit and SM clock
//! at most 1095 MHz on the GPUs that run a job). Another board runs hot under load (a failing fan): past 85 °C it shows SW
//! thermal slowdown and a lower SM clock, past 88 °C HW thermal slowdown too. The ECC, remapped
//! row and XID counters of the samples count these events since the simulated driver load.
//!
//! # Determinism
//!
//! Given the seed and the sequence of times passed to [`Fleet::collect`](crate::collect::Source),
//! the output is identical. The job schedule draws from its own random stream at event times
//! only, so it does not depend on how often the fleet is sampled; measurement noise draws from
//! a second stream; faults draw from a third, at fault times, handled in time order between the
//! job events. The first call initialises the fleet at the time it is given, with one job
//! already running and one notebook already idle (on nodes of 4 GPUs or more, a second one with
//! a time limit 12 to 24 hours on), so a demo shows both cases at once and for hours.
//!
//! # Other set-ups
//!
//! [`Fleet::new`] builds the demo node above. [`Fleet::with_options`] takes [`NodeOptions`]:
//! start empty (no demo jobs), job ids from a given first one, a training job that holds every
//! GPU for good (one node's share of a multi-node job), job lengths and arrival gaps scaled, and
//! fault rates scaled. The benchmarks' fleet (bench/src/fleet.rs) is built from such nodes, one
//! per host, so the agent and the benchmarks share one simulator. The defaults leave the demo
//! node exactly as it was: same seed, same samples.
//!
//! # Files
//!
//! | file | what |
//! | --- | --- |
//! | `mod.rs` | the [`Fleet`], its clock and event loop, the [`Source`] impl |
//! | `jobs.rs` | job arrivals, sizes, kinds, phases and stalls |
//! | `gpu.rs` | per-GPU physics (power, energy, temperatures, clocks) and one noisy reading |
//! | `health.rs` | simulated faults: XID and ECC events, remapped rows, power brake, a hot board |
//! | `rng.rs` | the deterministic random streams |

mod gpu;
mod health;
mod jobs;
mod rng;
#[cfg(test)]
mod tests;

use crate::collect::{GpuEvent, GpuSample, JobLabels, ProcessSample, Source};
use crate::error::Result;

use gpu::{Gpu, memory_temp_slow_target, temp_slow_target};
use health::Health;
use jobs::{Job, Kind, Mix, Pending, Phase, bounded_phase_end, next_phase};
use rng::{Rng, mix64, round_to, secs};

/// The product name NVML reports for the simulated GPUs.
pub const MODEL: &str = "NVIDIA H100 80GB HBM3";
/// Framebuffer size of an H100 80GB as NVML reports it, bytes.
pub const MEMORY_TOTAL_BYTES: i64 = 85_520_809_984;

const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;

/// Memory used on a free GPU (driver reservation): 480 MiB.
const MEMORY_FREE_BYTES: i64 = 503_316_480;
const GIB: f64 = 1_073_741_824.0;
const MEMORY_CLOCK_MHZ: i64 = 2619;
const SM_CLOCK_IDLE_MHZ: i64 = 345;
const SM_CLOCK_MAX_MHZ: i64 = 1980;

const IDLE_POWER_W: f64 = 73.5;
const CONTEXT_POWER_W: f64 = 126.0;
const LINGER_POWER_W: f64 = 130.0;
const POWER_CAP_W: f64 = 697.0;
/// After a job ends the driver keeps clocks and power up this long.
const LINGER_NS: u64 = 2_500_000_000;

const POWER_TAU_S: f64 = 0.8;
const TEMP_TAU_S: f64 = 30.0;
const MEMORY_TEMP_TAU_S: f64 = 40.0;

/// NVML clocks-event reason: nothing is running on the GPU.
const REASON_GPU_IDLE: i64 = 0x1;
/// NVML clocks-event reason: software power cap.
const REASON_SW_POWER_CAP: i64 = 0x4;

/// How long an arrived job waits for enough free GPUs before it goes elsewhere.
const PENDING_TIMEOUT_NS: u64 = 20 * MIN;

const USERS: &[&str] = &[
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
];

/// The Slurm account of each of [`USERS`] (a user bills one project), so statements and budgets
/// per account have something to show on the demo.
const ACCOUNTS: &[&str] = &[
    "physics", "physics", "chem", "chem", "bio", "ml", "ml", "ml",
];

/// The account of `user` ([`ACCOUNTS`]); `ml` for a user not listed.
fn account_of(user: &str) -> &'static str {
    USERS
        .iter()
        .position(|u| *u == user)
        .map_or("ml", |i| ACCOUNTS[i])
}

/// How a node is set up beyond its size and seed. [`Fleet::new`] takes the defaults: a demo
/// node. The benchmark fleet (bench/src/fleet.rs: many nodes scraped as dcgm-exporter) sets the
/// others: no demo jobs, job ids unique across its nodes, a multi-node job's share of a node,
/// hours-long jobs and a healthy fleet's fault rates.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeOptions {
    /// Place the demo's jobs at the first collection: a training job on half the GPUs and
    /// abandoned notebooks (see the module docs). Off, the node starts empty and fills as jobs
    /// arrive.
    pub demo_jobs: bool,
    /// The id of the node's first job; `None`, drawn from the seed (10,000..20,000).
    pub first_job_id: Option<u64>,
    /// A training job that holds every GPU of the node from the first collection on and never
    /// ends or hangs (one node's share of a multi-node job). Replaces the demo jobs.
    pub standing_job: Option<StandingJob>,
    /// Multiplies job lengths, the gaps between arrivals and how long an arrival waits for GPUs
    /// (1: the demo's minutes; 6: a production cluster's hours). Phases keep their lengths.
    pub job_time_scale: f64,
    /// Multiplies every fault rate (1: the demo's, far above a healthy fleet's). Below 1 the
    /// node has its hot board only with that chance.
    pub fault_rate_scale: f64,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            demo_jobs: true,
            first_job_id: None,
            standing_job: None,
            job_time_scale: 1.0,
            fault_rate_scale: 1.0,
        }
    }
}

/// A job that holds all of a node's GPUs for good: see [`NodeOptions::standing_job`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandingJob {
    /// Its id, the same on every node it spans.
    pub id: u64,
    /// Its user, the same on every node it spans.
    pub user: &'static str,
}

/// A simulated node of H100 GPUs. See the module docs for the model.
#[derive(Debug, Clone)]
pub struct Fleet {
    seed: u64,
    options: NodeOptions,
    gpus: Vec<Gpu>,
    jobs: Vec<Job>,
    pending: Option<Pending>,
    /// Job schedule random stream: drawn only at event times.
    sched: Rng,
    /// Measurement noise random stream: drawn only when sampling.
    noise: Rng,
    /// Simulated time the state is at; `None` until the first `collect`.
    clock: Option<u64>,
    next_arrival: u64,
    next_job_id: u64,
    /// Simulated faults (`health.rs`).
    health: Health,
    /// The processes read by the last `collect`.
    processes: Vec<ProcessSample>,
}

impl Fleet {
    /// A node of `gpus` simulated H100s. Everything (UUIDs, jobs, noise) follows from `seed`.
    pub fn new(gpus: usize, seed: u64) -> Self {
        Self::with_options(gpus, seed, NodeOptions::default())
    }

    /// A node of `gpus` simulated H100s set up as `options` say; deterministic from `seed`.
    pub fn with_options(gpus: usize, seed: u64, options: NodeOptions) -> Self {
        let gpu_count = gpus;
        let mut boards = Rng::new(seed ^ 0x6770_7577_6174_6368);
        let uptime_days = boards.range(2.0, 40.0);
        let gpus = (0..gpus)
            .map(|i| {
                let a =
                    mix64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1)));
                let b = mix64(a ^ 0xd1b5_4a32_d192_ed03);
                let uuid = format!(
                    "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xffff,
                    b >> 48,
                    b & 0xffff_ffff_ffff
                );
                Gpu {
                    uuid,
                    job: None,
                    released_at: None,
                    power: IDLE_POWER_W,
                    temp_slow: 0.0,
                    memory_temp_slow: 0.0,
                    energy_joules: uptime_days * 86_400.0 * boards.range(180.0, 320.0),
                    power_offset: boards.range(-2.0, 2.0),
                    temp_offset: boards.range(-1.5, 1.5),
                }
            })
            .collect();
        let next_job_id = options
            .first_job_id
            .unwrap_or(10_000 + mix64(seed) % 10_000);
        let health = Health::new(seed, gpu_count, options.fault_rate_scale);
        Fleet {
            seed,
            options,
            gpus,
            jobs: Vec::new(),
            pending: None,
            sched: Rng::new(seed ^ 0x5363_6865_6475_6c65),
            noise: Rng::new(seed ^ 0x4e6f_6973_6521_2121),
            clock: None,
            next_arrival: 0,
            next_job_id,
            health,
            processes: Vec::new(),
        }
    }

    /// The seed this fleet was built from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of simulated GPUs.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// The UUIDs of the simulated GPUs, by index.
    pub fn uuids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid.clone()).collect()
    }

    /// The UUID of GPU `i`.
    pub fn uuid(&self, i: usize) -> &str {
        &self.gpus[i].uuid
    }

    /// Mean gap between job arrivals, scaled so a node stays fairly busy whatever its size.
    fn mean_arrival_gap_s(&self) -> f64 {
        let n = self.gpus.len().max(1) as f64;
        (8.0 * 60.0 * 8.0 / n).clamp(3.0 * 60.0, 30.0 * 60.0) * self.options.job_time_scale
    }

    /// Set up the node at time `t0`: a job already computing on half the GPUs and an abandoned
    /// notebook already holding the last one.
    fn init(&mut self, t0: u64) {
        let n = self.gpus.len();
        self.clock = Some(t0);
        self.health.start(t0);
        let gap = self.sched.exp(self.mean_arrival_gap_s() / 2.0);
        self.next_arrival = t0 + secs(gap.max(1.0));
        if n == 0 {
            return;
        }
        if let Some(standing) = self.options.standing_job {
            self.place_standing_job(standing, t0);
        } else if self.options.demo_jobs {
            self.place_demo_jobs(t0);
        }
        for i in 0..n {
            let t = self.targets(i, t0);
            let gpu = &mut self.gpus[i];
            gpu.power = t.power;
            gpu.temp_slow = temp_slow_target(t.power);
            gpu.memory_temp_slow = memory_temp_slow_target(t.power);
        }
    }

    /// A training job on every GPU from `t0` on, never ending or hanging.
    fn place_standing_job(&mut self, standing: StandingJob, t0: u64) {
        let gpus = (0..self.gpus.len()).collect();
        let mut job = self.new_job(Kind::TrainLlm, gpus, t0, u64::MAX);
        job.id = standing.id;
        job.user = standing.user;
        job.stall_at = None;
        job.phase = Phase::Compute;
        job.phase_end = t0 + secs(self.sched.range(60.0, 400.0));
        self.place(job);
    }

    /// The demo's jobs at `t0`: one computing on half the GPUs, abandoned notebooks.
    fn place_demo_jobs(&mut self, t0: u64) {
        let n = self.gpus.len();
        let (train, notebook) = if n == 1 {
            let nb = self.sched.chance(0.5);
            (!nb, nb)
        } else {
            (true, true)
        };
        if train {
            let size = (n / 2).max(1);
            let started = t0.saturating_sub(secs(self.sched.range(5.0, 15.0) * 60.0));
            let end = t0 + secs(self.sched.range(10.0, 40.0) * 60.0);
            let mut job = self.new_job(Kind::TrainLlm, (0..size).collect(), started, end);
            job.stall_at = None;
            job.phase = Phase::Compute;
            job.phase_end = (t0 + secs(self.sched.range(60.0, 400.0))).min(end);
            self.place(job);
        }
        if notebook {
            let started = t0.saturating_sub(secs(self.sched.range(15.0, 40.0) * 60.0));
            let end = t0 + secs(self.sched.range(45.0, 120.0) * 60.0);
            let mut job = self.new_job(Kind::Notebook, vec![n - 1], started, end);
            job.stall_at = Some(started + secs(self.sched.range(3.0, 8.0) * 60.0));
            job.phase = Phase::Hold;
            job.phase_end = end;
            self.place(job);
        }
        if n >= 4 {
            self.place_long_notebook(t0);
        }
    }

    /// On nodes of 4 GPUs or more, a second notebook abandoned an hour or more before `t0`,
    /// with a day-long time limit (12 to 24 hours on), holds GPU n-2: a demo shows an idle GPU
    /// held by a job for its first half day at least. Its figures come from a hash of the seed,
    /// not from the schedule's random stream, which stays as it was.
    fn place_long_notebook(&mut self, t0: u64) {
        let n = self.gpus.len();
        let h = mix64(self.seed ^ 0x4c6f_6e67_4e6f_7465);
        let started = t0.saturating_sub((60 + h % 120) * MIN);
        let end = t0 + (12 * 60 + (h >> 8) % (12 * 60)) * MIN;
        let job = Job {
            id: self.next_job_id,
            user: USERS[((h >> 24) % USERS.len() as u64) as usize],
            kind: Kind::Notebook,
            gpus: vec![n - 2],
            end,
            phase: Phase::Hold,
            phase_end: end,
            memory_bytes: ((12 + (h >> 32) % 18) as f64 * GIB) as i64,
            intensity: 0.7,
            stall_at: Some(started + (3 + (h >> 40) % 8) * MIN),
        };
        self.next_job_id += 1;
        self.place(job);
    }

    /// Run the simulation forward to `t`, handling every event on the way.
    fn advance_to(&mut self, t: u64) {
        while let Some(next) = self.next_event() {
            if next > t {
                break;
            }
            self.faults_until(next);
            self.integrate(next);
            self.handle_events(next);
        }
        self.faults_until(t);
        self.integrate(t);
    }

    fn next_event(&self) -> Option<u64> {
        let clock = self.clock?;
        let mut next = self.next_arrival;
        for job in &self.jobs {
            next = next.min(job.end).min(job.phase_end);
        }
        if let Some(p) = &self.pending {
            next = next.min(p.deadline);
        }
        for gpu in &self.gpus {
            if let Some(r) = gpu.released_at {
                let linger_end = r + LINGER_NS;
                if linger_end > clock {
                    next = next.min(linger_end);
                }
            }
        }
        Some(next)
    }

    /// Move power, temperatures and energy from the current clock to `t` (nothing changes state
    /// in between: events sit at segment boundaries).
    fn integrate(&mut self, t: u64) {
        let Some(clock) = self.clock else { return };
        if t <= clock {
            return;
        }
        let dt = (t - clock) as f64 / SEC as f64;
        for i in 0..self.gpus.len() {
            let target = self.targets(i, clock);
            let gpu = &mut self.gpus[i];
            let p_target = target.power;
            let decay = (-dt / POWER_TAU_S).exp();
            // Exact integral of an exponential approach from `power` to `p_target`.
            let energy = p_target * dt + (gpu.power - p_target) * POWER_TAU_S * (1.0 - decay);
            debug_assert!(energy >= 0.0);
            gpu.energy_joules += energy.max(0.0);
            gpu.power = p_target + (gpu.power - p_target) * decay;
            let ts = temp_slow_target(p_target);
            gpu.temp_slow = ts + (gpu.temp_slow - ts) * (-dt / TEMP_TAU_S).exp();
            let ms = memory_temp_slow_target(p_target);
            gpu.memory_temp_slow =
                ms + (gpu.memory_temp_slow - ms) * (-dt / MEMORY_TEMP_TAU_S).exp();
        }
        self.clock = Some(t);
    }

    /// Everything that happens at `now`: jobs end, phases change, jobs arrive and start.
    fn handle_events(&mut self, now: u64) {
        // Jobs that end free their GPUs.
        let mut i = 0;
        while i < self.jobs.len() {
            if self.jobs[i].end <= now {
                let job = self.jobs.swap_remove(i);
                self.job_ended(&job, now);
                for &g in &job.gpus {
                    self.gpus[g].job = None;
                    self.gpus[g].released_at = Some(now);
                }
            } else {
                i += 1;
            }
        }
        // Phase changes.
        for j in 0..self.jobs.len() {
            if self.jobs[j].phase_end <= now {
                let (phase, dur) = next_phase(&self.jobs[j], now, &mut self.sched);
                let job = &mut self.jobs[j];
                job.phase = phase;
                job.phase_end = bounded_phase_end(job, now, dur);
            }
        }
        // A pending job gives up and goes to another node.
        if self.pending.as_ref().is_some_and(|p| p.deadline <= now) {
            self.pending = None;
        }
        // Arrivals.
        if self.next_arrival <= now {
            if self.pending.is_none() {
                self.pending = Some(self.draw_request(now));
            }
            let gap = self.sched.exp(self.mean_arrival_gap_s());
            self.next_arrival = now + secs(gap.max(1.0));
        }
        self.try_start_pending(now);
    }
}

impl Source for Fleet {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn collect(&mut self, now_unix_nano: u64) -> Result<Vec<GpuSample>> {
        match self.clock {
            None => self.init(now_unix_nano),
            // Time going backwards leaves the state where it is.
            Some(clock) if now_unix_nano > clock => self.advance_to(now_unix_nano),
            Some(_) => {}
        }
        let samples: Vec<GpuSample> = (0..self.gpus.len())
            .map(|i| self.sample(i, now_unix_nano))
            .collect();
        self.processes = samples.iter().filter_map(|s| self.process(s)).collect();
        Ok(samples)
    }

    /// One process per GPU of each running job (a rank of the job), from the last collection.
    fn processes(&mut self) -> Vec<ProcessSample> {
        self.processes.clone()
    }

    fn events(&mut self) -> Vec<GpuEvent> {
        self.health.drain()
    }

    fn simulated(&self) -> bool {
        true
    }

    fn attributable(&self) -> bool {
        false
    }
}
