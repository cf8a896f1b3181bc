//! A simulated fleet of H100 GPUs, sampled the way dcgm-exporter and a Prometheus scrape see them.
//!
//! The model (docs/benchmarks.md describes it and where each figure comes from) is calibrated on
//! the real H100 trace of the repository's test data: each GPU is either free or held by a job;
//! a job runs phases (tensor-bound compute, memory-bound copies, light kernels, FP64 compute,
//! allocated-but-idle) whose levels and noise are the trace's; temperatures follow their target
//! with a lag; energy is the integral of power; ECC counters step rarely. Everything is derived
//! from one seed, so two runs with the same flags produce the same samples.

/// dcgm-exporter's series that fill a `gpu_metrics` column, in the order of [`Sample::values`].
pub(crate) const FIELDS: [&str; 26] = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
];

/// Index of `DCGM_FI_DEV_GPU_UTIL` (percent) in [`Sample::values`].
pub(crate) const GPU_UTIL: usize = 0;
const MEM_UTIL: usize = 1;
const SM_ACTIVE: usize = 2;
const SM_OCCUPANCY: usize = 3;
const TENSOR: usize = 4;
const DRAM: usize = 5;
const FP64: usize = 6;
const FP32: usize = 7;
const FP16: usize = 8;
/// Index of `DCGM_FI_DEV_FB_USED` (MiB) in [`Sample::values`].
pub(crate) const FB_USED: usize = 9;
const FB_TOTAL: usize = 10;
const POWER: usize = 11;
const ENERGY: usize = 12;
const TEMP: usize = 13;
const MEM_TEMP: usize = 14;
const SM_CLOCK: usize = 15;
const MEM_CLOCK: usize = 16;
const REASONS: usize = 17;
const PCIE_TX: usize = 18;
const PCIE_RX: usize = 19;
const NVLINK_TX: usize = 20;
const NVLINK_RX: usize = 21;
/// Index of `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL` in [`Sample::values`].
pub(crate) const ECC_SBE: usize = 22;
const ECC_DBE: usize = 23;
const REMAPPED: usize = 24;
const REMAP_FAILURE: usize = 25;

/// The H100 80GB HBM3's memory as NVML reports it (85520809984 bytes), in MiB.
const FB_TOTAL_MIB: f64 = 81559.0;
/// Memory used on a GPU without processes in the trace (503316480 bytes).
pub(crate) const FB_FREE_GPU_MIB: f64 = 480.0;
const MEM_CLOCK_MHZ: f64 = 2619.0;
const IDLE_SM_CLOCK_MHZ: f64 = 345.0;
const BOOST_SM_CLOCK_MHZ: f64 = 1980.0;
const POWER_CAP_W: f64 = 700.0;
/// NVML clocks-event reasons: GPU idle, software power cap.
const REASON_IDLE: f64 = 1.0;
const REASON_SW_POWER_CAP: f64 = 4.0;
/// Samples that SM clocks stay at boost after work ends (the trace: about 30 s).
const CLOCK_HOLD_SAMPLES: u32 = 3;

/// A deterministic generator (SplitMix64), enough for simulation and free of dependencies.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        let mut r = Self(seed ^ 0x5DEE_CE66_D1CE_4E5B);
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }

    /// Exponentially distributed with the given mean.
    pub(crate) fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.uniform()).ln()
    }
}

/// What a GPU is doing during one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No job holds the GPU.
    Free,
    /// Tensor-bound compute (the trace's `matmul`: bf16 matrix products).
    Compute,
    /// Memory-bound work (the trace's `copy`).
    MemoryBound,
    /// Tiny kernels with waits (the trace's `small`): data loading, evaluation, light inference.
    Light,
    /// FP64 compute (HPC codes; not in the trace, levels scaled from `matmul`).
    Fp64,
    /// Memory allocated, no work (the trace's `hold`): the idle-in-job case.
    Held,
}

