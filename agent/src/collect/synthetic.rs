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
//! # Determinism
//!
//! Given the seed and the sequence of times passed to [`Fleet::collect`](crate::collect::Source),
//! the output is identical. The job schedule draws from its own random stream at event times
//! only, so it does not depend on how often the fleet is sampled; measurement noise draws from
//! a second stream. The first call initialises the fleet at the time it is given, with one job
//! already running and one notebook already idle, so a demo shows both cases at once.

use crate::collect::{GpuSample, JobLabels, Source};
use crate::error::Result;

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

/// A simulated node of H100 GPUs. See the module docs for the model.
#[derive(Debug, Clone)]
pub struct Fleet {
    seed: u64,
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
}

#[derive(Debug, Clone)]
struct Gpu {
    uuid: String,
    /// Index into `Fleet::jobs` is unstable, so the job is found by id.
    job: Option<u64>,
    released_at: Option<u64>,
    /// Board power, W (state, without measurement noise).
    power: f64,
    /// Slow part of the core temperature, °C above the fast part.
    temp_slow: f64,
    /// Slow part of the HBM temperature.
    memory_temp_slow: f64,
    energy_joules: f64,
    /// Per-board differences: idle power and temperature offsets.
    power_offset: f64,
    temp_offset: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    TrainLlm,
    FinetuneBert,
    EvalSweep,
    RenderBatch,
    Notebook,
    MdSim,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::TrainLlm => "train-llm",
            Kind::FinetuneBert => "finetune-bert",
            Kind::EvalSweep => "eval-sweep",
            Kind::RenderBatch => "render-batch",
            Kind::Notebook => "notebook",
            Kind::MdSim => "md-sim",
        }
    }

    fn mix(self) -> Mix {
        match self {
            Kind::RenderBatch => Mix::Fp32,
            Kind::MdSim => Mix::Fp64,
            _ => Mix::Tensor,
        }
    }
}

/// What the compute phase of a job keeps busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    Tensor,
    Fp32,
    Fp64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Compute,
    Copy,
    Small,
    Hold,
}

#[derive(Debug, Clone)]
struct Job {
    id: u64,
    user: &'static str,
    kind: Kind,
    gpus: Vec<usize>,
    end: u64,
    phase: Phase,
    phase_end: u64,
    /// Memory allocated on each of its GPUs.
    memory_bytes: i64,
    /// 0..1: how hard the compute phase drives the GPU.
    intensity: f64,
    /// From this time on the job holds its GPUs without using them (hung or abandoned).
    stall_at: Option<u64>,
}

#[derive(Debug, Clone)]
struct Pending {
    kind: Kind,
    gpus: usize,
    deadline: u64,
}

/// What a GPU does right now, before noise.
#[derive(Debug, Clone, Copy)]
struct Targets {
    util: f64,
    memory_util: f64,
    sm_active: f64,
    sm_occupancy: f64,
    tensor: f64,
    dram: f64,
    fp64: f64,
    fp32: f64,
    fp16: f64,
    power: f64,
    sm_clock: SmClock,
    reasons: i64,
    pcie_tx_kib: f64,
    pcie_rx_kib: f64,
    nvlink_bytes: f64,
    memory_used: i64,
}

#[derive(Debug, Clone, Copy)]
enum SmClock {
    Fixed(i64),
    /// Power-capped: the clock falls as the GPU heats up (1425 MHz at 60 °C in the trace).
    PowerCapped,
}

