//! Job reports over HTTP (`GET /api/v1/jobs`, `GET /api/v1/jobs/{job_id}`, query scope) and on
//! the command line (`gpuwatch job JOBID`, `gpuwatch jobs --user U --since 7d`). The figures and
//! the advice rules live in `gpuwatch_alerts::cost::report` (docs/jobs.md).

use std::sync::Arc;
use std::time::Duration;

use crate::server::sql::{EngineSlot, ErrorResponse, error_response};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use gpuwatch_alerts::cost::report::{self, JobReport, JobSummary, ListFilter};
use gpuwatch_alerts::cost::{CostConfig, JobsConfig};
use gpuwatch_query::Status;
use serde::Deserialize;

use crate::client::Client;
use crate::error::{Error, Result};

#[derive(Clone)]
struct JobsState {
    engine: EngineSlot,
    cost: Arc<CostConfig>,
    jobs: Arc<JobsConfig>,
}

/// The job routes (mounted behind the query scope); `jobs` holds `[jobs.advice]` and
/// `[jobs.work]`.
pub(crate) fn router(engine: EngineSlot, cost: CostConfig, jobs: JobsConfig) -> Router {
    Router::new()
        .route("/api/v1/jobs", get(list))
        .route("/api/v1/jobs/{job_id}", get(one))
        .with_state(JobsState {
            engine,
            cost: Arc::new(cost),
            jobs: Arc::new(jobs),
        })
}

fn now_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX)
}

fn not_ready() -> Response {
    error_response(
        Status::Unavailable,
        "not ready: write-ahead log replay in progress",
    )
}

fn json<T: serde::Serialize>(v: &T) -> Response {
    match serde_json::to_string(v) {
        Ok(body) => (StatusCode::OK, [("content-type", "application/json")], body).into_response(),
        Err(e) => error_response(Status::Internal, &format!("cannot encode the answer: {e}")),
    }
}

#[tracing::instrument(skip(state))]
async fn one(State(state): State<JobsState>, Path(job_id): Path<String>) -> Response {
    let Some(engine) = state.engine.get() else {
        return not_ready();
    };
    if job_id.is_empty() || job_id.len() > 1024 {
        return error_response(
            Status::BadRequest,
            "job id must be 1 to 1024 bytes: GET /api/v1/jobs/<job_id>",
        );
    }
    match report::job_report(engine, &state.cost, &state.jobs, &job_id, now_ns()).await {
        Ok(Some(r)) => json(&r),
        Ok(None) => {
            let mut resp = error_response(
                Status::BadRequest,
                &format!(
                    "no such job {job_id:?}: no gpu_metrics sample carries that job_id (list jobs with GET /api/v1/jobs)"
                ),
            );
            *resp.status_mut() = StatusCode::NOT_FOUND;
            resp
        }
        Err(e) => e.into_response(),
    }
}

/// Jobs a list answers when the request names no `limit`.
const DEFAULT_LIST_LIMIT: usize = 500;
/// Set on a job list that stops at its `limit` while more jobs matched.
const TRUNCATED_HEADER: &str = "gpuwatch-truncated";
/// Set with [`TRUNCATED_HEADER`]: the query parameters of the next page (`until=…&after=…`).
const NEXT_HEADER: &str = "gpuwatch-next";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    user: Option<String>,
    since: Option<String>,
    running: Option<bool>,
    limit: Option<usize>,
    /// A later page: jobs last seen before this instant (RFC 3339 or nanoseconds since the
    /// epoch), or at it with an id after `after`.
    until: Option<String>,
    after: Option<String>,
}

/// An instant of a page cursor: nanoseconds since the epoch, or RFC 3339.
fn parse_instant(text: &str) -> std::result::Result<i64, String> {
    if let Ok(ns) = text.parse::<i64>() {
        return Ok(ns);
    }
    rfc3339_nanos(text).ok_or_else(|| {
        format!("until {text:?}: not an instant (write nanoseconds since the epoch or RFC 3339, as the gpuwatch-next header gives)")
    })
}

/// An RFC 3339 time as nanoseconds since the epoch (`None`: not one, or out of range).
pub(crate) fn rfc3339_nanos(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
}

/// The page cursor of `until` and `after`.
fn cursor(
    until: Option<&str>,
    after: Option<&str>,
) -> std::result::Result<Option<(i64, String)>, String> {
    match (until, after) {
        (None, None) => Ok(None),
        (Some(t), after) => Ok(Some((
            parse_instant(t)?,
            after.unwrap_or_default().to_string(),
        ))),
        (None, Some(_)) => Err("after needs until (the gpuwatch-next header gives both)".into()),
    }
}

/// Parses `7d`, `12h`, `30m` (humantime) into a duration.
fn parse_since(text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("since {text:?}: {e} (write e.g. 7d, 12h, 30m)"))
}

