//! gpuwatch's alerting and cost accounting.
//!
//! Data flow: a rules file ([`rules`]) holds groups of SQL rules. Every group `interval`, the
//! [`engine::RuleEngine`] runs each rule's query through the server's query engine
//! ([`source`]), with `now()` taken from the injected clock; each row is an alert instance whose
//! state moves pending → firing → resolved as Prometheus defines it ([`engine::step`]).
//! Transitions are rows of the `alerts` table ([`history`]); the states are saved after each
//! evaluation so a restart resumes them. The notifier ([`notify`]) groups alerts by route,
//! deduplicates and silences them with Alertmanager's semantics, renders each receiver's format
//! and hands the messages to one delivery queue per receiver, persisted on disk, which retries
//! with backoff and honours rate limits and `Retry-After`. [`cost`] defines the `jobs` table, a
//! SQL view over `gpu_metrics` priced from the config file.

pub mod active;
pub mod cost;
pub mod engine;
mod error;
pub mod history;
pub mod metrics;
pub mod notify;
pub mod rules;
pub mod service;
pub mod source;
pub mod state;
pub mod template;

#[cfg(test)]
mod tests;

pub use engine::{Alert, RuleEngine, State};
pub use error::{Error, Result};
pub use rules::RuleFile;
pub use service::Alerting;
pub use source::{EngineSource, Instance, RuleSource};

/// The built-in rule pack (deploy/rules/), compiled in so `gpuwatch demo` needs no files.
pub const BUILTIN_RULES: &[(&str, &str)] = &[
    (
        "deploy/rules/idle.yaml",
        include_str!("../../deploy/rules/idle.yaml"),
    ),
    (
        "deploy/rules/jobs.yaml",
        include_str!("../../deploy/rules/jobs.yaml"),
    ),
    (
        "deploy/rules/health.yaml",
        include_str!("../../deploy/rules/health.yaml"),
    ),
];

/// The built-in rule pack, parsed.
pub fn builtin_rules() -> Result<RuleFile> {
    let mut all = RuleFile { groups: Vec::new() };
    for (path, text) in BUILTIN_RULES {
        all.merge(RuleFile::parse(text, path)?)?;
    }
    Ok(all)
}
