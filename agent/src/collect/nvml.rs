//! Real GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by nvml-wrapper).
//!
//! Every field is read on its own: a call that fails leaves that field `None` (logged at debug)
//! and the others are still read. A GPU whose handle or UUID cannot be read is skipped with a
//! warning (once per GPU, then at debug). What is read, and the unit conversions:
//!
//! | field | NVML call | conversion |
//! | --- | --- | --- |
//! | `gpu_uuid`, `gpu_model`, the device handle, MIG on/off | `nvmlDeviceGetHandleByIndex`, `…GetUUID`, `…GetName`, `…GetMigMode`, once per GPU (see `Gpu`); the GPU count and MIG mode again every `--slow-interval` | |
//! | gpu / memory utilisation | `nvmlDeviceGetUtilizationRates` | % → ratio |
//! | memory used / total | `nvmlDeviceGetMemoryInfo` | bytes |
//! | power | `nvmlDeviceGetPowerUsage` | mW → W |
//! | energy | `nvmlDeviceGetTotalEnergyConsumption` every `--slow-interval` (it costs about 4 ms of CPU per call on an H100), advanced by power × time in between, never backwards | mJ → J |
//! | temperature | `nvmlDeviceGetTemperature(GPU)` | °C |
//! | memory temperature, remapped rows | `nvmlDeviceGetFieldValues` (ids 82, 143, 145), one call | °C, rows, 0/1 |
//! | SM / memory clock | `nvmlDeviceGetClockInfo` | MHz |
//! | clock-event reasons | `nvmlDeviceGetCurrentClocksThrottleReasons` (older name, same bitmask) | bits |
//! | PCIe tx / rx | GPM `PCIE_TX/RX_PER_SEC` where GPM works (Hopper+), else `nvmlDeviceGetPcieThroughput` (which samples for 20 ms per call) | MiB/s or KiB/s → B/s |
//! | ECC volatile totals | `nvmlDeviceGetTotalEccErrors(corrected/uncorrected, volatile)` | count |
//! | SM active / occupancy, tensor, DRAM, fp64/32/16, NVLink tx/rx | GPM (Hopper+): two samples one interval apart, kept and refilled with `nvmlGpmSampleGet` ([`crate::collect::gpm`]) | % → ratio, MiB/s → B/s |
//!
//! | XID errors since agent start, `gpu_events` | event set (`nvmlEventSetWait`, non-blocking, drained each collection): XID, single- and double-bit ECC | count |
//! | processes: used memory, SM utilisation | `nvmlDeviceGetComputeRunningProcesses` every collection; `nvmlDeviceGetProcessUtilization` (2 ms of CPU per call on an H100) every `--slow-interval`, the mean of the samples since the previous read, null in between | bytes, % → ratio |
//!
//! Not read yet: MIG instances (nvml-wrapper 0.13 does not wrap the GPU / compute instance ids
//! that name them). Job attribution is done afterwards ([`crate::attribute`]).
//! GPM values appear from the second collection on, since they are computed between two samples.

use std::collections::{HashMap, HashSet};

use nvml_wrapper::Device;
use nvml_wrapper::EventSet;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_UNC,
};
use tracing::{debug, info, warn};

use crate::collect::gpm::GpmPair;
use crate::collect::{GpuEvent, GpuSample, ProcessSample, Source};
use crate::error::{Error, Result};

/// The GPM metrics read on Hopper and newer GPUs.
pub const GPM_METRICS: &[GpmMetricId] = &[
    GpmMetricId::GraphicsUtil,
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::Fp64Util,
    GpmMetricId::Fp32Util,
    GpmMetricId::Fp16Util,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
];

