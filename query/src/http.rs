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

use crate::engine::QueryEngine;
use crate::error::{Error, Status};
use crate::format::{Format, encode};

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

async fn run(engine: &EngineSlot, sql: &str, format: Option<&str>) -> Response {
    let format: Format = match format.unwrap_or("json").parse() {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let Some(engine) = engine.get() else {
        return Error::NotReady.into_response();
    };
    let result = match engine.query(sql).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match encode(&result, format) {
        Ok(body) => {
            let mut resp = (StatusCode::OK, body).into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            resp
        }
        Err(e) => e.into_response(),
    }
}
