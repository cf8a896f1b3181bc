//! SQL over HTTP: `POST /api/v1/sql` with `{"sql": "...", "format": "json"}`, or
//! `GET /api/v1/sql?q=...&format=...`. An answer that leaves damaged data out says so in a
//! `Gpuwatch-Warning` header per warning ([`WARNING_HEADER`]). Monthly cost statements,
//! `GET /api/v1/cost?by=account&month=2026-11&format=csv`, are SQL over the `job_days` view
//! ([`gpuwatch_alerts::cost::statement`]) answered the same way.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use gpuwatch_alerts::cost::statement::{Month, Statement};
use serde::Deserialize;

use bytes::Bytes;
use futures::StreamExt;
use gpuwatch_common::metrics::prometheus_client::metrics::histogram::Histogram;
use tracing::Instrument;

use gpuwatch_query::QueryEngine;
use gpuwatch_query::executor::AbortOnDrop;
use gpuwatch_query::format::{Encoder, Format};
use gpuwatch_query::{Error, Status};

/// The engine, once the store is ready.
pub(crate) type EngineSlot = Arc<OnceLock<QueryEngine>>;

/// What the SQL handlers share: the engine, and the latency histogram of their queries.
#[derive(Debug, Clone)]
struct Sql {
    engine: EngineSlot,
    seconds: Histogram,
}

/// How long after the time limit the handler gives up on a query task that has not answered.
const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a cut answer waits for what was sent before the cut to leave.
const FLUSH_BEFORE_CUT: std::time::Duration = std::time::Duration::from_millis(100);

/// Largest SQL request body accepted.
pub(crate) const MAX_SQL_BODY_BYTES: usize = 1 << 20;

/// The SQL routes.
pub(crate) fn router(engine: EngineSlot, seconds: Histogram) -> Router {
    Router::new()
        .route("/api/v1/sql", get(get_sql).post(post_sql))
        .route("/api/v1/cost", get(get_cost))
        .with_state(Sql { engine, seconds })
}

/// A JSON error answer with the status of `status`.
pub(crate) fn error_response(status: Status, message: &str) -> Response {
    let code = StatusCode::from_u16(status.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({ "error": message }).to_string();
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if matches!(status, Status::Unavailable | Status::TooManyRequests) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// A query engine error as an HTTP answer (the engine crate knows no HTTP).
pub(crate) trait ErrorResponse {
    /// The JSON error answer with the error's status.
    fn into_response(self) -> Response;
}

impl ErrorResponse for Error {
    fn into_response(self) -> Response {
        if matches!(self.status(), Status::Internal) {
            tracing::error!(error = %self, "query failed");
        }
        error_response(self.status(), &self.to_string())
    }
}

#[derive(Debug, Deserialize)]
struct GetParams {
    q: Option<String>,
    sql: Option<String>,
    format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostBody {
    sql: String,
    #[serde(default)]
    format: Option<String>,
}

async fn get_sql(
    State(Sql { engine, seconds }): State<Sql>,
    params: Result<Query<GetParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(params)) = params else {
        return Error::BadRequest("malformed query string: use ?q=<sql>&format=<format>".into())
            .into_response();
    };
    let Some(sql) = params.q.or(params.sql) else {
        return Error::BadRequest("missing query: use ?q=<sql>".into()).into_response();
    };
    run(&engine, &seconds, &sql, params.format.as_deref()).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CostParams {
    by: Option<String>,
    month: Option<String>,
    format: Option<String>,
}

/// The statement `params` ask for: by account and this month (UTC) unless they say otherwise.
fn statement(params: CostParams) -> Result<(Statement, Option<String>), Error> {
    let bad = |e: gpuwatch_alerts::Error| Error::BadRequest(e.to_string());
    let by = params
        .by
        .as_deref()
        .unwrap_or("account")
        .parse()
        .map_err(bad)?;
    let month = match params.month.as_deref() {
        Some(m) => m.parse().map_err(bad)?,
        None => Month::of(chrono::Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX)),
    };
    Ok((Statement { by, month }, params.format))
}

async fn get_cost(
    State(Sql { engine, seconds }): State<Sql>,
    params: Result<Query<CostParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let parsed = params
        .map_err(|e| {
            Error::BadRequest(format!(
                "malformed query string ({e}): use ?by=account|user|namespace|partition|label:NAME&month=YYYY-MM&format=json"
            ))
        })
        .and_then(|Query(p)| statement(p));
    match parsed {
        Ok((st, format)) => run(&engine, &seconds, &st.sql(), format.as_deref()).await,
        Err(e) => e.into_response(),
    }
}

async fn post_sql(State(Sql { engine, seconds }): State<Sql>, body: Body) -> Response {
    let body = match axum::body::to_bytes(body, MAX_SQL_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(
                Status::PayloadTooLarge,
                &format!(
                    "request body larger than {MAX_SQL_BODY_BYTES} bytes: send a shorter statement"
                ),
            );
        }
    };
    let parsed: PostBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return Error::BadRequest(format!(
                "malformed request body ({e}): send {{\"sql\": \"SELECT ...\", \"format\": \"json\"}}"
            ))
            .into_response();
        }
    };
    run(&engine, &seconds, &parsed.sql, parsed.format.as_deref()).await
}

