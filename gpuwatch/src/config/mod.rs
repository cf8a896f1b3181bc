//! Settings of the server: declared once in [`settings`], read from flags, `GPUWATCH_*`
//! variables and the TOML file by `gpuwatch_common::settings` (flag > env > file > default),
//! then checked and turned into what the server runs with ([`ServeConfig`]).
//!
//! | piece | file |
//! | --- | --- |
//! | every setting, its flag, variable, default and help | `settings.rs` |
//! | the file-only sections `[retention]`, `[alerting]`, `[cost]` | `sections.rs` |
//! | checks across settings, defaults that depend on the command, [`ServeConfig`] | this file |
//! | docs/configuration.md's tables, rendered from the declaration | `docs.rs` |

#[cfg(test)]
mod docs;
mod sections;
pub(crate) mod settings;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpuwatch_common::settings::{Loaded, Sources};

pub(crate) use sections::Sections;
#[cfg(test)]
use settings::OptionalAddr;
pub(crate) use settings::{DemoSettings, OnOff, Role, ServeSettings, WalSync};

use crate::error::{Error, Result};
use crate::server::{auth, tls};

/// The keys of the config file besides the settings: the sections, and the demo's settings (a
/// file may serve both commands).
pub(crate) const FILE_ONLY_KEYS: &[&str] = &[
    "retention",
    "alerting",
    "cost",
    "jobs",
    "synthetic_hosts",
    "synthetic_gpus",
    "interval",
    "backfill",
];

/// How `serve` (and `demo`) run: the settings as given, and what follows from them.
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    /// Every setting, merged.
    pub settings: ServeSettings,
    /// `--data-dir`, or the command's default.
    pub data_dir: PathBuf,
    /// `--persist-interval`, or the command's default.
    pub persist_interval: Duration,
    /// Whether maintenance runs here (`--maintenance`, or by role).
    pub maintenance: bool,
    /// The process's memory ceiling in bytes; `None`: none.
    pub memory_limit: Option<usize>,
    /// Retention per table (`[retention]`).
    pub retention: gpuwatch_store::RetentionConfig,
    /// Rules, receivers, routes and prices.
    pub alerts: crate::alerts_wiring::AlertsConfig,
    /// TLS on every listener; `None`: plain TCP.
    pub tls: Option<tls::Tls>,
    /// Bearer tokens; `None`: no auth, loopback only unless insecure.
    pub auth_tokens: Option<Arc<auth::Tokens>>,
    /// Where queries run (the query runtime).
    pub executor: gpuwatch_query::executor::Executor,
    /// How PromQL is evaluated (the query API; `expr:` rules get the same in `alerts`).
    pub promql: gpuwatch_promql::Settings,
}

impl ServeConfig {
    /// Memory one query may use; `None`: unbounded.
    pub(crate) fn query_memory_limit(&self) -> Option<usize> {
        Some(self.settings.limits.query_memory_limit).filter(|n| *n > 0)
    }

    /// Queries at once; `None`: unbounded.
    pub(crate) fn max_concurrent_queries(&self) -> Option<usize> {
        Some(self.settings.limits.max_concurrent_queries).filter(|n| *n > 0)
    }

    /// The largest answer sent; `None`: unbounded.
    pub(crate) fn max_answer_bytes(&self) -> Option<usize> {
        Some(self.settings.limits.max_answer_bytes).filter(|n| *n > 0)
    }
}

impl ServeConfig {
    /// The store's configuration; the write buffer gets at most its share of the memory
    /// ceiling.
    pub(crate) fn store_config(
        &self,
        ceiling: Option<&gpuwatch_query::memory::Ceiling>,
    ) -> gpuwatch_store::StoreConfig {
        let storage = &self.settings.storage;
        gpuwatch_store::StoreConfig {
            ingest: self.settings.role.role != Role::Query,
            wal_sync: storage.wal_sync == WalSync::Always,
            max_buffer_bytes: ceiling.map_or(storage.max_buffer_bytes, |c| {
                storage.max_buffer_bytes.min(c.buffer_bytes())
            }),
            retention: self.retention.clone(),
            compaction: gpuwatch_store::CompactionConfig {
                // Replaced files outlive every query that may still read them, here or on a
                // query node that has not refreshed yet.
                grace: gpuwatch_store::CompactionConfig::default().grace.max(
                    self.settings.limits.query_timeout.get() * 2
                        + storage.refresh_interval.get() * 2,
                ),
                ..Default::default()
            },
            object_store: storage.object_store.clone(),
            ..gpuwatch_store::StoreConfig::new(self.data_dir.clone())
        }
    }

