//! Silences, as Alertmanager has them: label matchers and a time window. A silenced alert is left
//! out of notifications; when the silence ends, a still-firing alert is notified as new.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One label matcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Matcher {
    /// Label name.
    pub name: String,
    /// Value or regex (anchored).
    pub value: String,
    /// Regex match.
    #[serde(default)]
    pub is_regex: bool,
    /// Equal (true) or not equal (false).
    #[serde(default = "yes")]
    pub is_equal: bool,
}

fn yes() -> bool {
    true
}

impl Matcher {
    /// Checks the regex.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::Config("matcher name must not be empty".into()));
        }
        if self.is_regex {
            regex::Regex::new(&format!("^(?:{})$", self.value)).map_err(|e| {
                Error::Config(format!(
                    "matcher {}: bad regex {:?}: {e}",
                    self.name, self.value
                ))
            })?;
        }
        Ok(())
    }

    /// Whether `labels` satisfy the matcher (a missing label is the empty string).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map(String::as_str).unwrap_or("");
        let hit = if self.is_regex {
            regex::Regex::new(&format!("^(?:{})$", self.value)).is_ok_and(|re| re.is_match(v))
        } else {
            v == self.value
        };
        hit == self.is_equal
    }
}

/// A silence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Silence {
    /// Its id.
    pub id: String,
    /// All must match.
    pub matchers: Vec<Matcher>,
    /// Start (ns).
    pub starts_at: i64,
    /// End (ns).
    pub ends_at: i64,
    /// Who.
    #[serde(default)]
    pub created_by: String,
    /// Why.
    #[serde(default)]
    pub comment: String,
}

impl Silence {
    /// `pending`, `active` or `expired` at `now`.
    pub fn status(&self, now: i64) -> &'static str {
        if now < self.starts_at {
            "pending"
        } else if now < self.ends_at {
            "active"
        } else {
            "expired"
        }
    }

    /// Whether it silences `labels` at `now`.
    pub fn silences(&self, labels: &BTreeMap<String, String>, now: i64) -> bool {
        self.status(now) == "active" && self.matchers.iter().all(|m| m.matches(labels))
    }
}

/// The silences, saved to a JSON file on every change.
#[derive(Debug, Default)]
pub struct Silences {
    path: Option<PathBuf>,
    list: Vec<Silence>,
    next: u64,
}

/// Expired silences are kept this long for the API, then dropped.
const KEEP_EXPIRED_NS: i64 = 5 * 86_400 * 1_000_000_000;

impl Silences {
    /// Loads the silences saved at `path` (if any).
    pub fn open(path: Option<PathBuf>) -> Result<Self> {
        let mut list = Vec::new();
        if let Some(p) = &path
            && let Some(l) = crate::state::load(p, "silences")?
        {
            list = l;
        }
        Ok(Self {
            path,
            list,
            next: 0,
        })
    }

    /// Every silence.
    pub fn list(&self) -> &[Silence] {
        &self.list
    }

    /// Whether any active silence covers `labels`.
    pub fn silenced(&self, labels: &BTreeMap<String, String>, now: i64) -> bool {
        self.list.iter().any(|s| s.silences(labels, now))
    }

    /// Adds a silence; returns its id.
    pub fn add(&mut self, mut s: Silence, now: i64) -> Result<String> {
        if s.matchers.is_empty() {
            return Err(Error::Config("a silence needs at least one matcher".into()));
        }
        for m in &s.matchers {
            m.validate()?;
        }
        if s.ends_at <= s.starts_at {
            return Err(Error::Config("endsAt must be after startsAt".into()));
        }
        self.next += 1;
        s.id = format!("{:x}-{:x}", now, self.next);
        let id = s.id.clone();
        self.list.retain(|x| now - x.ends_at < KEEP_EXPIRED_NS);
        self.list.push(s);
        self.save()?;
        Ok(id)
    }

    /// Ends a silence now; false when there is no such id.
    pub fn expire(&mut self, id: &str, now: i64) -> Result<bool> {
        let Some(s) = self.list.iter_mut().find(|s| s.id == id) else {
            return Ok(false);
        };
        if s.ends_at > now {
            s.ends_at = now;
        }
        if s.starts_at > now {
            s.starts_at = now;
        }
        self.save()?;
        Ok(true)
    }

    fn save(&self) -> Result<()> {
        let Some(p) = &self.path else {
            return Ok(());
        };
        crate::state::save(p, &self.list, "silences")
    }
}
