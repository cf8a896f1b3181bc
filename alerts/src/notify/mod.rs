//! Notification: routing, grouping, dedup and silences ([`dispatch`], [`silence`]), each
//! receiver's format ([`format`]) and durable delivery with retries ([`deliver`]).

pub mod config;
pub mod deliver;
pub mod dispatch;
pub mod format;
pub mod silence;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use config::{AlertingConfig, ReceiverConfig, ReceiverKind, RouteConfig};
pub use deliver::Outbox;
pub use dispatch::Dispatcher;
pub use silence::{Matcher, Silence, Silences};

/// An alert as receivers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NAlert {
    /// Label-set fingerprint.
    pub fingerprint: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// `firing` or `resolved`.
    pub status: String,
    /// Start (ns).
    pub starts_at: i64,
    /// End (ns), if resolved (or, for Alertmanager pushes, the expected end).
    pub ends_at: Option<i64>,
    /// The latest value.
    pub value: f64,
}

/// One notification: a group's alerts for one receiver.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Receiver name.
    pub receiver: String,
    /// Group key.
    pub group_key: String,
    /// `firing` when any alert fires, else `resolved`.
    pub status: String,
    /// The labels the group is made of.
    pub group_labels: BTreeMap<String, String>,
    /// Labels every alert has.
    pub common_labels: BTreeMap<String, String>,
    /// Annotations every alert has.
    pub common_annotations: BTreeMap<String, String>,
    /// The server's URL.
    pub external_url: String,
    /// The alerts.
    pub alerts: Vec<NAlert>,
}

fn common(maps: &[&BTreeMap<String, String>]) -> BTreeMap<String, String> {
    let Some(first) = maps.first() else {
        return BTreeMap::new();
    };
    first
        .iter()
        .filter(|(k, v)| maps.iter().all(|m| m.get(*k) == Some(*v)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Message {
    /// A message for `alerts`.
    pub fn new(
        receiver: &str,
        group_key: &str,
        group_labels: &BTreeMap<String, String>,
        alerts: Vec<NAlert>,
        external_url: &str,
    ) -> Self {
        let status = if alerts.iter().any(|a| a.status == "firing") {
            "firing"
        } else {
            "resolved"
        };
        let labels: Vec<&BTreeMap<String, String>> = alerts.iter().map(|a| &a.labels).collect();
        let annotations: Vec<&BTreeMap<String, String>> =
            alerts.iter().map(|a| &a.annotations).collect();
        Self {
            receiver: receiver.to_string(),
            group_key: group_key.to_string(),
            status: status.to_string(),
            group_labels: group_labels.clone(),
            common_labels: common(&labels),
            common_annotations: common(&annotations),
            external_url: external_url.to_string(),
            alerts,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
