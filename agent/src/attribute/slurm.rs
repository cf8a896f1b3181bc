//! The job mapping directory (`--job-mapping-dir`, default `/run/gpuwatch/jobs`), in the
//! layout of dcgm-exporter's `--hpc-job-mapping-dir`: one file per GPU, named by its index
//! (`0`, `1`, …) or, for a MIG instance, `<index>.<gpu instance>`, holding the ids of the jobs
//! that own it, one per line. `deploy/slurm/prolog.sh` writes it and `epilog.sh` removes the
//! job from it.
//!
//! The prolog also writes `.jobs/<job id>` (`key=value` lines: `user`, `name`, and for
//! chargeback `account`, `partition`, `qos`, `array_job_id`, `array_task_id`, `time_limit` as
//! `scontrol show job` prints `TimeLimit`, or `time_limit_seconds`) so that a GPU whose job runs
//! no process still carries the job's user, and so that what `/proc` cannot say (the time limit,
//! or anything of a process the agent may not read) is known. Unknown keys are ignored, so a
//! newer prolog works with an older agent. dcgm-exporter ignores the hidden directory.

use std::collections::HashMap;
use std::path::Path;

use crate::attribute::SLURM;
use crate::collect::JobLabels;

/// Files larger than this are not read (a mapping file holds a few job ids).
const MAX_FILE: u64 = 64 * 1024;

/// Mapping key (file name) of GPU `index`, or of MIG instance `gi.ci` on it (`index.gi`).
pub fn mapping_key(index: u32, mig_instance: Option<&str>) -> String {
    match mig_instance.and_then(|m| m.split('.').next()) {
        Some(gi) if !gi.is_empty() => format!("{index}.{gi}"),
        _ => index.to_string(),
    }
}

fn is_key(name: &str) -> bool {
    let mut parts = name.split('.');
    let ok =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    match (parts.next(), parts.next(), parts.next()) {
        (a, None, None) => ok(a),
        (a, b @ Some(_), None) => ok(a) && ok(b),
        _ => false,
    }
}

/// Read the mapping: file name → job ids in file order. A missing directory is an empty
/// mapping (no Slurm on this host, or no job yet); unreadable files are skipped.
pub fn read_mapping_dir(dir: &Path) -> std::io::Result<HashMap<String, Vec<String>>> {
    let mut mapping = HashMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(mapping),
        Err(e) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!(
                    "cannot read {}: {e}; check --job-mapping-dir",
                    dir.display()
                ),
            ));
        }
    };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !is_key(&name) {
            continue;
        }
        let Some(text) = read_small(&entry.path()) else {
            continue;
        };
        let ids: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            mapping.insert(name, ids);
        }
    }
    Ok(mapping)
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    f.take(MAX_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The job `id`, with user and name from `<dir>/.jobs/<id>` when the prolog wrote it.
pub fn read_job_info(dir: &Path, id: &str) -> JobLabels {
    let mut job = JobLabels {
        id: id.to_string(),
        user: String::new(),
        name: String::new(),
        scheduler: SLURM.to_string(),
        k8s: None,
        extra: Default::default(),
    };
    // An id is a file name here: refuse anything that could leave the directory.
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return job;
    }
    let Some(text) = read_small(&dir.join(".jobs").join(id)) else {
        return job;
    };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().to_string();
        // Empty, or Slurm's word for unset (QOS without accounting): nothing said, so an earlier
        // line with a value stands.
        if v.is_empty() || v == "(null)" {
            continue;
        }
        match k.trim() {
            "user" => job.user = v,
            "name" => job.name = v,
            "account" => job.extra.account = v,
            "partition" => job.extra.partition = v,
            "qos" => job.extra.qos = v,
            "array_job_id" => job.extra.array_id = v,
            "array_task_id" => job.extra.array_task_id = v,
            "time_limit" => job.extra.time_limit_seconds = parse_time_limit(&v),
            "time_limit_seconds" => job.extra.time_limit_seconds = v.parse().ok(),
            _ => {}
        }
    }
    job
}

