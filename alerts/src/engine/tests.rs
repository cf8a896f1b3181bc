use std::sync::Mutex as StdMutex;

use arrow::array::Array;
use async_trait::async_trait;
use gpuwatch_store::clock::ManualClock;

use super::*;
use crate::source::Instance;

const SEC: i64 = 1_000_000_000;

/// Answers each rule's query with whatever the test set.
#[derive(Default)]
struct Scripted(StdMutex<Vec<Instance>>);

impl Scripted {
    fn set(&self, hosts: &[&str]) {
        *self.0.lock().expect("lock") = hosts
            .iter()
            .map(|h| Instance {
                labels: [("host".to_string(), h.to_string())].into_iter().collect(),
                value: 0.5,
            })
            .collect();
    }
}

#[async_trait]
impl RuleSource for Scripted {
    async fn instances(&self, _: &str, _: &crate::rules::Query, _: i64) -> Result<Vec<Instance>> {
        Ok(self.0.lock().expect("lock").clone())
    }
}

fn rules(for_: &str, keep: &str) -> RuleFile {
    let text = format!(
        "groups:\n  - name: g\n    interval: 1m\n    rules:\n      - alert: Idle\n        sql: SELECT 1 AS value\n        for: {for_}\n        keep_firing_for: {keep}\n        labels: {{severity: warning}}\n        annotations: {{summary: \"{{{{ labels.host }}}} at {{{{ value }}}}\"}}\n"
    );
    RuleFile::parse(&text, "t.yaml").expect("rules")
}

fn states(e: &RuleEngine) -> Vec<(String, State)> {
    e.alerts()
        .into_iter()
        .map(|a| (a.labels["host"].clone(), a.state))
        .collect()
}

#[tokio::test]
async fn pending_firing_resolved_as_prometheus() {
    let clock = Arc::new(ManualClock::new(1_000 * SEC));
    let e = RuleEngine::new(rules("5m", "0s"), clock.clone(), None, History::in_memory())
        .expect("engine");
    let src = Scripted::default();

    src.set(&["a"]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Pending)]);
    let a = &e.alerts()[0];
    assert_eq!(a.annotations["summary"], "a at 0.5");
    assert_eq!(a.labels["alertname"], "Idle");
    assert_eq!(a.labels["severity"], "warning");

    // 4m59s later: still pending. A pending alert that disappears is dropped silently.
    clock.advance(299 * SEC);
    src.set(&["a", "b"]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(
        states(&e)
            .into_iter()
            .filter(|(_, s)| *s == State::Firing)
            .count(),
        0
    );
    clock.advance(SEC);
    src.set(&["a"]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Firing)]);

    clock.advance(60 * SEC);
    src.set(&[]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Resolved)]);

    // Coming back after resolving starts over as pending.
    clock.advance(60 * SEC);
    src.set(&["a"]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Pending)]);

    let hist: Vec<String> = {
        let b = e.history().memory_batches();
        let mut v = Vec::new();
        for batch in b {
            let s = batch
                .column(2)
                .as_any()
                .downcast_ref::<arrow::array::StringArray>()
                .expect("state")
                .clone();
            for i in 0..s.len() {
                v.push(s.value(i).to_string());
            }
        }
        v
    };
    // a: pending, firing, resolved, pending; b: pending (then dropped without a row).
    assert_eq!(
        hist,
        ["pending", "pending", "firing", "resolved", "pending"]
    );
}

#[tokio::test]
async fn zero_for_fires_at_once_and_keep_firing_for_holds() {
    let clock = Arc::new(ManualClock::new(0));
    let e = RuleEngine::new(rules("0s", "2m"), clock.clone(), None, History::in_memory())
        .expect("engine");
    let src = Scripted::default();
    src.set(&["a"]);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Firing)]);
    src.set(&[]);
    clock.advance(119 * SEC);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Firing)]);
    clock.advance(SEC);
    e.evaluate_all(&src).await.expect("eval");
    assert_eq!(states(&e), vec![("a".into(), State::Resolved)]);
    // Resolved alerts are forgotten after the retention.
    clock.advance(nanos(RESOLVED_RETENTION));
    e.evaluate_all(&src).await.expect("eval");
    assert!(e.alerts().is_empty());
}

#[tokio::test]
async fn state_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state.json");
    let clock = Arc::new(ManualClock::new(0));
    let history = || {
        let store = gpuwatch_store::Store::open(
            gpuwatch_store::StoreConfig::new(dir.path().join("data")),
            clock.clone(),
        )
        .expect("store");
        History::in_store(Arc::new(store), None).expect("history")
    };
    let src = Scripted::default();
    src.set(&["a"]);
    {
        let e = RuleEngine::new(
            rules("1m", "0s"),
            clock.clone(),
            Some(state.clone()),
            history(),
        )
        .expect("engine");
        e.evaluate_all(&src).await.expect("eval");
        clock.advance(60 * SEC);
        e.evaluate_all(&src).await.expect("eval");
        assert_eq!(states(&e), vec![("a".into(), State::Firing)]);
    }
    let e = RuleEngine::new(
        rules("1m", "0s"),
        clock.clone(),
        Some(state.clone()),
        history(),
    )
    .expect("engine");
    assert_eq!(states(&e), vec![("a".into(), State::Firing)]);
    assert_eq!(e.history().len(), 2);
    clock.advance(60 * SEC);
    e.evaluate_all(&src).await.expect("eval");
    // Still firing, same start, no new transition.
    assert_eq!(e.alerts()[0].fired_at, Some(60 * SEC));
    assert_eq!(e.history().len(), 2);

    std::fs::write(&state, b"{not json").expect("write");
    let err = RuleEngine::new(rules("1m", "0s"), clock, Some(state), History::in_memory())
        .expect_err("corrupt state");
    assert!(err.to_string().contains("move the file away"), "{err}");
}

#[test]
fn fingerprint_is_stable_and_label_sensitive() {
    let mut l = BTreeMap::new();
    l.insert("alertname".to_string(), "X".to_string());
    let a = fingerprint(&l);
    assert_eq!(a, fingerprint(&l.clone()));
    l.insert("host".to_string(), "n1".to_string());
    assert_ne!(a, fingerprint(&l));
    assert_eq!(a.len(), 16);
}

#[test]
fn writers_of_the_same_file_at_the_same_time_all_succeed_and_leave_one_whole_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.json");
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let path = &path;
            s.spawn(move || {
                for i in 0..50u8 {
                    let body = vec![t.wrapping_mul(31).wrapping_add(i); 4096];
                    write_atomic(path, &body).expect("every write succeeds");
                }
            });
        }
    });
    let got = std::fs::read(&path).expect("read");
    assert_eq!(got.len(), 4096);
    assert!(got.iter().all(|b| *b == got[0]), "one writer's whole copy");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("state.json")],
        "no temporary file left"
    );
}
