//! Per-GPU physics of the simulated node: what each GPU does in each phase (targets) and one
//! noisy reading of it.

use super::*;
use crate::JobExtra;

#[derive(Debug, Clone)]
pub(super) struct Gpu {
    pub(super) uuid: String,
    /// Index into `Fleet::jobs` is unstable, so the job is found by id.
    pub(super) job: Option<u64>,
    pub(super) released_at: Option<u64>,
    /// Board power, W (state, without measurement noise).
    pub(super) power: f64,
    /// Slow part of the core temperature, °C above the fast part.
    pub(super) temp_slow: f64,
    /// Slow part of the HBM temperature.
    pub(super) memory_temp_slow: f64,
    pub(super) energy_joules: f64,
    /// Per-board differences: idle power and temperature offsets.
    pub(super) power_offset: f64,
    pub(super) temp_offset: f64,
}

/// What a GPU does right now, before noise.
#[derive(Debug, Clone, Copy)]
pub(super) struct Targets {
    pub(super) util: f64,
    pub(super) memory_util: f64,
    pub(super) sm_active: f64,
    pub(super) sm_occupancy: f64,
    pub(super) tensor: f64,
    pub(super) dram: f64,
    fp64: f64,
    fp32: f64,
    fp16: f64,
    pub(super) power: f64,
    pub(super) sm_clock: SmClock,
    pub(super) reasons: i64,
    pub(super) pcie_tx_kib: f64,
    pub(super) pcie_rx_kib: f64,
    pub(super) nvlink_bytes: f64,
    pub(super) memory_used: i64,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum SmClock {
    Fixed(i64),
    /// Power-capped: the clock falls as the GPU heats up (1425 MHz at 60 °C in the trace).
    PowerCapped,
}

impl Fleet {
    /// What GPU `i` does at time `t`, before noise.
    pub(super) fn targets(&self, i: usize, t: u64) -> Targets {
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
        match job.phase {
            Phase::Hold => {}
            Phase::Small => small_targets(&mut tg, power_base, multi),
            Phase::Copy => copy_targets(&mut tg, power_base, multi),
            Phase::Compute => {
                let load = Load {
                    k: job.intensity,
                    multi,
                    power_base,
                    power_offset: gpu.power_offset,
                };
                compute_targets(&mut tg, job.kind.mix(), &load);
            }
        }
        tg
    }

