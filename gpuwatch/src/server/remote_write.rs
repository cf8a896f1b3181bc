//! `POST /api/v1/write`: Prometheus remote write 1.0.
//!
//! The body is decoded by `gpuwatch_store::ingest::remote_write` (its module docs give the sample
//! policy), written through [`super::ingest::write`] (WAL fsync before the answer), and
//! answered `204 No Content`.
//! Rejected samples do not fail the request: their count comes back in the
//! `X-Gpuwatch-Rejected-Samples` header, and in `/metrics`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gpuwatch_common::metrics::Registry;
use gpuwatch_common::metrics::prometheus_client::metrics::counter::Counter;
use gpuwatch_common::metrics::prometheus_client::metrics::family::Family;
use gpuwatch_store::ingest::http::Encoding;
use gpuwatch_store::ingest::remote_write::{RemoteWriteStats, decode_request_within};

use super::App;
use super::ingest::{self, Protocol, header_text, read_body};

/// The header that carries the number of rejected samples of an accepted request.
pub(super) const REJECTED_HEADER: &str = "x-gpuwatch-rejected-samples";

/// Counters of the remote-write endpoint, registered for `/metrics`.
#[derive(Debug, Default)]
pub(super) struct Counters {
    requests: Counter,
    samples: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Counters {
    fn add(&self, s: &RemoteWriteStats) {
        self.requests.inc();
        for (outcome, n) in [
            ("stored", s.samples),
            ("stale_marker", s.stale),
            ("duplicate", s.duplicates),
            ("rejected_non_finite", s.non_finite),
            ("rejected_out_of_range", s.out_of_range),
            ("rejected_unnamed", s.unnamed),
        ] {
            self.samples
                .get_or_create(&[("outcome", outcome)])
                .inc_by(n);
        }
    }

    /// Registers the counters.
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "gpuwatch_remote_write_requests",
            "Remote write requests stored",
            self.requests.clone(),
        );
        r.register(
            "gpuwatch_remote_write_samples",
            "Remote write samples by outcome",
            self.samples.clone(),
        );
    }
}

/// The handler.
pub(super) async fn handle(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let limit = app.max_body_bytes;
    let content_type = header_text(&headers, header::CONTENT_TYPE);
    let encoding = header_text(&headers, header::CONTENT_ENCODING);
    let stored = ingest::write(
        &app,
        Protocol::RemoteWrite,
        read_body(body, limit),
        move |body, now, budget| {
            let encoding = Encoding {
                content_type: content_type.as_deref(),
                content_encoding: encoding.as_deref(),
                max_decoded_bytes: limit,
            };
            decode_request_within(&encoding, &body, now, budget)
        },
    )
    .await;
    let stats = match stored {
        Ok(s) => s,
        Err(e) => return e.response(),
    };
    app.remote_write.add(&stats);
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Some(summary) = stats.rejection_summary() {
        tracing::warn!(
            series = stats.series,
            stored = stats.samples,
            "remote write: {summary}"
        );
        resp.headers_mut()
            .insert(REJECTED_HEADER, HeaderValue::from(stats.rejected()));
    } else {
        tracing::debug!(
            series = stats.series,
            stored = stats.samples,
            "remote write stored"
        );
    }
    resp
}
