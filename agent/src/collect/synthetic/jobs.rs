//! The simulated Slurm-like jobs: what arrives, how many GPUs it takes, how long it runs, its
//! phases and when it stalls.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    TrainLlm,
    FinetuneBert,
    EvalSweep,
    RenderBatch,
    Notebook,
    MdSim,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::TrainLlm => "train-llm",
            Kind::FinetuneBert => "finetune-bert",
            Kind::EvalSweep => "eval-sweep",
            Kind::RenderBatch => "render-batch",
            Kind::Notebook => "notebook",
            Kind::MdSim => "md-sim",
        }
    }

    /// The command name (`/proc/<pid>/comm`) of the job's GPU processes.
    pub(super) fn process_name(self) -> &'static str {
        match self {
            Kind::RenderBatch => "blender",
            Kind::MdSim => "gmx",
            _ => "python",
        }
    }

    pub(super) fn mix(self) -> Mix {
        match self {
            Kind::RenderBatch => Mix::Fp32,
            Kind::MdSim => Mix::Fp64,
            _ => Mix::Tensor,
        }
    }
}

/// What the compute phase of a job keeps busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mix {
    Tensor,
    Fp32,
    Fp64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Compute,
    Copy,
    Small,
    Hold,
}

#[derive(Debug, Clone)]
pub(super) struct Job {
    pub(super) id: u64,
    pub(super) user: &'static str,
    pub(super) kind: Kind,
    pub(super) gpus: Vec<usize>,
    pub(super) end: u64,
    pub(super) phase: Phase,
    pub(super) phase_end: u64,
    /// Memory allocated on each of its GPUs.
    pub(super) memory_bytes: i64,
    /// 0..1: how hard the compute phase drives the GPU.
    pub(super) intensity: f64,
    /// From this time on the job holds its GPUs without using them (hung or abandoned).
    pub(super) stall_at: Option<u64>,
}

#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) kind: Kind,
    pub(super) gpus: usize,
    pub(super) deadline: u64,
}

impl Fleet {
    /// A new job of `kind` on `gpus`, starting at `start` and ending at `end`, in its first phase.
    pub(super) fn new_job(&mut self, kind: Kind, gpus: Vec<usize>, start: u64, end: u64) -> Job {
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
    pub(super) fn place(&mut self, job: Job) {
        for &g in &job.gpus {
            debug_assert!(self.gpus[g].job.is_none(), "gpu {g} already allocated");
            self.gpus[g].job = Some(job.id);
            self.gpus[g].released_at = None;
        }
        self.jobs.push(job);
    }

    pub(super) fn job_of(&self, gpu: usize) -> Option<&Job> {
        let id = self.gpus[gpu].job?;
        self.jobs.iter().find(|j| j.id == id)
    }

    pub(super) fn draw_request(&mut self, now: u64) -> Pending {
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
            deadline: now + (PENDING_TIMEOUT_NS as f64 * self.options.job_time_scale) as u64,
        }
    }

    pub(super) fn try_start_pending(&mut self, now: u64) {
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
        let end = now + secs(minutes * 60.0 * self.options.job_time_scale);
        let job = self.new_job(kind, free[..size].to_vec(), now, end);
        self.place(job);
    }
}

/// The next phase of `job` at `now` and how long it lasts, seconds.
pub(super) fn next_phase(job: &Job, now: u64, rng: &mut Rng) -> (Phase, f64) {
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
pub(super) fn bounded_phase_end(job: &Job, now: u64, dur_s: f64) -> u64 {
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
