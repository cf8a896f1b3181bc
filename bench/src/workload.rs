//! What a gpuwatch agent reports besides GPU metrics, derived from the simulated fleet's samples:
//! the processes of each job on its GPUs (`gpu_processes`) and XID and ECC events
//! (`gpu_events`), as the agent's own types, encoded by the agent's own OTLP encoder.
//!
//! - **Processes.** Every GPU sample that carries a job has the job's processes on that GPU:
//!   one per GPU (a training rank, an inference server, an HPC code), two for data-preparation
//!   jobs (a worker beside the main process). The job's user, name and process names are a
//!   function of the job id and the seed, the same on every GPU and host of the job; the pids of
//!   a job's processes on a host are consecutive, one rank per GPU. Used memory is the GPU's
//!   memory used less what a GPU without processes shows (split 80/20 between two processes).
//!   SM utilisation is sent as the agent sends it: every `--slow-interval` (60 s by default;
//!   null in between) the mean GPU utilisation of the job's samples since the previous read,
//!   split like the memory.
//! - **Events.** ECC single-bit events are the fleet's own corrected-error counter steps (one
//!   event per step, so `gpu_events` agrees with `ecc_sbe_volatile_total`), with XID 92 each
//!   time a board's count passes a multiple of [`SBE_RATE_STEP`]. The other events are drawn at
//!   the per-GPU daily rates of [`RATES`]: application faults (XID 13 or 31, then 43, and 45
//!   half of the time) on GPUs held by a job, NVLink errors (74), a GPU off the bus (79),
//!   contained and uncontained ECC errors (94, 95), a double-bit error (an `ecc_dbe` event and
//!   XID 48, half the time followed by a row remap, 63), row remaps (63) and a failed one (64).
//!   On 1,024 GPUs that is about 180 XID and 550 ECC events a day. An event is stamped with the
//!   sample at which the agent would drain it.
//!
//! Everything is drawn from streams seeded by the fleet's seed and the host, separate from the
//! fleet's own, so the GPU samples stay those of the other benchmarks.

use gpuwatch_agent::collect::{GpuEvent, JobLabels, ProcessSample};

use crate::fleet::{ECC_SBE, FB_FREE_GPU_MIB, FB_USED, GPU_UTIL, JobKind, Rng, Sample};

/// XID 92 ("high single-bit ECC error rate") each time a board's corrected count passes a
/// multiple of this.
pub(crate) const SBE_RATE_STEP: f64 = 10.0;

/// What a drawn event turns into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draw {
    /// XID 13 or 31, then 43, and 45 half of the time (only on a GPU held by a job).
    AppFault,
    /// One XID.
    Xid(i64),
    /// A double-bit ECC error: `ecc_dbe`, XID 48, and half of the time XID 63.
    DoubleBit,
}

/// Per-GPU daily rates of the drawn events. Application faults count per GPU-day held by a job.
pub(crate) const RATES: &[(f64, &str)] = &[
    (0.045, "application fault (XID 13/31, 43, 45)"),
    (0.015, "NVLink error (XID 74)"),
    (0.001, "GPU fallen off the bus (XID 79)"),
    (0.003, "contained ECC error (XID 94)"),
    (0.001, "uncontained ECC error (XID 95)"),
    (0.002, "double-bit ECC error (ecc_dbe, XID 48, 63)"),
    (0.002, "row remap (XID 63)"),
    (0.0005, "row remap failure (XID 64)"),
];

const DRAWS: [Draw; 8] = [
    Draw::AppFault,
    Draw::Xid(74),
    Draw::Xid(79),
    Draw::Xid(94),
    Draw::Xid(95),
    Draw::DoubleBit,
    Draw::Xid(63),
    Draw::Xid(64),
];

const USERS: &[&str] = &[
    "aanya", "ben", "carla", "dmitri", "elena", "farid", "grace", "hiro", "ines", "jonas", "kofi",
    "lena", "mateo", "nadia", "omar", "priya", "quentin", "rosa", "sven", "tariq", "uma", "viktor",
    "wen", "yusuf",
];

