//! The rule state machine, as Prometheus defines it.
//!
//! Each evaluation of a rule returns a set of instances (label sets). For each:
//! - a label set not seen before becomes `pending` at that time (`active_at`), or `firing` at
//!   once when the rule's `for` is zero;
//! - a `pending` one whose `active_at` is at least `for` ago becomes `firing`;
//! - a `pending` one the query no longer returns is dropped (it never fired, nobody is told);
//! - a `firing` one the query no longer returns stays firing for `keep_firing_for` after it was
//!   last returned, then becomes `resolved`; a resolved alert is kept 15 minutes (so receivers
//!   hear about it) and then forgotten; if its label set comes back it starts again as pending.
//!
//! Every transition is a row of the `alerts` history table. The active alerts are saved after
//! each evaluation that changed them, to a JSON file replaced atomically, so a restart resumes
//! the same states (and the notifier, which keeps its own log, sends nothing twice).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

use gpuwatch_store::clock::Clock;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::{History, HistoryRow};
use crate::rules::{Rule, RuleFile};
use crate::source::{Instance, RuleSource};
use crate::state;

/// Evaluations run on a fixed grid, but each reads the clock a few milliseconds after its tick:
/// `for` counts as elapsed when it is short of this. Without it, `for: 1m` with a 1m interval
/// would wait for a third evaluation half of the time.
pub const FOR_TOLERANCE: Duration = Duration::from_millis(250);

/// How long a resolved alert is kept and re-announced (Prometheus' `resolvedRetention`).
pub const RESOLVED_RETENTION: Duration = Duration::from_secs(15 * 60);

/// An alert's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Returned by the query, not yet for `for`.
    Pending,
    /// Returned for at least `for`.
    Firing,
    /// No longer returned (after `keep_firing_for`).
    Resolved,
}

impl State {
    /// The name used in the `alerts` table and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Firing => "firing",
            State::Resolved => "resolved",
        }
    }
}

/// One alert instance and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    /// The rule (label `alertname`).
    pub rule: String,
    /// Hash of the labels (hex FNV-1a 64, as Alertmanager computes it).
    pub fingerprint: String,
    /// Query labels, rule labels and `alertname`.
    pub labels: BTreeMap<String, String>,
    /// Rendered annotations.
    pub annotations: BTreeMap<String, String>,
    /// The latest value.
    pub value: f64,
    /// The state.
    pub state: State,
    /// When it became pending (ns).
    pub active_at: i64,
    /// When it started firing (ns).
    pub fired_at: Option<i64>,
    /// When it resolved (ns).
    pub resolved_at: Option<i64>,
    /// When the query last returned it (ns).
    pub last_seen: i64,
}

/// Alertmanager's label-set fingerprint: FNV-1a 64 over sorted `name 0xff value 0xff`.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (k, v) in labels {
        eat(k.as_bytes());
        eat(&[0xff]);
        eat(v.as_bytes());
        eat(&[0xff]);
    }
    format!("{h:016x}")
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Applies one evaluation's instances to a rule's alerts; returns the transitions (as history
/// rows). Pure: no I/O, no clock.
pub fn step(
    rule: &Rule,
    alerts: &mut BTreeMap<String, Alert>,
    instances: Vec<Instance>,
    now: i64,
) -> Vec<HistoryRow> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for inst in instances {
        let labels = alert_labels(rule, inst.labels);
        let fp = fingerprint(&labels);
        if !seen.insert(fp.clone()) {
            continue; // two rows with the same labels: the first wins, as in Prometheus
        }
        let fresh = new_alert(rule, fp, labels, inst.value, now);
        out.extend(returned(rule, alerts, fresh, now));
    }
    out.extend(not_returned(rule, alerts, &seen, now));
    out
}

/// An instance's labels with the rule's labels (they win) and `alertname` added.
fn alert_labels(rule: &Rule, mut labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    for (k, v) in &rule.labels {
        labels.insert(k.0.clone(), v.clone());
    }
    labels.insert("alertname".into(), rule.alert.0.clone());
    labels
}

/// The alert an instance starts when its label set is new (or resolved): pending, or firing
/// at once when the rule's `for` is zero; its annotations rendered.
fn new_alert(
    rule: &Rule,
    fingerprint: String,
    labels: BTreeMap<String, String>,
    value: f64,
    now: i64,
) -> Alert {
    let annotations: BTreeMap<String, String> = rule
        .annotations
        .iter()
        .map(|(k, t)| (k.clone(), t.0.render(&labels, value)))
        .collect();
    let state = if rule.for_.0.is_zero() {
        State::Firing
    } else {
        State::Pending
    };
    Alert {
        rule: rule.alert.0.clone(),
        fingerprint,
        labels,
        annotations,
        value,
        state,
        active_at: now,
        fired_at: (state == State::Firing).then_some(now),
        resolved_at: None,
        last_seen: now,
    }
}

/// Applies an instance the query returned (as the alert it would start, `fresh`): starts it,
/// or updates the active one and fires it once pending for `for`. The transition, if any.
fn returned(
    rule: &Rule,
    alerts: &mut BTreeMap<String, Alert>,
    fresh: Alert,
    now: i64,
) -> Option<HistoryRow> {
    let Some(a) = alerts
        .get_mut(&fresh.fingerprint)
        .filter(|a| a.state != State::Resolved)
    else {
        let row = HistoryRow::of(&fresh, now);
        alerts.insert(fresh.fingerprint.clone(), fresh);
        return Some(row);
    };
    a.value = fresh.value;
    a.annotations = fresh.annotations;
    a.last_seen = now;
    if a.state == State::Pending && now - a.active_at + nanos(FOR_TOLERANCE) >= nanos(rule.for_.0) {
        a.state = State::Firing;
        a.fired_at = Some(now);
        return Some(HistoryRow::of(a, now));
    }
    None
}