/// Levels and noise (standard deviations) of one phase; rates in bytes per second.
struct Profile {
    util: (f64, f64),
    mem_util: (f64, f64),
    sm_active: (f64, f64),
    occupancy: (f64, f64),
    tensor: (f64, f64),
    dram: (f64, f64),
    fp64: (f64, f64),
    fp32: (f64, f64),
    power: (f64, f64),
    temp: f64,
    mem_temp: f64,
    sm_clock: (f64, f64),
    reasons: f64,
    pcie_tx: (f64, f64),
    pcie_rx: (f64, f64),
    /// NVLink traffic per direction when the job spans several GPUs.
    nvlink: (f64, f64),
}

/// Per-phase levels, read off the trace (docs/benchmarks.md has the table).
fn profile(phase: Phase) -> Profile {
    match phase {
        Phase::Free => Profile {
            util: (0.0, 0.0),
            mem_util: (0.0, 0.0),
            sm_active: (0.0, 0.0),
            occupancy: (0.0, 0.0),
            tensor: (0.0, 0.0),
            dram: (0.00058, 0.00003),
            fp64: (0.0, 0.0),
            fp32: (0.0, 0.0),
            power: (73.6, 0.15),
            temp: 41.3,
            mem_temp: 44.1,
            sm_clock: (IDLE_SM_CLOCK_MHZ, 0.0),
            reasons: REASON_IDLE,
            pcie_tx: (840e3, 280e3),
            pcie_rx: (600e3, 100e3),
            nvlink: (0.0, 0.0),
        },
        Phase::Compute => Profile {
            util: (100.0, 0.0),
            mem_util: (31.2, 0.4),
            sm_active: (0.953, 0.006),
            occupancy: (0.1408, 0.001),
            tensor: (0.925, 0.006),
            dram: (0.2345, 0.003),
            fp64: (0.0, 0.0),
            fp32: (0.00011, 0.0001),
            power: (690.0, 8.0),
            temp: 65.5,
            mem_temp: 58.0,
            sm_clock: (1365.0, 28.0),
            reasons: REASON_SW_POWER_CAP,
            pcie_tx: (8.52e6, 0.26e6),
            pcie_rx: (18.97e6, 0.42e6),
            nvlink: (45e9, 2e9),
        },
        Phase::MemoryBound => Profile {
            util: (99.9, 0.7),
            mem_util: (100.0, 0.0),
            sm_active: (0.994, 0.003),
            occupancy: (0.798, 0.003),
            tensor: (0.0, 0.0),
            dram: (0.90, 0.005),
            fp64: (0.0, 0.0),
            fp32: (0.0, 0.0),
            power: (400.0, 3.0),
            temp: 53.0,
            mem_temp: 64.7,
            sm_clock: (BOOST_SM_CLOCK_MHZ, 0.0),
            reasons: 0.0,
            pcie_tx: (15.5e6, 0.42e6),
            pcie_rx: (31.2e6, 0.5e6),
            nvlink: (2e9, 0.5e9),
        },
        Phase::Light => Profile {
            util: (2.9, 0.33),
            mem_util: (0.0, 0.0),
            sm_active: (0.02, 0.003),
            occupancy: (0.0011, 0.0002),
            tensor: (0.0, 0.0),
            dram: (0.0006, 0.0001),
            fp64: (0.0, 0.0),
            fp32: (0.00116, 0.0002),
            power: (126.0, 2.0),
            temp: 44.8,
            mem_temp: 46.8,
            sm_clock: (BOOST_SM_CLOCK_MHZ, 0.0),
            reasons: 0.0,
            pcie_tx: (4.0e6, 0.46e6),
            pcie_rx: (16.6e6, 3.2e6),
            nvlink: (0.1e9, 0.02e9),
        },
        Phase::Fp64 => Profile {
            util: (100.0, 0.0),
            mem_util: (45.0, 2.0),
            sm_active: (0.90, 0.01),
            occupancy: (0.45, 0.01),
            tensor: (0.0, 0.0),
            dram: (0.40, 0.01),
            fp64: (0.65, 0.01),
            fp32: (0.02, 0.002),
            power: (610.0, 10.0),
            temp: 62.0,
            mem_temp: 60.0,
            sm_clock: (1755.0, 20.0),
            reasons: 0.0,
            pcie_tx: (6.0e6, 0.3e6),
            pcie_rx: (12.0e6, 0.5e6),
            nvlink: (20e9, 1e9),
        },
        Phase::Held => Profile {
            util: (0.0, 0.0),
            mem_util: (0.0, 0.0),
            sm_active: (0.0, 0.0),
            occupancy: (0.0, 0.0),
            tensor: (0.0, 0.0),
            dram: (0.0006, 0.00002),
            fp64: (0.0, 0.0),
            fp32: (0.0, 0.0),
            power: (125.7, 0.12),
            temp: 43.0,
            mem_temp: 44.1,
            sm_clock: (BOOST_SM_CLOCK_MHZ, 0.0),
            reasons: 0.0,
            pcie_tx: (772e3, 330e3),
            pcie_rx: (471e3, 48e3),
            nvlink: (0.0, 0.0),
        },
    }
}