/// The job's names and the names (`/proc/<pid>/comm`) of its processes, per kind.
fn names_of(kind: JobKind) -> (&'static [&'static str], &'static [&'static str]) {
    match kind {
        JobKind::Training => (
            &[
                "llama-8b-sft",
                "gpt-pretrain",
                "vit-l16-imagenet",
                "bert-large-mlm",
                "sdxl-finetune",
                "whisper-distill",
            ],
            &["pt_main_thread", "python3"],
        ),
        JobKind::Inference => (
            &["vllm-serve", "triton-ensemble", "embed-batch"],
            &["python3", "tritonserver"],
        ),
        JobKind::DataPrep => (&["rapids-etl", "dali-preprocess"], &["python3"]),
        JobKind::Hpc => (
            &["lammps-md", "gromacs-npt", "qe-scf"],
            &["lmp", "gmx_mpi", "pw.x"],
        ),
        JobKind::Idle => (&["jupyter", "interactive"], &["python3"]),
    }
}

/// 64 bits from a job id, a salt and the seed (SplitMix64's finaliser).
fn mix(seed: u64, job: u64, salt: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(job)
        .wrapping_add(salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Who runs a job and what its processes are called: the same wherever the job is seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobProfile {
    /// `SLURM_JOB_USER`.
    pub user: &'static str,
    /// `SLURM_JOB_NAME`.
    pub name: &'static str,
    /// The process on each of its GPUs.
    pub process: &'static str,
    /// Whether a second process (a worker) holds memory on each GPU too.
    pub worker: bool,
}

impl JobProfile {
    /// The profile of job `job` of kind `kind` in the fleet of `seed`.
    pub(crate) fn of(seed: u64, job: u64, kind: JobKind) -> Self {
        let (names, processes) = names_of(kind);
        let name = names[(mix(seed, job, 1) % names.len() as u64) as usize];
        Self {
            user: USERS[(mix(seed, job, 2) % USERS.len() as u64) as usize],
            name,
            process: processes[(mix(seed, job, 3) % processes.len() as u64) as usize],
            worker: kind == JobKind::DataPrep,
        }
    }

    fn labels(&self, job: u64) -> JobLabels {
        JobLabels {
            id: job.to_string(),
            user: self.user.to_string(),
            name: self.name.to_string(),
            scheduler: "slurm".to_string(),
            k8s: None,
            extra: Default::default(),
        }
    }
}

/// The first pid of job `job`'s processes on host `h` (its ranks follow, one per GPU).
fn first_pid(seed: u64, job: u64, h: usize) -> u32 {
    // Pids of a busy node: above the system daemons, below Linux's default pid_max (4194304).
    10_000 + (mix(seed, job, 4 + h as u64) % 4_000_000) as u32
}

#[derive(Debug, Clone, Default)]
struct GpuState {
    /// The job in the previous sample.
    job: Option<u64>,
    /// Sum and count of the utilisation ratios since the last per-process read.
    util_sum: f64,
    util_n: u32,
    /// Corrected ECC errors in the previous sample.
    sbe: Option<f64>,
}

/// The processes and events of one host, fed its samples round by round.
#[derive(Debug, Clone)]
pub(crate) struct HostWorkload {
    seed: u64,
    host: usize,
    /// Event probabilities per sample, in [`DRAWS`] order.
    chances: [f64; 8],
    /// Per-process utilisation is read every this many rounds, at rounds `k` with
    /// `k % slow_every == slow_phase` (each agent started at its own time).
    slow_every: u64,
    slow_phase: u64,
    rng: Rng,
    gpus: Vec<GpuState>,
}

/// What [`HostWorkload::observe`] added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Added {
    /// Process samples (rows of `gpu_processes`).
    pub processes: u64,
    /// OTLP data points of those processes (memory always, SM utilisation on read rounds).
    pub process_points: u64,
    /// XID events.
    pub xid: u64,
    /// ECC events.
    pub ecc: u64,
}

impl HostWorkload {
    /// Host `h` of a fleet of `seed` with `gpus` GPUs per host, sampled every `interval_ms`,
    /// its agent reading per-process utilisation every `slow_interval_ms`.
    pub(crate) fn new(
        seed: u64,
        h: usize,
        gpus: usize,
        interval_ms: i64,
        slow_interval_ms: i64,
    ) -> Self {
        let interval = interval_ms.max(1);
        let per_sample = interval as f64 / 86_400_000.0;
        let mut chances = [0.0; 8];
        for (c, (rate, _)) in chances.iter_mut().zip(RATES) {
            *c = rate * per_sample;
        }
        let slow_every = (slow_interval_ms.max(interval) + interval - 1) as u64 / interval as u64;
        let mut rng = Rng::new(mix(seed, h as u64, 0xE7E7));
        let slow_phase = rng.below(slow_every.max(1));
        Self {
            seed,
            host: h,
            chances,
            slow_every: slow_every.max(1),
            slow_phase,
            rng,
            gpus: vec![GpuState::default(); gpus],
        }
    }

    /// Takes scrape round `k` of the host: `samples[i]` of GPU `i` (`uuids[i]`), held by a job
    /// of kind `kinds[i]`. Appends the round's process samples and events.
    pub(crate) fn observe(
        &mut self,
        k: u64,
        samples: &[Sample],
        kinds: &[Option<JobKind>],
        uuids: &[String],
        procs: &mut Vec<ProcessSample>,
        events: &mut Vec<GpuEvent>,
    ) -> Added {
        let mut out = Out {
            procs,
            events,
            added: Added::default(),
        };
        let read = k % self.slow_every == self.slow_phase;
        for (i, s) in samples.iter().enumerate().take(self.gpus.len()) {
            let at = At {
                t: u64::try_from(s.time_ms).unwrap_or(0) * 1_000_000,
                uuid: uuids.get(i).map(String::as_str).unwrap_or_default(),
                index: i,
            };
            let gpu = &mut self.gpus[i];
            if gpu.job != s.job {
                gpu.util_sum = 0.0;
                gpu.util_n = 0;
            }
            gpu.job = s.job;
            if let (Some(job), Some(kind)) = (s.job, kinds.get(i).copied().flatten()) {
                let util = (s.values[GPU_UTIL] / 100.0).clamp(0.0, 1.0);
                let sm = gpu.utilisation(util, read);
                self.push_processes(&at, s, (job, kind), sm, &mut out);
            }
            ecc_events(&mut self.gpus[i], s.values[ECC_SBE], &at, &mut out);
            self.drawn_events(s, &at, &mut out);
        }
        out.added
    }

    /// The processes of `job` on the GPU: one, or a worker and its helper sharing its memory.
    fn push_processes(
        &self,
        at: &At<'_>,
        s: &Sample,
        (job, kind): (u64, JobKind),
        sm: Option<f64>,
        out: &mut Out<'_>,
    ) {
        let i = at.index;
        let profile = JobProfile::of(self.seed, job, kind);
        let labels = profile.labels(job);
        let bytes = ((s.values[FB_USED] - FB_FREE_GPU_MIB).max(0.0) * 1_048_576.0) as i64;
        let pid = first_pid(self.seed, job, self.host) + i as u32;
        let mut push = |pid: u32, name: &str, share: f64| {
            out.procs.push(ProcessSample {
                time_unix_nano: at.t,
                gpu_uuid: at.uuid.to_string(),
                gpu_index: i as u32,
                pid,
                process_name: Some(name.to_string()),
                job: Some(labels.clone()),
                used_memory_bytes: Some((bytes as f64 * share) as i64),
                sm_utilization: sm.map(|m| m * share),
            });
            out.added.processes += 1;
            out.added.process_points += 1 + u64::from(sm.is_some());
        };
        if profile.worker {
            push(pid, profile.process, 0.8);
            push(pid + 1000, profile.process, 0.2);
        } else {
            push(pid, profile.process, 1.0);
        }
    }

    /// The drawn events: one uniform draw per GPU and sample.
    fn drawn_events(&mut self, s: &Sample, at: &At<'_>, out: &mut Out<'_>) {
        let (t, uuid, i) = (at.t, at.uuid, at.index);
        let u = self.rng.uniform();
        let mut edge = 0.0;
        for (draw, chance) in DRAWS.iter().zip(self.chances) {
            edge += chance;
            if u >= edge {
                continue;
            }
            match draw {
                Draw::AppFault if s.job.is_some() => {
                    let first = if self.rng.chance(0.6) { 13 } else { 31 };
                    let mut codes = vec![first, 43];
                    if self.rng.chance(0.5) {
                        codes.push(45);
                    }
                    for c in codes {
                        out.events.push(event(t, uuid, i, "xid", c));
                        out.added.xid += 1;
                    }
                }
                Draw::AppFault => {}
                Draw::Xid(c) => {
                    out.events.push(event(t, uuid, i, "xid", *c));
                    out.added.xid += 1;
                }
                Draw::DoubleBit => {
                    out.events.push(event(t, uuid, i, "ecc_dbe", 0));
                    out.events.push(event(t, uuid, i, "xid", 48));
                    out.added.ecc += 1;
                    out.added.xid += 1;
                    if self.rng.chance(0.5) {
                        out.events.push(event(t, uuid, i, "xid", 63));
                        out.added.xid += 1;
                    }
                }
            }
            break;
        }
    }
}

impl GpuState {
    /// Adds a sample's utilisation; on a read round, returns the mean since the last read (the
    /// processes' SM utilisation) and starts over.
    fn utilisation(&mut self, util: f64, read: bool) -> Option<f64> {
        self.util_sum += util;
        self.util_n += 1;
        let mean = if self.util_n > 0 {
            self.util_sum / f64::from(self.util_n)
        } else {
            0.0
        };
        if read {
            self.util_sum = 0.0;
            self.util_n = 0;
        }
        read.then_some(mean)
    }
}

/// Where a sample was taken: its time (ns), GPU UUID and index.
#[derive(Debug)]
struct At<'a> {
    t: u64,
    uuid: &'a str,
    index: usize,
}

