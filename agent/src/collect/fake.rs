//! A simulated NVML for hosts without GPUs (`--source fake`), used by the Slurm end-to-end
//! test. It stands where [`super::nvml::NvmlSource`] stands, behind the same [`Source`] trait,
//! so the attribution, the exporters and the spool run exactly as they do on real GPUs.
//!
//! GPU `i` is the device node `<dev-dir>/nvidia<i>` (the test makes them with `mknod`, as
//! Slurm's gres needs). Like the real driver, the fake knows a process is on a GPU when the
//! process holds the GPU's device node open: it scans `/proc/<pid>/fd` for links to the node.
//! A GPU with a process reads busy (utilisation 1, 300 W); one without reads idle (0, 70 W).
//! XID errors are injected by appending XID numbers, one per line, to `<dev-dir>/nvidia<i>.xid`:
//! each new line is one `xid` event and counts in `xid_errors_total`, as an NVML event would.
//! Values are plain and predictable; nothing here pretends to be a calibrated simulation
//! (that is [`super::synthetic::Fleet`]).
//!
//! **MIG** (`--fake-mig N`): every GPU is split into `N` MIG instances, as NVML shows a
//! MIG-enabled GPU. The GPU keeps its own row (power, temperature, clocks, energy, ECC: what
//! NVML reads on the parent), with utilisation null (NVML does not give it on a MIG-enabled
//! GPU); each instance is a row of its own with `gpu_uuid` = its MIG device UUID
//! ([`FakeNvml::mig_uuid`]), the parent's `gpu_index`, `mig_instance` = `"<gi>.<ci>"` (GPU
//! instance `1..=N`, compute instance 0) and only what a MIG device handle gives: memory used
//! and total (the GPU's memory split evenly); everything else null.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::collect::{GpuEvent, GpuSample, ProcessSample, Source};
use crate::error::Result;

/// Memory the fake GPU reports in use with no process, bytes.
const IDLE_MEMORY: i64 = 512 << 20;
/// Memory each process uses, bytes.
const PROCESS_MEMORY: i64 = 1 << 30;
/// Memory installed, bytes.
const TOTAL_MEMORY: i64 = 80 << 30;

/// The simulated NVML: `gpus` GPUs whose processes are those holding
/// `<dev_dir>/nvidia<index>` open.
#[derive(Debug)]
pub struct FakeNvml {
    gpus: u32,
    dev_dir: PathBuf,
    proc_root: PathBuf,
    energy_joules: Vec<f64>,
    last_time: Option<u64>,
    processes: Vec<ProcessSample>,
    xid_seen: Vec<usize>,
    events: Vec<GpuEvent>,
    mig: u32,
}

impl FakeNvml {
    /// `gpus` fake GPUs with device nodes in `dev_dir`, processes read from `proc_root`
    /// (normally `/proc`).
    pub fn new(gpus: u32, dev_dir: &Path, proc_root: &Path) -> Self {
        FakeNvml {
            gpus,
            dev_dir: dev_dir.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            energy_joules: vec![0.0; gpus as usize],
            last_time: None,
            processes: Vec::new(),
            xid_seen: vec![0; gpus as usize],
            events: Vec::new(),
            mig: 0,
        }
    }

    /// Split every GPU into `instances` MIG instances (0: MIG off).
    pub fn with_mig(mut self, instances: u32) -> Self {
        self.mig = instances;
        self
    }

    /// The MIG device UUID of GPU instance `gi` of fake GPU `index`.
    pub fn mig_uuid(index: u32, gi: u32) -> String {
        format!("MIG-fa4e0000-0000-4000-8000-{index:06x}{gi:06x}")
    }

    /// The UUID of fake GPU `index`.
    pub fn uuid(index: u32) -> String {
        format!("GPU-fa4e0000-0000-4000-8000-{index:012x}")
    }

    /// pid → GPU indices whose device node it holds open.
    fn holders(&self) -> HashMap<u32, Vec<u32>> {
        let nodes: Vec<PathBuf> = (0..self.gpus)
            .map(|i| self.dev_dir.join(format!("nvidia{i}")))
            .collect();
        let mut found: HashMap<u32, Vec<u32>> = HashMap::new();
        let Ok(entries) = std::fs::read_dir(&self.proc_root) else {
            return found;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // Processes may exit while we look, or be unreadable: skip them.
            let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                if let Some(index) = nodes.iter().position(|n| *n == target) {
                    let list = found.entry(pid).or_default();
                    let index = index as u32;
                    if !list.contains(&index) {
                        list.push(index);
                    }
                }
            }
        }
        found
    }
}

