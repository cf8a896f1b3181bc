//! A simulated fleet of H100 GPUs, sampled the way dcgm-exporter and a Prometheus scrape see them.
//!
//! Every host is one node of the agent's synthetic model (`gpuwatch_agent::Fleet`,
//! agent/src/collect/synthetic/): its jobs, phases, physics and noise are the agent's, calibrated
//! on the real H100 trace; this file only sets the nodes up as a production fleet
//! ([`gpuwatch_agent::NodeOptions`]: hours-long jobs, fleet-wide job ids, a healthy fleet's fault
//! rates, the multi-host job) and turns each reading into dcgm-exporter's series and units
//! (docs/benchmarks.md describes the result). Each host is scraped at its own offset within the
//! interval, with a few ms of jitter. Everything is derived from one seed, so two runs with the
//! same flags produce the same samples.

use gpuwatch_agent::collect::{GpuSample, Source};
use gpuwatch_agent::{NodeOptions, StandingJob};

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
#[cfg(test)]
const FB_TOTAL_MIB: f64 = 81559.0;
/// Memory used on a GPU without processes in the trace (503316480 bytes).
pub(crate) const FB_FREE_GPU_MIB: f64 = 480.0;
const MIB: f64 = 1_048_576.0;

/// Multiplies the agent's job lengths and arrival gaps: its demo's minutes become a production
/// cluster's hours (training jobs 2–6 h, notebooks 3–12 h).
const JOB_TIME_SCALE: f64 = 6.0;
/// Multiplies the agent's fault rates (a demo's, far above a healthy fleet's): one corrected
/// ECC error every 8 hours or so on one board per host, a hot board on one host in a hundred.
const FAULT_RATE_SCALE: f64 = 0.01;
/// Simulated time each node runs before the first scrape, so the fleet starts in its steady
/// state (jobs of every age, GPUs free and busy).
const WARM_UP_MS: i64 = 24 * 3_600_000;
/// Job ids of host `h` start at `FIRST_JOB_ID + h * JOB_IDS_PER_HOST`, unique across the fleet.
const FIRST_JOB_ID: u64 = 4_200_000;
const JOB_IDS_PER_HOST: u64 = 100_000;

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
}

/// What a job does, as the processes and names of `workload.rs` see it: the agent's job kinds
/// grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// The agent's `train-llm` and `finetune-bert`: compute with copies and evaluation stalls;
    /// may hang (then idle in the job).
    Training,
    /// The agent's `eval-sweep`: light kernels with bursts of compute.
    Inference,
    /// The agent's `render-batch`: FP32 compute and copies, with a worker process.
    DataPrep,
    /// The agent's `md-sim`: FP64 codes.
    Hpc,
    /// The agent's `notebook`: holds memory, mostly does nothing.
    Idle,
}

impl JobKind {
    /// The group of the agent's job kind `name` (its `JobLabels::name`).
    fn of_agent(name: &str) -> Self {
        match name {
            "eval-sweep" => Self::Inference,
            "render-batch" => Self::DataPrep,
            "md-sim" => Self::Hpc,
            "notebook" => Self::Idle,
            _ => Self::Training,
        }
    }
}

/// One host: a node of the agent's model, its dcgm-exporter scraped every interval at its own
/// phase.
#[derive(Debug, Clone)]
struct Host {
    name: String,
    /// Where in the interval this host's scrapes fall.
    offset_ms: i64,
    node: gpuwatch_agent::Fleet,
    pci_bus: Vec<String>,
    /// The kind of the job on each GPU in the last scrape.
    kinds: Vec<Option<JobKind>>,
    /// Scrape jitter.
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
/// Its user (one of the agent's).
const BIG_JOB_USER: &str = "alice";

/// The simulated fleet.
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    config: FleetConfig,
    hosts: Vec<Host>,
}

