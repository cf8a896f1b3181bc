//! Receivers and routes, from the `[alerting]` section of the config file.
//!
//! ```toml
//! [alerting]
//! external_url = "http://gpuwatch.example:9500"
//!
//! [[alerting.receivers]]
//! name = "sre-slack"
//! kind = "slack"             # slack | teams | discord | webhook | alertmanager
//! url = "https://hooks.slack.com/services/..."
//!
//! [[alerting.routes]]
//! receiver = "sre-slack"
//! matchers = { severity = "critical" }   # equality; a value starting with "~" is a regex
//! group_by = ["alertname", "host"]
//! group_wait = "30s"
//! group_interval = "5m"
//! repeat_interval = "4h"
//! send_resolved = true
//! continue = false
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::rules::Dur;

/// The `[alerting]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertingConfig {
    /// The server's URL as receivers should link to it (Alertmanager's `externalURL`).
    #[serde(default)]
    pub external_url: Option<String>,
    /// Where notifications go.
    #[serde(default)]
    pub receivers: Vec<ReceiverConfig>,
    /// Which alerts go where, first match wins unless `continue`.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
}

/// A receiver's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiverKind {
    /// Slack incoming webhook (Block Kit).
    Slack,
    /// Microsoft Teams Workflows webhook (Adaptive Card).
    Teams,
    /// Discord webhook (embeds).
    Discord,
    /// Alertmanager's webhook v4 JSON.
    Webhook,
    /// A real Alertmanager: alerts pushed to `/api/v2/alerts`, re-sent while firing.
    Alertmanager,
}

impl ReceiverKind {
    /// The default rate limit, messages per second (Slack 1/s, Teams 4/s).
    pub fn default_rate(self) -> f64 {
        match self {
            ReceiverKind::Slack => 1.0,
            ReceiverKind::Teams => 4.0,
            ReceiverKind::Discord => 0.5,
            ReceiverKind::Webhook | ReceiverKind::Alertmanager => 10.0,
        }
    }
}

/// One receiver.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConfig {
    /// Name routes refer to.
    pub name: String,
    /// Format.
    pub kind: ReceiverKind,
    /// Webhook URL (for `alertmanager`: its base URL, e.g. `http://127.0.0.1:9093`).
    pub url: String,
    /// For `webhook`: sign the body with HMAC-SHA256 in header `X-Gpuwatch-Signature`.
    #[serde(default)]
    pub hmac_secret: Option<String>,
    /// Messages per second at most [default: slack 1, teams 4, discord 0.5, others 10].
    #[serde(default)]
    pub rate_limit_per_second: Option<f64>,
    /// Per-request timeout [default: 10s].
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// First retry delay, doubled after each failure [default: 1s].
    #[serde(default)]
    pub backoff_initial: Option<Dur>,
    /// Longest retry delay [default: 5m].
    #[serde(default)]
    pub backoff_max: Option<Dur>,
    /// A message not delivered within this long is dropped (and counted) [default: 24h].
    #[serde(default)]
    pub max_age: Option<Dur>,
    /// For `alertmanager`: how often firing alerts are re-sent [default: 1m].
    #[serde(default)]
    pub resend_delay: Option<Dur>,
    /// Extra HTTP headers (e.g. authorization).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl ReceiverConfig {
    /// Effective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout.map_or(Duration::from_secs(10), |d| d.0)
    }
    /// Effective first backoff.
    pub fn backoff_initial(&self) -> Duration {
        self.backoff_initial.map_or(Duration::from_secs(1), |d| d.0)
    }
    /// Effective longest backoff.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max.map_or(Duration::from_secs(300), |d| d.0)
    }
    /// Effective max age.
    pub fn max_age(&self) -> Duration {
        self.max_age.map_or(Duration::from_secs(86_400), |d| d.0)
    }
    /// Effective resend delay.
    pub fn resend_delay(&self) -> Duration {
        self.resend_delay.map_or(Duration::from_secs(60), |d| d.0)
    }
    /// Effective rate limit.
    pub fn rate(&self) -> f64 {
        self.rate_limit_per_second
            .filter(|r| *r > 0.0)
            .unwrap_or_else(|| self.kind.default_rate())
    }
}

fn default_group_by() -> Vec<String> {
    vec!["alertname".into()]
}
fn default_true() -> bool {
    true
}

/// One route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The receiver's name.
    pub receiver: String,
    /// Label matchers, all of which must hold (`"~regex"` for a regex, anchored) [default: all].
    #[serde(default)]
    pub matchers: BTreeMap<String, String>,
    /// Labels that split alerts into notification groups (`"..."` for all labels).
    #[serde(default = "default_group_by")]
    pub group_by: Vec<String>,
    /// Wait before the first notification of a new group [default: 30s].
    #[serde(default)]
    pub group_wait: Option<Dur>,
    /// Wait between notifications of a group about new alerts [default: 5m].
    #[serde(default)]
    pub group_interval: Option<Dur>,
    /// Wait before re-sending an unchanged, still firing group [default: 4h].
    #[serde(default)]
    pub repeat_interval: Option<Dur>,
    /// Also notify when alerts resolve [default: true].
    #[serde(default = "default_true")]
    pub send_resolved: bool,
    /// Keep matching later routes after this one.
    #[serde(default, rename = "continue")]
    pub continue_: bool,
}

impl RouteConfig {
    /// Effective group_wait.
    pub fn group_wait(&self) -> Duration {
        self.group_wait.map_or(Duration::from_secs(30), |d| d.0)
    }
    /// Effective group_interval.
    pub fn group_interval(&self) -> Duration {
        self.group_interval
            .map_or(Duration::from_secs(300), |d| d.0)
    }
    /// Effective repeat_interval.
    pub fn repeat_interval(&self) -> Duration {
        self.repeat_interval
            .map_or(Duration::from_secs(4 * 3600), |d| d.0)
    }
}

impl AlertingConfig {
    /// Checks names and references.
    pub fn validate(&self) -> Result<()> {
        let mut names = std::collections::HashSet::new();
        for r in &self.receivers {
            if !names.insert(r.name.as_str()) {
                return Err(Error::Config(format!(
                    "alerting: receiver {:?} is defined twice: give each its own name",
                    r.name
                )));
            }
            let url = reqwest::Url::parse(&r.url).map_err(|e| {
                Error::Config(format!(
                    "alerting: receiver {:?}: invalid url {:?}: {e}",
                    r.name, r.url
                ))
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(Error::Config(format!(
                    "alerting: receiver {:?}: url must be http or https",
                    r.name
                )));
            }
        }
        for (i, route) in self.routes.iter().enumerate() {
            if !names.contains(route.receiver.as_str()) {
                return Err(Error::Config(format!(
                    "alerting: route {i} names receiver {:?}, which is not defined: add it under [[alerting.receivers]]",
                    route.receiver
                )));
            }
            for (k, v) in &route.matchers {
                if let Some(re) = v.strip_prefix('~') {
                    regex::Regex::new(&format!("^(?:{re})$")).map_err(|e| {
                        Error::Config(format!("alerting: route {i} matcher {k}: bad regex: {e}"))
                    })?;
                }
            }
        }
        Ok(())
    }
}