/// Reads every GPU of this host through NVML.
pub struct NvmlSource {
    /// Leaked once per process so that device handles and GPM samples (which borrow it) can
    /// be kept between collections; the agent holds NVML for its whole life anyway.
    nvml: &'static Nvml,
    /// GPUs seen (`nvmlDeviceGetCount`), read again every `--slow-interval`.
    count: u32,
    /// When `count` was read (Unix ns).
    count_read: Option<u64>,
    /// What does not change of each GPU, looked up once (see [`Gpu`]).
    gpus: HashMap<u32, Gpu>,
    /// The last two GPM samples per GPU index.
    gpm: HashMap<u32, GpmPair>,
    /// GPUs on which GPM is not supported (checked once).
    gpm_unsupported: HashSet<u32>,
    /// GPUs already warned about, so a broken GPU does not flood the log.
    warned: HashSet<u32>,
    /// XID and ECC events of every GPU that supports them.
    events: Option<EventSet<'static>>,
    /// GPUs registered for XID events: their `xid_errors_total` starts at 0.
    xid_registered: HashSet<String>,
    /// XID errors per GPU UUID since the agent started.
    xid_counts: HashMap<String, i64>,
    /// Events drained by the last collection.
    pending_events: Vec<GpuEvent>,
    /// Processes read by the last collection.
    processes: Vec<ProcessSample>,
    /// Newest per-process utilisation timestamp seen per GPU (µs, NVML's clock).
    process_util_seen: HashMap<u32, u64>,
    /// When per-process utilisation was last read, per GPU (Unix ns).
    process_util_read: HashMap<u32, u64>,
    /// Energy counter per GPU between its (costly) reads.
    energy: HashMap<u32, EnergyTrack>,
    /// Least time between two reads of the costly counters, ns (`--slow-interval`).
    slow_interval_ns: u64,
}

/// What is looked up once per GPU rather than at every collection: its handle
/// (`nvmlDeviceGetHandleByIndex`, which makes NVML check the GPU, 0.2 ms on average on an H100
/// with tails of several ms), UUID and name, and whether MIG is on (read again every
/// `--slow-interval`: turning MIG on or off takes a GPU reset). The entry is dropped, and the
/// GPU looked up again at the next collection, when a read fails in a way that may mean the
/// handle went stale (GPU lost, reset, invalid argument, unknown error).
#[derive(Debug)]
struct Gpu {
    device: Device<'static>,
    uuid: String,
    model: String,
    mig_on: bool,
    /// When the MIG mode was read (Unix ns).
    mig_read: u64,
    /// The maximum SM clock (it never changes: read once with the handle).
    sm_clock_max_mhz: Option<i64>,
}

/// Whether something last read at `last` is due again at `now` (also when the clock went back).
fn due(last: Option<u64>, now: u64, interval_ns: u64) -> bool {
    last.is_none_or(|t| now.saturating_sub(t) >= interval_ns || now < t)
}

/// An error after which a kept device handle is looked up again.
fn handle_suspect(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::GpuLost
            | NvmlError::InvalidArg
            | NvmlError::Uninitialized
            | NvmlError::ResetRequired
            | NvmlError::Unknown
    )
}

/// `energy_joules` of one GPU: NVML's counter, read every `--slow-interval`, advanced in
/// between by the power readings (trapezoids), never going backwards.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EnergyTrack {
    /// The value reported last, J.
    pub joules: Option<f64>,
    /// When the counter was last read from NVML (Unix ns).
    pub last_read: Option<u64>,
    /// Time and power of the previous collection.
    pub last: Option<(u64, f64)>,
}

impl EnergyTrack {
    /// Whether the counter is due for a real read at `now`.
    pub fn due(&self, now: u64, slow_interval_ns: u64) -> bool {
        due(self.last_read, now, slow_interval_ns)
    }

    /// Advance to `now` with this collection's `power` (W) and, when read, NVML's `counter` (J).
    /// Returns the value to report.
    pub fn advance(&mut self, now: u64, power: Option<f64>, counter: Option<f64>) -> Option<f64> {
        let estimate = match (self.joules, self.last, power) {
            (Some(j), Some((t, p0)), Some(p1)) if now > t => {
                Some(j + (p0 + p1) / 2.0 * ((now - t) as f64 / 1e9))
            }
            (j, _, _) => j,
        };
        let value = match counter {
            // The real counter wins, unless it would make the series go backwards (after an
            // over-estimate): then the value holds until the counter passes it.
            Some(c) => Some(self.joules.map_or(c, |j| c.max(j))),
            None => estimate,
        };
        if counter.is_some() {
            self.last_read = Some(now);
        }
        if let Some(p) = power {
            self.last = Some((now, p));
        }
        if value.is_some() {
            self.joules = value;
        }
        value
    }
}

