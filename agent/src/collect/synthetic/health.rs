//! Simulated faults: XID events, ECC errors and remapped rows, power-brake episodes and one hot
//! board, so that health views have something to show. Everything here is simulated and
//! deterministic from the seed; the rates are far above a healthy fleet's (see the module docs).
//!
//! Faults draw from their own random stream, at fault times only, and are handled in time order
//! between the job events (see `Fleet::advance_to`), so they do not depend on how often the node
//! is sampled and never disturb the job schedule or the measurement noise.

use super::*;

/// NVML clocks-event reason: software thermal slowdown.
pub(super) const REASON_SW_THERMAL: i64 = 0x20;
/// NVML clocks-event reason: hardware thermal slowdown.
pub(super) const REASON_HW_THERMAL: i64 = 0x40;
/// NVML clocks-event reason: hardware power brake (asserted by the system, e.g. the PSU).
pub(super) const REASON_HW_POWER_BRAKE: i64 = 0x80;

/// GPU core temperature at which the hot board's driver slows it down (SW thermal).
pub(super) const SW_THERMAL_C: f64 = 85.0;
/// GPU core temperature at which the hardware slows it down too (HW thermal).
pub(super) const HW_THERMAL_C: f64 = 88.0;
/// Extra heat of the hot board (a failing fan or a blocked air path), °C per W above idle.
const HOT_BOARD_C_PER_W: f64 = 0.035;
/// SM clock while the power brake is asserted, MHz.
pub(super) const POWER_BRAKE_SM_CLOCK_MHZ: i64 = 1095;

/// Mean gap between corrected (single-bit) ECC errors on the degraded board.
const SBE_MEAN_GAP_S: f64 = 5.0 * 60.0;
/// Mean gap between uncorrectable (double-bit) ECC errors on the degraded board.
const DBE_MEAN_GAP_S: f64 = 6.0 * 3600.0;
/// Mean gap between NVLink errors (XID 74) on the node.
const NVLINK_MEAN_GAP_S: f64 = 12.0 * 3600.0;
/// Mean gap between "fallen off the bus" (XID 79) on the node.
const OFF_BUS_MEAN_GAP_S: f64 = 7.0 * 86_400.0;
/// Mean gap between power-brake episodes on the node.
const BRAKE_MEAN_GAP_S: f64 = 2.0 * 3600.0;
/// Share of jobs that end with an application fault (XID 13, 31 or 43).
const CRASH_SHARE: u64 = 25;
/// Spare rows per bank: remapping fails (XID 64) once this many rows are remapped.
const SPARE_ROWS: i64 = 16;
/// XID 92 (high single-bit error rate) each time the corrected count passes a multiple of this.
const SBE_RATE_STEP: i64 = 20;

/// Events kept until drained; beyond this the oldest half is dropped.
const MAX_PENDING_EVENTS: usize = 10_000;

/// The health counters of one GPU, since driver load (NVML's volatile counters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub(super) sbe: i64,
    pub(super) dbe: i64,
    pub(super) remapped: i64,
    pub(super) remap_failure: i64,
    pub(super) xid: i64,
}

/// The faults of one node.
#[derive(Debug, Clone)]
pub(super) struct Health {
    /// Fault random stream: drawn only at fault times.
    rng: Rng,
    /// The board whose HBM is wearing out: corrected errors often, uncorrectable ones rarely.
    degraded: Option<usize>,
    /// The board that runs hot under load (thermal slowdown).
    hot: Option<usize>,
    counters: Vec<Counters>,
    next_sbe: u64,
    next_dbe: u64,
    next_nvlink: u64,
    next_off_bus: u64,
    next_brake: u64,
    /// The current (or last) power-brake episode, `[start, end)`.
    brake: (u64, u64),
    /// Events not yet drained by `Source::events`.
    events: Vec<GpuEvent>,
    /// Multiplies every mean gap between faults (the inverse of the node's fault-rate scale).
    gap_scale: f64,
}