/// The kind of a job, which decides its phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// Mostly compute, with evaluation stalls and checkpoints; may hang (then idle in the job).
    Training,
    /// Mostly light, with bursts of compute.
    Inference,
    /// Memory-bound and light phases.
    DataPrep,
    /// FP64 codes.
    Hpc,
    /// Holds memory and does nothing (an interactive session left open).
    Idle,
}

impl JobKind {
    fn pick(rng: &mut Rng) -> Self {
        let u = rng.uniform();
        match u {
            u if u < 0.55 => Self::Training,
            u if u < 0.70 => Self::Inference,
            u if u < 0.78 => Self::DataPrep,
            u if u < 0.85 => Self::Hpc,
            _ => Self::Idle,
        }
    }

    fn first_phase(self) -> Phase {
        match self {
            Self::Training => Phase::Compute,
            Self::Inference => Phase::Light,
            Self::DataPrep => Phase::MemoryBound,
            Self::Hpc => Phase::Fp64,
            Self::Idle => Phase::Held,
        }
    }

    /// The next phase: a Markov chain per kind, per 10 s sample.
    fn next_phase(self, phase: Phase, rng: &mut Rng) -> Phase {
        let u = rng.uniform();
        match (self, phase) {
            (Self::Training, Phase::Compute) if u < 0.0004 => Phase::Held, // the job hangs
            (Self::Training, Phase::Compute) if u < 0.03 => Phase::Light,
            (Self::Training, Phase::Compute) if u < 0.04 => Phase::MemoryBound,
            (Self::Training, Phase::Light) if u < 0.3 => Phase::Compute,
            (Self::Training, Phase::MemoryBound) if u < 0.5 => Phase::Compute,
            (Self::Inference, Phase::Light) if u < 0.1 => Phase::Compute,
            (Self::Inference, Phase::Compute) if u < 0.3 => Phase::Light,
            (Self::DataPrep, Phase::MemoryBound) if u < 0.1 => Phase::Light,
            (Self::DataPrep, Phase::Light) if u < 0.1 => Phase::MemoryBound,
            (Self::Hpc, Phase::Fp64) if u < 0.02 => Phase::Light,
            (Self::Hpc, Phase::Light) if u < 0.3 => Phase::Fp64,
            _ => phase,
        }
    }
}

#[derive(Debug, Clone)]
struct Job {
    id: u64,
    kind: JobKind,
    /// Memory the job keeps allocated on each of its GPUs.
    fb_mib: f64,
}

/// GPUs scheduled together: one job at a time, gaps between jobs.
#[derive(Debug, Clone)]
struct Group {
    first_gpu: usize,
    gpus: usize,
    job: Option<Job>,
    /// Samples left in the current job or gap.
    remaining: u64,
    phase: Phase,
}

#[derive(Debug, Clone)]
struct Gpu {
    uuid: String,
    pci_bus: String,
    /// Per-board spread of power (a multiplier) and temperature (°C).
    power_scale: f64,
    temp_offset: f64,
    temp: f64,
    mem_temp: f64,
    energy_mj: f64,
    fb_extra_mib: f64,
    ecc_sbe: f64,
    /// Chance per sample that a single-bit error is corrected (0 on most boards).
    ecc_rate: f64,
    remapped: f64,
    clock_hold: u32,
    /// The job's phase during the previous sample (for the clock hold after work ends).
    busy_before: bool,
}