/// Default `--slow-interval`: energy and per-process utilisation are read at most this often.
pub const DEFAULT_SLOW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Most events drained per collection (a storm of ECC events must not stall the loop).
const MAX_EVENTS_PER_TICK: usize = 1000;

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("gpus", &self.gpus.len())
            .field("gpm_gpus", &self.gpm.len())
            .finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// Load `libnvidia-ml.so.1` and initialise NVML.
    ///
    /// Fails with [`Error::NvmlUnavailable`] when the library cannot be loaded or initialised
    /// (no driver, no GPU, no permission).
    pub fn new() -> Result<Self> {
        Self::with_slow_interval(DEFAULT_SLOW_INTERVAL)
    }

    /// Like [`NvmlSource::new`], reading the costly counters (energy, per-process utilisation)
    /// at most every `slow_interval`.
    pub fn with_slow_interval(slow_interval: std::time::Duration) -> Result<Self> {
        let nvml = Nvml::init().map_err(|e| Error::NvmlUnavailable {
            cause: match e {
                // "a libloading error occurred: …" adds nothing for the reader.
                NvmlError::LibloadingError(inner) => inner.to_string(),
                other => other.to_string(),
            },
        })?;
        let count = nvml.device_count().map_err(|source| Error::Nvml {
            context: "counting gpus",
            source,
        })?;
        info!(
            gpus = count,
            driver = nvml.sys_driver_version().unwrap_or_default(),
            "nvml initialised"
        );
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let (events, xid_registered) = register_events(nvml, count);
        Ok(NvmlSource {
            nvml,
            count,
            count_read: None,
            gpus: HashMap::new(),
            gpm: HashMap::new(),
            gpm_unsupported: HashSet::new(),
            warned: HashSet::new(),
            events,
            xid_registered,
            xid_counts: HashMap::new(),
            pending_events: Vec::new(),
            processes: Vec::new(),
            process_util_seen: HashMap::new(),
            process_util_read: HashMap::new(),
            energy: HashMap::new(),
            slow_interval_ns: u64::try_from(slow_interval.as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// Drain the event set (non-blocking) into `pending_events` and the XID counts.
    fn drain_events(&mut self, now: u64) {
        let Some(set) = &self.events else {
            return;
        };
        for _ in 0..MAX_EVENTS_PER_TICK {
            let event = match set.wait(0) {
                Ok(e) => e,
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    crate::metrics::nvml_error("event set wait");
                    debug!(error = %e, "nvml event wait failed");
                    break;
                }
            };
            let uuid = event.device.uuid().unwrap_or_default();
            let index = event.device.index().unwrap_or(u32::MAX);
            let (kind, code, detail) = if event.event_type.contains(EventTypes::CRITICAL_XID_ERROR)
            {
                *self.xid_counts.entry(uuid.clone()).or_insert(0) += 1;
                match event.event_data {
                    Some(XidError::Value(x)) => (
                        "xid",
                        i64::try_from(x).unwrap_or(i64::MAX),
                        format!("xid {x}"),
                    ),
                    _ => ("xid", 0, "xid of unknown value".to_string()),
                }
            } else if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                (
                    "ecc_dbe",
                    0,
                    "double-bit (uncorrected) ecc error".to_string(),
                )
            } else if event.event_type.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
                ("ecc_sbe", 0, "single-bit (corrected) ecc error".to_string())
            } else {
                continue;
            };
            warn!(gpu = index, %uuid, kind, code, "gpu event");
            self.pending_events.push(GpuEvent {
                time_unix_nano: now,
                gpu_uuid: uuid,
                gpu_index: index,
                kind: kind.to_string(),
                code,
                detail,
            });
        }
    }

    /// Compute processes of one GPU with their memory and SM utilisation.
    fn read_processes(&mut self, index: u32, device: &Device<'static>, s: &GpuSample) {
        let Some(procs) = field(
            index,
            "running compute processes",
            device.running_compute_processes(),
        ) else {
            return;
        };
        if procs.is_empty() {
            return;
        }
        let seen = self.process_util_seen.get(&index).copied();
        let due = self.process_util_read.get(&index).is_none_or(|t| {
            s.time_unix_nano.saturating_sub(*t) >= self.slow_interval_ns || s.time_unix_nano < *t
        });
        // Per-process utilisation costs milliseconds per call: read every --slow-interval, as
        // the mean of NVML's samples since the previous read. Not every GPU or driver keeps
        // per-process samples: the rows then have memory only.
        let util = if due {
            self.process_util_read.insert(index, s.time_unix_nano);
            match device.process_utilization_stats(seen) {
                Ok(u) => Some(u),
                Err(NvmlError::NotFound) => Some(Vec::new()),
                Err(e) => {
                    field::<()>(index, "process utilization", Err(e));
                    None
                }
            }
        } else {
            None
        };
        let mut mean: HashMap<u32, (u64, u64)> = HashMap::new();
        for u in util.iter().flatten() {
            let entry = mean.entry(u.pid).or_insert((0, 0));
            entry.0 += u64::from(u.sm_util);
            entry.1 += 1;
        }
        if let Some(max) = util.iter().flatten().map(|u| u.timestamp).max() {
            self.process_util_seen.insert(index, max);
        }
        for p in procs {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => to_i64(b),
                UsedGpuMemory::Unavailable => None,
            };
            self.processes.push(ProcessSample {
                time_unix_nano: s.time_unix_nano,
                gpu_uuid: s.gpu_uuid.clone(),
                gpu_index: index,
                pid: p.pid,
                process_name: None,
                job: None,
                used_memory_bytes: used,
                // A process with no sample in the window did not use the SMs: 0, but only if
                // the GPU gives per-process samples at all.
                sm_utilization: match (&util, mean.get(&p.pid)) {
                    (Some(_), Some((sum, n))) if *n > 0 => {
                        Some(percent_to_ratio(*sum as f64 / *n as f64))
                    }
                    (Some(u), None) if !u.is_empty() || seen.is_some() => Some(0.0),
                    _ => None,
                },
            });
        }
    }

    fn warn_once(&mut self, index: u32, what: &str, error: &NvmlError) {
        if self.warned.insert(index) {
            warn!(gpu = index, %error, "skipping gpu: cannot read its {what}");
        } else {
            debug!(gpu = index, %error, "skipping gpu: cannot read its {what}");
        }
    }

    /// GPU `index` as kept from an earlier collection, or looked up now (handle, UUID, name,
    /// MIG mode); the MIG mode is read again when `--slow-interval` has passed. `None` (with a
    /// warning) when the GPU cannot be named.
    fn take_gpu(&mut self, index: u32, now: u64) -> Option<Gpu> {
        if let Some(mut gpu) = self.gpus.remove(&index) {
            if due(Some(gpu.mig_read), now, self.slow_interval_ns) {
                gpu.mig_on = mig_on(&gpu.device);
                gpu.mig_read = now;
            }
            return Some(gpu);
        }
        let device = match self.nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                self.warn_once(index, "handle", &e);
                return None;
            }
        };
        let uuid = match device.uuid() {
            Ok(u) => u,
            Err(e) => {
                self.warn_once(index, "uuid", &e);
                return None;
            }
        };
        let model = field(index, "name", device.name()).unwrap_or_else(|| "unknown".to_string());
        let mig_on = mig_on(&device);
        let sm_clock_max_mhz =
            field(index, "max sm clock", device.max_clock_info(Clock::SM)).map(i64::from);
        Some(Gpu {
            device,
            uuid,
            model,
            mig_on,
            mig_read: now,
            sm_clock_max_mhz,
        })
    }

    fn read_gpu(&mut self, index: u32, now: u64) -> Option<GpuSample> {
        let gpu = self.take_gpu(index, now)?;
        let device = &gpu.device;
        let mut s = GpuSample::empty(now, gpu.uuid.clone(), index, gpu.model.clone());

        let utilization = device.utilization_rates();
        let mut suspect = utilization.as_ref().is_err_and(handle_suspect);
        if let Some(u) = field(index, "utilization", utilization) {
            s.gpu_utilization = Some(percent_to_ratio(f64::from(u.gpu)));
            s.memory_utilization = Some(percent_to_ratio(f64::from(u.memory)));
        }
        let memory = device.memory_info();
        suspect |= memory.as_ref().is_err_and(handle_suspect);
        if let Some(m) = field(index, "memory info", memory) {
            s.memory_used_bytes = to_i64(m.used);
            s.memory_total_bytes = to_i64(m.total);
        }
        s.power_watts = field(index, "power", device.power_usage()).map(milliwatts_to_watts);
        s.temperature_celsius = field(
            index,
            "temperature",
            device.temperature(TemperatureSensor::Gpu),
        )
        .map(f64::from);
        read_clocks_and_link(index, device, &mut s);
        s.sm_clock_max_mhz = gpu.sm_clock_max_mhz;
        self.read_gpm(index, device, &mut s);
        if self.gpm_unsupported.contains(&index) {
            read_pcie_throughput(index, device, &mut s);
        }
        read_ecc(index, device, &mut s);
        read_field_values(index, &device, &mut s);
        self.read_energy(index, device, now, &mut s);
        if self.xid_registered.contains(&s.gpu_uuid) {
            s.xid_errors_total = Some(self.xid_counts.get(&s.gpu_uuid).copied().unwrap_or(0));
        }
        self.read_processes(index, device, &s);
        if suspect {
            debug!(
                gpu = index,
                "nvml reads failed: the gpu's handle is looked up again"
            );
            self.gpm.remove(&index);
        } else {
            self.gpus.insert(index, gpu);
        }
        Some(s)
    }

    /// The MIG instances of GPU `index` when MIG is on, one row each, after the GPU's own row:
    /// `gpu_uuid` is the MIG device UUID, `gpu_index` the parent's, `mig_instance` `dev<n>`
    /// (the MIG device index on its GPU, nvidia-smi's "MIG … Device n": nvml-wrapper 0.13 does
    /// not read GPU/compute instance ids). A MIG handle gives memory used and total; the other
    /// fields are per GPU (power, temperature, clocks, ECC: on the parent's row) or not given
    /// (utilisation) and stay null.
    ///
    /// Whether MIG is on is known from [`NvmlSource::take_gpu`]; the instances themselves are
    /// listed at every collection, since they can be created and destroyed at any time.
    fn read_mig(&self, index: u32, now: u64) -> Vec<GpuSample> {
        let Some(gpu) = self.gpus.get(&index).filter(|g| g.mig_on) else {
            return Vec::new();
        };
        let device = &gpu.device;
        let count = field(index, "mig device count", device.mig_device_count()).unwrap_or(0);
        let mut out = Vec::new();
        for n in 0..count {
            // A slot without an instance answers NotFound.
            let Ok(mig) = device.mig_device_by_index(n) else {
                continue;
            };
            let Some(uuid) = field(index, "mig uuid", mig.uuid()) else {
                continue;
            };
            let model = field(index, "mig name", mig.name()).unwrap_or_else(|| "MIG".into());
            let mut s = GpuSample::empty(now, uuid, index, model);
            s.mig_instance = Some(format!("dev{n}"));
            if let Some(m) = field(index, "mig memory info", mig.memory_info()) {
                s.memory_used_bytes = to_i64(m.used);
                s.memory_total_bytes = to_i64(m.total);
            }
            out.push(s);
        }
        out
    }

    /// Energy: reading the counter costs about 4 ms of CPU on an H100
    /// (docs/agent-gpu-test.md), so it is read every --slow-interval and advanced by the power
    /// readings in between.
    fn read_energy(&mut self, index: u32, device: &Device<'static>, now: u64, s: &mut GpuSample) {
        let mut track = self.energy.get(&index).copied().unwrap_or_default();
        let counter = if track.due(now, self.slow_interval_ns) {
            field(index, "energy", device.total_energy_consumption()).map(millijoules_to_joules)
        } else {
            None
        };
        s.energy_joules = track.advance(now, s.power_watts, counter);
        self.energy.insert(index, track);
    }

    /// GPM metrics between the previous collection and now.
    fn read_gpm(&mut self, index: u32, device: &Device<'static>, s: &mut GpuSample) {
        if self.gpm_unsupported.contains(&index) {
            return;
        }
        if !self.gpm.contains_key(&index) {
            match device.gpm_support() {
                Ok(true) => {}
                Ok(false) => {
                    debug!(gpu = index, "gpm not supported: activity ratios stay empty");
                    self.gpm_unsupported.insert(index);
                    return;
                }
                Err(e) => {
                    debug!(gpu = index, error = %e, "gpm support query failed: activity ratios stay empty");
                    self.gpm_unsupported.insert(index);
                    return;
                }
            }
        }
        let pair = self.gpm.entry(index).or_default();
        let Some(Some((previous, current))) = field(index, "gpm sample", pair.sample(device))
        else {
            return;
        };
        let results = match gpm_metrics_get(self.nvml, previous, current, GPM_METRICS) {
            Ok(r) => r,
            Err(e) => {
                debug!(gpu = index, error = %e, "gpm metrics failed");
                return;
            }
        };
        for result in results {
            match result {
                Ok(m) => apply_gpm(s, m.metric_id, m.value),
                Err(e) => debug!(gpu = index, error = %e, "gpm metric failed"),
            }
        }
    }
}