impl Health {
    /// The node's boards: which one is degraded and which runs hot, and the counters they show
    /// at start (errors since the driver was loaded, days ago).
    ///
    /// `rate_scale` multiplies every fault rate (1: the demo's); below 1 the hot board is there
    /// only with that chance.
    pub(super) fn new(seed: u64, gpus: usize, rate_scale: f64) -> Self {
        let mut rng = Rng::new(seed ^ 0x4661_756c_7473_2121);
        let degraded = (gpus > 0).then(|| rng.below(gpus as u64) as usize);
        let mut hot = match (gpus, degraded) {
            (0, _) => None,
            (1, _) => Some(0),
            (n, Some(d)) => Some((d + 1 + rng.below(n as u64 - 1) as usize) % n),
            (n, None) => Some(rng.below(n as u64) as usize),
        };
        if rate_scale < 1.0 && !rng.chance(rate_scale) {
            hot = None;
        }
        let mut counters = vec![Counters::default(); gpus];
        if let Some(d) = degraded {
            let c = &mut counters[d];
            c.sbe = 20 + rng.below(120) as i64;
            c.dbe = rng.below(2) as i64;
            c.remapped = c.dbe + rng.below(2) as i64;
        }
        Health {
            rng,
            degraded,
            hot,
            counters,
            next_sbe: u64::MAX,
            next_dbe: u64::MAX,
            next_nvlink: u64::MAX,
            next_off_bus: u64::MAX,
            next_brake: u64::MAX,
            brake: (0, 0),
            events: Vec::new(),
            gap_scale: 1.0 / rate_scale.max(1e-9),
        }
    }

    /// A random gap, in ns, before the next fault of a kind whose mean gap is `mean_s`
    /// seconds at the demo's rates.
    fn gap(&mut self, mean_s: f64) -> u64 {
        secs(self.rng.exp(mean_s * self.gap_scale).max(1.0))
    }

    /// Start the fault clocks at `t0`.
    pub(super) fn start(&mut self, t0: u64) {
        if self.counters.is_empty() {
            return;
        }
        if self.degraded.is_some() {
            self.next_sbe = t0 + self.gap(SBE_MEAN_GAP_S);
            self.next_dbe = t0 + self.gap(DBE_MEAN_GAP_S);
        }
        self.next_nvlink = t0 + self.gap(NVLINK_MEAN_GAP_S);
        self.next_off_bus = t0 + self.gap(OFF_BUS_MEAN_GAP_S);
        self.next_brake = t0 + self.gap(BRAKE_MEAN_GAP_S);
    }

    /// The counters of GPU `i`.
    pub(super) fn counters(&self, i: usize) -> &Counters {
        &self.counters[i]
    }

    /// Drain the events seen so far.
    pub(super) fn drain(&mut self) -> Vec<GpuEvent> {
        std::mem::take(&mut self.events)
    }

    /// Extra core temperature of GPU `i` at board power `power`, °C.
    pub(super) fn extra_heat(&self, i: usize, power: f64) -> f64 {
        if self.hot == Some(i) {
            HOT_BOARD_C_PER_W * (power - IDLE_POWER_W).max(0.0)
        } else {
            0.0
        }
    }

    /// Whether the node's power brake is asserted at `t`.
    pub(super) fn braking(&self, t: u64) -> bool {
        (self.brake.0..self.brake.1).contains(&t)
    }

    fn next_fault(&self) -> u64 {
        self.next_sbe
            .min(self.next_dbe)
            .min(self.next_nvlink)
            .min(self.next_off_bus)
            .min(self.next_brake)
    }
}

/// What an XID means, for the event's detail (NVIDIA's XID catalogue, shortened).
pub(super) fn xid_meaning(code: i64) -> &'static str {
    match code {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup, due to previous errors",
        48 => "double-bit ECC error",
        63 => "row remapping recorded",
        64 => "row remapping failed",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        _ => "unknown",
    }
}

impl Fleet {
    /// Handle every fault due at or before `t`, in time order. The jobs on the GPUs are those
    /// of the segment that ends at `t` (no job event lies in between).
    pub(super) fn faults_until(&mut self, t: u64) {
        loop {
            let next = self.health.next_fault();
            if next > t || next == u64::MAX {
                return;
            }
            let h = &self.health;
            if next == h.next_sbe {
                self.corrected_error(next);
                self.health.next_sbe = next + self.health.gap(SBE_MEAN_GAP_S);
            } else if next == h.next_dbe {
                self.uncorrectable_error(next);
                self.health.next_dbe = next + self.health.gap(DBE_MEAN_GAP_S);
            } else if next == h.next_nvlink {
                let i = self.health.rng.below(self.gpus.len() as u64) as usize;
                self.xid(next, i, 74, None);
                self.health.next_nvlink = next + self.health.gap(NVLINK_MEAN_GAP_S);
            } else if next == h.next_off_bus {
                let i = self.health.rng.below(self.gpus.len() as u64) as usize;
                self.xid(next, i, 79, None);
                self.health.next_off_bus = next + self.health.gap(OFF_BUS_MEAN_GAP_S);
            } else {
                let length = secs(self.health.rng.range(20.0, 90.0));
                self.health.brake = (next, next + length);
                self.health.next_brake = next + length + self.health.gap(BRAKE_MEAN_GAP_S);
            }
        }
    }