/// A Slurm time limit as `scontrol show job` prints `TimeLimit` (`[days-]hours:minutes:seconds`,
/// `minutes:seconds`, or plain minutes), in seconds. `UNLIMITED`, `Partition_Limit` and
/// anything unreadable give `None`.
pub fn parse_time_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let (h, m, s) = match (parts.as_slice(), days > 0) {
        // With days, a lone number is hours ("1-12" is a day and a half).
        ([h], true) => (*h, 0, 0),
        ([m], false) => (0, *m, 0),
        ([a, b], true) => (*a, *b, 0),
        ([m, s], false) => (0, *m, *s),
        ([h, m, s], _) => (*h, *m, *s),
        _ => return None,
    };
    days.checked_mul(86_400)?
        .checked_add(h.checked_mul(3_600)?)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(mapping_key(3, None), "3");
        assert_eq!(mapping_key(3, Some("2.0")), "3.2");
        assert!(is_key("0") && is_key("12") && is_key("1.2"));
        assert!(
            !is_key(".jobs") && !is_key("a") && !is_key("1.") && !is_key("1.2.3") && !is_key("")
        );
    }

    #[test]
    fn time_limits() {
        assert_eq!(parse_time_limit("00:10:00"), Some(600));
        assert_eq!(parse_time_limit("2-00:00:00"), Some(172_800));
        assert_eq!(parse_time_limit("1-12"), Some(129_600));
        assert_eq!(parse_time_limit("1-01:02"), Some(90_120));
        assert_eq!(parse_time_limit("45:30"), Some(2_730));
        assert_eq!(parse_time_limit("30"), Some(1_800));
        for bad in [
            "UNLIMITED",
            "Partition_Limit",
            "",
            "1:2:3:4",
            "-5",
            "x-1:00:00",
        ] {
            assert_eq!(parse_time_limit(bad), None, "{bad}");
        }
        assert_eq!(parse_time_limit("99999999999999999-00:00:00"), None);
    }

    #[test]
    fn reads_the_layout() {
        let dir = std::env::temp_dir().join(format!("gpuwatch-map-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".jobs")).unwrap();
        std::fs::write(dir.join("0"), "12\n\n13\n").unwrap();
        std::fs::write(dir.join("1.2"), "14").unwrap();
        std::fs::write(dir.join("2"), "").unwrap();
        std::fs::write(dir.join("README"), "not a gpu").unwrap();
        std::fs::write(dir.join(".jobs/12"), "user=alice\nname=a=b\n").unwrap();
        let m = read_mapping_dir(&dir).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m["0"], vec!["12", "13"]);
        assert_eq!(m["1.2"], vec!["14"]);
        let job = read_job_info(&dir, "12");
        assert_eq!((job.user.as_str(), job.name.as_str()), ("alice", "a=b"));
        assert!(job.extra.is_empty());
        std::fs::write(
            dir.join(".jobs/15"),
            "user=bob\naccount=physics\npartition=gpu\nqos=high\narray_job_id=14\n\
array_task_id=1\ntime_limit=1-00:30:00\nfuture=x\nnot a pair\n",
        )
        .unwrap();
        let extra = read_job_info(&dir, "15").extra;
        assert_eq!(
            (
                extra.account.as_str(),
                extra.partition.as_str(),
                extra.qos.as_str(),
                extra.array_id.as_str(),
                extra.array_task_id.as_str(),
                extra.time_limit_seconds
            ),
            ("physics", "gpu", "high", "14", "1", Some(88_200))
        );
        // An empty line (the prolog environment lacked the array ids) and `(null)` (no QOS
        // without slurmdbd) say nothing: the other lines stand.
        std::fs::write(
            dir.join(".jobs/16"),
            "array_job_id=20\narray_task_id=3\nqos=(null)\narray_job_id=\naccount=\n",
        )
        .unwrap();
        let extra = read_job_info(&dir, "16").extra;
        assert_eq!(
            (extra.array_id.as_str(), extra.array_task_id.as_str()),
            ("20", "3")
        );
        assert_eq!((extra.qos.as_str(), extra.account.as_str()), ("", ""));
        assert_eq!(read_job_info(&dir, "13").user, "");
        assert_eq!(read_job_info(&dir, "../x").user, "");
        assert!(read_mapping_dir(&dir.join("absent")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