/// Runs `sql` and streams the answer. Planning, execution and encoding all run on the query
/// runtime ([`gpuwatch_query::executor`]); this handler only relays the encoded chunks. The first batch
/// is awaited before the status is sent (so planning and early execution errors, and a first
/// chunk already over `--max-answer-bytes`, get their status code); after that each batch is
/// encoded and sent as it comes, and a later failure, the time limit or `--max-answer-bytes`
/// ends the response early: the text formats get a last line `{"error": "..."}`, and the
/// chunked body is cut without its terminating chunk, so no client takes it for a complete
/// answer. A client that goes away stops the query.
async fn run(
    engine: &EngineSlot,
    seconds: &Histogram,
    sql: &str,
    format: Option<&str>,
) -> Response {
    let format: Format = match format.unwrap_or("json").parse() {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let Some(engine) = engine.get() else {
        return Error::NotReady(gpuwatch_store::startup::reason()).into_response();
    };
    let (head_tx, head_rx) = tokio::sync::oneshot::channel::<Result<Vec<String>, Error>>();
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(2);
    let span = tracing::info_span!(
        "query",
        sql = %shorten(sql, 200),
        format = ?format,
        rows = tracing::field::Empty,
        bytes = tracing::field::Empty,
        error = tracing::field::Empty,
    );
    let task = engine.executor().spawn(timed(
        seconds.clone(),
        answer(engine.clone(), sql.to_owned(), format, head_tx, body_tx).instrument(span),
    ));
    let task = AbortOnDrop(task);
    // The query task keeps the time limit itself; this side keeps it too (with a little grace
    // for the task's own answer), in case the query's threads are too busy to notice.
    let limit = engine.query_timeout();
    let deadline = tokio::time::Instant::now() + limit + DEADLINE_GRACE;
    let warnings = match tokio::time::timeout_at(deadline, head_rx).await {
        Ok(Ok(Ok(w))) => w,
        Ok(Ok(Err(e))) => return e.into_response(),
        Ok(Err(_)) => {
            return Error::Internal("the query task ended early".into()).into_response();
        }
        Err(_) => return Error::Timeout(limit).into_response(),
    };
    let body = futures::stream::unfold((body_rx, Some(task)), move |(mut rx, task)| async move {
        let task = task?;
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Err(e))) => {
                // Let the connection send what it holds (the error line of a text answer)
                // before the body is cut: it flushes while the body is pending.
                tokio::time::sleep(FLUSH_BEFORE_CUT).await;
                Some((Err(e), (rx, Some(task))))
            }
            Ok(Some(chunk)) => Some((chunk, (rx, Some(task)))),
            Ok(None) => None,
            Err(_) => {
                drop(task);
                Some((
                    Err(std::io::Error::other(Error::Timeout(limit))),
                    (rx, None),
                ))
            }
        }
    });
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    for w in &warnings {
        resp.headers_mut().append(WARNING_HEADER, header_value(w));
    }
    resp
}

/// The header an answer that left data out carries, once per warning
/// ([`gpuwatch_query::skipped`]).
pub(crate) const WARNING_HEADER: &str = "gpuwatch-warning";

/// `text` as a header value: visible ASCII and spaces only (anything else becomes `?`).
fn header_value(text: &str) -> HeaderValue {
    let clean: String = text
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    HeaderValue::from_str(&clean).unwrap_or_else(|_| HeaderValue::from_static("data left out"))
}