/// What one round appends, and the count of it.
#[derive(Debug)]
struct Out<'a> {
    procs: &'a mut Vec<ProcessSample>,
    events: &'a mut Vec<GpuEvent>,
    added: Added,
}

/// Corrected ECC errors: an event per step of the counter, and XID 92 when the corrected-error
/// rate crosses a step.
fn ecc_events(gpu: &mut GpuState, sbe: f64, at: &At<'_>, out: &mut Out<'_>) {
    let (t, uuid, i) = (at.t, at.uuid, at.index);
    if let Some(before) = gpu.sbe
        && sbe > before
    {
        let steps = (sbe - before).round() as u64;
        for _ in 0..steps {
            out.events.push(event(t, uuid, i, "ecc_sbe", 0));
            out.added.ecc += 1;
        }
        if (sbe / SBE_RATE_STEP).floor() > (before / SBE_RATE_STEP).floor() {
            out.events.push(event(t, uuid, i, "xid", 92));
            out.added.xid += 1;
        }
    }
    gpu.sbe = Some(sbe);
}

/// An event as the agent's NVML source describes it.
fn event(t: u64, uuid: &str, index: usize, kind: &str, code: i64) -> GpuEvent {
    let detail = match kind {
        "xid" => format!("xid {code}"),
        "ecc_dbe" => "double-bit (uncorrected) ecc error".to_string(),
        _ => "single-bit (corrected) ecc error".to_string(),
    };
    GpuEvent {
        time_unix_nano: t,
        gpu_uuid: uuid.to_string(),
        gpu_index: index as u32,
        kind: kind.to_string(),
        code,
        detail,
    }
}