/// The fixed readings of a whole fake GPU, busy (held by `procs` processes) or idle.
fn fill_readings(s: &mut GpuSample, busy: bool, procs: usize, power: f64, energy: f64) {
    s.gpu_utilization = Some(if busy { 1.0 } else { 0.0 });
    s.memory_utilization = Some(if busy { 0.3 } else { 0.0 });
    s.memory_used_bytes = Some(IDLE_MEMORY + PROCESS_MEMORY * procs as i64);
    s.memory_total_bytes = Some(TOTAL_MEMORY);
    s.power_watts = Some(power);
    s.energy_joules = Some(energy);
    s.temperature_celsius = Some(if busy { 60.0 } else { 40.0 });
    s.sm_clock_mhz = Some(if busy { 1980 } else { 345 });
    s.sm_clock_max_mhz = Some(1980);
    s.pcie_link_gen = Some(if busy { 5 } else { 1 });
    s.pcie_link_width = Some(16);
    s.memory_clock_mhz = Some(2619);
    s.clock_event_reasons = Some(if busy { 0 } else { 1 });
    s.ecc_sbe_volatile_total = Some(0);
    s.ecc_dbe_volatile_total = Some(0);
}

impl FakeNvml {
    /// XIDs appended to `nvidia<index>.xid` since the last read become events; the count of
    /// all seen so far.
    fn new_xids(&mut self, index: u32, now_unix_nano: u64, uuid: &str) -> i64 {
        let xids: Vec<i64> =
            std::fs::read_to_string(self.dev_dir.join(format!("nvidia{index}.xid")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
        let seen = &mut self.xid_seen[index as usize];
        for &code in xids.iter().skip(*seen) {
            self.events.push(GpuEvent {
                time_unix_nano: now_unix_nano,
                gpu_uuid: uuid.to_string(),
                gpu_index: index,
                kind: "xid".to_string(),
                code,
                detail: format!("xid {code}"),
            });
        }
        *seen = (*seen).max(xids.len());
        *seen as i64
    }

    /// The MIG instances of GPU `index`: an equal share of the memory each, idle.
    fn mig_samples(&self, index: u32, now_unix_nano: u64, model: &str) -> Vec<GpuSample> {
        let share = TOTAL_MEMORY / i64::from(self.mig);
        (1..=self.mig)
            .map(|gi| {
                let mut m = GpuSample::empty(
                    now_unix_nano,
                    Self::mig_uuid(index, gi),
                    index,
                    format!("{model} MIG"),
                );
                m.mig_instance = Some(format!("{gi}.0"));
                m.memory_total_bytes = Some(share);
                m.memory_used_bytes = Some(IDLE_MEMORY / i64::from(self.mig));
                m
            })
            .collect()
    }
}

impl Source for FakeNvml {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn collect(&mut self, now_unix_nano: u64) -> Result<Vec<GpuSample>> {
        let holders = self.holders();
        let dt = self
            .last_time
            .map_or(0.0, |t| now_unix_nano.saturating_sub(t) as f64 / 1e9);
        self.last_time = Some(now_unix_nano);
        let mut per_gpu: Vec<Vec<u32>> = vec![Vec::new(); self.gpus as usize];
        let mut pids: Vec<&u32> = holders.keys().collect();
        pids.sort();
        for pid in pids {
            for &i in &holders[pid] {
                per_gpu[i as usize].push(*pid);
            }
        }
        self.processes.clear();
        let mut samples = Vec::with_capacity(self.gpus as usize);
        for index in 0..self.gpus {
            let procs = &per_gpu[index as usize];
            let busy = !procs.is_empty();
            let mut s = GpuSample::empty(
                now_unix_nano,
                Self::uuid(index),
                index,
                "Simulated GPU (fake NVML)".to_string(),
            );
            let power = if busy { 300.0 } else { 70.0 };
            let energy = &mut self.energy_joules[index as usize];
            *energy += power * dt;
            fill_readings(&mut s, busy, procs.len(), power, *energy);
            s.xid_errors_total = Some(self.new_xids(index, now_unix_nano, &s.gpu_uuid));
            if self.mig > 0 {
                s.gpu_utilization = None;
                s.memory_utilization = None;
                samples.extend(self.mig_samples(index, now_unix_nano, &s.gpu_model));
            }
            for &pid in procs {
                self.processes.push(ProcessSample {
                    time_unix_nano: now_unix_nano,
                    gpu_uuid: s.gpu_uuid.clone(),
                    gpu_index: index,
                    pid,
                    process_name: None,
                    job: None,
                    used_memory_bytes: Some(PROCESS_MEMORY),
                    sm_utilization: Some(1.0 / procs.len() as f64),
                });
            }
            // The GPU's own row first, then its instances (NVML's order).
            let at = samples.len() - if self.mig > 0 { self.mig as usize } else { 0 };
            samples.insert(at, s);
        }
        Ok(samples)
    }

    fn simulated(&self) -> bool {
        true
    }

    fn processes(&mut self) -> Vec<ProcessSample> {
        self.processes.clone()
    }

    fn events(&mut self) -> Vec<GpuEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_holding_the_node_is_on_that_gpu() {
        let dir = std::env::temp_dir().join(format!("gpuwatch-fake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A plain file stands for the device node: what matters is the open descriptor.
        std::fs::write(dir.join("nvidia1"), b"").unwrap();
        let held = std::fs::File::open(dir.join("nvidia1")).unwrap();
        let mut fake = FakeNvml::new(2, &dir, Path::new("/proc"));
        let samples = fake.collect(1_000_000_000).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].gpu_utilization, Some(0.0));
        assert_eq!(samples[1].gpu_utilization, Some(1.0));
        let procs = fake.processes();
        assert!(
            procs
                .iter()
                .any(|p| p.pid == std::process::id() && p.gpu_index == 1),
            "{procs:?}"
        );
        assert!(procs.iter().all(|p| p.gpu_index == 1));
        drop(held);
        std::fs::write(dir.join("nvidia1.xid"), "79\n").unwrap();
        let samples = fake.collect(2_000_000_000).unwrap();
        assert_eq!(samples[1].gpu_utilization, Some(0.0));
        assert_eq!(samples[1].energy_joules, Some(70.0));
        assert_eq!(samples[1].xid_errors_total, Some(1));
        assert_eq!(samples[0].xid_errors_total, Some(0));
        let events = fake.events();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].gpu_index, events[0].code), (1, 79));
        assert!(fake.events().is_empty(), "events are drained");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mig_instances_are_rows_of_their_own() {
        let dir = std::env::temp_dir().join(format!("gpuwatch-fake-mig-{}", std::process::id()));
        let mut fake = FakeNvml::new(2, &dir, Path::new("/nonexistent-proc")).with_mig(3);
        let samples = fake.collect(1_000_000_000).unwrap();
        assert_eq!(samples.len(), 2 * (1 + 3));
        let parent = &samples[4];
        assert_eq!(
            (parent.gpu_index, parent.mig_instance.as_deref()),
            (1, None)
        );
        assert_eq!(parent.gpu_uuid, FakeNvml::uuid(1));
        assert_eq!(
            parent.gpu_utilization, None,
            "not given on a MIG-enabled gpu"
        );
        assert!(parent.power_watts.is_some());
        let rows: Vec<(u32, String, String)> = samples[5..]
            .iter()
            .map(|m| {
                (
                    m.gpu_index,
                    m.gpu_uuid.clone(),
                    m.mig_instance.clone().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            (1..=3)
                .map(|gi| (1, FakeNvml::mig_uuid(1, gi), format!("{gi}.0")))
                .collect::<Vec<_>>()
        );
        let m = &samples[5];
        assert_eq!(m.memory_total_bytes, Some(TOTAL_MEMORY / 3));
        assert!(m.memory_used_bytes.is_some());
        // What a MIG handle cannot give is null, never 0.
        assert_eq!(m.power_watts, None);
        assert_eq!(m.gpu_utilization, None);
        assert_eq!(m.temperature_celsius, None);
        assert_eq!(m.energy_joules, None);
        assert_ne!(FakeNvml::mig_uuid(0, 1), FakeNvml::mig_uuid(1, 0));
    }
}
