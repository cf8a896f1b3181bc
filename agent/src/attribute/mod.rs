//! Which job owns each GPU and each GPU process.
//!
//! Every collection, [`Attributor::apply`] labels the samples with a [`JobLabels`]:
//!
//! 1. each GPU process from its `/proc/<pid>/environ` (`SLURM_JOB_ID`, `SLURM_JOB_USER`,
//!    `SLURM_JOB_NAME`), or else from the Slurm job id in its `/proc/<pid>/cgroup`
//!    ([`proc`]);
//! 2. each GPU from the job mapping directory written by the Slurm prolog/epilog
//!    ([`slurm`], dcgm-exporter's `--hpc-job-mapping-dir` layout), so that a GPU allocated to
//!    a job with no process on it still carries the job;
//! 3. a GPU with no mapping file takes the job of its first process that has one;
//! 5. what `/proc` did not say of a Slurm job (always its time limit; account, partition, QOS
//!    and array ids of a process the agent cannot read) is filled from `.jobs/<id>` of the
//!    mapping directory.
//!
//! 4. on Kubernetes, a GPU that the kubelet's pod-resources API lists as allocated to a pod
//!    takes that pod ([`kubernetes`]; `scheduler = kubernetes`, `k8s.*` labels), and so do the
//!    GPU processes whose cgroup path names a pod.
//!
//! When a GPU's mapping file lists several jobs (a shared GPU), the job of a process on it
//! that is listed wins; otherwise the last line (the newest job). The directory is read again at
//! every collection, so a job starting or ending is seen at the next tick without a restart.
//! What `/proc` says of a process is kept while the same process (pid and start time) stays on
//! a GPU: its environment cannot change, and re-reading it every tick was a tenth of the
//! agent's CPU time on a one-GPU host.

pub mod kubelet;
pub mod kubernetes;
pub mod proc;
pub mod shares;
pub mod slurm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use crate::collect::{GpuSample, JobLabels, ProcessSample};

/// Scheduler name of Slurm jobs.
pub const SLURM: &str = "slurm";

/// Default `--job-mapping-dir`.
pub const DEFAULT_JOB_MAPPING_DIR: &str = "/run/gpuwatch/jobs";

/// Attributes samples to jobs from the mapping directory and `/proc`.
#[derive(Debug)]
pub struct Attributor {
    mapping_dir: PathBuf,
    proc_root: PathBuf,
    warned: bool,
    /// What was read of each GPU process, with its start time.
    known: HashMap<u32, (u64, proc::ProcessInfo)>,
    pods: kubernetes::DeviceMap,
    pod_labels: kubelet::LabelMap,
}

impl Attributor {
    /// Reads the mapping from `mapping_dir` and processes from `proc_root` (`/proc`).
    pub fn new(mapping_dir: &Path, proc_root: &Path) -> Self {
        Attributor {
            mapping_dir: mapping_dir.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            warned: false,
            known: HashMap::new(),
            pods: kubernetes::DeviceMap::new(),
            pod_labels: kubelet::LabelMap::new(),
        }
    }

    /// The GPU devices allocated to pods, from the last answer of the kubelet (empty when not
    /// on Kubernetes).
    pub fn set_pod_devices(&mut self, pods: kubernetes::DeviceMap) {
        self.pods = pods;
    }

    /// The labels of each pod named by `--pod-label`, from the kubelet's `/pods`
    /// ([`kubelet`]); a pod's job carries them.
    pub fn set_pod_labels(&mut self, labels: kubelet::LabelMap) {
        self.pod_labels = labels;
    }

    /// The job of `pod`, with its labels.
    fn pod_job(&self, pod: &crate::collect::PodLabels) -> JobLabels {
        let mut job = kubernetes::job_of(pod);
        if let Some(l) = self
            .pod_labels
            .get(&(pod.namespace.clone(), pod.pod.clone()))
        {
            job.extra.labels.clone_from(l);
        }
        job
    }