/// One host: a dcgm-exporter scraped every interval at its own phase.
#[derive(Debug, Clone)]
struct Host {
    name: String,
    /// Where in the interval this host's scrapes fall.
    offset_ms: i64,
    gpus: Vec<Gpu>,
    groups: Vec<Group>,
    rng: Rng,
}

/// One GPU's sample: its scrape time, the job holding it, and the [`FIELDS`] values in
/// dcgm-exporter's units.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// Milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// The job id (dcgm-exporter's `hpc_job` label), if a job holds the GPU.
    pub job: Option<u64>,
    /// Values in [`FIELDS`] order.
    pub values: [f64; 26],
}

/// How the fleet is shaped.
#[derive(Debug, Clone)]
pub(crate) struct FleetConfig {
    /// Hosts.
    pub hosts: usize,
    /// GPUs per host.
    pub gpus_per_host: usize,
    /// Sampling interval in ms.
    pub interval_ms: i64,
    /// Time of the first scrape round (ms since the epoch); each host adds its own offset.
    pub start_ms: i64,
    /// Seed of everything random.
    pub seed: u64,
    /// The first this many hosts run one training job on all their GPUs for the whole run
    /// ([`BIG_JOB_ID`]): a multi-node job (8 hosts of 8 GPUs: 64 GPUs) for the job report's
    /// benchmark. 0 for none.
    pub job_hosts: usize,
}

/// The job id of the multi-host job of [`FleetConfig::job_hosts`].
pub(crate) const BIG_JOB_ID: u64 = 4_100_000;

/// The simulated fleet.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    config: FleetConfig,
    hosts: Vec<Host>,
    next_job: u64,
}

/// Samples per hour at a 10 s interval: the scale of job and gap durations below.
const SAMPLES_PER_HOUR_10S: f64 = 360.0;

fn round_to(v: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (v * f).round() / f
}

fn noisy(rng: &mut Rng, (mean, sd): (f64, f64)) -> f64 {
    if sd == 0.0 {
        mean
    } else {
        mean + sd * rng.normal()
    }
}

