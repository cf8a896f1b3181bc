//! Flags, environment variables and the TOML config file.
//!
//! Every flag `--some-flag` also reads `GPUWATCH_SOME_FLAG` and the key `some_flag` of the file
//! given by `--config`. Precedence: flag > environment > file > default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The `[server]`-level keys of the config file (the file is flat: one key per flag).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--http-addr`
    pub http_addr: Option<SocketAddr>,
    /// `--otlp-http-addr`
    pub otlp_http_addr: Option<SocketAddr>,
    /// `--otlp-grpc-addr`
    pub otlp_grpc_addr: Option<SocketAddr>,
    /// `--pg-addr`: an address, or `"off"`
    pub pg_addr: Option<String>,
    /// `--tls-cert` (PEM)
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key` (PEM)
    pub tls_key: Option<PathBuf>,
    /// `--data-dir`
    pub data_dir: Option<PathBuf>,
    /// `--object-store`, e.g. `"s3://bucket/prefix"`
    pub object_store: Option<String>,
    /// `--persist-interval`, e.g. `"5m"`
    pub persist_interval: Option<String>,
    /// `--max-body-bytes`
    pub max_body_bytes: Option<usize>,
    /// `--query-timeout`, e.g. `"30s"`
    pub query_timeout: Option<String>,
    /// `--insecure-no-auth`
    pub insecure_no_auth: Option<bool>,
    /// `--query-memory-limit` (bytes)
    pub query_memory_limit: Option<usize>,
    /// `--max-concurrent-queries`
    pub max_concurrent_queries: Option<usize>,
    /// `--self-telemetry-endpoint`: a base URL, or `"self"`
    pub self_telemetry_endpoint: Option<String>,
    /// `--self-telemetry-interval`, e.g. `"10s"`
    pub self_telemetry_interval: Option<String>,
    /// `--memory-limit` (bytes; 0 for none)
    pub memory_limit: Option<usize>,
    /// `--max-value-bytes`
    pub max_value_bytes: Option<usize>,
    /// `--max-answer-bytes` (0 for unbounded)
    pub max_answer_bytes: Option<usize>,
    /// `--auth-tokens`
    pub auth_tokens: Option<PathBuf>,
    /// `--log-level`
    pub log_level: Option<String>,
    /// `--wal-sync`: `"always"` or `"interval"`
    pub wal_sync: Option<crate::server::WalSync>,
    /// `--wal-sync-interval`, e.g. `"100ms"`
    pub wal_sync_interval: Option<String>,
    /// `--max-buffer-bytes`
    pub max_buffer_bytes: Option<usize>,
    /// `--compaction-interval`, e.g. `"1m"`
    pub compaction_interval: Option<String>,
    /// `--role`: `"all"`, `"ingest"` or `"query"`
    pub role: Option<crate::server::Role>,
    /// `--maintenance`: `"on"` or `"off"`
    pub maintenance: Option<crate::server::OnOff>,
    /// `--refresh-interval`, e.g. `"5s"`
    pub refresh_interval: Option<String>,
    /// `[retention]`: how long each table keeps its data.
    pub retention: Option<RetentionFile>,
    /// `--synthetic-hosts` (demo)
    pub synthetic_hosts: Option<usize>,
    /// `--synthetic-gpus` (demo)
    pub synthetic_gpus: Option<usize>,
    /// `--interval` (demo's built-in agent)
    pub interval: Option<String>,
    /// `--backfill` (demo)
    pub backfill: Option<String>,
    /// `--rules` (alert rules files)
    pub rules: Option<Vec<PathBuf>>,
    /// `[alerting]`: receivers and routes (docs/alerts.md)
    pub alerting: Option<gpuwatch_alerts::notify::AlertingConfig>,
    /// `[cost]`: GPU-hour and energy prices, budgets (docs/cost.md)
    pub cost: Option<gpuwatch_alerts::cost::CostConfig>,
    /// `[jobs]`: `[jobs.advice]` thresholds of the job limiter and notes (docs/jobs.md)
    pub jobs: Option<gpuwatch_alerts::cost::JobsConfig>,
}

/// The `[retention]` table: a duration per table (`"30d"`, `"1y"`), or `"forever"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionFile {
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
    /// GPU events (default 365d).
    pub gpu_events: Option<String>,
    /// Alert history (default 365d).
    pub alerts: Option<String>,
}