/// At most `max` bytes of `text`, on a character boundary.
fn shorten(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Runs `work`, observing how long it took in `seconds`.
async fn timed(seconds: Histogram, work: impl std::future::Future<Output = ()>) {
    let started = std::time::Instant::now();
    work.await;
    seconds.observe(started.elapsed().as_secs_f64());
}

/// The query task: plans and runs `sql`, says through `head` whether the answer starts, then
/// sends it encoded through `body`.
async fn answer(
    engine: QueryEngine,
    sql: String,
    format: Format,
    head: tokio::sync::oneshot::Sender<Result<Vec<String>, Error>>,
    body: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
) {
    let limit = engine.query_timeout();
    let deadline = tokio::time::Instant::now() + limit;
    let max_bytes = engine.max_answer_bytes().unwrap_or(usize::MAX);
    let execute = tracing::info_span!("execute");
    let encode = tracing::info_span!("encode");
    let (_slot, stream, first, warnings) =
        match first_batch(&engine, &sql, deadline, &execute).await {
            Ok(started) => started,
            Err(e) => {
                let _ = head.send(Err(e));
                return;
            }
        };
    if !warnings.is_empty() {
        tracing::warn!(warnings = ?warnings, "the answer leaves damaged data out");
    }
    let mut encoder = match Encoder::new(&stream.schema(), format) {
        Ok(e) => e,
        Err(e) => {
            let _ = head.send(Err(e));
            return;
        }
    };
    let (chunk, more) = match first {
        // No rows: the whole answer is the encoder's opening and closing.
        None => (encoder.finish(), None),
        Some(b) => (
            encode.in_scope(|| encoder.write(&b)),
            Some((encoder, b.num_rows())),
        ),
    };
    let chunk = match chunk {
        Ok(c) => c,
        Err(e) => {
            let _ = head.send(Err(e));
            return;
        }
    };
    if chunk.len() > max_bytes {
        let _ = head.send(Err(Error::AnswerTooLarge(max_bytes)));
        return;
    }
    if head.send(Ok(warnings)).is_err() {
        return;
    }
    let sent = chunk.len();
    let Some((encoder, rows)) = more else {
        let _ = body.send(Ok(Bytes::from(chunk))).await;
        return;
    };
    if body.send(Ok(Bytes::from(chunk))).await.is_err() {
        return;
    }
    let answer = Streaming {
        deadline,
        limit,
        max_bytes,
        format,
        execute,
        encode,
        rows,
        sent,
    };
    answer.rest(stream, encoder, body).await;
}

/// Plans `sql` and waits for its first batch (`None`: no rows) within the time limit; with
/// the warnings of what the answer leaves out.
async fn first_batch(
    engine: &QueryEngine,
    sql: &str,
    deadline: tokio::time::Instant,
    execute: &tracing::Span,
) -> Result<
    (
        gpuwatch_query::engine::QuerySlot,
        datafusion::execution::SendableRecordBatchStream,
        Option<arrow::array::RecordBatch>,
        Vec<String>,
    ),
    Error,
> {
    let gpuwatch_query::engine::Started {
        slot,
        mut stream,
        warnings,
    } = engine
        .start(sql)
        .instrument(tracing::info_span!("plan"))
        .await?;
    match tokio::time::timeout_at(deadline, stream.next())
        .instrument(execute.clone())
        .await
    {
        Err(_) => Err(Error::Timeout(engine.query_timeout())),
        Ok(None) => Ok((slot, stream, None, warnings)),
        Ok(Some(Ok(b))) => Ok((slot, stream, Some(b), warnings)),
        Ok(Some(Err(e))) => Err(Error::from(e)),
    }
}

/// Where a streaming answer stands after its first chunk.
#[derive(Debug)]
struct Streaming {
    deadline: tokio::time::Instant,
    limit: std::time::Duration,
    max_bytes: usize,
    format: Format,
    execute: tracing::Span,
    encode: tracing::Span,
    rows: usize,
    sent: usize,
}

impl Streaming {
    /// Encodes and sends the batches after the first, then the encoder's end; a failure, the
    /// time limit or `--max-answer-bytes` cuts the answer (an error line for text formats).
    async fn rest(
        self,
        mut stream: datafusion::execution::SendableRecordBatchStream,
        mut encoder: Encoder,
        body: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    ) {
        let Streaming {
            deadline,
            limit,
            max_bytes,
            format,
            execute,
            encode,
            mut rows,
            mut sent,
        } = self;
        let failure = loop {
            let batch = match tokio::time::timeout_at(deadline, stream.next())
                .instrument(execute.clone())
                .await
            {
                Err(_) => break Error::Timeout(limit),
                Ok(Some(Ok(b))) => b,
                Ok(Some(Err(e))) => break Error::from(e),
                Ok(None) => match encoder.finish() {
                    Ok(tail) => {
                        if sent + tail.len() > max_bytes {
                            break Error::AnswerTooLarge(max_bytes);
                        }
                        let span = tracing::Span::current();
                        span.record("rows", rows);
                        span.record("bytes", sent + tail.len());
                        let _ = body.send(Ok(Bytes::from(tail))).await;
                        return;
                    }
                    Err(e) => break e,
                },
            };
            rows += batch.num_rows();
            let chunk = match encode.in_scope(|| encoder.write(&batch)) {
                Ok(c) => c,
                Err(e) => break e,
            };
            sent += chunk.len();
            if sent > max_bytes {
                break Error::AnswerTooLarge(max_bytes);
            }
            if body.send(Ok(Bytes::from(chunk))).await.is_err() {
                return;
            }
        };
        let span = tracing::Span::current();
        span.record("rows", rows);
        span.record("bytes", sent);
        span.record("error", tracing::field::display(&failure));
        tracing::warn!(error = %failure, "answer cut short");
        if format.is_text() {
            let line = format!(
                "\n{}\n",
                serde_json::json!({ "error": failure.to_string() })
            );
            let _ = body.send(Ok(Bytes::from(line))).await;
        }
        let _ = body.send(Err(std::io::Error::other(failure))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_unavailable_answers_say_when_to_retry() {
        let resp = error_response(Status::TooManyRequests, "busy");
        assert_eq!(resp.status().as_u16(), 429);
        assert_eq!(
            resp.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        let resp = Error::Busy(1).into_response();
        assert_eq!(resp.status().as_u16(), 429);
        assert!(
            error_response(Status::BadRequest, "x")
                .headers()
                .get("retry-after")
                .is_none()
        );
    }
}