impl Source for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn collect(&mut self, now_unix_nano: u64) -> Result<Vec<GpuSample>> {
        if due(self.count_read, now_unix_nano, self.slow_interval_ns) {
            self.count = self.nvml.device_count().map_err(|source| Error::Nvml {
                context: "counting gpus",
                source,
            })?;
            self.count_read = Some(now_unix_nano);
            self.gpus.retain(|i, _| *i < self.count);
        }
        let count = self.count;
        self.processes.clear();
        self.drain_events(now_unix_nano);
        let mut samples = Vec::with_capacity(count as usize);
        for i in 0..count {
            if let Some(s) = self.read_gpu(i, now_unix_nano) {
                samples.push(s);
                samples.extend(self.read_mig(i, now_unix_nano));
            }
        }
        Ok(samples)
    }

    fn processes(&mut self) -> Vec<ProcessSample> {
        std::mem::take(&mut self.processes)
    }

    fn events(&mut self) -> Vec<GpuEvent> {
        std::mem::take(&mut self.pending_events)
    }
}

/// One event set with every GPU that supports XID / ECC events registered. Returns the set (if
/// any GPU could be registered) and the UUIDs registered for XID events.
fn register_events(
    nvml: &'static Nvml,
    count: u32,
) -> (Option<EventSet<'static>>, HashSet<String>) {
    let wanted = EventTypes::CRITICAL_XID_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR;
    let mut set: Option<EventSet<'static>> = None;
    let mut xid = HashSet::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let Ok(uuid) = device.uuid() else {
            continue;
        };
        let types = match device.supported_event_types() {
            Ok(t) => t & wanted,
            Err(e) => {
                debug!(gpu = index, error = %e, "no nvml events on this gpu");
                continue;
            }
        };
        if types.is_empty() {
            continue;
        }
        let current = match set.take() {
            Some(s) => s,
            None => match nvml.create_event_set() {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "cannot create an nvml event set: xid and ecc events are not watched");
                    return (None, HashSet::new());
                }
            },
        };
        match device.register_events(types, current) {
            Ok(s) => {
                set = Some(s);
                if types.contains(EventTypes::CRITICAL_XID_ERROR) {
                    xid.insert(uuid);
                }
            }
            // The wrapper released the set: the GPUs registered before are lost with it.
            Err(e) => {
                warn!(gpu = index, error = %e.error, "cannot watch nvml events on this gpu");
                xid.clear();
            }
        }
    }
    (set, xid)
}