impl RetentionFile {
    /// Applies the file's keys over the defaults.
    pub fn resolve(&self) -> Result<gpuwatch_store::RetentionConfig> {
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
            ("gpu_events", &self.gpu_events, &mut r.gpu_events),
            ("alerts", &self.alerts, &mut r.alerts),
        ];
        for (key, text, target) in keys {
            let Some(text) = text else { continue };
            *target = if text == "forever" {
                None
            } else {
                let d = parse_duration(text).map_err(|e| {
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

impl FileConfig {
    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!("cannot read config file {}: {e}", path.display()))
        })?;
        toml::from_str(&text).map_err(|e| {
            Error::Config(format!(
                "config file {}: {}",
                path.display(),
                e.to_string().trim()
            ))
        })
    }
}

/// True when the user gave `id` on the command line or in the environment.
pub fn given(m: &ArgMatches, id: &str) -> bool {
    matches!(
        m.try_get_raw(id).ok().flatten().and(m.value_source(id)),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// Applies a file value where the user did not give the flag or its variable.
pub fn apply<T>(m: &ArgMatches, id: &str, target: &mut T, file: Option<T>) {
    if let (false, Some(v)) = (given(m, id), file) {
        *target = v;
    }
}

/// A listen address that can be turned off (`--pg-addr off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalAddr(pub Option<SocketAddr>);

/// Parses `HOST:PORT`, or `off` for no listener.
pub fn parse_optional_addr(s: &str) -> std::result::Result<OptionalAddr, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(OptionalAddr(None));
    }
    t.parse::<SocketAddr>()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| {
            format!("invalid address {s:?} ({e}): use HOST:PORT such as 127.0.0.1:5433, or off")
        })
}

/// Parses a duration such as `5s`, `1m30s`, `250ms`.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration {s:?} ({e}): use e.g. 5s, 1m, 250ms"))
}

/// Applies a file duration (text) where the user did not give the flag.
pub fn apply_duration(
    m: &ArgMatches,
    id: &str,
    target: &mut Duration,
    file: Option<String>,
) -> Result<()> {
    if let Some(text) = file {
        let d =
            parse_duration(&text).map_err(|e| Error::Config(format!("config key {id}: {e}")))?;
        apply(m, id, target, Some(d));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_values_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "http_adr = \"x\"\n").expect("write");
        let e = FileConfig::load(&p).expect_err("unknown key").to_string();
        assert!(e.contains("http_adr"), "{e}");
        std::fs::write(&p, "http_addr = \"nonsense\"\n").expect("write");
        let e = FileConfig::load(&p).expect_err("bad addr").to_string();
        assert!(e.contains("line 1"), "{e}");
        assert!(FileConfig::load(&dir.path().join("missing.toml")).is_err());
    }

    #[test]
    fn every_shipped_example_parses() {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let mut seen = 0;
        for entry in std::fs::read_dir(&deploy).expect("deploy/") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if name.starts_with("gpuwatch.") && name.ends_with(".example.toml") {
                let f = FileConfig::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
                if let Some(cost) = &f.cost {
                    cost.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
                }
                if let Some(jobs) = &f.jobs {
                    jobs.advice
                        .validate()
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                }
                seen += 1;
            }
        }
        assert!(seen >= 1, "no deploy/gpuwatch.*.example.toml found");
    }

    #[test]
    fn retention_keys_override_the_defaults() {
        let f: FileConfig =
            toml::from_str("[retention]\ngpu_metrics = \"7d\"\ngpu_metrics_1h = \"forever\"\ngpu_events = \"2d\"\n")
                .expect("parse");
        let r = f.retention.expect("section").resolve().expect("resolve");
        assert_eq!(r.gpu_metrics, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(r.gpu_events, Some(Duration::from_secs(2 * 86400)));
        assert_eq!(r.gpu_processes, Some(Duration::from_secs(30 * 86400)));
        assert_eq!(r.gpu_metrics_1h, None);
        assert_eq!(r.gpu_metrics_1m, Some(Duration::from_secs(365 * 86400)));
        let bad: FileConfig = toml::from_str("[retention]\nmetrics = \"soon\"\n").expect("parse");
        let e = bad.retention.expect("section").resolve().expect_err("bad");
        assert!(e.to_string().contains("retention.metrics"), "{e}");
        assert!(toml::from_str::<FileConfig>("[retention]\nraw = \"1d\"\n").is_err());
    }

    #[test]
    fn optional_addresses() {
        assert_eq!(parse_optional_addr("off"), Ok(OptionalAddr(None)));
        assert_eq!(parse_optional_addr("OFF"), Ok(OptionalAddr(None)));
        assert_eq!(
            parse_optional_addr("127.0.0.1:5433"),
            Ok(OptionalAddr(Some("127.0.0.1:5433".parse().expect("addr"))))
        );
        let e = parse_optional_addr("localhost").expect_err("no port");
        assert!(e.contains("off"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
    }
}