fn uuid(rng: &mut Rng) -> String {
    let a = rng.next_u64();
    let b = rng.next_u64();
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl Fleet {
    /// A fleet in its steady state at `config.start_ms`.
    pub(crate) fn new(config: FleetConfig) -> Self {
        let mut seed_rng = Rng::new(config.seed);
        let mut hosts = Vec::with_capacity(config.hosts);
        let interval = config.interval_ms.max(1);
        for h in 0..config.hosts {
            let mut rng = Rng::new(seed_rng.next_u64());
            let gpus = (0..config.gpus_per_host)
                .map(|i| {
                    let temp_offset = rng.normal() * 1.5;
                    Gpu {
                        uuid: uuid(&mut rng),
                        pci_bus: format!("00000000:{:02X}:00.0", 0x18 + 0x10 * i),
                        power_scale: 1.0 + 0.02 * rng.normal(),
                        temp_offset,
                        temp: 41.3 + temp_offset,
                        mem_temp: 44.1 + temp_offset,
                        // Energy since the driver loaded: days to weeks at 100–700 W.
                        energy_mj: (5e10 + rng.uniform() * 5e11).round(),
                        fb_extra_mib: if i == 0 { 512.0 } else { 0.0 },
                        ecc_sbe: 0.0,
                        ecc_rate: if rng.chance(0.03) { 0.002 } else { 0.0 },
                        remapped: if rng.chance(0.005) { 1.0 } else { 0.0 },
                        clock_hold: 0,
                        busy_before: false,
                    }
                })
                .collect();
            let groups = partition(config.gpus_per_host, &mut rng);
            hosts.push(Host {
                name: format!("gpu-node-{:03}", h + 1),
                offset_ms: rng.below(interval as u64) as i64,
                gpus,
                groups,
                rng,
            });
        }
        let mut fleet = Self {
            next_job: 4_200_000 + seed_rng.below(100_000),
            config,
            hosts,
        };
        // The multi-host job: one group of all the GPUs, for good.
        let job_hosts = fleet.config.job_hosts.min(fleet.hosts.len());
        for host in &mut fleet.hosts[..job_hosts] {
            let gpus = host.gpus.len();
            host.groups = vec![Group {
                first_gpu: 0,
                gpus,
                job: Some(Job {
                    id: BIG_JOB_ID,
                    kind: JobKind::Training,
                    fb_mib: 71_000.0,
                }),
                remaining: u64::MAX,
                phase: JobKind::Training.first_phase(),
            }];
        }
        // Steady state: most groups are in the middle of a job.
        for h in job_hosts..fleet.hosts.len() {
            for g in 0..fleet.hosts[h].groups.len() {
                let busy = fleet.hosts[h].rng.chance(0.85);
                if busy {
                    fleet.start_job(h, g);
                    let host = &mut fleet.hosts[h];
                    let left = host.rng.below(host.groups[g].remaining.max(1)) + 1;
                    host.groups[g].remaining = left;
                } else {
                    fleet.start_gap(h, g);
                }
            }
        }
        fleet
    }

    /// Hosts.
    pub(crate) fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// GPUs per host.
    pub(crate) fn gpus_per_host(&self) -> usize {
        self.config.gpus_per_host
    }

    /// A host's name (dcgm-exporter's `Hostname`).
    pub(crate) fn host_name(&self, h: usize) -> &str {
        &self.hosts[h].name
    }

    /// A GPU's UUID and PCI bus id.
    pub(crate) fn gpu_ids(&self, h: usize, i: usize) -> (&str, &str) {
        let g = &self.hosts[h].gpus[i];
        (&g.uuid, &g.pci_bus)
    }

    /// The kind of the job holding GPU `i` of host `h` in the host's last scrape, if any.
    pub(crate) fn job_kind(&self, h: usize, i: usize) -> Option<JobKind> {
        self.hosts[h]
            .groups
            .iter()
            .find(|g| (g.first_gpu..g.first_gpu + g.gpus).contains(&i))
            .and_then(|g| g.job.as_ref())
            .map(|j| j.kind)
    }

    /// The scale of durations: samples per hour at this interval.
    fn per_hour(&self) -> f64 {
        SAMPLES_PER_HOUR_10S * 10_000.0 / self.config.interval_ms.max(1) as f64
    }

    fn start_job(&mut self, h: usize, g: usize) {
        let per_hour = self.per_hour();
        let id = self.next_job;
        self.next_job += 1 + self.hosts[h].rng.below(3);
        let host = &mut self.hosts[h];
        let rng = &mut host.rng;
        let kind = JobKind::pick(rng);
        // Log-normal durations, median 3 h, clipped to 10 min .. 48 h.
        let hours = (3.0 * (rng.normal() * 1.0).exp()).clamp(1.0 / 6.0, 48.0);
        let fb_mib = (20_000.0 + rng.uniform() * 55_000.0).round();
        let group = &mut host.groups[g];
        group.job = Some(Job { id, kind, fb_mib });
        group.phase = kind.first_phase();
        group.remaining = (hours * per_hour).round().max(1.0) as u64;
    }

    fn start_gap(&mut self, h: usize, g: usize) {
        let per_hour = self.per_hour();
        let host = &mut self.hosts[h];
        let rng = &mut host.rng;
        // A busy cluster: a third of the time the next job starts at once, else after ~30 min.
        let hours = if rng.chance(0.33) {
            1.0 / per_hour
        } else {
            rng.exponential(0.5)
        };
        let group = &mut host.groups[g];
        group.job = None;
        group.phase = Phase::Free;
        group.remaining = (hours * per_hour).round().max(1.0) as u64;
    }

    /// Samples of host `h` for scrape round `k` (the k-th interval after the start), one per
    /// GPU, written into `out`. Rounds of one host must be asked for in order.
    pub(crate) fn scrape(&mut self, h: usize, k: u64, out: &mut Vec<Sample>) {
        out.clear();
        // Schedule: end jobs and gaps that ran out.
        for g in 0..self.hosts[h].groups.len() {
            let group = &mut self.hosts[h].groups[g];
            if group.remaining == 0 {
                if group.job.is_some() {
                    self.start_gap(h, g);
                } else {
                    self.start_job(h, g);
                }
            }
        }
        let interval = self.config.interval_ms;
        let host = &mut self.hosts[h];
        let rng = &mut host.rng;
        // Scrape jitter: a few ms around the host's slot (the trace: sd 1.8 ms).
        let jitter = (rng.normal() * 2.0).round().clamp(-8.0, 8.0) as i64;
        let time_ms = self.config.start_ms + host.offset_ms + k as i64 * interval + jitter;
        for group in &mut host.groups {
            group.remaining = group.remaining.saturating_sub(1);
            if let Some(job) = &group.job {
                group.phase = job.kind.next_phase(group.phase, rng);
            }
            let p = profile(group.phase);
            let multi_gpu = group.gpus > 1;
            for gpu in &mut host.gpus[group.first_gpu..group.first_gpu + group.gpus] {
                let mut v = [0.0f64; 26];
                let busy = group.phase != Phase::Free;
                if busy {
                    gpu.clock_hold = CLOCK_HOLD_SAMPLES;
                } else if gpu.busy_before {
                    gpu.clock_hold = CLOCK_HOLD_SAMPLES;
                } else {
                    gpu.clock_hold = gpu.clock_hold.saturating_sub(1);
                }
                gpu.busy_before = busy;
                v[GPU_UTIL] = noisy(rng, p.util).round().clamp(0.0, 100.0);
                v[MEM_UTIL] = noisy(rng, p.mem_util).round().clamp(0.0, 100.0);
                let ratio =
                    |rng: &mut Rng, x: (f64, f64)| round_to(noisy(rng, x).clamp(0.0, 1.0), 6);
                v[SM_ACTIVE] = ratio(rng, p.sm_active);
                v[SM_OCCUPANCY] = ratio(rng, p.occupancy);
                v[TENSOR] = ratio(rng, p.tensor);
                v[DRAM] = ratio(rng, p.dram);
                v[FP64] = ratio(rng, p.fp64);
                v[FP32] = ratio(rng, p.fp32);
                v[FP16] = 0.0;
                v[FB_USED] = match &group.job {
                    Some(job) => job.fb_mib + gpu.fb_extra_mib,
                    None => FB_FREE_GPU_MIB,
                };
                v[FB_TOTAL] = FB_TOTAL_MIB;
                let mut power = noisy(rng, p.power) * gpu.power_scale;
                if group.phase == Phase::Free && rng.chance(0.01) {
                    power += 5.0 + rng.uniform() * 10.0;
                }
                let power = round_to(power.clamp(50.0, POWER_CAP_W), 3);
                v[POWER] = power;
                // Energy in mJ: W × ms.
                gpu.energy_mj += (power * interval as f64).round();
                v[ENERGY] = gpu.energy_mj;
                gpu.temp += (p.temp + gpu.temp_offset - gpu.temp) * 0.35 + 0.25 * rng.normal();
                gpu.mem_temp +=
                    (p.mem_temp + gpu.temp_offset - gpu.mem_temp) * 0.35 + 0.25 * rng.normal();
                v[TEMP] = gpu.temp.round();
                v[MEM_TEMP] = gpu.mem_temp.round();
                let (clock, reasons) = if group.phase == Phase::Free {
                    if gpu.clock_hold > 0 {
                        (BOOST_SM_CLOCK_MHZ, 0.0)
                    } else {
                        (IDLE_SM_CLOCK_MHZ, REASON_IDLE)
                    }
                } else {
                    let c = (noisy(rng, p.sm_clock) / 15.0).round() * 15.0;
                    (c.min(BOOST_SM_CLOCK_MHZ), p.reasons)
                };
                v[SM_CLOCK] = clock;
                v[REASONS] = reasons;
                v[MEM_CLOCK] = MEM_CLOCK_MHZ;
                v[PCIE_TX] = noisy(rng, p.pcie_tx).max(0.0).round();
                let mut rx = noisy(rng, p.pcie_rx).max(0.0);
                if group.phase == Phase::Free && rng.chance(0.05) {
                    rx = 18e6 * rng.uniform();
                }
                v[PCIE_RX] = rx.round();
                let link = if multi_gpu { p.nvlink } else { (0.0, 0.0) };
                v[NVLINK_TX] = noisy(rng, link).max(0.0).round();
                v[NVLINK_RX] = noisy(rng, link).max(0.0).round();
                if gpu.ecc_rate > 0.0 && rng.chance(gpu.ecc_rate) {
                    gpu.ecc_sbe += 1.0;
                }
                v[ECC_SBE] = gpu.ecc_sbe;
                v[ECC_DBE] = 0.0;
                v[REMAPPED] = gpu.remapped;
                v[REMAP_FAILURE] = 0.0;
                out.push(Sample {
                    time_ms,
                    job: group.job.as_ref().map(|j| j.id),
                    values: v,
                });
            }
        }
    }
}

/// Splits a host's GPUs into scheduling groups: whole-node jobs are the most common.
fn partition(gpus: usize, rng: &mut Rng) -> Vec<Group> {
    let u = rng.uniform();
    let sizes: Vec<usize> = if gpus < 8 {
        vec![1; gpus]
    } else if u < 0.55 {
        vec![gpus]
    } else if u < 0.75 {
        vec![gpus / 2, gpus - gpus / 2]
    } else if u < 0.85 {
        let q = gpus / 4;
        vec![q, q, gpus - 2 * q]
    } else {
        vec![1; gpus]
    };
    let mut first = 0;
    sizes
        .into_iter()
        .map(|n| {
            let g = Group {
                first_gpu: first,
                gpus: n,
                job: None,
                remaining: 0,
                phase: Phase::Free,
            };
            first += n;
            g
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let others: std::collections::HashSet<Option<u64>> =
            all[2..].iter().flatten().flatten().map(|s| s.job).collect();
        assert!(others.len() > 2 && !others.contains(&Some(BIG_JOB_ID)));
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
                        assert!(
                            (0.0..=1.0).contains(&s.values[i]),
                            "{} {}",
                            FIELDS[i],
                            s.values[i]
                        );
                    }
                    assert!((0.0..=100.0).contains(&s.values[GPU_UTIL]));
                    assert!(s.values[POWER] >= 50.0 && s.values[POWER] <= POWER_CAP_W);
                    assert!(s.values[FB_USED] <= s.values[FB_TOTAL]);
                }
            }
        }
    }

    #[test]
    fn fleet_shows_every_phase_jobs_change_and_idle_jobs_exist() {
        let all = run(&mut fleet(11), 3000);
        let samples: Vec<&Sample> = all.iter().flatten().flatten().collect();
        let jobs: std::collections::HashSet<u64> = samples.iter().filter_map(|s| s.job).collect();
        assert!(jobs.len() > 8, "jobs start and end: {}", jobs.len());
        assert!(
            samples.iter().any(|s| s.job.is_none()),
            "some GPUs are free"
        );
        // Busy, light and allocated-but-idle samples all occur.
        assert!(samples.iter().any(|s| s.values[TENSOR] > 0.8));
        assert!(samples.iter().any(|s| s.values[DRAM] > 0.8));
        assert!(samples.iter().any(|s| s.values[FP64] > 0.5));
        assert!(
            samples.iter().any(|s| s.job.is_some()
                && s.values[GPU_UTIL] == 0.0
                && s.values[FB_USED] > 10_000.0)
        );
        // Flat columns stay flat, noisy ones are noisy.
        let distinct = |i: usize| {
            samples
                .iter()
                .map(|s| s.values[i].to_bits())
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        assert_eq!(distinct(MEM_CLOCK), 1);
        assert_eq!(distinct(FB_TOTAL), 1);
        assert!(distinct(POWER) > samples.len() / 4);
    }
}
