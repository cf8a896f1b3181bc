//! The alerting service's state files (`<data-dir>/alerts/`): the rule engine's alerts
//! (`state.json`), the dispatcher's groups (`notify.json`), the silences (`silences.json`) and
//! the outbox's queued notifications. One reader and one writer for all of them: JSON, written
//! atomically (a temporary file, fsynced, renamed over the old one, the directory fsynced); a
//! file that does not decode is an error that says to move it away. At start, such a file is
//! set aside ([`set_aside`]): it moves to `<data-dir>/quarantine/` with a note, loudly, instead
//! of keeping alerting (and the server) from starting.

use std::path::{Path, PathBuf};

use gpuwatch_store::clock::Clock;
use gpuwatch_store::quarantine::{self, Note};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Reads the state saved at `path`; `None` when there is none yet. `what` names it in errors
/// (`"alert state"`, `"silences"`, …).
pub fn load<T: DeserializeOwned>(path: &Path, what: &'static str) -> Result<Option<T>> {
    if !path.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        what: read_what(what),
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| Error::Corrupt {
            path: path.to_path_buf(),
            source,
        })
}

/// Saves `value` at `path` atomically.
pub fn save<T: Serialize>(path: &Path, value: &T, what: &'static str) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|source| Error::Encode { what, source })?;
    write_atomic(path, &bytes)
}

fn read_what(what: &'static str) -> &'static str {
    match what {
        "alert state" => "cannot read alert state",
        "notification state" => "cannot read notification state",
        "silences" => "cannot read silences",
        _ => "cannot read",
    }
}

/// Writes `bytes` to `path` atomically: a temporary file, fsynced, renamed over it. The
/// temporary name is unique to the call, so writers of the same path at the same time do not
/// replace each other's temporary file (the last rename wins).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::io::Write;
    let io = |what: &'static str| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("cannot create directory for"))?;
    }
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("{}-{seq}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io("cannot write"))?;
        f.write_all(bytes).map_err(io("cannot write"))?;
        f.sync_all().map_err(io("cannot sync"))?;
        std::fs::rename(&tmp, path).map_err(io("cannot replace"))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Moves `path` (a file under `dir`, `<data-dir>/alerts`) that could not be read because of
/// `problem` to the data directory's quarantine, with a note. Returns where it went.
pub(crate) fn set_aside(
    dir: &Path,
    path: &Path,
    problem: &str,
    clock: &dyn Clock,
) -> Result<PathBuf> {
    let data_dir = dir.parent().unwrap_or(dir);
    let rel = path
        .strip_prefix(data_dir)
        .map_err(|_| {
            Error::Other(format!(
                "{} is not under {}",
                path.display(),
                data_dir.display()
            ))
        })?
        .to_string_lossy()
        .into_owned();
    let now = clock.now_nanos().div_euclid(1_000_000);
    let note = Note::new(
        &rel,
        now,
        format!("unreadable alerting state ({problem}): alerting started without it"),
        serde_json::json!({
            "effect": "alerts that were pending or firing start again from pending; silences in this file must be made again; queued notifications in it are not sent",
        }),
    );
    let moved =
        quarantine::move_local(data_dir, &rel, &note, now).map_err(|source| Error::Quarantine {
            path: path.to_path_buf(),
            source,
        })?;
    tracing::error!(file = %path.display(), quarantined = %moved.display(), problem,
        "alerting state damaged: moved to quarantine, alerting starts from an empty state (firing alerts fire again, silences must be made again)");
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_missing_and_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("sub/s.json");
        assert_eq!(load::<Vec<u32>>(&p, "silences").expect("none"), None);
        save(&p, &vec![1u32, 2], "silences").expect("save");
        assert_eq!(
            load::<Vec<u32>>(&p, "silences").expect("load"),
            Some(vec![1, 2])
        );
        std::fs::write(&p, b"{not json").expect("write");
        let e = load::<Vec<u32>>(&p, "silences").expect_err("corrupt");
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("move the file away"), "{e}");
    }
}
