//! The config file's sections that have no flags: `[retention]`, `[alerting]` (receivers and
//! routes, docs/alerts.md), `[cost]` (prices and budgets, docs/cost.md) and `[jobs]` (the job
//! limiter's thresholds, docs/jobs.md).

use std::path::{Path, PathBuf};

use gpuwatch_alerts::cost::{CostConfig, JobsConfig};
use gpuwatch_alerts::notify::AlertingConfig;
use gpuwatch_common::settings::section;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The sections of one config file.
#[derive(Debug, Default)]
pub(crate) struct Sections {
    /// `[retention]`.
    pub retention: Option<RetentionFile>,
    /// `[alerting]`.
    pub alerting: Option<AlertingConfig>,
    /// `[cost]`.
    pub cost: Option<CostConfig>,
    /// `[jobs]`: `[jobs.advice]`.
    pub jobs: Option<JobsConfig>,
}

impl Sections {
    /// Reads the sections of the file at `path` whose text is `text` (empty: none).
    pub(crate) fn read(path: Option<&Path>, text: &str) -> Result<Self> {
        Ok(Self {
            retention: section(path, text, "retention")?,
            alerting: section(path, text, "alerting")?,
            cost: section(path, text, "cost")?,
            jobs: section(path, text, "jobs")?,
        })
    }

    /// Retention per table: the file's keys over the defaults.
    pub(crate) fn retention(&self) -> Result<gpuwatch_store::RetentionConfig> {
        match &self.retention {
            Some(r) => r.resolve(),
            None => Ok(gpuwatch_store::RetentionConfig::default()),
        }
    }

    /// Rules, receivers, routes and prices; the demo loads the built-in rules, and example
    /// prices when the file has no `[cost]`.
    pub(crate) fn alerts(
        &self,
        rules: Vec<PathBuf>,
        demo: bool,
    ) -> crate::alerts_wiring::AlertsConfig {
        crate::alerts_wiring::AlertsConfig {
            rules,
            builtin_rules: demo,
            alerting: self.alerting.clone().unwrap_or_default(),
            cost: match (self.cost.clone(), demo) {
                (Some(cost), _) => cost,
                (None, true) => demo_prices(),
                (None, false) => CostConfig::default(),
            },
            jobs: self.jobs.clone().unwrap_or_default(),
            // The `--promql-*` settings, set by `ServeSettings::validate`.
            promql: gpuwatch_promql::Settings::default(),
        }
    }
}

/// Example prices the demo uses when the config file has no `[cost]` section, so that its `jobs`
/// table shows costs: USD 2.50 per H100 GPU-hour, USD 0.12 per kWh, PUE 1.3.
fn demo_prices() -> CostConfig {
    CostConfig {
        gpu_hour_usd: vec![gpuwatch_alerts::cost::ModelPrice {
            model: "*H100*".into(),
            usd: 2.50,
        }],
        default_gpu_hour_usd: 1.00,
        kwh_usd: 0.12,
        pue: 1.3,
        ..Default::default()
    }
}

/// The `[retention]` table: a duration per table (`"30d"`, `"1y"`), or `"forever"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionFile {
    /// Raw samples (default 30d).
    pub gpu_metrics: Option<String>,
    /// Other metrics (default 30d).
    pub metrics: Option<String>,
    /// 1-minute rollups (default 365d).
    pub gpu_metrics_1m: Option<String>,
    /// 1-hour rollups (default 1825d).
    pub gpu_metrics_1h: Option<String>,
    /// GPU processes (default 30d).
    pub gpu_processes: Option<String>,
    /// GPU processes' 1-minute rollups (default 365d).
    pub gpu_processes_1m: Option<String>,
    /// GPU processes' 1-hour rollups (default 1825d).
    pub gpu_processes_1h: Option<String>,
    /// GPU events (default 365d).
    pub gpu_events: Option<String>,
    /// Alert history (default 365d).
    pub alerts: Option<String>,
    /// The job ledger and its daily sums (default 1825d).
    pub job_ledger: Option<String>,
}

impl RetentionFile {
    /// Applies the file's keys over the defaults.
    pub(crate) fn resolve(&self) -> Result<gpuwatch_store::RetentionConfig> {
        let mut r = gpuwatch_store::RetentionConfig::default();
        let keys = [
            ("gpu_metrics", &self.gpu_metrics, &mut r.gpu_metrics),
            ("metrics", &self.metrics, &mut r.metrics),
            (
                "gpu_metrics_1m",
                &self.gpu_metrics_1m,
                &mut r.gpu_metrics_1m,
            ),
            (
                "gpu_metrics_1h",
                &self.gpu_metrics_1h,
                &mut r.gpu_metrics_1h,
            ),
            ("gpu_processes", &self.gpu_processes, &mut r.gpu_processes),
            (
                "gpu_processes_1m",
                &self.gpu_processes_1m,
                &mut r.gpu_processes_1m,
            ),
            (
                "gpu_processes_1h",
                &self.gpu_processes_1h,
                &mut r.gpu_processes_1h,
            ),
            ("gpu_events", &self.gpu_events, &mut r.gpu_events),
            ("alerts", &self.alerts, &mut r.alerts),
            ("job_ledger", &self.job_ledger, &mut r.job_ledger),
        ];
        for (key, text, target) in keys {
            let Some(text) = text else { continue };
            *target = if text == "forever" {
                None
            } else {
                let d = gpuwatch_common::duration::parse_duration(text).map_err(|e| {
                    Error::Config(format!("config key retention.{key}: {e} (or \"forever\")"))
                })?;
                if d.is_zero() {
                    return Err(Error::Config(format!(
                        "config key retention.{key}: must be above zero (or \"forever\")"
                    )));
                }
                Some(d)
            };
        }
        Ok(r)
    }
}
