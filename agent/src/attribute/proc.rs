//! What `/proc/<pid>` says about a GPU process: its name, and its job from the environment
//! (`SLURM_JOB_ID`, `SLURM_JOB_USER`, `SLURM_JOB_NAME`, and for chargeback
//! `SLURM_JOB_ACCOUNT`, `SLURM_JOB_PARTITION`, `SLURM_JOB_QOS`, `SLURM_ARRAY_JOB_ID`,
//! `SLURM_ARRAY_TASK_ID`) or, failing that, from its cgroup path
//! (`…/job_<id>/…`, as Slurm's cgroup plugins name them). Every read may fail (the process
//! exited, or belongs to another user and the agent is not root): the answer is then "unknown",
//! never an error.

use std::path::Path;

use crate::attribute::SLURM;
use crate::collect::JobLabels;

/// Environment variables are read from at most this many bytes of `environ`.
const MAX_ENVIRON: u64 = 1 << 20;

/// What was learnt about one process.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `/proc/<pid>/comm`, trimmed.
    pub name: Option<String>,
    /// The job, if its environment or cgroup names one.
    pub job: Option<JobLabels>,
    /// The Kubernetes pod UID from the cgroup path, if any.
    pub pod_uid: Option<String>,
}

/// Read `<proc_root>/<pid>/{comm,environ,cgroup}`.
pub fn read_process(proc_root: &Path, pid: u32) -> ProcessInfo {
    let dir = proc_root.join(pid.to_string());
    let name = std::fs::read_to_string(dir.join("comm"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let environ = read_limited(&dir.join("environ")).unwrap_or_default();
    let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
    let job = job_from_environ(&environ).or_else(|| {
        slurm_job_from_cgroup(&cgroup).map(|id| JobLabels {
            id,
            user: String::new(),
            name: String::new(),
            scheduler: SLURM.to_string(),
            k8s: None,
            extra: Default::default(),
        })
    });
    ProcessInfo {
        name,
        job,
        pod_uid: pod_uid_from_cgroup(&cgroup),
    }
}

/// When process `pid` started (field 22 of `/proc/<pid>/stat`, clock ticks since boot): with
/// the pid, it names one process for the life of the host, so what was read of it can be kept.
/// `None` when unreadable (the process exited) or malformed.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may
/// hold spaces and parentheses itself, so fields are counted from the last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first; field 22 is the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

fn read_limited(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_ENVIRON).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// The Slurm job in a NUL-separated `environ`.
pub fn job_from_environ(environ: &[u8]) -> Option<JobLabels> {
    let mut id = None;
    let mut user = String::new();
    let mut name = String::new();
    let mut extra = crate::collect::JobExtra::default();
    for entry in environ.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((k, v)) = entry.split_once('=') else {
            continue;
        };
        match k {
            "SLURM_JOB_ID" => id = Some(v.trim().to_string()),
            // Older Slurm and some launchers only set SLURM_JOBID.
            "SLURM_JOBID" if id.is_none() => id = Some(v.trim().to_string()),
            "SLURM_JOB_USER" => user = v.trim().to_string(),
            "SLURM_JOB_NAME" => name = v.trim().to_string(),
            "SLURM_JOB_ACCOUNT" => extra.account = v.trim().to_string(),
            "SLURM_JOB_PARTITION" => extra.partition = v.trim().to_string(),
            "SLURM_JOB_QOS" => extra.qos = v.trim().to_string(),
            "SLURM_ARRAY_JOB_ID" => extra.array_id = v.trim().to_string(),
            "SLURM_ARRAY_TASK_ID" => extra.array_task_id = v.trim().to_string(),
            _ => {}
        }
    }
    let id = id.filter(|i| !i.is_empty())?;
    Some(JobLabels {
        id,
        user,
        name,
        scheduler: SLURM.to_string(),
        k8s: None,
        extra,
    })
}

/// The Slurm job id in a `/proc/<pid>/cgroup` (v1 `/slurm/uid_1000/job_42/step_0`, v2
/// `/system.slice/slurmstepd.scope/job_42/step_0/…`).
pub fn slurm_job_from_cgroup(cgroup: &str) -> Option<String> {
    for line in cgroup.lines() {
        // hierarchy-id:controllers:path
        let path = line.splitn(3, ':').nth(2)?;
        for part in path.split('/') {
            if let Some(id) = part.strip_prefix("job_")
                && !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_digit())
            {
                return Some(id.to_string());
            }
        }
    }
    None
}

