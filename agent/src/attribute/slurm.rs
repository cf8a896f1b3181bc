//! The job mapping directory (`--job-mapping-dir`, default `/run/gpuwatch/jobs`), in the
//! layout of dcgm-exporter's `--hpc-job-mapping-dir`: one file per GPU, named by its index
//! (`0`, `1`, …) or, for a MIG instance, `<index>.<gpu instance>`, holding the ids of the jobs
//! that own it, one per line. `deploy/slurm/prolog.sh` writes it and `epilog.sh` removes the
//! job from it.
//!
//! The prolog also writes `.jobs/<job id>` (`user=…` and `name=…` lines) so that a GPU whose
//! job runs no process still carries the job's user. dcgm-exporter ignores it.

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
    };
    // An id is a file name here: refuse anything that could leave the directory.
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return job;
    }
    let Some(text) = read_small(&dir.join(".jobs").join(id)) else {
        return job;
    };
    for line in text.lines() {
        match line.split_once('=') {
            Some(("user", v)) => job.user = v.trim().to_string(),
            Some(("name", v)) => job.name = v.trim().to_string(),
            _ => {}
        }
    }
    job
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
        assert_eq!(read_job_info(&dir, "13").user, "");
        assert_eq!(read_job_info(&dir, "../x").user, "");
        assert!(read_mapping_dir(&dir.join("absent")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
