//! Shared GPUs: when several jobs use one GPU (Kubernetes time-slicing, MPS, Slurm shards or
//! oversubscription), the GPU's row carries one job, and `job.shares` says how the sample splits
//! between all of them, so that the server bills each its share and the GPU exactly once.
//!
//! The jobs of a GPU are the pods the kubelet lists for it (on Kubernetes), else the jobs of its
//! mapping file and of its processes (Slurm). Each job's share is its processes' SM utilisation
//! (NVML per-process utilisation) over the sum of all of theirs, when every job has a process
//! with a reading and the sum is above zero; equal shares otherwise. On Kubernetes the shares
//! are always equal: the pod-resources API names no process, and a process's cgroup gives a pod
//! UID that API does not list, so which pod's process used the SMs is not known.

use crate::collect::ProcessSample;

/// Each job's share of a GPU used by `jobs` (distinct ids, at least two), from the SM
/// utilisation of `procs` (the GPU's processes with their job ids) unless `equal`.
pub fn split(jobs: &[String], procs: &[(&str, Option<f64>)], equal: bool) -> Vec<(String, f64)> {
    let n = jobs.len() as f64;
    let used: Vec<Option<f64>> = jobs
        .iter()
        .map(|j| {
            let mine: Vec<f64> = procs
                .iter()
                .filter(|(pj, _)| pj == j)
                .filter_map(|(_, sm)| sm.filter(|v| v.is_finite() && *v >= 0.0))
                .collect();
            (!mine.is_empty()).then(|| mine.iter().sum())
        })
        .collect();
    let total: f64 = used.iter().flatten().sum();
    let by_sm = !equal && total > 0.0 && used.iter().all(Option::is_some);
    jobs.iter()
        .zip(&used)
        .map(|(j, u)| {
            let share = if by_sm {
                u.unwrap_or(0.0) / total
            } else {
                1.0 / n
            };
            (j.clone(), share)
        })
        .collect()
}

/// The `job.shares` text: `id=share` pairs sorted by id, joined by `,`; `,` and `=` in an id
/// become `_` (job ids and pod names never hold them), shares with at most 6 decimals.
pub fn encode(shares: &[(String, f64)]) -> String {
    let mut pairs: Vec<String> = shares
        .iter()
        .map(|(id, s)| {
            let share = format!("{s:.6}");
            let share = share.trim_end_matches('0').trim_end_matches('.');
            format!("{}={share}", id.replace([',', '='], "_"))
        })
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// The processes of GPU `gpu_uuid` as (job id, SM utilisation).
pub fn processes_of<'a>(procs: &'a [ProcessSample], gpu_uuid: &str) -> Vec<(&'a str, Option<f64>)> {
    procs
        .iter()
        .filter(|p| p.gpu_uuid == gpu_uuid)
        .filter_map(|p| p.job.as_ref().map(|j| (j.id.as_str(), p.sm_utilization)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn shares_follow_sm_utilisation_when_every_job_has_a_reading() {
        let jobs = ids(&["7", "8"]);
        let procs = [("7", Some(0.6)), ("7", Some(0.15)), ("8", Some(0.25))];
        assert_eq!(encode(&split(&jobs, &procs, false)), "7=0.75,8=0.25");
        // A job without a process, or a process without a reading: equal shares.
        assert_eq!(encode(&split(&jobs, &procs[..2], false)), "7=0.5,8=0.5");
        assert_eq!(
            encode(&split(&jobs, &[("7", Some(0.5)), ("8", None)], false)),
            "7=0.5,8=0.5"
        );
        // Both idle: equal. Kubernetes: equal whatever the readings.
        assert_eq!(
            encode(&split(&jobs, &[("7", Some(0.0)), ("8", Some(0.0))], false)),
            "7=0.5,8=0.5"
        );
        assert_eq!(encode(&split(&jobs, &procs, true)), "7=0.5,8=0.5");
        let three = split(&ids(&["ns/a", "ns/b", "ns/c"]), &[], true);
        assert_eq!(encode(&three), "ns/a=0.333333,ns/b=0.333333,ns/c=0.333333");
        assert_eq!(encode(&[("a,b=c".into(), 1.0)]), "a_b_c=1");
    }
}