impl Fleet {
    /// A node of `gpus` simulated H100s. Everything (UUIDs, jobs, noise) follows from `seed`.
    pub fn new(gpus: usize, seed: u64) -> Self {
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
        Fleet {
            seed,
            gpus,
            jobs: Vec::new(),
            pending: None,
            sched: Rng::new(seed ^ 0x5363_6865_6475_6c65),
            noise: Rng::new(seed ^ 0x4e6f_6973_6521_2121),
            clock: None,
            next_arrival: 0,
            next_job_id: 10_000 + mix64(seed) % 10_000,
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

    /// Mean gap between job arrivals, scaled so a node stays fairly busy whatever its size.
    fn mean_arrival_gap_s(&self) -> f64 {
        let n = self.gpus.len().max(1) as f64;
        (8.0 * 60.0 * 8.0 / n).clamp(3.0 * 60.0, 30.0 * 60.0)
    }

    /// Set up the node at time `t0`: a job already computing on half the GPUs and an abandoned
    /// notebook already holding the last one.
    fn init(&mut self, t0: u64) {
        let n = self.gpus.len();
        self.clock = Some(t0);
        let gap = self.sched.exp(self.mean_arrival_gap_s() / 2.0);
        self.next_arrival = t0 + secs(gap.max(1.0));
        if n == 0 {
            return;
        }
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
        for i in 0..n {
            let t = self.targets(i, t0);
            let gpu = &mut self.gpus[i];
            gpu.power = t.power;
            gpu.temp_slow = temp_slow_target(t.power);
            gpu.memory_temp_slow = memory_temp_slow_target(t.power);
        }
    }

    /// A new job of `kind` on `gpus`, starting at `start` and ending at `end`, in its first phase.
    fn new_job(&mut self, kind: Kind, gpus: Vec<usize>, start: u64, end: u64) -> Job {
        let id = self.next_job_id;
        self.next_job_id += 1 + self.sched.below(5);
        let user = USERS[self.sched.below(USERS.len() as u64) as usize];
        let rng = &mut self.sched;
        let (mem_lo, mem_hi) = match kind {
            Kind::TrainLlm => (55.0, 78.0),
            Kind::FinetuneBert => (18.0, 40.0),
            Kind::EvalSweep => (8.0, 24.0),
            Kind::RenderBatch => (6.0, 16.0),
            Kind::Notebook => (12.0, 30.0),
            Kind::MdSim => (4.0, 12.0),
        };
        let memory_bytes = (rng.range(mem_lo, mem_hi) * GIB) as i64;
        let intensity = match kind {
            Kind::TrainLlm => rng.range(0.9, 1.0),
            Kind::FinetuneBert => rng.range(0.85, 1.0),
            Kind::EvalSweep => rng.range(0.6, 0.85),
            Kind::RenderBatch | Kind::MdSim => rng.range(0.8, 1.0),
            Kind::Notebook => rng.range(0.5, 0.9),
        };
        let duration = end.saturating_sub(start);
        let stall_at = match kind {
            // A hung collective or data loader: the job keeps its GPUs until its time limit.
            Kind::TrainLlm | Kind::FinetuneBert if rng.chance(0.15) => {
                Some(start + (duration as f64 * rng.range(0.2, 0.7)) as u64)
            }
            // Abandoned: a few minutes of work, then nothing until the time limit.
            Kind::Notebook if rng.chance(0.5) => Some(start + secs(rng.range(3.0, 10.0) * 60.0)),
            _ => None,
        };
        let (phase, dur) = match kind {
            Kind::EvalSweep | Kind::Notebook => (Phase::Small, rng.range(20.0, 90.0)),
            _ => (Phase::Copy, rng.range(30.0, 90.0)),
        };
        let mut job = Job {
            id,
            user,
            kind,
            gpus,
            end,
            phase,
            phase_end: 0,
            memory_bytes,
            intensity,
            stall_at,
        };
        job.phase_end = bounded_phase_end(&job, start, dur);
        job
    }

    /// Put `job` on its GPUs.
    fn place(&mut self, job: Job) {
        for &g in &job.gpus {
            debug_assert!(self.gpus[g].job.is_none(), "gpu {g} already allocated");
            self.gpus[g].job = Some(job.id);
            self.gpus[g].released_at = None;
        }
        self.jobs.push(job);
    }

    fn job_of(&self, gpu: usize) -> Option<&Job> {
        let id = self.gpus[gpu].job?;
        self.jobs.iter().find(|j| j.id == id)
    }

    /// Run the simulation forward to `t`, handling every event on the way.
    fn advance_to(&mut self, t: u64) {
        while let Some(next) = self.next_event() {
            if next > t {
                break;
            }
            self.integrate(next);
            self.handle_events(next);
        }
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

    fn draw_request(&mut self, now: u64) -> Pending {
        let n = self.gpus.len().max(1);
        let rng = &mut self.sched;
        let kind = match rng.below(100) {
            0..25 => Kind::TrainLlm,
            25..45 => Kind::FinetuneBert,
            45..60 => Kind::EvalSweep,
            60..70 => Kind::RenderBatch,
            70..90 => Kind::Notebook,
            _ => Kind::MdSim,
        };
        let roll = rng.below(100);
        let gpus = match kind {
            Kind::TrainLlm => match roll {
                0..60 => n,
                60..85 => n / 2,
                _ => 2,
            },
            Kind::FinetuneBert => [1, 2, 4][(roll % 3) as usize],
            Kind::EvalSweep | Kind::MdSim => 1 + (roll % 2) as usize,
            Kind::RenderBatch => 1 + (roll % 4) as usize,
            Kind::Notebook => {
                if roll < 90 {
                    1
                } else {
                    2
                }
            }
        };
        Pending {
            kind,
            gpus: gpus.clamp(1, n),
            deadline: now + PENDING_TIMEOUT_NS,
        }
    }

    fn try_start_pending(&mut self, now: u64) {
        let Some(p) = &self.pending else { return };
        let free: Vec<usize> = (0..self.gpus.len())
            .filter(|&g| self.gpus[g].job.is_none())
            .collect();
        if free.len() < p.gpus || p.gpus == 0 {
            return;
        }
        let (kind, size) = (p.kind, p.gpus);
        self.pending = None;
        let minutes = match kind {
            Kind::TrainLlm => self.sched.range(20.0, 60.0),
            Kind::FinetuneBert => self.sched.range(10.0, 30.0),
            Kind::EvalSweep => self.sched.range(5.0, 20.0),
            Kind::RenderBatch => self.sched.range(10.0, 40.0),
            Kind::Notebook => self.sched.range(30.0, 120.0),
            Kind::MdSim => self.sched.range(15.0, 45.0),
        };
        let end = now + secs(minutes * 60.0);
        let job = self.new_job(kind, free[..size].to_vec(), now, end);
        self.place(job);
    }

    /// What GPU `i` does at time `t`, before noise.
    fn targets(&self, i: usize, t: u64) -> Targets {
        let gpu = &self.gpus[i];
        let Some(job) = self.job_of(i) else {
            let lingering = gpu
                .released_at
                .is_some_and(|r| t.saturating_sub(r) < LINGER_NS);
            return free_targets(gpu, lingering, t);
        };
        let multi = job.gpus.len() > 1;
        let power_base = CONTEXT_POWER_W + gpu.power_offset;
        let mut tg = Targets {
            util: 0.0,
            memory_util: 0.0,
            sm_active: 0.0,
            sm_occupancy: 0.0,
            tensor: 0.0,
            dram: 0.0006,
            fp64: 0.0,
            fp32: 0.0,
            fp16: 0.0,
            power: power_base,
            sm_clock: SmClock::Fixed(SM_CLOCK_MAX_MHZ),
            reasons: 0,
            pcie_tx_kib: 800.0,
            pcie_rx_kib: 480.0,
            nvlink_bytes: 0.0,
            memory_used: job.memory_bytes,
        };
        let k = job.intensity;
        match job.phase {
            Phase::Hold => {}
            Phase::Small => {
                tg.util = 0.03;
                tg.sm_active = 0.0187;
                tg.sm_occupancy = 0.0011;
                tg.fp32 = 0.0012;
                tg.power = power_base + 1.0;
                tg.pcie_tx_kib = 4200.0;
                tg.pcie_rx_kib = 18_100.0;
                tg.nvlink_bytes = if multi { 0.2e9 } else { 0.0 };
            }
            Phase::Copy => {
                tg.util = 1.0;
                tg.memory_util = 1.0;
                tg.sm_active = 0.995;
                tg.sm_occupancy = 0.80;
                tg.dram = 0.90;
                tg.power = power_base + 272.0;
                tg.pcie_tx_kib = 15_500.0;
                tg.pcie_rx_kib = 31_200.0;
                tg.nvlink_bytes = if multi { 20e9 } else { 0.0 };
            }
            Phase::Compute => {
                tg.util = (0.9 + 0.1 * k).min(1.0);
                tg.pcie_tx_kib = 8500.0;
                tg.pcie_rx_kib = 19_000.0;
                match job.kind.mix() {
                    Mix::Tensor => {
                        tg.memory_util = 0.31 * k;
                        tg.sm_active = 0.966 * k;
                        tg.sm_occupancy = 0.143;
                        tg.tensor = 0.938 * k;
                        tg.dram = 0.238 * k;
                        tg.fp32 = 0.002;
                        // Demand above the cap is clipped by the power controller.
                        let demand = power_base + 600.0 * k;
                        if demand >= POWER_CAP_W {
                            tg.power = POWER_CAP_W + gpu.power_offset * 0.3;
                            tg.sm_clock = SmClock::PowerCapped;
                            tg.reasons = REASON_SW_POWER_CAP;
                        } else {
                            tg.power = demand;
                        }
                        tg.nvlink_bytes = if multi { (25.0 + 50.0 * k) * 1e9 } else { 0.0 };
                    }
                    Mix::Fp32 => {
                        tg.memory_util = 0.45 * k;
                        tg.sm_active = 0.93 * k;
                        tg.sm_occupancy = 0.45;
                        tg.tensor = 0.02;
                        tg.dram = 0.40 * k;
                        tg.fp32 = 0.62 * k;
                        tg.fp16 = 0.05 * k;
                        tg.power = power_base + 380.0 * k;
                        tg.nvlink_bytes = if multi { 2e9 } else { 0.0 };
                    }
                    Mix::Fp64 => {
                        tg.memory_util = 0.25 * k;
                        tg.sm_active = 0.90 * k;
                        tg.sm_occupancy = 0.30;
                        tg.dram = 0.20 * k;
                        tg.fp64 = 0.55 * k;
                        tg.fp32 = 0.05 * k;
                        tg.power = power_base + 450.0 * k;
                        tg.nvlink_bytes = if multi { 10e9 } else { 0.0 };
                    }
                }
            }
        }
        tg
    }

    /// One noisy reading of GPU `i` at `t` (the state must already be at `t`).
    fn sample(&mut self, i: usize, t: u64) -> GpuSample {
        let tg = self.targets(i, t);
        let job = self.job_of(i).map(|j| JobLabels {
            id: j.id.to_string(),
            user: j.user.to_string(),
            name: j.kind.name().to_string(),
            scheduler: "slurm".to_string(),
            k8s: None,
        });
        let gpu = &self.gpus[i];
        let n = &mut self.noise;
        let power = (gpu.power + n.normal() * (0.002 * gpu.power + 0.1)).max(0.0);
        let temp = 39.0 + gpu.temp_offset + 0.028 * gpu.power + gpu.temp_slow;
        let memory_temp =
            43.5 + gpu.temp_offset + 0.006 * gpu.power + 12.0 * tg.dram + gpu.memory_temp_slow;
        let sm_clock = match tg.sm_clock {
            SmClock::Fixed(mhz) => mhz,
            SmClock::PowerCapped => {
                let mhz = 1425.0 - 12.0 * (temp - 60.0) + n.normal() * 15.0;
                ((mhz / 15.0).round() * 15.0).clamp(1200.0, 1755.0) as i64
            }
        };
        let mut s = GpuSample::empty(t, gpu.uuid.clone(), i as u32, MODEL.to_string());
        s.job = job;
        s.gpu_utilization = Some(percent(n, tg.util, 0.3));
        s.memory_utilization = Some(percent(n, tg.memory_util, 0.4));
        s.sm_active = Some(activity(n, tg.sm_active));
        s.sm_occupancy = Some(activity(n, tg.sm_occupancy));
        s.tensor_active = Some(activity(n, tg.tensor));
        s.dram_active = Some(activity(n, tg.dram));
        s.fp64_active = Some(activity(n, tg.fp64));
        s.fp32_active = Some(activity(n, tg.fp32));
        s.fp16_active = Some(activity(n, tg.fp16));
        s.memory_used_bytes = Some(tg.memory_used);
        s.memory_total_bytes = Some(MEMORY_TOTAL_BYTES);
        s.power_watts = Some(round_to(power, 1000.0));
        s.energy_joules = Some(round_to(gpu.energy_joules, 1000.0));
        s.temperature_celsius = Some((temp + n.normal() * 0.25).round());
        s.memory_temperature_celsius = Some((memory_temp + n.normal() * 0.25).round());
        s.sm_clock_mhz = Some(sm_clock);
        s.memory_clock_mhz = Some(MEMORY_CLOCK_MHZ);
        s.clock_event_reasons = Some(tg.reasons);
        s.pcie_tx_bytes_per_second = Some(pcie(n, tg.pcie_tx_kib));
        s.pcie_rx_bytes_per_second = Some(pcie(n, tg.pcie_rx_kib));
        s.nvlink_tx_bytes_per_second = Some(nvlink(n, tg.nvlink_bytes));
        s.nvlink_rx_bytes_per_second = Some(nvlink(n, tg.nvlink_bytes));
        s.ecc_sbe_volatile_total = Some(0);
        s.ecc_dbe_volatile_total = Some(0);
        s.remapped_rows_uncorrectable = Some(0);
        s.remapped_rows_failure = Some(0);
        s.xid_errors_total = Some(0);
        s
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
        Ok((0..self.gpus.len())
            .map(|i| self.sample(i, now_unix_nano))
            .collect())
    }

    fn simulated(&self) -> bool {
        true
    }

    fn attributable(&self) -> bool {
        false
    }
}

/// A free GPU: no process, or the 2.5 s after one exited.
fn free_targets(gpu: &Gpu, lingering: bool, t: u64) -> Targets {
    let since_release = gpu.released_at.map(|r| t.saturating_sub(r));
    // Clocks step down after the context goes: 1980 → 690 → 435 → 345 MHz in the trace.
    let sm_clock = match since_release {
        Some(d) if d < LINGER_NS => SM_CLOCK_MAX_MHZ,
        Some(d) if d < LINGER_NS + SEC => 690,
        Some(d) if d < LINGER_NS + 2 * SEC => 435,
        _ => SM_CLOCK_IDLE_MHZ,
    };
    Targets {
        util: 0.0,
        memory_util: 0.0,
        sm_active: 0.0,
        sm_occupancy: 0.0,
        tensor: 0.0,
        dram: 0.0006,
        fp64: 0.0,
        fp32: 0.0,
        fp16: 0.0,
        power: if lingering {
            LINGER_POWER_W + gpu.power_offset
        } else {
            IDLE_POWER_W + gpu.power_offset
        },
        sm_clock: SmClock::Fixed(sm_clock),
        reasons: if lingering { 0 } else { REASON_GPU_IDLE },
        pcie_tx_kib: 710.0,
        pcie_rx_kib: 640.0,
        nvlink_bytes: 0.0,
        memory_used: MEMORY_FREE_BYTES,
    }
}

/// The next phase of `job` at `now` and how long it lasts, seconds.
fn next_phase(job: &Job, now: u64, rng: &mut Rng) -> (Phase, f64) {
    if job.stall_at.is_some_and(|s| s <= now) {
        return (Phase::Hold, f64::INFINITY);
    }
    let p = job.phase;
    match job.kind {
        Kind::TrainLlm => match p {
            Phase::Compute if rng.chance(0.7) => (Phase::Copy, rng.range(15.0, 45.0)),
            Phase::Compute => (Phase::Small, rng.range(10.0, 30.0)),
            _ => (Phase::Compute, rng.range(180.0, 600.0)),
        },
        Kind::FinetuneBert => match p {
            Phase::Compute if rng.chance(0.65) => (Phase::Copy, rng.range(10.0, 30.0)),
            Phase::Compute => (Phase::Small, rng.range(5.0, 20.0)),
            _ => (Phase::Compute, rng.range(60.0, 240.0)),
        },
        Kind::EvalSweep => match p {
            Phase::Small => (Phase::Compute, rng.range(30.0, 90.0)),
            Phase::Compute => (Phase::Hold, rng.range(10.0, 60.0)),
            Phase::Hold => (Phase::Copy, rng.range(10.0, 30.0)),
            Phase::Copy => (Phase::Small, rng.range(30.0, 120.0)),
        },
        Kind::RenderBatch => match p {
            Phase::Compute => (Phase::Copy, rng.range(10.0, 30.0)),
            _ => (Phase::Compute, rng.range(120.0, 360.0)),
        },
        Kind::Notebook => match rng.below(100) {
            0..45 => (Phase::Hold, rng.range(120.0, 900.0)),
            45..80 => (Phase::Small, rng.range(20.0, 90.0)),
            _ => (Phase::Compute, rng.range(30.0, 180.0)),
        },
        Kind::MdSim => match p {
            Phase::Compute => (Phase::Small, rng.range(10.0, 30.0)),
            Phase::Small => (Phase::Copy, rng.range(10.0, 30.0)),
            _ => (Phase::Compute, rng.range(300.0, 900.0)),
        },
    }
}

/// End of a phase starting at `now` lasting `dur_s`, cut at the job's end and stall time.
fn bounded_phase_end(job: &Job, now: u64, dur_s: f64) -> u64 {
    let mut end = if dur_s.is_finite() {
        now + secs(dur_s.max(1.0))
    } else {
        job.end
    };
    end = end.min(job.end);
    if let Some(s) = job.stall_at
        && s > now
    {
        end = end.min(s);
    }
    end.max(now + 1)
}

fn temp_slow_target(power: f64) -> f64 {
    0.016 * (power - IDLE_POWER_W).max(0.0)
}

fn memory_temp_slow_target(power: f64) -> f64 {
    0.019 * (power - IDLE_POWER_W).max(0.0)
}

fn secs(s: f64) -> u64 {
    (s * SEC as f64) as u64
}

fn round_to(x: f64, per_unit: f64) -> f64 {
    (x * per_unit).round() / per_unit
}

/// NVML reports utilisation as whole percent: a ratio with two decimals. Exactly 0 stays 0.
fn percent(n: &mut Rng, target: f64, noise_pct: f64) -> f64 {
    if target <= 0.0 {
        return 0.0;
    }
    ((target * 100.0 + n.normal() * noise_pct).round() / 100.0).clamp(0.0, 1.0)
}

/// A GPM activity ratio with 0.5 % relative noise, clamped to 0..1. Exactly 0 stays 0.
fn activity(n: &mut Rng, target: f64) -> f64 {
    if target <= 0.0 {
        return 0.0;
    }
    round_to(
        (target * (1.0 + 0.005 * n.normal())).clamp(0.0, 1.0),
        10_000.0,
    )
}

/// PCIe rate from a KiB/s figure: 5 % noise and an occasional doubling, as in the trace.
fn pcie(n: &mut Rng, kib: f64) -> f64 {
    let spike = if n.chance(0.06) { 2.0 } else { 1.0 };
    (kib * spike * (1.0 + 0.05 * n.normal()) * 1024.0)
        .max(0.0)
        .round()
}

fn nvlink(n: &mut Rng, bytes: f64) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    (bytes * (1.0 + 0.08 * n.normal())).max(0.0).round()
}

/// SplitMix64's finaliser: a good 64-bit mix.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64: small, fast, deterministic, good enough for a simulation.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(mix64(seed))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in 0..n (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n.max(1)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(1e-12);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Exponential with the given mean.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