    /// One noisy reading of GPU `i` at `t` (the state must already be at `t`).
    pub(super) fn sample(&mut self, i: usize, t: u64) -> GpuSample {
        let tg = self.targets(i, t);
        let job = self.job_of(i).map(|j| JobLabels {
            id: j.id.to_string(),
            user: j.user.to_string(),
            name: j.kind.name().to_string(),
            scheduler: "slurm".to_string(),
            k8s: None,
            extra: JobExtra {
                account: super::account_of(j.user).to_string(),
                partition: if j.kind == Kind::Notebook {
                    "interactive"
                } else {
                    "gpu"
                }
                .to_string(),
                ..JobExtra::default()
            },
        });
        let gpu = &self.gpus[i];
        let n = &mut self.noise;
        let power = (gpu.power + n.normal() * (0.002 * gpu.power + 0.1)).max(0.0);
        let health = &self.health;
        let extra = health.extra_heat(i, gpu.power);
        let temp = 39.0 + gpu.temp_offset + 0.028 * gpu.power + gpu.temp_slow + extra;
        let memory_temp = 43.5
            + gpu.temp_offset
            + 0.006 * gpu.power
            + 12.0 * tg.dram
            + gpu.memory_temp_slow
            + 0.5 * extra;
        let busy = job.is_some();
        let (sm_clock, reasons) = clock_and_reasons(n, health, &tg, temp, t, busy);
        let counters = health.counters(i);
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
        // The graphics engine is busy whenever a kernel runs: the simulated GPU gives it the
        // utilisation (no extra noise draw, so the rest of the sample is unchanged).
        s.gr_engine_active = s.gpu_utilization;
        s.memory_used_bytes = Some(tg.memory_used);
        s.memory_total_bytes = Some(MEMORY_TOTAL_BYTES);
        s.power_watts = Some(round_to(power, 1000.0));
        s.energy_joules = Some(round_to(gpu.energy_joules, 1000.0));
        s.temperature_celsius = Some((temp + n.normal() * 0.25).round());
        s.memory_temperature_celsius = Some((memory_temp + n.normal() * 0.25).round());
        s.sm_clock_mhz = Some(sm_clock);
        s.memory_clock_mhz = Some(MEMORY_CLOCK_MHZ);
        s.clock_event_reasons = Some(reasons);
        s.pcie_tx_bytes_per_second = Some(pcie(n, tg.pcie_tx_kib));
        s.pcie_rx_bytes_per_second = Some(pcie(n, tg.pcie_rx_kib));
        s.nvlink_tx_bytes_per_second = Some(nvlink(n, tg.nvlink_bytes));
        s.nvlink_rx_bytes_per_second = Some(nvlink(n, tg.nvlink_bytes));
        s.ecc_sbe_volatile_total = Some(counters.sbe);
        s.ecc_dbe_volatile_total = Some(counters.dbe);
        s.remapped_rows_uncorrectable = Some(counters.remapped);
        s.remapped_rows_failure = Some(counters.remap_failure);
        s.xid_errors_total = Some(counters.xid);
        // The H100 SXM of the trace: 1980 MHz at most, a PCIe gen 5 x16 link busy or idle.
        s.sm_clock_max_mhz = Some(SM_CLOCK_MAX_MHZ);
        s.pcie_link_gen = Some(5);
        s.pcie_link_width = Some(16);
        s
    }
}

/// The SM clock and clocks-event reasons of a reading at core temperature `temp`: the phase's
/// clock (a power-capped one falls as the GPU heats up, with noise), lowered by the hot board's
/// thermal limits and by the power brake, which holds every working GPU of the node low while
/// the system asserts it (a free GPU idles at 345 MHz anyway).
fn clock_and_reasons(
    n: &mut Rng,
    health: &Health,
    tg: &Targets,
    temp: f64,
    t: u64,
    busy: bool,
) -> (i64, i64) {
    let mut sm_clock = match tg.sm_clock {
        SmClock::Fixed(mhz) => mhz,
        SmClock::PowerCapped => {
            let mhz = 1425.0 - 12.0 * (temp - 60.0) + n.normal() * 15.0;
            ((mhz / 15.0).round() * 15.0).clamp(1200.0, 1755.0) as i64
        }
    };
    let mut reasons = tg.reasons;
    if temp >= health::SW_THERMAL_C {
        reasons |= health::REASON_SW_THERMAL;
        let mhz = 1155.0 - 30.0 * (temp - health::SW_THERMAL_C);
        sm_clock = sm_clock.min(((mhz / 15.0).round() * 15.0).max(705.0) as i64);
    }
    if temp >= health::HW_THERMAL_C {
        reasons |= health::REASON_HW_THERMAL;
    }
    if health.braking(t) && busy {
        reasons |= health::REASON_HW_POWER_BRAKE;
        sm_clock = sm_clock.min(health::POWER_BRAKE_SM_CLOCK_MHZ);
    }
    (sm_clock, reasons)
}

/// Memory a CUDA context takes on top of the free GPU's, outside the process's own use: the
/// trace's `fb_used_bytes - proc_used_bytes` in every phase.
const CONTEXT_RESERVED_BYTES: i64 = 512_557_056;

impl Fleet {
    /// The process of the job on the GPU of sample `s` (one rank per GPU: pids are consecutive
    /// from a base drawn from the job id, so a job's ranks look like a launcher's children).
    /// Its memory is the GPU's used memory less the context's; its SM share is the GPU's
    /// utilisation, as in the trace (100 % / 100 %, 0 / 0).
    pub(super) fn process(&self, s: &GpuSample) -> Option<ProcessSample> {
        let i = s.gpu_index as usize;
        let job = self.job_of(i)?;
        let rank = job.gpus.iter().position(|&g| g == i)? as u32;
        let base = 1_000 + (mix64(self.seed ^ job.id) % 3_000_000) as u32;
        Some(ProcessSample {
            time_unix_nano: s.time_unix_nano,
            gpu_uuid: s.gpu_uuid.clone(),
            gpu_index: s.gpu_index,
            pid: base + rank,
            process_name: Some(job.kind.process_name().to_string()),
            job: s.job.clone(),
            used_memory_bytes: s
                .memory_used_bytes
                .map(|m| (m - CONTEXT_RESERVED_BYTES).max(0)),
            sm_utilization: s.gpu_utilization,
        })
    }
}

/// A free GPU: no process, or the 2.5 s after one exited.
pub(super) fn free_targets(gpu: &Gpu, lingering: bool, t: u64) -> Targets {
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

pub(super) fn temp_slow_target(power: f64) -> f64 {
    0.016 * (power - IDLE_POWER_W).max(0.0)
}

pub(super) fn memory_temp_slow_target(power: f64) -> f64 {
    0.019 * (power - IDLE_POWER_W).max(0.0)
}

/// NVML reports utilisation as whole percent: a ratio with two decimals. Exactly 0 stays 0.
pub(super) fn percent(n: &mut Rng, target: f64, noise_pct: f64) -> f64 {
    if target <= 0.0 {
        return 0.0;
    }
    ((target * 100.0 + n.normal() * noise_pct).round() / 100.0).clamp(0.0, 1.0)
}

/// A GPM activity ratio with 0.5 % relative noise, clamped to 0..1. Exactly 0 stays 0.
pub(super) fn activity(n: &mut Rng, target: f64) -> f64 {
    if target <= 0.0 {
        return 0.0;
    }
    round_to(
        (target * (1.0 + 0.005 * n.normal())).clamp(0.0, 1.0),
        10_000.0,
    )
}

/// PCIe rate from a KiB/s figure: 5 % noise and an occasional doubling, as in the trace.
pub(super) fn pcie(n: &mut Rng, kib: f64) -> f64 {
    let spike = if n.chance(0.06) { 2.0 } else { 1.0 };
    (kib * spike * (1.0 + 0.05 * n.normal()) * 1024.0)
        .max(0.0)
        .round()
}

pub(super) fn nvlink(n: &mut Rng, bytes: f64) -> f64 {
    if bytes <= 0.0 {
        return 0.0;
    }
    (bytes * (1.0 + 0.08 * n.normal())).max(0.0).round()
}

/// What a computing GPU's targets depend on besides its mix.
struct Load {
    /// The job's intensity, 0..1.
    k: f64,
    /// True when the job spans several GPUs (NVLink traffic).
    multi: bool,
    /// Idle power with a context, plus the board's offset.
    power_base: f64,
    /// The board's own power offset.
    power_offset: f64,
}

/// A job running small kernels: a little SM work, PCIe traffic.
fn small_targets(tg: &mut Targets, power_base: f64, multi: bool) {
    tg.util = 0.03;
    tg.sm_active = 0.0187;
    tg.sm_occupancy = 0.0011;
    tg.fp32 = 0.0012;
    tg.power = power_base + 1.0;
    tg.pcie_tx_kib = 4200.0;
    tg.pcie_rx_kib = 18_100.0;
    tg.nvlink_bytes = if multi { 0.2e9 } else { 0.0 };
}

/// A job copying memory: DRAM busy, pipes idle.
fn copy_targets(tg: &mut Targets, power_base: f64, multi: bool) {
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

/// A job computing with `mix`'s pipes at its intensity.
fn compute_targets(tg: &mut Targets, mix: Mix, l: &Load) {
    let (k, multi, power_base) = (l.k, l.multi, l.power_base);
    tg.util = (0.9 + 0.1 * k).min(1.0);
    tg.pcie_tx_kib = 8500.0;
    tg.pcie_rx_kib = 19_000.0;
    match mix {
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
                tg.power = POWER_CAP_W + l.power_offset * 0.3;
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
