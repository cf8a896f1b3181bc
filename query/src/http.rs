//! SQL over HTTP: `POST /api/v1/sql` with `{"sql": "...", "format": "json"}`, or
//! `GET /api/v1/sql?q=...&format=...`.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use arrow::array::RecordBatch;
use bytes::Bytes;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;

use crate::engine::{QueryEngine, QuerySlot};
use crate::error::{Error, Status};
use crate::format::{Encoder, Format};

/// The engine, once the store is ready.
pub type EngineSlot = Arc<OnceLock<QueryEngine>>;

/// Largest SQL request body accepted.
pub const MAX_SQL_BODY_BYTES: usize = 1 << 20;

/// The SQL routes.
pub fn router(engine: EngineSlot) -> Router {
    Router::new()
        .route("/api/v1/sql", get(get_sql).post(post_sql))
        .with_state(engine)
}

/// A JSON error answer with the status of `status`.
pub fn error_response(status: Status, message: &str) -> Response {
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

impl IntoResponse for Error {
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
    State(engine): State<EngineSlot>,
    params: Result<Query<GetParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(params)) = params else {
        return Error::BadRequest("malformed query string: use ?q=<sql>&format=<format>".into())
            .into_response();
    };
    let Some(sql) = params.q.or(params.sql) else {
        return Error::BadRequest("missing query: use ?q=<sql>".into()).into_response();
    };
    run(&engine, &sql, params.format.as_deref()).await
}

async fn post_sql(State(engine): State<EngineSlot>, body: Body) -> Response {
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
    run(&engine, &parsed.sql, parsed.format.as_deref()).await
}

/// Runs `sql` and streams the answer: the first batch is awaited before the status is sent (so
/// planning and early execution errors get their status code); after that each batch is encoded
/// and sent as it comes, and a later failure or the time limit aborts the response (the client
/// sees a truncated chunked body, never a complete-looking wrong answer).
async fn run(engine: &EngineSlot, sql: &str, format: Option<&str>) -> Response {
    let format: Format = match format.unwrap_or("json").parse() {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let Some(engine) = engine.get() else {
        return Error::NotReady.into_response();
    };
    let limit = engine.query_timeout();
    let deadline = tokio::time::Instant::now() + limit;
    let (slot, mut stream) = match engine.start(sql).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let first = match tokio::time::timeout_at(deadline, stream.next()).await {
        Err(_) => return Error::Timeout(limit).into_response(),
        Ok(None) => None,
        Ok(Some(Ok(b))) => Some(b),
        Ok(Some(Err(e))) => return Error::from(e).into_response(),
    };
    let encoder = match Encoder::new(&stream.schema(), format) {
        Ok(e) => e,
        Err(e) => return e.into_response(),
    };
    let state = Streaming {
        encoder: Some(encoder),
        stream,
        first,
        deadline,
        limit,
        _slot: slot,
    };
    let body = futures::stream::unfold(state, |mut st| async move {
        let chunk = st.next_chunk().await?;
        Some((chunk, st))
    });
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    resp
}

struct Streaming {
    encoder: Option<Encoder>,
    stream: SendableRecordBatchStream,
    first: Option<RecordBatch>,
    deadline: tokio::time::Instant,
    limit: std::time::Duration,
    _slot: QuerySlot,
}

impl Streaming {
    /// The next piece of the body; `None` at the end (after an error, too).
    async fn next_chunk(&mut self) -> Option<std::io::Result<Bytes>> {
        let encoder = self.encoder.as_mut()?;
        let batch = match self.first.take() {
            Some(b) => b,
            None => match tokio::time::timeout_at(self.deadline, self.stream.next()).await {
                Err(_) => {
                    self.encoder = None;
                    tracing::warn!(limit = ?self.limit, "query timed out while streaming; answer aborted");
                    return Some(Err(std::io::Error::other(Error::Timeout(self.limit))));
                }
                Ok(Some(Ok(b))) => b,
                Ok(Some(Err(e))) => {
                    self.encoder = None;
                    let e = Error::from(e);
                    tracing::warn!(error = %e, "query failed while streaming; answer aborted");
                    return Some(Err(std::io::Error::other(e)));
                }
                Ok(None) => {
                    let encoder = self.encoder.take()?;
                    return Some(
                        encoder
                            .finish()
                            .map(Bytes::from)
                            .map_err(std::io::Error::other),
                    );
                }
            },
        };
        Some(
            encoder
                .write(&batch)
                .map(Bytes::from)
                .map_err(std::io::Error::other),
        )
    }
}