    /// The query engine's configuration.
    pub(crate) fn engine_config(
        &self,
        ceiling: Option<Arc<gpuwatch_query::memory::Ceiling>>,
    ) -> gpuwatch_query::EngineConfig {
        gpuwatch_query::EngineConfig {
            query_timeout: self.settings.limits.query_timeout.get(),
            memory_limit: self.query_memory_limit(),
            max_concurrent_queries: self.max_concurrent_queries(),
            max_value_bytes: self.settings.limits.max_value_bytes,
            max_answer_bytes: self.max_answer_bytes(),
            executor: self.executor.clone(),
            ceiling,
        }
    }
}

/// The sources of the binary: the process's environment, and the file's other keys.
pub(crate) fn sources(env: &dyn Fn(&str) -> Option<String>) -> Sources<'_> {
    Sources {
        env,
        other_keys: FILE_ONLY_KEYS,
    }
}

impl ServeSettings {
    /// Checks what one value alone cannot, and resolves what depends on the command (`demo`)
    /// or on other settings.
    pub(crate) fn validate(self, sections: Sections, demo: bool) -> Result<ServeConfig> {
        let storage = &self.storage;
        if storage.wal_sync_interval.get().is_zero() {
            return Err(Error::Config(
                "--wal-sync-interval must be above zero".into(),
            ));
        }
        if let Some(url) = &storage.object_store {
            gpuwatch_store::persist::storage::ObjectStoreUrl::parse(url)
                .map_err(|e| Error::Config(format!("--object-store: {e}")))?;
        }
        let persist_interval = storage
            .persist_interval
            .map(|d| d.get())
            .unwrap_or(Duration::from_secs(if demo { 60 } else { 300 }));
        if persist_interval.is_zero() {
            return Err(Error::Config(
                "--persist-interval must be above zero".into(),
            ));
        }
        if self.role.role == Role::Query && !self.alerts.rules.is_empty() {
            return Err(Error::Config(
                "--rules needs --role all or ingest: alert transitions are written to the alerts table, and a query node takes no writes (run the rules on one ingest node; docs/scale-out.md)".into(),
            ));
        }
        if self.limits.max_value_bytes == 0 {
            return Err(Error::Config("--max-value-bytes must be above zero".into()));
        }
        let data_dir = storage.data_dir.clone().unwrap_or_else(|| {
            PathBuf::from(if demo {
                "./gpuwatch-demo-data"
            } else {
                "./gpuwatch-data"
            })
        });
        let maintenance = match self.role.maintenance {
            Some(m) => m == OnOff::On,
            None => self.role.role == Role::All,
        };
        let memory_limit = match self.limits.memory_limit {
            Some(0) => None,
            Some(n) => Some(n),
            None => gpuwatch_query::memory::default_limit(),
        };
        let tls = self.listeners.tls()?;
        let promql = self.promql.settings()?;
        let auth_tokens = match &self.listeners.auth_tokens {
            Some(path) => Some(Arc::new(auth::Tokens::load(path)?)),
            None => None,
        };
        Ok(ServeConfig {
            alerts: crate::alerts_wiring::AlertsConfig {
                promql: promql.clone(),
                ..sections.alerts(self.alerts.rules.clone(), demo)
            },
            retention: sections.retention()?,
            settings: self,
            data_dir,
            persist_interval,
            maintenance,
            memory_limit,
            tls,
            auth_tokens,
            executor: gpuwatch_query::executor::Executor::current(),
            promql,
        })
    }
}

impl settings::Listeners {
    /// The certificate and key of `--tls-cert` / `--tls-key`, both or neither.
    fn tls(&self) -> Result<Option<tls::Tls>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(tls::Tls::load(cert, key)?)),
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::Config(
                "--tls-cert needs --tls-key (the certificate's private key, PEM)".into(),
            )),
            (None, Some(_)) => Err(Error::Config(
                "--tls-key needs --tls-cert (the certificate chain, PEM)".into(),
            )),
        }
    }
}

impl settings::PromQl {
    /// The evaluation settings of `--promql-*`; each must be above zero.
    fn settings(&self) -> Result<gpuwatch_promql::Settings> {
        let ms = |flag: &str, d: Duration| match i64::try_from(d.as_millis()) {
            Ok(ms) if ms > 0 => Ok(ms),
            _ => Err(Error::Config(format!(
                "{flag} must be at least 1ms and at most a few years, e.g. 5m"
            ))),
        };
        if self.promql_max_samples == 0 {
            return Err(Error::Config(
                "--promql-max-samples must be above zero, e.g. 50000000".into(),
            ));
        }
        Ok(gpuwatch_promql::Settings {
            lookback: ms("--promql-lookback-delta", self.promql_lookback_delta.get())?,
            subquery_step: ms("--promql-subquery-step", self.promql_subquery_step.get())?,
            max_samples: self.promql_max_samples,
            ..gpuwatch_promql::Settings::default()
        })
    }
}

/// Reads the config file's sections of a loaded command.
pub(crate) fn sections<S>(loaded: &Loaded<S>) -> Result<Sections> {
    Sections::read(loaded.file.as_deref(), &loaded.file_text)
}

#[cfg(test)]
mod tests;