/// One OTLP/HTTP request body of host `host`'s processes and events, as the agent encodes a
/// collection (`host.name` as the resource attribute).
pub(crate) fn otlp_body(host: &str, procs: &[ProcessSample], events: &[GpuEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    gpuwatch_agent::export::otlp::encode_collection_to(
        &mut out,
        &[],
        procs,
        events,
        &[("host.name".to_string(), host.to_string())],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Fleet, FleetConfig};
    use std::collections::{HashMap, HashSet};

    /// The agent's `--slow-interval` default: per-process utilisation is read this often.
    const AGENT_SLOW_INTERVAL_MS: i64 = 60_000;

    struct Run {
        procs: Vec<ProcessSample>,
        events: Vec<GpuEvent>,
        added: Added,
        /// (uuid, time ns) → the sample's job and memory used (MiB).
        samples: HashMap<(String, u64), (Option<u64>, f64)>,
        sbe_steps: u64,
    }

    fn run(seed: u64, hosts: usize, rounds: u64) -> Run {
        let interval = 10_000;
        let mut fleet = Fleet::new(FleetConfig {
            hosts,
            gpus_per_host: 8,
            interval_ms: interval,
            start_ms: 1_790_000_000_000,
            seed,
            job_hosts: 0,
        });
        let mut work: Vec<HostWorkload> = (0..hosts)
            .map(|h| HostWorkload::new(seed, h, 8, interval, AGENT_SLOW_INTERVAL_MS))
            .collect();
        let mut out = Run {
            procs: Vec::new(),
            events: Vec::new(),
            added: Added::default(),
            samples: HashMap::new(),
            sbe_steps: 0,
        };
        let mut last_sbe: HashMap<String, f64> = HashMap::new();
        let mut buf = Vec::new();
        for k in 0..rounds {
            for (h, w) in work.iter_mut().enumerate() {
                fleet.scrape(h, k, &mut buf);
                let kinds: Vec<Option<JobKind>> = (0..8).map(|i| fleet.job_kind(h, i)).collect();
                let uuids: Vec<String> =
                    (0..8).map(|i| fleet.gpu_ids(h, i).0.to_string()).collect();
                let a = w.observe(k, &buf, &kinds, &uuids, &mut out.procs, &mut out.events);
                out.added.processes += a.processes;
                out.added.process_points += a.process_points;
                out.added.xid += a.xid;
                out.added.ecc += a.ecc;
                for (s, u) in buf.iter().zip(&uuids) {
                    let t = s.time_ms as u64 * 1_000_000;
                    out.samples
                        .insert((u.clone(), t), (s.job, s.values[FB_USED]));
                    if let Some(before) = last_sbe.insert(u.clone(), s.values[ECC_SBE]) {
                        out.sbe_steps += (s.values[ECC_SBE] - before) as u64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn processes_follow_the_jobs_of_the_gpus() {
        let r = run(5, 4, 720);
        assert_eq!(r.added.processes, r.procs.len() as u64);
        let job_samples = r.samples.values().filter(|(j, _)| j.is_some()).count();
        assert!(
            r.procs.len() >= job_samples,
            "every job sample has a process"
        );
        let mut per_job_user: HashMap<String, String> = HashMap::new();
        let mut with_sm = 0;
        for p in &r.procs {
            let (job, fb_mib) = r.samples[&(p.gpu_uuid.clone(), p.time_unix_nano)];
            let labels = p.job.as_ref().expect("job labels");
            assert_eq!(Some(labels.id.clone()), job.map(|j| j.to_string()));
            assert_eq!(labels.scheduler, "slurm");
            // One user per job, wherever it runs.
            let user = per_job_user
                .entry(labels.id.clone())
                .or_insert(labels.user.clone());
            assert_eq!(*user, labels.user);
            let mem = p.used_memory_bytes.expect("memory");
            assert!(mem > 0 && (mem as f64) <= fb_mib * 1_048_576.0);
            if let Some(sm) = p.sm_utilization {
                assert!((0.0..=1.0).contains(&sm));
                with_sm += 1;
            }
            assert!(p.process_name.is_some());
        }
        // SM utilisation every 60 s of 10 s samples: a sixth of the rows.
        let share = with_sm as f64 / r.procs.len() as f64;
        assert!((0.15..0.19).contains(&share), "share with SM {share}");
        assert_eq!(
            r.added.process_points,
            r.procs.len() as u64 + with_sm as u64
        );
        // No two processes share a pid on one GPU at one time.
        let keys: HashSet<(String, u64, u32)> = r
            .procs
            .iter()
            .map(|p| (p.gpu_uuid.clone(), p.time_unix_nano, p.pid))
            .collect();
        assert_eq!(keys.len(), r.procs.len());
    }

    #[test]
    fn events_match_the_counters_and_the_rates() {
        // 32 hosts × 8 GPUs × 1 day of 10 s samples.
        let r = run(3, 32, 8640);
        let sbe = r.events.iter().filter(|e| e.kind == "ecc_sbe").count() as u64;
        assert_eq!(sbe, r.sbe_steps, "one event per corrected-error step");
        let xid = r.events.iter().filter(|e| e.kind == "xid").count() as u64;
        assert_eq!(xid, r.added.xid);
        assert_eq!(r.events.len() as u64, r.added.xid + r.added.ecc);
        // About 180 XIDs per 1,024 GPU-days: 45 on 256 GPUs, give or take the draws.
        assert!((15..=90).contains(&xid), "{xid} XID events");
        let codes: HashSet<i64> = r
            .events
            .iter()
            .filter(|e| e.kind == "xid")
            .map(|e| e.code)
            .collect();
        for c in [13, 43, 74] {
            assert!(codes.contains(&c), "XID {c} in {codes:?}");
        }
        for e in &r.events {
            assert!(
                r.samples
                    .contains_key(&(e.gpu_uuid.clone(), e.time_unix_nano))
            );
            match e.kind.as_str() {
                "xid" => assert_eq!(e.detail, format!("xid {}", e.code)),
                "ecc_sbe" | "ecc_dbe" => assert_eq!(e.code, 0),
                other => panic!("kind {other}"),
            }
        }
    }

    #[test]
    fn same_seed_same_workload() {
        let a = run(9, 2, 400);
        let b = run(9, 2, 400);
        let c = run(10, 2, 400);
        assert_eq!(a.procs, b.procs);
        assert_eq!(a.events, b.events);
        assert_ne!(a.procs, c.procs);
    }

    #[test]
    fn profiles_are_stable_per_job() {
        let p = JobProfile::of(1, 4_200_123, JobKind::Training);
        assert_eq!(p, JobProfile::of(1, 4_200_123, JobKind::Training));
        assert!(!p.worker);
        assert!(JobProfile::of(1, 4_200_123, JobKind::DataPrep).worker);
        let users: HashSet<&str> = (0..200)
            .map(|j| JobProfile::of(1, 4_200_000 + j, JobKind::Hpc).user)
            .collect();
        assert!(users.len() > 15, "jobs spread over users: {}", users.len());
    }

    #[test]
    fn the_body_is_the_agents_otlp_request() {
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use prost::Message;
        let r = run(2, 1, 60);
        let body = otlp_body("gpu-node-001", &r.procs, &r.events);
        let req = ExportMetricsServiceRequest::decode(body.as_slice()).expect("protobuf");
        let rm = &req.resource_metrics[0];
        let host = rm.resource.as_ref().expect("resource").attributes[0].clone();
        assert_eq!(host.key, "host.name");
        let names: Vec<&str> = rm.scope_metrics[0]
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert!(names.contains(&"gpu.process.memory.usage"), "{names:?}");
        assert!(names.contains(&"gpu.process.sm.utilization"), "{names:?}");
        if !r.events.is_empty() {
            assert!(names.contains(&"gpu.event"), "{names:?}");
        }
    }
}