/// 64 bits from the fleet's seed and a host (SplitMix64's finaliser).
fn host_seed(seed: u64, h: usize) -> u64 {
    let mut z = seed ^ (h as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Milliseconds to the agent's Unix nanoseconds (times before 1970 clamp to 0).
fn ms_to_ns(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0) * 1_000_000
}

impl Fleet {
    /// A fleet in its steady state at `config.start_ms`.
    pub(crate) fn new(config: FleetConfig) -> Self {
        let mut seed_rng = Rng::new(config.seed);
        let interval = config.interval_ms.max(1);
        let hosts = (0..config.hosts)
            .map(|h| {
                let mut rng = Rng::new(seed_rng.next_u64());
                let node = Self::node(&config, h);
                let pci_bus = (0..config.gpus_per_host)
                    .map(|i| format!("00000000:{:02X}:00.0", 0x18 + 0x10 * i))
                    .collect();
                Host {
                    name: format!("gpu-node-{:03}", h + 1),
                    offset_ms: rng.below(interval as u64) as i64,
                    node,
                    pci_bus,
                    kinds: vec![None; config.gpus_per_host],
                    rng,
                }
            })
            .collect();
        Self { config, hosts }
    }

    /// Host `h`'s node of the agent's model, run for [`WARM_UP_MS`] before the start.
    fn node(config: &FleetConfig, h: usize) -> gpuwatch_agent::Fleet {
        let standing = (h < config.job_hosts).then_some(StandingJob {
            id: BIG_JOB_ID,
            user: BIG_JOB_USER,
        });
        let options = NodeOptions {
            demo_jobs: false,
            first_job_id: Some(FIRST_JOB_ID + h as u64 * JOB_IDS_PER_HOST),
            standing_job: standing,
            job_time_scale: JOB_TIME_SCALE,
            fault_rate_scale: FAULT_RATE_SCALE,
        };
        let mut node = gpuwatch_agent::Fleet::with_options(
            config.gpus_per_host,
            host_seed(config.seed, h),
            options,
        );
        // The synthetic source never fails; its first reading only starts the clock.
        let _ = node.collect(ms_to_ns(config.start_ms - WARM_UP_MS));
        node
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
        let host = &self.hosts[h];
        (host.node.uuid(i), &host.pci_bus[i])
    }

    /// The kind of the job holding GPU `i` of host `h` in the host's last scrape, if any.
    pub(crate) fn job_kind(&self, h: usize, i: usize) -> Option<JobKind> {
        self.hosts[h].kinds[i]
    }

    /// Samples of host `h` for scrape round `k` (the k-th interval after the start), one per
    /// GPU, written into `out`. Rounds of one host must be asked for in order.
    pub(crate) fn scrape(&mut self, h: usize, k: u64, out: &mut Vec<Sample>) {
        out.clear();
        let interval = self.config.interval_ms;
        let host = &mut self.hosts[h];
        // Scrape jitter: a few ms around the host's slot (the trace: sd 1.8 ms).
        let jitter = (host.rng.normal() * 2.0).round().clamp(-8.0, 8.0) as i64;
        let time_ms = self.config.start_ms + host.offset_ms + k as i64 * interval + jitter;
        // The synthetic source never fails: an error would leave the round empty.
        let readings = host.node.collect(ms_to_ns(time_ms)).unwrap_or_default();
        for (i, r) in readings.iter().enumerate() {
            host.kinds[i] = r.job.as_ref().map(|j| JobKind::of_agent(&j.name));
            out.push(Sample {
                time_ms,
                job: r.job.as_ref().and_then(|j| j.id.parse().ok()),
                values: dcgm_values(r),
            });
        }
    }
}

/// One of the agent's readings in dcgm-exporter's series and units: utilisation in percent,
/// memory in MiB, energy in mJ, the rest as the agent has them.
fn dcgm_values(r: &GpuSample) -> [f64; 26] {
    let f = |v: Option<f64>| v.unwrap_or(0.0);
    let i = |v: Option<i64>| v.unwrap_or(0) as f64;
    let percent = |v: Option<f64>| (f(v) * 100.0).round();
    let mut v = [0.0f64; 26];
    v[GPU_UTIL] = percent(r.gpu_utilization);
    v[MEM_UTIL] = percent(r.memory_utilization);
    v[SM_ACTIVE] = f(r.sm_active);
    v[SM_OCCUPANCY] = f(r.sm_occupancy);
    v[TENSOR] = f(r.tensor_active);
    v[DRAM] = f(r.dram_active);
    v[FP64] = f(r.fp64_active);
    v[FP32] = f(r.fp32_active);
    v[FP16] = f(r.fp16_active);
    v[FB_USED] = (i(r.memory_used_bytes) / MIB).round();
    v[FB_TOTAL] = (i(r.memory_total_bytes) / MIB).round();
    v[POWER] = f(r.power_watts);
    v[ENERGY] = (f(r.energy_joules) * 1000.0).round();
    v[TEMP] = f(r.temperature_celsius);
    v[MEM_TEMP] = f(r.memory_temperature_celsius);
    v[SM_CLOCK] = i(r.sm_clock_mhz);
    v[MEM_CLOCK] = i(r.memory_clock_mhz);
    v[REASONS] = i(r.clock_event_reasons);
    v[PCIE_TX] = f(r.pcie_tx_bytes_per_second);
    v[PCIE_RX] = f(r.pcie_rx_bytes_per_second);
    v[NVLINK_TX] = f(r.nvlink_tx_bytes_per_second);
    v[NVLINK_RX] = f(r.nvlink_rx_bytes_per_second);
    v[ECC_SBE] = i(r.ecc_sbe_volatile_total);
    v[ECC_DBE] = i(r.ecc_dbe_volatile_total);
    v[REMAPPED] = i(r.remapped_rows_uncorrectable);
    v[REMAP_FAILURE] = i(r.remapped_rows_failure);
    v
}

#[cfg(test)]
mod tests;
