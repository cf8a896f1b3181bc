//! What a report says of the job's accounting: its Slurm account, partition, QOS and array ids,
//! its Kubernetes namespace and pod labels, and how much of its requested time limit it used,
//! with the `time_limit` note (docs/jobs.md).

use serde::{Deserialize, Serialize};

use super::super::AdviceConfig;
use super::parts::GpuUsage;
use super::{Advice, JobReport};
use crate::cost::Charge;

/// Unused time below which the `time_limit` note stays quiet, seconds: asking for an hour
/// more than needed costs the scheduler little.
pub const TIME_LIMIT_MIN_UNUSED_S: f64 = 3600.0;

/// The job's accounting labels (null where no sample carried them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobCharge {
    /// Slurm account (`job_account`).
    pub account: Option<String>,
    /// Slurm partition.
    pub partition: Option<String>,
    /// Slurm QOS.
    pub qos: Option<String>,
    /// The array job this job is a task of.
    pub array_job_id: Option<String>,
    /// Its task id.
    pub array_task_id: Option<String>,
    /// Kubernetes namespace.
    pub namespace: Option<String>,
    /// Pod labels, `name=value` joined by `,`.
    pub labels: Option<String>,
    /// The time limit the job asked for, seconds.
    pub time_limit_seconds: Option<i64>,
    /// Its first to last sample over the time limit (null without a limit).
    pub time_limit_used: Option<f64>,
}

impl JobCharge {
    /// The labels of the job's GPUs, for a job seen for `wall_s` seconds.
    pub fn of(usages: &[GpuUsage], wall_s: f64) -> Self {
        let mut all = Charge::default();
        for u in usages {
            all.merge(&u.charge);
        }
        let text = |c: &str| all.get(c).map(str::to_string);
        let limit = all.time_limit.filter(|l| *l > 0);
        JobCharge {
            account: text("job_account"),
            partition: text("job_partition"),
            qos: text("job_qos"),
            array_job_id: text("job_array_id"),
            array_task_id: text("job_array_task_id"),
            namespace: text("k8s_namespace"),
            labels: text("job_labels"),
            time_limit_seconds: limit,
            time_limit_used: limit.map(|l| wall_s / l as f64),
        }
    }
}

/// `1-02:03:04` (Slurm's days-hours:minutes:seconds) for `s` seconds.
pub fn slurm_duration(s: i64) -> String {
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else {
        format!("{h:02}:{m:02}:{sec:02}")
    }
}

/// `time_limit`: an ended job that used less than `time_limit_share` of the time it asked for,
/// and left at least [`TIME_LIMIT_MIN_UNUSED_S`] unused. A job that asks for far more time than
/// it needs waits longer in the queue and keeps the scheduler from backfilling others into the
/// gap.
pub fn time_limit_note(r: &JobReport, t: &AdviceConfig) -> Option<Advice> {
    let (limit, used) = (r.charge.time_limit_seconds?, r.charge.time_limit_used?);
    let unused = limit as f64 * (1.0 - used);
    if r.state != "ended" || used >= t.time_limit_share || unused < TIME_LIMIT_MIN_UNUSED_S {
        return None;
    }
    let ran = (r.last_seen_ns - r.first_seen_ns) / 1_000_000_000;
    Some(Advice {
        rule: "time_limit".into(),
        figure: format!(
            "used {:.0}% of the requested time ({} of {})",
            used * 100.0,
            slurm_duration(ran),
            slurm_duration(limit)
        ),
        advice: format!(
            "ask for less time next run (e.g. --time={}, the run plus a fifth): a shorter limit starts sooner and lets the scheduler fit other jobs in",
            slurm_duration(ran + ran / 5)
        ),
        host: None,
        gpu_uuid: None,
        gpu_index: None,
        value: Some(used),
        threshold: Some(t.time_limit_share),
        unit: "ratio".into(),
        informational: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_slurm_writes_them() {
        assert_eq!(slurm_duration(59), "00:00:59");
        assert_eq!(slurm_duration(7_200), "02:00:00");
        assert_eq!(slurm_duration(93_784), "1-02:03:04");
    }
}
