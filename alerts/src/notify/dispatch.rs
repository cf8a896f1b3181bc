//! Routing, grouping and deduplication with Alertmanager's semantics.
//!
//! Firing and resolved alerts from the rule engine are routed (first matching route, unless it
//! says `continue`), then grouped by the route's `group_by` labels. A new group waits
//! `group_wait` before its first notification; after that it is looked at every
//! `group_interval`. A group is notified when its firing set holds an alert not in the last
//! notification, when an alert of the last notification resolved (with `send_resolved`), or when
//! `repeat_interval` passed since the last one; otherwise nothing is sent (deduplication, as
//! Alertmanager's notification log does). Silenced alerts count as absent. Resolved alerts leave
//! the group once notified; an empty group is dropped.
//!
//! Routes to an `alertmanager` receiver skip grouping: every alert is pushed when its state
//! changes and re-sent every `resend_delay` while firing, with `endsAt` four resend delays ahead,
//! as Prometheus pushes to Alertmanager.
//!
//! Time comes from the caller, so all of this is tested without sleeping. The state is saved
//! after every change, so a restart sends nothing twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::config::{AlertingConfig, ReceiverKind, RouteConfig};
use super::silence::Silences;
use super::{Message, NAlert};
use crate::engine::{Alert, State};
use crate::error::Result;

