//! `POST /v1/metrics` (on `--http-addr` and `--otlp-http-addr`): OTLP/HTTP, protobuf or JSON,
//! gzip allowed, decoded by `gpuwatch_store::ingest::http` and stored through
//! [`super::ingest::write`]. The answer is in the request's format, with `partial_success` when
//! points were rejected.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gpuwatch_store::ingest::http::{Encoding, decode_request_within};

use super::App;
use super::ingest::{self, Protocol, header_text, read_body};

/// The handler.
pub(super) async fn handle(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let limit = app.max_body_bytes;
    let content_type = header_text(&headers, header::CONTENT_TYPE);
    let encoding = header_text(&headers, header::CONTENT_ENCODING);
    let stored = ingest::write(
        &app,
        Protocol::OtlpHttp,
        read_body(body, limit),
        move |body, now, budget| {
            let encoding = Encoding {
                content_type: content_type.as_deref(),
                content_encoding: encoding.as_deref(),
                max_decoded_bytes: limit,
            };
            let (batch, stats, format) = decode_request_within(&encoding, &body, now, budget)?;
            Ok((batch, (stats, format)))
        },
    )
    .await;
    let (stats, format) = match stored {
        Ok(s) => s,
        Err(e) => return e.response(),
    };
    tracing::debug!(
        points = stats.points,
        rejected = stats.rejected,
        "otlp export stored"
    );
    if let Some(message) = stats.partial_success_message() {
        tracing::warn!("otlp export partly rejected: {message}");
    }
    let mut resp = (StatusCode::OK, format.answer_body(&stats)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    resp
}
