//! Alerting in the server: rules files, the `[alerting]` and `[cost]` config sections, the
//! `alerts`, `jobs` and `budgets` SQL tables, and the `/api/v1/alerts` and `/api/v1/silences`
//! routes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::server::sql::error_response;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use gpuwatch_alerts::cost::{CostConfig, JobsConfig};
use gpuwatch_alerts::notify::format::rfc3339;
use gpuwatch_alerts::notify::{AlertingConfig, Matcher, Silence};
use gpuwatch_alerts::{Alerting, EngineSource, RuleFile};
use gpuwatch_query::{QueryEngine, Status};
use gpuwatch_store::clock::Clock;
use serde::Deserialize;
use tokio::sync::watch;

use crate::error::{Error, Result};

/// Where the running alerting service is, once the store is open.
pub(crate) type AlertingSlot = Arc<OnceLock<Arc<Alerting>>>;

/// What `serve` needs to run alerts.
#[derive(Debug, Clone, Default)]
pub(crate) struct AlertsConfig {
    /// Rules files (`--rules`).
    pub rules: Vec<PathBuf>,
    /// Load the built-in rule pack (demo).
    pub builtin_rules: bool,
    /// `[alerting]`: receivers and routes.
    pub alerting: AlertingConfig,
    /// `[cost]`: prices and budgets.
    pub cost: CostConfig,
    /// `[jobs]`: the thresholds of the job limiter and notes.
    pub jobs: JobsConfig,
    /// How `expr:` (PromQL) rules are evaluated (`--promql-*`).
    pub promql: gpuwatch_promql::Settings,
}

/// Reads and checks every rules file (and the built-in pack when asked), before anything starts.
pub(crate) fn load_rules(config: &AlertsConfig) -> Result<RuleFile> {
    let mut all = if config.builtin_rules {
        gpuwatch_alerts::builtin_rules().map_err(|e| Error::Config(e.to_string()))?
    } else {
        RuleFile { groups: Vec::new() }
    };
    for p in &config.rules {
        let f = RuleFile::load(p).map_err(|e| Error::Config(e.to_string()))?;
        all.merge(f).map_err(|e| Error::Config(e.to_string()))?;
    }
    config
        .alerting
        .validate()
        .map_err(|e| Error::Config(format!("config file: {e}")))?;
    config
        .cost
        .validate()
        .map_err(|e| Error::Config(format!("config file: {e}")))?;
    config
        .jobs
        .validate()
        .map_err(|e| Error::Config(format!("config file: {e}")))?;
    Ok(all)
}

