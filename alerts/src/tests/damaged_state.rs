//! Damaged alerting state set aside at start (`state::set_aside`): alerting opens without it.

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
