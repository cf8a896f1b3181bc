//! Damaged alerting state set aside: a state file that cannot be read moves to
//! `<data-dir>/quarantine/` with a note, loudly, instead of keeping alerting (and the server)
//! from starting.

use std::path::{Path, PathBuf};

use gpuwatch_store::clock::Clock;
use gpuwatch_store::quarantine::{self, Note};

use crate::error::{Error, Result};

/// Moves `path` (a file under `dir`, `<data-dir>/alerts`) to the data directory's quarantine.
/// Returns where it went.
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
    let moved = quarantine::move_local(data_dir, &rel, &note, now)
        .map_err(|e| Error::Other(format!("cannot move the damaged {rel} to quarantine: {e}")))?;
    tracing::error!(file = %path.display(), quarantined = %moved.display(), problem,
        "alerting state damaged: moved to quarantine, alerting starts from an empty state (firing alerts fire again, silences must be made again)");
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuwatch_store::clock::ManualClock;

    use crate::notify::AlertingConfig;
    use crate::{Alerting, RuleFile};

    #[test]
    fn damaged_state_and_silences_are_set_aside_and_alerting_starts_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let alerts = dir.path().join("alerts");
        std::fs::create_dir_all(&alerts).expect("mkdir");
        std::fs::write(alerts.join("state.json"), b"{\"alerts\": {trunc").expect("state");
        std::fs::write(alerts.join("silences.json"), b"").expect("silences");
        let rules = RuleFile::parse(
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        sql: SELECT 1 AS value\n",
            "r.yaml",
        )
        .expect("rules");
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000_000));
        let a = Alerting::open(rules, AlertingConfig::default(), Some(&alerts), clock, None)
            .expect("alerting starts");
        assert_eq!(a.quarantined().len(), 2, "{:?}", a.quarantined());
        assert!(a.alerts().is_empty());
        assert!(!alerts.join("state.json").exists());
        for moved in a.quarantined() {
            assert!(moved.exists(), "{}", moved.display());
            let note = format!("{}.note.json", moved.display());
            let text = std::fs::read_to_string(&note).expect("note");
            assert!(text.contains("alerting started without it"), "{text}");
        }
        let kept: Vec<u8> = std::fs::read(
            a.quarantined()
                .iter()
                .find(|p| p.ends_with("state.json"))
                .expect("state moved"),
        )
        .expect("read");
        assert_eq!(kept, b"{\"alerts\": {trunc");
    }
}