    /// A job ended at `now`: about one in five ends with an application fault on its first GPU
    /// (XID 13, 31 or 43), followed by XID 45 on its other GPUs as the driver cleans up. Decided
    /// by a hash of the job id, so the job schedule's random stream is not touched.
    pub(super) fn job_ended(&mut self, job: &Job, now: u64) {
        let h = mix64(self.seed ^ job.id.wrapping_mul(0x2545_f491_4f6c_dd1d));
        if h % 100 >= CRASH_SHARE {
            return;
        }
        let code = match (h >> 8) % 100 {
            0..35 => 13,
            35..70 => 31,
            _ => 43,
        };
        let Some((&first, rest)) = job.gpus.split_first() else {
            return;
        };
        let id = job.id.to_string();
        self.xid(now, first, code, Some(&id));
        for &g in rest {
            self.xid(now, g, 45, Some(&id));
        }
    }

    /// A corrected error on the degraded board; XID 92 each time the count passes a step.
    fn corrected_error(&mut self, t: u64) {
        let Some(i) = self.health.degraded else {
            return;
        };
        let n = 1 + self.health.rng.below(3) as i64;
        let before = self.health.counters[i].sbe;
        self.health.counters[i].sbe += n;
        self.event(
            t,
            i,
            "ecc_sbe",
            0,
            format!("ecc_sbe: {n} corrected single-bit error(s) in HBM"),
        );
        if (before + n) / SBE_RATE_STEP > before / SBE_RATE_STEP {
            self.xid(t, i, 92, None);
        }
    }

    /// An uncorrectable error on the degraded board: XID 48, then XID 94 (contained: only the
    /// job's process is hit) or rarely XID 95 (uncontained) when a job runs there, then the row
    /// is remapped (XID 63) or, when no spare row is left, remapping fails (XID 64).
    fn uncorrectable_error(&mut self, t: u64) {
        let Some(i) = self.health.degraded else {
            return;
        };
        let contained = self.health.rng.chance(0.8);
        let job = self.job_of(i).map(|j| j.id.to_string());
        self.health.counters[i].dbe += 1;
        self.event(
            t,
            i,
            "ecc_dbe",
            0,
            "ecc_dbe: uncorrectable double-bit error in HBM".to_string(),
        );
        self.xid(t, i, 48, job.as_deref());
        if job.is_some() {
            self.xid(t, i, if contained { 94 } else { 95 }, job.as_deref());
        }
        let c = &mut self.health.counters[i];
        if c.remapped < SPARE_ROWS {
            c.remapped += 1;
            self.xid(t, i, 63, None);
        } else {
            c.remap_failure = 1;
            self.xid(t, i, 64, None);
        }
    }

    fn xid(&mut self, t: u64, i: usize, code: i64, job: Option<&str>) {
        self.health.counters[i].xid += 1;
        let detail = match job {
            Some(id) => format!("xid {code}: {} (job {id})", xid_meaning(code)),
            None => format!("xid {code}: {}", xid_meaning(code)),
        };
        self.event(t, i, "xid", code, detail);
    }

    fn event(&mut self, t: u64, i: usize, kind: &str, code: i64, detail: String) {
        // Nobody drains them (a caller of `collect` only): keep the newest.
        if self.health.events.len() >= MAX_PENDING_EVENTS {
            self.health.events.drain(..MAX_PENDING_EVENTS / 2);
        }
        self.health.events.push(GpuEvent {
            time_unix_nano: t,
            gpu_uuid: self.gpus[i].uuid.clone(),
            gpu_index: i as u32,
            kind: kind.to_string(),
            code,
            detail,
        });
    }
}