/// Whether MIG is on. Not supported (before Ampere, most boards) or unreadable: off.
fn mig_on(device: &Device<'_>) -> bool {
    matches!(device.mig_mode(), Ok(mode) if mode.current == 1)
}

/// `Ok` → `Some`; `Err` → `None` with a debug log naming the field.
fn field<T>(index: u32, what: &'static str, r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            // "Not supported" is what the GPU is, not an error of the call.
            if !matches!(e, NvmlError::NotSupported) {
                crate::metrics::nvml_error(what);
            }
            debug!(gpu = index, field = what, error = %e, "nvml field not available");
            None
        }
    }
}

/// SM and memory clocks, the PCIe link's current generation and width (it trains down when
/// idle on some boards: what PCIe rates are measured against, docs/jobs.md) and the
/// clocks-event reasons.
fn read_clocks_and_link(index: u32, device: &Device<'static>, s: &mut GpuSample) {
    s.sm_clock_mhz = field(index, "sm clock", device.clock_info(Clock::SM)).map(i64::from);
    s.memory_clock_mhz =
        field(index, "memory clock", device.clock_info(Clock::Memory)).map(i64::from);
    s.pcie_link_gen = field(index, "pcie link gen", device.current_pcie_link_gen()).map(i64::from);
    s.pcie_link_width =
        field(index, "pcie link width", device.current_pcie_link_width()).map(i64::from);
    s.clock_event_reasons = field(
        index,
        "clock event reasons",
        device.current_throttle_reasons(),
    )
    .and_then(|r| to_i64(r.bits()));
}