/// Applies the query's silence to the alerts it did not return (`seen` holds those it did):
/// pending ones are dropped, firing ones resolve after `keep_firing_for`, resolved ones are
/// forgotten after their retention. The transitions.
fn not_returned(
    rule: &Rule,
    alerts: &mut BTreeMap<String, Alert>,
    seen: &HashSet<String>,
    now: i64,
) -> Vec<HistoryRow> {
    let keep = nanos(rule.keep_firing_for.0);
    let retention = nanos(RESOLVED_RETENTION);
    let mut out = Vec::new();
    alerts.retain(|fp, a| {
        if seen.contains(fp) {
            return true;
        }
        match a.state {
            State::Pending => false,
            State::Firing if now - a.last_seen >= keep => {
                a.state = State::Resolved;
                a.resolved_at = Some(now);
                out.push(HistoryRow::of(a, now));
                true
            }
            State::Firing => true,
            State::Resolved => a.resolved_at.is_some_and(|t| now - t < retention),
        }
    });
    out
}

/// What is saved across restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    /// rule → fingerprint → alert
    alerts: BTreeMap<String, BTreeMap<String, Alert>>,
    /// rule → last evaluation time (ns)
    #[serde(default)]
    last_eval: BTreeMap<String, i64>,
}

/// The rules, their alerts, and where transitions go.
pub struct RuleEngine {
    rules: RuleFile,
    clock: Arc<dyn Clock>,
    state_path: Option<PathBuf>,
    history: History,
    saved: Mutex<Saved>,
    /// Held from taking a snapshot of `saved` to its rename: groups evaluated at the same time
    /// save one after the other, and the file ends with the newest snapshot.
    save_order: Mutex<()>,
    errors: Mutex<HashMap<String, String>>,
    /// Rule evaluations run.
    pub evaluations: std::sync::atomic::AtomicU64,
    /// Rule evaluations that failed.
    pub evaluation_failures: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RuleEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleEngine")
            .field("state_path", &self.state_path)
            .finish()
    }
}

pub use crate::state::write_atomic;

impl RuleEngine {
    /// An engine for `rules`. With `state_path`, the alerts saved there are resumed.
    pub fn new(
        rules: RuleFile,
        clock: Arc<dyn Clock>,
        state_path: Option<PathBuf>,
        history: History,
    ) -> Result<Self> {
        let mut saved = Saved::default();
        if let Some(p) = &state_path
            && let Some(s) = state::load::<Saved>(p, "alert state")?
        {
            saved = s;
            // Rules removed since: their alerts go.
            saved
                .alerts
                .retain(|name, _| rules.rules().any(|r| &r.alert.0 == name));
        }
        Ok(Self {
            rules,
            clock,
            state_path,
            history,
            saved: Mutex::new(saved),
            save_order: Mutex::new(()),
            errors: Mutex::new(HashMap::new()),
            evaluations: Default::default(),
            evaluation_failures: Default::default(),
        })
    }

    /// The rules.
    pub fn rules(&self) -> &RuleFile {
        &self.rules
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The history table.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Evaluates every rule of group `group` now; returns the alerts of the group's rules after it.
    pub async fn evaluate_group(&self, group: usize, source: &dyn RuleSource) -> Result<()> {
        let Some(g) = self.rules.groups.get(group) else {
            return Err(Error::Other(format!("no rule group {group}")));
        };
        let now = self.clock.now_nanos();
        let mut rows = Vec::new();
        for rule in &g.rules {
            let name = &rule.alert.0;
            let result = source
                .instances(name, &rule.query, now)
                .instrument(tracing::info_span!("rule_evaluation", rule = %name))
                .await;
            self.evaluations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let instances = match result {
                Ok(i) => {
                    self.lock_errors().remove(name);
                    i
                }
                Err(e) => {
                    // As Prometheus: a failed evaluation leaves the rule's alerts as they were.
                    tracing::warn!(rule = %name, error = %e, "rule evaluation failed");
                    self.evaluation_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.lock_errors().insert(name.clone(), e.to_string());
                    continue;
                }
            };
            let mut saved = self.lock();
            let alerts = saved.alerts.entry(name.clone()).or_default();
            rows.extend(step(rule, alerts, instances, now));
            saved.last_eval.insert(name.clone(), now);
        }
        self.history.append(&rows)?;
        self.save()?;
        Ok(())
    }

    /// Evaluates every group once (tests and `rules` one-shot runs).
    pub async fn evaluate_all(&self, source: &dyn RuleSource) -> Result<()> {
        for g in 0..self.rules.groups.len() {
            self.evaluate_group(g, source).await?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Saved> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_errors(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self) -> Result<()> {
        let Some(p) = &self.state_path else {
            return Ok(());
        };
        let _order = self.save_order.lock().unwrap_or_else(|p| p.into_inner());
        state::save(p, &*self.lock(), "alert state")
    }

    /// Every alert (pending, firing and recently resolved), ordered by rule and fingerprint.
    pub fn alerts(&self) -> Vec<Alert> {
        self.lock()
            .alerts
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// The last error of each rule whose latest evaluation failed.
    pub fn rule_errors(&self) -> HashMap<String, String> {
        self.lock_errors().clone()
    }
}

#[cfg(test)]
mod tests;