fn nanos(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// What was last sent for a group.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct LogEntry {
    firing: BTreeSet<String>,
    resolved: BTreeSet<String>,
    at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Group {
    route: usize,
    labels: BTreeMap<String, String>,
    alerts: BTreeMap<String, NAlert>,
    next_flush: i64,
    log: Option<LogEntry>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Pushed {
    status: String,
    at: i64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    groups: BTreeMap<String, Group>,
    /// route → fingerprint → last push (alertmanager receivers)
    pushed: BTreeMap<usize, BTreeMap<String, Pushed>>,
}

/// Routing, grouping and dedup state.
#[derive(Debug)]
pub struct Dispatcher {
    config: AlertingConfig,
    path: Option<PathBuf>,
    saved: Saved,
    /// route → the latest alerts it matched (alertmanager receivers)
    latest: BTreeMap<usize, BTreeMap<String, NAlert>>,
}

fn matches(route: &RouteConfig, labels: &BTreeMap<String, String>) -> bool {
    route.matchers.iter().all(|(k, want)| {
        let v = labels.get(k).map(String::as_str).unwrap_or("");
        match want.strip_prefix('~') {
            Some(re) => regex::Regex::new(&format!("^(?:{re})$")).is_ok_and(|r| r.is_match(v)),
            None => v == want,
        }
    })
}

fn to_nalert(a: &Alert) -> NAlert {
    NAlert {
        fingerprint: a.fingerprint.clone(),
        labels: a.labels.clone(),
        annotations: a.annotations.clone(),
        status: if a.state == State::Resolved {
            "resolved".into()
        } else {
            "firing".into()
        },
        starts_at: a.fired_at.unwrap_or(a.active_at),
        ends_at: a.resolved_at,
        value: a.value,
    }
}

impl Dispatcher {
    /// A dispatcher for `config`, resuming the state saved at `path`.
    pub fn new(config: AlertingConfig, path: Option<PathBuf>) -> Result<Self> {
        config.validate()?;
        let mut saved = Saved::default();
        if let Some(p) = &path
            && let Some(s) = crate::state::load::<Saved>(p, "notification state")?
        {
            saved = s;
            // Routes may have changed: groups of routes that are gone are dropped.
            saved.groups.retain(|_, g| g.route < config.routes.len());
        }
        Ok(Self {
            config,
            path,
            saved,
            latest: BTreeMap::new(),
        })
    }

    /// The config.
    pub fn config(&self) -> &AlertingConfig {
        &self.config
    }

    fn receiver_kind(&self, route: usize) -> Option<ReceiverKind> {
        let name = &self.config.routes.get(route)?.receiver;
        self.config
            .receivers
            .iter()
            .find(|r| &r.name == name)
            .map(|r| r.kind)
    }

    fn routes_for(&self, labels: &BTreeMap<String, String>) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, r) in self.config.routes.iter().enumerate() {
            if matches(r, labels) {
                out.push(i);
                if !r.continue_ {
                    break;
                }
            }
        }
        out
    }

    /// Takes the rule engine's current alerts (pending ones are ignored).
    pub fn ingest(&mut self, alerts: &[Alert], now: i64) -> Result<()> {
        let mut latest: BTreeMap<usize, BTreeMap<String, NAlert>> = BTreeMap::new();
        let mut changed = false;
        for a in alerts {
            if a.state == State::Pending {
                continue;
            }
            let n = to_nalert(a);
            for route in self.routes_for(&a.labels) {
                if self.receiver_kind(route) == Some(ReceiverKind::Alertmanager) {
                    latest
                        .entry(route)
                        .or_default()
                        .insert(n.fingerprint.clone(), n.clone());
                    continue;
                }
                let r = &self.config.routes[route];
                let group_labels: BTreeMap<String, String> =
                    if r.group_by.iter().any(|g| g == "...") {
                        a.labels.clone()
                    } else {
                        r.group_by
                            .iter()
                            .filter_map(|k| a.labels.get(k).map(|v| (k.clone(), v.clone())))
                            .collect()
                    };
                let key = format!(
                    "{route}:{}",
                    serde_json::to_string(&group_labels).unwrap_or_default()
                );
                let wait = nanos(r.group_wait());
                match self.saved.groups.get_mut(&key) {
                    Some(g) => {
                        let old = g.alerts.get(&n.fingerprint);
                        if n.status == "resolved" && old.is_none() {
                            continue; // already notified and removed, or never in the group
                        }
                        if old != Some(&n) {
                            g.alerts.insert(n.fingerprint.clone(), n.clone());
                            changed = true;
                        }
                    }
                    None => {
                        if n.status == "resolved" {
                            continue;
                        }
                        let mut alerts = BTreeMap::new();
                        alerts.insert(n.fingerprint.clone(), n.clone());
                        self.saved.groups.insert(
                            key,
                            Group {
                                route,
                                labels: group_labels,
                                alerts,
                                next_flush: now.saturating_add(wait),
                                log: None,
                            },
                        );
                        changed = true;
                    }
                }
            }
        }
        self.latest = latest;
        if changed {
            self.save()?;
        }
        Ok(())
    }

    /// The notifications due at `now`, as (receiver name, message).
    pub fn tick(&mut self, now: i64, silences: &Silences) -> Result<Vec<(String, Message)>> {
        let external_url = self.config.external_url.clone().unwrap_or_default();
        let mut out = Vec::new();
        let grouped = self.flush_groups(now, silences, &external_url, &mut out);
        let pushed = self.push_alertmanager(now, silences, &external_url, &mut out);
        if grouped || pushed {
            self.save()?;
        }
        Ok(out)
    }

    /// The messages of the groups whose flush is due; true when any group changed.
    fn flush_groups(
        &mut self,
        now: i64,
        silences: &Silences,
        external_url: &str,
        out: &mut Vec<(String, Message)>,
    ) -> bool {
        let mut changed = false;
        let keys: Vec<String> = self
            .saved
            .groups
            .iter()
            .filter(|(_, g)| g.next_flush <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some(g) = self.saved.groups.get_mut(&key) else {
                continue;
            };
            let route = &self.config.routes[g.route];
            changed = true;
            g.next_flush = now.saturating_add(nanos(route.group_interval()));
            let live: Vec<&NAlert> = g
                .alerts
                .values()
                .filter(|a| !silences.silenced(&a.labels, now))
                .collect();
            let firing: BTreeSet<String> = live
                .iter()
                .filter(|a| a.status == "firing")
                .map(|a| a.fingerprint.clone())
                .collect();
            let resolved: BTreeSet<String> = live
                .iter()
                .filter(|a| a.status == "resolved")
                .map(|a| a.fingerprint.clone())
                .collect();
            let needs = needs_notification(g.log.as_ref(), route, &firing, &resolved, now);
            if needs {
                let previously: BTreeSet<String> =
                    g.log.as_ref().map(|e| e.firing.clone()).unwrap_or_default();
                let alerts: Vec<NAlert> = live
                    .iter()
                    .filter(|a| {
                        a.status == "firing"
                            || (route.send_resolved && previously.contains(&a.fingerprint))
                    })
                    .map(|a| (*a).clone())
                    .collect();
                if !alerts.is_empty() {
                    out.push((
                        route.receiver.clone(),
                        Message::new(&route.receiver, &key, &g.labels, alerts, external_url),
                    ));
                }
                g.log = Some(LogEntry {
                    firing: firing.clone(),
                    resolved: resolved.clone(),
                    at: now,
                });
            }
            // Resolved alerts that have been looked at leave the group.
            g.alerts.retain(|_, a| a.status == "firing");
            if g.alerts.is_empty() {
                self.saved.groups.remove(&key);
            }
        }
        changed
    }

    /// The Alertmanager pushes due (new, changed, or firing past the receiver's resend delay);
    /// true when any was pushed.
    fn push_alertmanager(
        &mut self,
        now: i64,
        silences: &Silences,
        external_url: &str,
        out: &mut Vec<(String, Message)>,
    ) -> bool {
        let mut changed = false;
        for (route, alerts) in &self.latest {
            let Some(r) = self.config.routes.get(*route) else {
                continue;
            };
            let resend = self
                .config
                .receivers
                .iter()
                .find(|x| x.name == r.receiver)
                .map(|x| nanos(x.resend_delay()))
                .unwrap_or(60_000_000_000);
            let pushed = self.saved.pushed.entry(*route).or_default();
            let mut due = Vec::new();
            for a in alerts.values() {
                if silences.silenced(&a.labels, now) {
                    continue;
                }
                let send = match pushed.get(&a.fingerprint) {
                    None => true,
                    Some(p) if p.status != a.status => true,
                    Some(p) => a.status == "firing" && now - p.at >= resend,
                };
                if !send {
                    continue;
                }
                let mut n = a.clone();
                if n.status == "firing" {
                    n.ends_at = Some(now.saturating_add(4 * resend));
                }
                pushed.insert(
                    a.fingerprint.clone(),
                    Pushed {
                        status: a.status.clone(),
                        at: now,
                    },
                );
                due.push(n);
            }
            pushed.retain(|fp, _| alerts.contains_key(fp));
            if !due.is_empty() {
                changed = true;
                out.push((
                    r.receiver.clone(),
                    Message::new(
                        &r.receiver,
                        &format!("{route}:push"),
                        &BTreeMap::new(),
                        due,
                        external_url,
                    ),
                ));
            }
        }
        changed
    }

    fn save(&self) -> Result<()> {
        let Some(p) = &self.path else {
            return Ok(());
        };
        crate::state::save(p, &self.saved, "notification state")
    }
}

/// Whether a group whose live alerts are `firing` and `resolved` notifies at `now`, after its
/// last notification `log`: a new firing alert, a notified one resolved (with `send_resolved`),
/// everything notified gone, or the repeat interval past.
fn needs_notification(
    log: Option<&LogEntry>,
    route: &RouteConfig,
    firing: &BTreeSet<String>,
    resolved: &BTreeSet<String>,
    now: i64,
) -> bool {
    let Some(e) = log else {
        return !firing.is_empty();
    };
    if !e.firing.is_empty() && firing.is_empty() {
        // Everything notified resolved (or went silent).
        !resolved.is_empty()
    } else if !firing.is_subset(&e.firing)
        || (route.send_resolved
            && resolved
                .iter()
                .any(|f| e.firing.contains(f) && !e.resolved.contains(f)))
    {
        // A new firing alert, or a notified one resolved.
        true
    } else {
        !firing.is_empty() && now - e.at >= nanos(route.repeat_interval())
    }
}

#[cfg(test)]
mod tests;