/// PCIe rates from nvmlDeviceGetPcieThroughput, which samples the bus for 20 ms per call (most
/// of a collection's time): read only where GPM does not give them (before Hopper).
fn read_pcie_throughput(index: u32, device: &Device<'static>, s: &mut GpuSample) {
    s.pcie_tx_bytes_per_second = field(
        index,
        "pcie tx",
        device.pcie_throughput(PcieUtilCounter::Send),
    )
    .map(kib_per_second_to_bytes);
    s.pcie_rx_bytes_per_second = field(
        index,
        "pcie rx",
        device.pcie_throughput(PcieUtilCounter::Receive),
    )
    .map(kib_per_second_to_bytes);
}

/// The volatile ECC counters.
fn read_ecc(index: u32, device: &Device<'static>, s: &mut GpuSample) {
    s.ecc_sbe_volatile_total = field(
        index,
        "ecc corrected",
        device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
    )
    .and_then(to_i64);
    s.ecc_dbe_volatile_total = field(
        index,
        "ecc uncorrected",
        device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
    )
    .and_then(to_i64);
}

/// Memory temperature and remapped rows: one `nvmlDeviceGetFieldValues` call.
fn read_field_values(index: u32, device: &Device<'_>, s: &mut GpuSample) {
    let ids = [
        FieldId(NVML_FI_DEV_MEMORY_TEMP),
        FieldId(NVML_FI_DEV_REMAPPED_UNC),
        FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
    ];
    let Some(values) = field(index, "field values", device.field_values_for(&ids)) else {
        return;
    };
    for (id, value) in ids.iter().zip(values) {
        let value = match value.and_then(|v| v.value) {
            Ok(v) => v,
            Err(e) => {
                debug!(gpu = index, field_id = id.0, error = %e, "nvml field value not available");
                continue;
            }
        };
        match id.0 {
            NVML_FI_DEV_MEMORY_TEMP => s.memory_temperature_celsius = sample_value_f64(&value),
            NVML_FI_DEV_REMAPPED_UNC => s.remapped_rows_uncorrectable = sample_value_i64(&value),
            NVML_FI_DEV_REMAPPED_FAILURE => s.remapped_rows_failure = sample_value_i64(&value),
            _ => {}
        }
    }
}