    /// Label `gpus` and `procs` with their jobs (replacing any previous label).
    pub fn apply(&mut self, gpus: &mut [GpuSample], procs: &mut [ProcessSample]) {
        let in_pod = self.label_processes(procs);
        let mapping = self.read_mapping();
        for gpu in gpus.iter_mut() {
            gpu.job = self.job_of_gpu(gpu, procs, &mapping);
        }
        self.fill_from_mapping(gpus, procs);
        self.label_pods(gpus, procs, &in_pod);
        self.share_gpus(gpus, procs, &mapping);
    }

    /// Sets `job.shares` on each GPU that several jobs used: the pods the kubelet lists for it,
    /// else the jobs of its mapping file and of its processes ([`shares`]).
    fn share_gpus(
        &self,
        gpus: &mut [GpuSample],
        procs: &[ProcessSample],
        mapping: &HashMap<String, Vec<String>>,
    ) {
        for gpu in gpus.iter_mut() {
            let on_gpu = shares::processes_of(procs, &gpu.gpu_uuid);
            let pods = self.pods.get(&gpu.gpu_uuid).filter(|p| !p.is_empty());
            let mut jobs: Vec<String> = match pods {
                Some(pods) => pods.iter().map(|p| kubernetes::job_of(p).id).collect(),
                None => {
                    let key = slurm::mapping_key(gpu.gpu_index, gpu.mig_instance.as_deref());
                    let listed = mapping.get(&key).cloned().unwrap_or_default();
                    listed
                        .into_iter()
                        .chain(on_gpu.iter().map(|(j, _)| j.to_string()))
                        .collect()
                }
            };
            let mut seen = std::collections::HashSet::new();
            jobs.retain(|j| seen.insert(j.clone()));
            if let Some(job) = gpu.job.as_mut() {
                job.extra.shares = if jobs.len() >= 2 {
                    shares::encode(&shares::split(&jobs, &on_gpu, pods.is_some()))
                } else {
                    String::new()
                };
            }
        }
    }

    /// Labels each process from `/proc` (kept while the process lives); returns which ones run
    /// in a pod.
    fn label_processes(&mut self, procs: &mut [ProcessSample]) -> Vec<bool> {
        let mut known = HashMap::with_capacity(procs.len());
        let mut in_pod = vec![false; procs.len()];
        for (p, in_pod) in procs.iter_mut().zip(in_pod.iter_mut()) {
            let started = proc::start_time(&self.proc_root, p.pid);
            let info = match (started, self.known.remove(&p.pid)) {
                (Some(s), Some((was, info))) if s == was => info,
                _ => proc::read_process(&self.proc_root, p.pid),
            };
            if p.process_name.is_none() {
                p.process_name.clone_from(&info.name);
            }
            p.job.clone_from(&info.job);
            *in_pod = info.pod_uid.is_some();
            if let Some(s) = started {
                known.insert(p.pid, (s, info));
            }
        }
        // Processes gone from every GPU are forgotten.
        self.known = known;
        in_pod
    }

    /// The job mapping dir (GPU key → job ids), empty (with one warning) when unreadable.
    fn read_mapping(&mut self) -> HashMap<String, Vec<String>> {
        match slurm::read_mapping_dir(&self.mapping_dir) {
            Ok(m) => {
                self.warned = false;
                m
            }
            Err(e) => {
                if self.warned {
                    debug!(error = %e, "job mapping dir unreadable");
                } else {
                    warn!(error = %e, "job mapping dir unreadable: gpus are labelled from their processes only");
                    self.warned = true;
                }
                HashMap::new()
            }
        }
    }

    /// A GPU's job: the mapping dir's (the last job listed, unless one of its processes runs
    /// another listed job), else the job of its first labelled process.
    fn job_of_gpu(
        &self,
        gpu: &GpuSample,
        procs: &[ProcessSample],
        mapping: &HashMap<String, Vec<String>>,
    ) -> Option<JobLabels> {
        let on_gpu: Vec<&JobLabels> = procs
            .iter()
            .filter(|p| p.gpu_uuid == gpu.gpu_uuid)
            .filter_map(|p| p.job.as_ref())
            .collect();
        let key = slurm::mapping_key(gpu.gpu_index, gpu.mig_instance.as_deref());
        let ids = match mapping.get(&key) {
            Some(ids) if !ids.is_empty() => ids,
            _ => return on_gpu.first().map(|j| (*j).clone()),
        };
        if let Some(job) = on_gpu.iter().find(|j| ids.contains(&j.id)) {
            return Some((*job).clone());
        }
        let id = &ids[ids.len() - 1];
        let mut job = slurm::read_job_info(&self.mapping_dir, id);
        // A process of the same job elsewhere may know more.
        if let Some(known) = procs
            .iter()
            .filter_map(|p| p.job.as_ref())
            .find(|j| j.id == *id)
        {
            if job.user.is_empty() {
                job.user.clone_from(&known.user);
            }
            if job.name.is_empty() {
                job.name.clone_from(&known.name);
            }
        }
        Some(job)
    }