/// The Kubernetes pod UID in a `/proc/<pid>/cgroup`: cgroupfs
/// `/kubepods/burstable/pod<uid>/<container>` or systemd
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/…`.
pub fn pod_uid_from_cgroup(cgroup: &str) -> Option<String> {
    for line in cgroup.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if !path.contains("kubepods") {
            continue;
        }
        for part in path.split('/') {
            let part = part.strip_suffix(".slice").unwrap_or(part);
            let Some(pos) = part.rfind("pod") else {
                continue;
            };
            let uid = part[pos + 3..].replace('_', "-");
            if uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
                return Some(uid);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ() {
        let env = b"PATH=/bin\0SLURM_JOB_ID=123\0SLURM_JOB_USER=alice\0SLURM_JOB_NAME=train llm\0";
        let job = job_from_environ(env).unwrap();
        assert_eq!(job.id, "123");
        assert_eq!(job.user, "alice");
        assert_eq!(job.name, "train llm");
        assert!(job.extra.is_empty());
        let env = b"SLURM_JOB_ID=124\0SLURM_JOB_ACCOUNT=physics\0SLURM_JOB_PARTITION=gpu\0\
SLURM_JOB_QOS=normal\0SLURM_ARRAY_JOB_ID=120\0SLURM_ARRAY_TASK_ID=4\0";
        let extra = job_from_environ(env).unwrap().extra;
        assert_eq!(
            (
                extra.account.as_str(),
                extra.partition.as_str(),
                extra.qos.as_str(),
                extra.array_id.as_str(),
                extra.array_task_id.as_str()
            ),
            ("physics", "gpu", "normal", "120", "4")
        );
        // The environment never carries the time limit: the mapping dir does.
        assert_eq!(extra.time_limit_seconds, None);
        assert_eq!(job_from_environ(b"PATH=/bin\0"), None);
        assert_eq!(job_from_environ(b"SLURM_JOB_ID=\0"), None);
        assert_eq!(
            job_from_environ(b"\xff\xfe\0SLURM_JOBID=9").unwrap().id,
            "9"
        );
    }

    #[test]
    fn cgroups() {
        assert_eq!(
            slurm_job_from_cgroup("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"),
            Some("42".into())
        );
        assert_eq!(
            slurm_job_from_cgroup("12:devices:/slurm/uid_1000/job_7/step_batch\n"),
            Some("7".into())
        );
        assert_eq!(slurm_job_from_cgroup("0::/user.slice\n"), None);
        assert_eq!(slurm_job_from_cgroup("garbage"), None);
        assert_eq!(
            pod_uid_from_cgroup(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/cri-containerd-abc.scope\n"
            ),
            Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718".into())
        );
        assert_eq!(
            pod_uid_from_cgroup(
                "11:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718/abc\n"
            ),
            Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718".into())
        );
        assert_eq!(pod_uid_from_cgroup("0::/system.slice\n"), None);
    }

    #[test]
    fn stat_start_time() {
        let stat = "431 (python3) S 1 431 431 0 -1 4194560 93851 0 0 0 2310 412 0 0 20 0 61 0 1834 29512110080 466173 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(1834));
        let odd = "77 (a) b (c) d) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0";
        assert_eq!(parse_start_time(odd), Some(99));
        assert_eq!(parse_start_time("77 (x) R 1 2"), None);
        assert_eq!(parse_start_time("no parenthesis"), None);
        assert_eq!(parse_start_time(""), None);
        let me = start_time(Path::new("/proc"), std::process::id());
        assert!(me.is_some());
        assert_eq!(me, start_time(Path::new("/proc"), std::process::id()));
    }

    #[test]
    fn pod_uid_in_every_cgroup_layout() {
        let uid = Some("0a1b2c3d-0000-4000-8000-00000000abcd".to_string());
        for cgroup in [
            // cgroup v2, systemd driver, guaranteed QoS (no QoS slice), containerd.
            "0::/kubepods.slice/kubepods-pod0a1b2c3d_0000_4000_8000_00000000abcd.slice/cri-containerd-9f.scope\n",
            // cgroup v2, systemd driver, burstable, CRI-O.
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_0000_4000_8000_00000000abcd.slice/crio-9f.scope\n",
            // cgroup v2, cgroupfs driver.
            "0::/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-00000000abcd/9f\n",
            // cgroup v1, cgroupfs driver, guaranteed, several hierarchies.
            "12:pids:/kubepods/pod0a1b2c3d-0000-4000-8000-00000000abcd/9f\n11:memory:/kubepods/pod0a1b2c3d-0000-4000-8000-00000000abcd/9f\n",
            // cgroup v1, systemd driver, docker.
            "4:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_0000_4000_8000_00000000abcd.slice/docker-9f.scope\n",
            // A kubelet in a container (kind): its cgroups nest under kubelet.slice.
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod0a1b2c3d_0000_4000_8000_00000000abcd.slice/cri-containerd-9f.scope\n",
        ] {
            assert_eq!(pod_uid_from_cgroup(cgroup), uid, "{cgroup}");
        }
        for cgroup in [
            "0::/\n",
            "0::/system.slice/containerd.service\n",
            // A pod-like name outside kubepods.
            "0::/user.slice/pod0a1b2c3d-0000-4000-8000-00000000abcd\n",
            // Too short to be a UID.
            "0::/kubepods/burstable/pod0a1b2c3d/9f\n",
            // Not hex.
            "0::/kubepods/burstable/podzzzzzzzz-0000-4000-8000-00000000abcd/9f\n",
            "no colons at all",
            "",
        ] {
            assert_eq!(pod_uid_from_cgroup(cgroup), None, "{cgroup}");
        }
    }

    #[test]
    fn a_vanished_process_is_unknown() {
        let info = read_process(Path::new("/nonexistent-proc"), 1);
        assert_eq!(info, ProcessInfo::default());
    }
}