/// Put one GPM metric into the sample, converting its unit.
fn apply_gpm(s: &mut GpuSample, id: GpmMetricId, value: f64) {
    let ratio = gpm_percent_to_ratio(value);
    match id {
        GpmMetricId::GraphicsUtil => s.gr_engine_active = ratio,
        GpmMetricId::SmUtil => s.sm_active = ratio,
        GpmMetricId::SmOccupancy => s.sm_occupancy = ratio,
        GpmMetricId::AnyTensorUtil => s.tensor_active = ratio,
        GpmMetricId::DramBwUtil => s.dram_active = ratio,
        GpmMetricId::Fp64Util => s.fp64_active = ratio,
        GpmMetricId::Fp32Util => s.fp32_active = ratio,
        GpmMetricId::Fp16Util => s.fp16_active = ratio,
        GpmMetricId::NvlinkTotalTxPerSec => {
            s.nvlink_tx_bytes_per_second = mib_per_second_to_bytes(value)
        }
        GpmMetricId::NvlinkTotalRxPerSec => {
            s.nvlink_rx_bytes_per_second = mib_per_second_to_bytes(value)
        }
        GpmMetricId::PcieTxPerSec => s.pcie_tx_bytes_per_second = mib_per_second_to_bytes(value),
        GpmMetricId::PcieRxPerSec => s.pcie_rx_bytes_per_second = mib_per_second_to_bytes(value),
        _ => {}
    }
}

/// NVML percent (0..100) → ratio (0..1), clamped.
pub fn percent_to_ratio(pct: f64) -> f64 {
    (pct / 100.0).clamp(0.0, 1.0)
}

/// GPM percent → ratio; `None` for a non-finite value (GPM returns NaN on some errors).
pub fn gpm_percent_to_ratio(pct: f64) -> Option<f64> {
    pct.is_finite().then(|| percent_to_ratio(pct))
}

/// NVML power (mW) → W.
pub fn milliwatts_to_watts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// NVML energy (mJ) → J.
pub fn millijoules_to_joules(mj: u64) -> f64 {
    mj as f64 / 1000.0
}

/// NVML PCIe throughput (KiB/s, as NVML's "KB/s" is 1024 bytes) → bytes/s.
pub fn kib_per_second_to_bytes(kib: u32) -> f64 {
    f64::from(kib) * 1024.0
}

/// GPM NVLink / PCIe rates (MiB/s) → bytes/s; `None` for a non-finite or negative value.
pub fn mib_per_second_to_bytes(mib: f64) -> Option<f64> {
    (mib.is_finite() && mib >= 0.0).then_some(mib * 1_048_576.0)
}

/// A counter that does not fit an `i64` is reported as missing rather than wrapped.
pub fn to_i64(v: u64) -> Option<i64> {
    i64::try_from(v).ok()
}

fn sample_value_f64(v: &SampleValue) -> Option<f64> {
    let x = match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    };
    x.is_finite().then_some(x)
}