/// `gpuwatch rules check FILE…`: prints a summary per file; the first error is returned.
pub(crate) fn check(files: &[PathBuf]) -> Result<String> {
    let mut out = String::new();
    let mut failed = Vec::new();
    for p in files {
        match RuleFile::load(p) {
            Ok(f) => out.push_str(&format!(
                "{}: ok ({} groups, {} rules)\n",
                p.display(),
                f.groups.len(),
                f.rules().count()
            )),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if failed.is_empty() {
        Ok(out)
    } else {
        print!("{out}");
        Err(Error::Rules(failed.join("\n")))
    }
}

/// Where alerting and the job ledger keep their data.
pub(crate) struct Placement<'a> {
    /// The server's store.
    pub store: Arc<gpuwatch_store::Store>,
    /// The server ingests (a query node keeps alerting state in memory only and runs no
    /// rules: the data directory may be another server's).
    pub ingest: bool,
    /// The server runs maintenance: it also folds the job ledger's hours and writes them.
    pub maintain: bool,
    /// The data directory.
    pub data_dir: &'a Path,
}

/// Registers the tables and starts rule evaluation, notification and delivery.
pub(crate) async fn start(
    engine: &QueryEngine,
    rules: RuleFile,
    config: &AlertsConfig,
    at: Placement<'_>,
    clock: Arc<dyn Clock>,
    query_timeout: Duration,
    stop: watch::Receiver<bool>,
) -> Result<(Arc<Alerting>, Vec<tokio::task::JoinHandle<()>>)> {
    let ledger = config.cost.register(engine.context(), &config.jobs).await?;
    let ledger_task = engine.executor().spawn(Arc::clone(&ledger).run(
        engine.context().clone(),
        Arc::clone(&at.store),
        at.ingest && at.maintain,
        Arc::clone(&clock),
        stop.clone(),
    ));
    let data_dir = at.ingest.then_some(at.data_dir);
    let store = at.ingest.then_some(at.store);
    let n = rules.rules().count();
    let alerting = Arc::new(Alerting::open(
        rules,
        config.alerting.clone(),
        data_dir.map(|d| d.join("alerts")).as_deref(),
        clock,
        store,
    )?);
    let source = Arc::new(
        EngineSource::new(engine.clone(), query_timeout).with_promql(config.promql.clone()),
    );
    alerting.set_ledger(ledger);
    let runs_rules = at.ingest.then(|| Arc::clone(&alerting));
    gpuwatch_alerts::active::register(engine.context(), runs_rules).await?;
    let mut tasks = alerting.start(source, stop);
    tasks.push(ledger_task);
    tracing::info!(
        rules = n,
        receivers = config.alerting.receivers.len(),
        "alerting started"
    );
    Ok((alerting, tasks))
}

/// The alert and silence routes.
pub(crate) fn router(slot: AlertingSlot) -> Router {
    Router::new()
        .route("/api/v1/alerts", get(alerts))
        .route("/api/v1/silences", get(silences).post(add_silence))
        .route("/api/v1/silences/{id}", delete(expire_silence))
        .with_state(slot)
}

fn not_ready() -> Response {
    error_response(
        Status::Unavailable,
        "not ready: write-ahead log replay in progress",
    )
}

fn json(v: serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn alerts(State(slot): State<AlertingSlot>) -> Response {
    let Some(a) = slot.get() else {
        return not_ready();
    };
    let list: Vec<serde_json::Value> = a
        .alerts()
        .iter()
        .map(|x| {
            serde_json::json!({
                "rule": x.rule,
                "state": x.state.as_str(),
                "labels": x.labels,
                "annotations": x.annotations,
                "value": if x.value.is_finite() { serde_json::json!(x.value) } else { serde_json::Value::Null },
                "fingerprint": x.fingerprint,
                "activeAt": rfc3339(Some(x.active_at)),
                "firedAt": x.fired_at.map(|t| rfc3339(Some(t))),
                "resolvedAt": x.resolved_at.map(|t| rfc3339(Some(t))),
                "silenced": a.silenced(x),
            })
        })
        .collect();
    json(serde_json::json!({
        "alerts": list,
        "ruleErrors": a.engine().rule_errors(),
        "pendingNotifications": a.outbox().pending(),
    }))
}

fn silence_json(s: &Silence, now: i64) -> serde_json::Value {
    serde_json::json!({
        "id": s.id,
        "status": s.status(now),
        "matchers": s.matchers,
        "startsAt": rfc3339(Some(s.starts_at)),
        "endsAt": rfc3339(Some(s.ends_at)),
        "createdBy": s.created_by,
        "comment": s.comment,
    })
}

async fn silences(State(slot): State<AlertingSlot>) -> Response {
    let Some(a) = slot.get() else {
        return not_ready();
    };
    let now = a.now();
    json(serde_json::Value::Array(
        a.silences().iter().map(|s| silence_json(s, now)).collect(),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NewSilence {
    matchers: Vec<Matcher>,
    #[serde(default)]
    starts_at: Option<String>,
    #[serde(default)]
    ends_at: Option<String>,
    /// Instead of endsAt, e.g. "2h".
    #[serde(default)]
    duration: Option<String>,
    #[serde(default)]
    created_by: String,
    #[serde(default)]
    comment: String,
}

fn parse_time(field: &str, s: &str) -> std::result::Result<i64, String> {
    crate::jobs::rfc3339_nanos(s).ok_or_else(|| {
        format!("{field}: not an RFC 3339 time ({s:?}): use e.g. 2026-01-02T15:04:05Z")
    })
}

async fn add_silence(State(slot): State<AlertingSlot>, body: axum::body::Bytes) -> Response {
    let Some(a) = slot.get() else {
        return not_ready();
    };
    let req: NewSilence = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                Status::BadRequest,
                &format!(
                    "invalid silence: {e}; send {{\"matchers\": [{{\"name\": \"alertname\", \"value\": \"GpuIdleInJob\"}}], \"duration\": \"2h\", \"createdBy\": \"...\", \"comment\": \"...\"}}"
                ),
            );
        }
    };
    let now = a.now();
    let starts_at = match req.starts_at.as_deref().map(|s| parse_time("startsAt", s)) {
        None => now,
        Some(Ok(t)) => t,
        Some(Err(e)) => return error_response(Status::BadRequest, &e),
    };
    let ends_at = match (req.ends_at.as_deref(), req.duration.as_deref()) {
        (Some(e), None) => match parse_time("endsAt", e) {
            Ok(t) => t,
            Err(e) => return error_response(Status::BadRequest, &e),
        },
        (None, Some(d)) => match humantime::parse_duration(d) {
            Ok(d) => starts_at.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            Err(e) => {
                return error_response(
                    Status::BadRequest,
                    &format!("duration: invalid duration {d:?} ({e}): use e.g. 2h, 30m"),
                );
            }
        },
        _ => {
            return error_response(
                Status::BadRequest,
                "give exactly one of endsAt and duration",
            );
        }
    };
    let s = Silence {
        id: String::new(),
        matchers: req.matchers,
        starts_at,
        ends_at,
        created_by: req.created_by,
        comment: req.comment,
    };
    match a.add_silence(s) {
        Ok(id) => json(serde_json::json!({ "silenceID": id })),
        Err(gpuwatch_alerts::Error::Config(m)) => error_response(Status::BadRequest, &m),
        Err(e) => error_response(Status::Internal, &e.to_string()),
    }
}

async fn expire_silence(
    State(slot): State<AlertingSlot>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let Some(a) = slot.get() else {
        return not_ready();
    };
    match a.expire_silence(&id) {
        Ok(true) => json(serde_json::json!({ "expired": id })),
        Ok(false) => {
            let mut r = error_response(
                Status::BadRequest,
                &format!("no silence {id:?}: list them with GET /api/v1/silences"),
            );
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
        Err(e) => error_response(Status::Internal, &e.to_string()),
    }
}