    /// On Kubernetes, a GPU allocated to a pod, and a process of a pod on it, belong to the
    /// pod.
    fn label_pods(&self, gpus: &mut [GpuSample], procs: &mut [ProcessSample], in_pod: &[bool]) {
        if self.pods.is_empty() {
            return;
        }
        for gpu in gpus.iter_mut() {
            if let Some(pod) = self.pods.get(&gpu.gpu_uuid).and_then(|v| v.first()) {
                gpu.job = Some(self.pod_job(pod));
            }
        }
        for (p, in_pod) in procs.iter_mut().zip(in_pod) {
            if *in_pod && let Some(pod) = self.pods.get(&p.gpu_uuid).and_then(|v| v.first()) {
                p.job = Some(self.pod_job(pod));
            }
        }
    }
}

impl Attributor {
    /// What `/proc` did not give of a Slurm job (its time limit always, its account and the
    /// rest for a process the agent cannot read) is taken from `.jobs/<id>` of the mapping
    /// directory, read once per job per collection.
    fn fill_from_mapping(&self, gpus: &mut [GpuSample], procs: &mut [ProcessSample]) {
        let mut infos: HashMap<String, JobLabels> = HashMap::new();
        let jobs = gpus
            .iter_mut()
            .filter_map(|g| g.job.as_mut())
            .chain(procs.iter_mut().filter_map(|p| p.job.as_mut()));
        for job in jobs.filter(|j| j.scheduler == SLURM) {
            let info = infos
                .entry(job.id.clone())
                .or_insert_with(|| slurm::read_job_info(&self.mapping_dir, &job.id));
            if job.user.is_empty() {
                job.user.clone_from(&info.user);
            }
            if job.name.is_empty() {
                job.name.clone_from(&info.name);
            }
            job.extra.fill_from(&info.extra);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuSample {
        GpuSample::empty(1, format!("GPU-{index}"), index, "m".into())
    }

    fn process(index: u32, pid: u32) -> ProcessSample {
        ProcessSample {
            time_unix_nano: 1,
            gpu_uuid: format!("GPU-{index}"),
            gpu_index: index,
            pid,
            process_name: None,
            job: None,
            used_memory_bytes: None,
            sm_utilization: None,
        }
    }

    struct Dirs {
        root: PathBuf,
    }

    impl Dirs {
        fn new(tag: &str) -> Self {
            let root =
                std::env::temp_dir().join(format!("gpuwatch-attr-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("jobs/.jobs")).unwrap();
            std::fs::create_dir_all(root.join("proc")).unwrap();
            Dirs { root }
        }
        fn jobs(&self) -> PathBuf {
            self.root.join("jobs")
        }
        fn proc(&self) -> PathBuf {
            self.root.join("proc")
        }
        fn fake_process(&self, pid: u32, environ: &[(&str, &str)], cgroup: &str) {
            let dir = self.proc().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let mut env = Vec::new();
            for (k, v) in environ {
                env.extend_from_slice(format!("{k}={v}").as_bytes());
                env.push(0);
            }
            std::fs::write(dir.join("environ"), env).unwrap();
            std::fs::write(dir.join("cgroup"), cgroup).unwrap();
            std::fs::write(dir.join("comm"), "python3\n").unwrap();
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn mapping_dir_labels_idle_gpus_and_processes_label_theirs() {
        let d = Dirs::new("a");
        std::fs::write(d.jobs().join("1"), "77\n").unwrap();
        std::fs::write(d.jobs().join(".jobs/77"), "user=bob\nname=notebook\n").unwrap();
        d.fake_process(
            4242,
            &[
                ("SLURM_JOB_ID", "55"),
                ("SLURM_JOB_USER", "alice"),
                ("SLURM_JOB_NAME", "train"),
            ],
            "0::/\n",
        );
        d.fake_process(
            4343,
            &[("PATH", "/bin")],
            "0::/system.slice/slurmstepd.scope/job_56/step_0/user/task_0\n",
        );
        let mut gpus = vec![gpu(0), gpu(1), gpu(2), gpu(3)];
        let mut procs = vec![process(0, 4242), process(2, 4343), process(3, 999_999)];
        let mut a = Attributor::new(&d.jobs(), &d.proc());
        a.apply(&mut gpus, &mut procs);
        let job0 = gpus[0].job.as_ref().unwrap();
        assert_eq!(
            (job0.id.as_str(), job0.user.as_str(), job0.name.as_str()),
            ("55", "alice", "train")
        );
        assert_eq!(job0.scheduler, "slurm");
        let job1 = gpus[1].job.as_ref().unwrap();
        assert_eq!(
            (job1.id.as_str(), job1.user.as_str(), job1.name.as_str()),
            ("77", "bob", "notebook")
        );
        assert_eq!(gpus[2].job.as_ref().unwrap().id, "56");
        // A process that vanished: no job, no panic.
        assert_eq!(gpus[3].job, None);
        assert_eq!(procs[0].process_name.as_deref(), Some("python3"));
        assert_eq!(procs[0].job.as_ref().unwrap().id, "55");
        assert_eq!(procs[2].job, None);

        // The job on GPU 1 ends: the epilog removes the file; the next tick drops the label.
        std::fs::remove_file(d.jobs().join("1")).unwrap();
        a.apply(&mut gpus, &mut procs);
        assert_eq!(gpus[1].job, None);
    }

    #[test]
    fn shared_gpu_prefers_the_listed_job_with_a_process() {
        let d = Dirs::new("b");
        std::fs::write(d.jobs().join("0"), "10\n11\n").unwrap();
        d.fake_process(
            5000,
            &[("SLURM_JOB_ID", "10"), ("SLURM_JOB_USER", "carol")],
            "",
        );
        let mut gpus = vec![gpu(0)];
        let mut a = Attributor::new(&d.jobs(), &d.proc());
        a.apply(&mut gpus, &mut []);
        assert_eq!(gpus[0].job.as_ref().unwrap().id, "11");
        let mut procs = vec![process(0, 5000)];
        a.apply(&mut gpus, &mut procs);
        let job = gpus[0].job.as_ref().unwrap();
        assert_eq!((job.id.as_str(), job.user.as_str()), ("10", "carol"));
    }

    #[test]
    fn a_process_is_read_once_until_its_pid_is_reused() {
        let d = Dirs::new("d");
        let stat = |start: u64| {
            format!("6000 (python3) S 1 6000 6000 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0")
        };
        d.fake_process(6000, &[("SLURM_JOB_ID", "20")], "");
        std::fs::write(d.proc().join("6000/stat"), stat(100)).unwrap();
        let mut gpus = vec![gpu(0)];
        let mut procs = vec![process(0, 6000)];
        let mut a = Attributor::new(&d.jobs(), &d.proc());
        a.apply(&mut gpus, &mut procs);
        assert_eq!(procs[0].job.as_ref().unwrap().id, "20");
        // The same process (same start time): what was read stands, /proc is not read again.
        d.fake_process(6000, &[("SLURM_JOB_ID", "21")], "");
        a.apply(&mut gpus, &mut procs);
        assert_eq!(procs[0].job.as_ref().unwrap().id, "20");
        assert_eq!(gpus[0].job.as_ref().unwrap().id, "20");
        // The pid now names another process: read afresh.
        std::fs::write(d.proc().join("6000/stat"), stat(200)).unwrap();
        a.apply(&mut gpus, &mut procs);
        assert_eq!(procs[0].job.as_ref().unwrap().id, "21");
        // Gone from the GPUs, then back with the same start time: forgotten, so read afresh.
        a.apply(&mut gpus, &mut []);
        d.fake_process(6000, &[("SLURM_JOB_ID", "22")], "");
        a.apply(&mut gpus, &mut procs);
        assert_eq!(procs[0].job.as_ref().unwrap().id, "22");
    }

    #[test]
    fn pods_label_their_gpus_and_the_processes_in_them() {
        use crate::collect::PodLabels;
        let d = Dirs::new("k8s");
        // A Slurm job on GPU 2 (a node may run both): kept, the kubelet does not list GPU 2.
        std::fs::write(d.jobs().join("2"), "88\n").unwrap();
        d.fake_process(
            6000,
            &[("PATH", "/bin")],
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_0000_4000_8000_00000000abcd.slice/cri-containerd-1.scope\n",
        );
        d.fake_process(6001, &[("PATH", "/bin")], "0::/user.slice\n");
        let mut pods = kubernetes::DeviceMap::new();
        let labels = PodLabels {
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: "trainer".into(),
        };
        pods.insert("GPU-0".into(), vec![labels.clone()]);
        let mut gpus = vec![gpu(0), gpu(1), gpu(2)];
        let mut procs = vec![process(0, 6000), process(0, 6001)];
        let mut a = Attributor::new(&d.jobs(), &d.proc());
        a.set_pod_devices(pods);
        a.apply(&mut gpus, &mut procs);
        let job = gpus[0].job.as_ref().unwrap();
        assert_eq!(job.scheduler, "kubernetes");
        assert_eq!(job.id, "ml/train-0");
        assert_eq!(job.k8s.as_ref(), Some(&labels));
        assert_eq!(gpus[1].job, None);
        assert_eq!(gpus[2].job.as_ref().unwrap().id, "88");
        assert_eq!(procs[0].job.as_ref().unwrap().id, "ml/train-0");
        // Not in a pod's cgroup: not the pod's process.
        assert_eq!(procs[1].job, None);
        // The pod goes away from the kubelet's answer: the label goes at the next tick.
        a.set_pod_devices(kubernetes::DeviceMap::new());
        a.apply(&mut gpus, &mut procs);
        assert_eq!(gpus[0].job, None);
        assert_eq!(procs[0].job, None);
    }

    #[test]
    fn the_mapping_dir_fills_what_proc_does_not_say() {
        let d = Dirs::new("extra");
        std::fs::write(d.jobs().join("0"), "30\n").unwrap();
        std::fs::write(
            d.jobs().join(".jobs/30"),
            "user=dan\naccount=bio\npartition=long\nqos=low\ntime_limit=02:00:00\n",
        )
        .unwrap();
        // The process says its own account; the file only adds what the process lacks.
        d.fake_process(
            7000,
            &[
                ("SLURM_JOB_ID", "30"),
                ("SLURM_JOB_ACCOUNT", "chem"),
                ("SLURM_ARRAY_JOB_ID", "29"),
                ("SLURM_ARRAY_TASK_ID", "1"),
            ],
            "",
        );
        let mut gpus = vec![gpu(0), gpu(1)];
        let mut procs = vec![process(0, 7000)];
        let mut a = Attributor::new(&d.jobs(), &d.proc());
        a.apply(&mut gpus, &mut procs);
        for job in [
            gpus[0].job.as_ref().unwrap(),
            procs[0].job.as_ref().unwrap(),
        ] {
            let e = &job.extra;
            assert_eq!(job.user, "dan");
            assert_eq!(
                (e.account.as_str(), e.partition.as_str(), e.qos.as_str()),
                ("chem", "long", "low")
            );
            assert_eq!((e.array_id.as_str(), e.array_task_id.as_str()), ("29", "1"));
            assert_eq!(e.time_limit_seconds, Some(7_200));
        }
        assert_eq!(gpus[1].job, None);
    }

    #[test]
    fn missing_mapping_dir_is_not_an_error() {
        let d = Dirs::new("c");
        let mut gpus = vec![gpu(0)];
        let mut a = Attributor::new(&d.root.join("absent"), &d.proc());
        a.apply(&mut gpus, &mut []);
        assert_eq!(gpus[0].job, None);
    }
}