fn sample_value_i64(v: &SampleValue) -> Option<i64> {
    match *v {
        SampleValue::F64(x) => x.is_finite().then(|| x.round() as i64),
        SampleValue::U32(x) => Some(i64::from(x)),
        SampleValue::U64(x) => to_i64(x),
        SampleValue::I64(x) => Some(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(percent_to_ratio(100.0), 1.0);
        assert_eq!(percent_to_ratio(3.0), 0.03);
        assert_eq!(percent_to_ratio(250.0), 1.0);
        assert_eq!(gpm_percent_to_ratio(96.6463), Some(0.966463));
        assert_eq!(gpm_percent_to_ratio(f64::NAN), None);
        // Figures from the H100 trace.
        assert_eq!(milliwatts_to_watts(697_507), 697.507);
        assert_eq!(millijoules_to_joules(49_850_753), 49_850.753);
        assert_eq!(kib_per_second_to_bytes(8759), 8_969_216.0);
        assert_eq!(mib_per_second_to_bytes(1.0), Some(1_048_576.0));
        assert_eq!(mib_per_second_to_bytes(-1.0), None);
        assert_eq!(to_i64(85_520_809_984), Some(85_520_809_984));
        assert_eq!(to_i64(u64::MAX), None);
    }

    #[test]
    fn sample_values() {
        assert_eq!(sample_value_f64(&SampleValue::U32(44)), Some(44.0));
        assert_eq!(sample_value_f64(&SampleValue::F64(f64::NAN)), None);
        assert_eq!(sample_value_i64(&SampleValue::U64(3)), Some(3));
        assert_eq!(sample_value_i64(&SampleValue::U64(u64::MAX)), None);
        assert_eq!(sample_value_i64(&SampleValue::F64(1.6)), Some(2));
    }

    #[test]
    fn energy_is_read_slowly_and_integrated_in_between() {
        let slow = 10_000_000_000;
        let s = |x: u64| x * 1_000_000_000;
        let mut e = EnergyTrack::default();
        assert!(e.due(s(100), slow));
        assert_eq!(e.advance(s(100), Some(100.0), Some(5000.0)), Some(5000.0));
        assert!(!e.due(s(101), slow));
        // 1 s at 100 → 300 W: the trapezoid adds 200 J.
        assert_eq!(e.advance(s(101), Some(300.0), None), Some(5200.0));
        assert_eq!(e.advance(s(102), Some(300.0), None), Some(5500.0));
        assert!(e.due(s(110), slow));
        // The real counter re-anchors the value …
        assert_eq!(e.advance(s(110), Some(300.0), Some(7900.0)), Some(7900.0));
        // … but never backwards after an over-estimate.
        assert_eq!(e.advance(s(111), Some(1000.0), None), Some(8550.0));
        assert_eq!(e.advance(s(120), Some(100.0), Some(8000.0)), Some(8550.0));
        // No power reading: the value holds.
        assert_eq!(e.advance(s(121), None, None), Some(8550.0));
        // Nothing read yet: nothing to report.
        assert_eq!(EnergyTrack::default().advance(s(1), Some(70.0), None), None);
    }

    #[test]
    fn kept_reads_fall_due_after_the_slow_interval() {
        assert!(due(None, 5, 10));
        assert!(!due(Some(5), 14, 10));
        assert!(due(Some(5), 15, 10));
        // A clock that went back reads again rather than waiting.
        assert!(due(Some(5), 4, 10));
        // Errors that may mean a stale handle, and errors that say what the GPU is.
        assert!(handle_suspect(&NvmlError::GpuLost));
        assert!(handle_suspect(&NvmlError::InvalidArg));
        assert!(!handle_suspect(&NvmlError::NotSupported));
        assert!(!handle_suspect(&NvmlError::NoPermission));
    }

    #[test]
    fn gpm_units() {
        let mut s = GpuSample::empty(1, "GPU-x".into(), 0, "m".into());
        apply_gpm(&mut s, GpmMetricId::SmUtil, 96.6463);
        apply_gpm(&mut s, GpmMetricId::AnyTensorUtil, 93.8091);
        apply_gpm(&mut s, GpmMetricId::NvlinkTotalTxPerSec, 2.0);
        apply_gpm(&mut s, GpmMetricId::Fp16Util, f64::NAN);
        assert_eq!(s.sm_active, Some(0.966463));
        assert_eq!(s.tensor_active, Some(0.938091));
        assert_eq!(s.nvlink_tx_bytes_per_second, Some(2_097_152.0));
        assert_eq!(s.fp16_active, None);
        assert_eq!(s.gpu_utilization, None);
    }

    #[test]
    fn init_without_a_gpu_says_what_to_do() {
        // This machine has no NVIDIA driver; on one that does, the source simply works.
        match NvmlSource::new() {
            Ok(_) => {}
            Err(e) => {
                assert!(matches!(e, Error::NvmlUnavailable { .. }), "{e}");
                assert_eq!(e.exit_code(), 2);
                assert!(e.to_string().contains("--source synthetic"));
            }
        }
    }
}