#[tracing::instrument(skip(state))]
async fn list(
    State(state): State<JobsState>,
    params: std::result::Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(engine) = state.engine.get() else {
        return not_ready();
    };
    let Ok(Query(p)) = params else {
        return error_response(
            Status::BadRequest,
            "malformed query string: use ?user=<user>&since=7d&running=true&limit=100",
        );
    };
    let since = match parse_since(p.since.as_deref().unwrap_or("7d")) {
        Ok(d) => d,
        Err(e) => return error_response(Status::BadRequest, &e),
    };
    let now = now_ns();
    let since_ns = now.saturating_sub(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX));
    let limit = p.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=report::MAX_LIST_LIMIT).contains(&limit) {
        return error_response(
            Status::BadRequest,
            &format!(
                "limit {limit}: list 1 to {} jobs at a time; page through more with a shorter since",
                report::MAX_LIST_LIMIT
            ),
        );
    }
    let until = match cursor(p.until.as_deref(), p.after.as_deref()) {
        Ok(c) => c,
        Err(e) => return error_response(Status::BadRequest, &e),
    };
    let filter = ListFilter {
        user: p.user.filter(|u| !u.is_empty()),
        since_ns: since_ns.max(0),
        until,
        running_only: p.running.unwrap_or(false),
        limit,
    };
    match report::list_jobs(engine, &filter, now).await {
        Ok(list) => {
            let mut resp = json(&list.jobs);
            if list.truncated {
                resp.headers_mut().insert(
                    TRUNCATED_HEADER,
                    axum::http::HeaderValue::from_static("true"),
                );
            }
            if let Some((t, id)) = &list.next {
                let next = format!("until={t}&after={}", encode(id));
                if let Ok(v) = axum::http::HeaderValue::from_str(&next) {
                    resp.headers_mut().insert(NEXT_HEADER, v);
                }
            }
            resp
        }
        Err(e) => e.into_response(),
    }
}

/// Output of `gpuwatch job` and `gpuwatch jobs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReportFormat {
    /// Text for people.
    Table,
    /// The API's JSON.
    Json,
}

/// Percent-encodes `s` for a URL path segment or query value.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `gpuwatch job JOBID`: what to print.
pub(crate) async fn job(client: &Client, job_id: &str, format: ReportFormat) -> Result<String> {
    let body = client
        .get(&format!("/api/v1/jobs/{}", encode(job_id)))
        .await?;
    match format {
        ReportFormat::Json => Ok(format!("{}\n", String::from_utf8_lossy(&body))),
        ReportFormat::Table => {
            let r: JobReport = serde_json::from_slice(&body).map_err(|e| Error::Malformed {
                what: "job report",
                source: Box::new(e),
            })?;
            Ok(report::render_text(&r))
        }
    }
}

/// The filter of `gpuwatch jobs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListArgs<'a> {
    /// Only this user's jobs.
    pub user: Option<&'a str>,
    /// Jobs seen within this long.
    pub since: &'a str,
    /// Only running jobs.
    pub running: bool,
    /// At most this many.
    pub limit: usize,
    /// A later page: the `--until` and `--after` the previous page printed.
    pub until: Option<&'a str>,
    pub after: Option<&'a str>,
}

/// The `until` and `after` of a [`NEXT_HEADER`].
fn next_page(header: &str) -> Option<(String, String)> {
    let url = reqwest::Url::parse(&format!("http://next/?{header}")).ok()?;
    let pick = |k: &str| {
        url.query_pairs()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.into_owned())
    };
    Some((pick("until")?, pick("after").unwrap_or_default()))
}

/// `s` as one shell word.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=+@".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `gpuwatch jobs`: what to print.
pub(crate) async fn jobs(
    client: &Client,
    filter: &ListArgs<'_>,
    format: ReportFormat,
) -> Result<String> {
    let ListArgs {
        user,
        since,
        running,
        limit,
        until,
        after,
    } = *filter;
    parse_since(since).map_err(|e| Error::Config(format!("--{e}")))?;
    let page = cursor(until, after).map_err(|e| Error::Config(format!("--{e}")))?;
    if !(1..=report::MAX_LIST_LIMIT).contains(&limit) {
        return Err(Error::Config(format!(
            "--limit {limit}: list 1 to {} jobs at a time; page through more with a shorter --since",
            report::MAX_LIST_LIMIT
        )));
    }
    let mut q = format!("/api/v1/jobs?since={}&limit={limit}", encode(since));
    if let Some(u) = user {
        q.push_str(&format!("&user={}", encode(u)));
    }
    if running {
        q.push_str("&running=true");
    }
    if let Some((t, id)) = &page {
        q.push_str(&format!("&until={t}&after={}", encode(id)));
    }
    let (body, next) = client.get_with_header(&q, NEXT_HEADER).await?;
    let list: Vec<JobSummary> = serde_json::from_slice(&body).map_err(|e| Error::Malformed {
        what: "job list",
        source: Box::new(e),
    })?;
    match format {
        ReportFormat::Json => serde_json::to_string(&list)
            .map(|s| format!("{s}\n"))
            .map_err(|e| Error::Malformed {
                what: "job list",
                source: Box::new(e),
            }),
        ReportFormat::Table => {
            let mut out = report::render_list(&list);
            if let Some((t, id)) = next.as_deref().and_then(next_page) {
                out.push_str(&format!(
                    "(the {limit} most recent jobs; more match: narrow --since or --user, raise --limit, or list the next page with --until {t} --after {})\n",
                    shell_word(&id)
                ));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_encoded_as_one_path_segment() {
        assert_eq!(encode("1234_5.0"), "1234_5.0");
        assert_eq!(encode("a/b'; --"), "a%2Fb%27%3B%20--");
        assert!(parse_since("7d").is_ok());
        assert!(parse_since("soon").is_err());
    }
}
