//! `POST /api/v1/write`: Prometheus remote write 1.0.
//!
//! The body is decoded by `gpuwatch_store::ingest::remote_write` (its module docs give the sample
//! policy), written to the store (WAL fsync before the answer), and answered `204 No Content`.
//! Rejected samples do not fail the request: their count comes back in the
//! `X-Gpuwatch-Rejected-Samples` header, and in `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use gpuwatch_query::Status;
use gpuwatch_query::http::error_response;
use gpuwatch_store::ingest::remote_write::{RemoteWriteStats, decode_request};

use super::{App, read_body, store_error};

/// The header that carries the number of rejected samples of an accepted request.
pub const REJECTED_HEADER: &str = "x-gpuwatch-rejected-samples";

/// Counters of the remote-write endpoint, exposed on `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    samples: AtomicU64,
    stale: AtomicU64,
    non_finite: AtomicU64,
    out_of_range: AtomicU64,
    unnamed: AtomicU64,
    duplicates: AtomicU64,
}

impl Counters {
    fn add(&self, s: &RemoteWriteStats) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.samples.fetch_add(s.samples, Ordering::Relaxed);
        self.stale.fetch_add(s.stale, Ordering::Relaxed);
        self.non_finite.fetch_add(s.non_finite, Ordering::Relaxed);
        self.out_of_range
            .fetch_add(s.out_of_range, Ordering::Relaxed);
        self.unnamed.fetch_add(s.unnamed, Ordering::Relaxed);
        self.duplicates.fetch_add(s.duplicates, Ordering::Relaxed);
    }

    /// Appends the counters in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str(
            "# HELP gpuwatch_remote_write_requests_total Remote write requests stored\n\
             # TYPE gpuwatch_remote_write_requests_total counter\n",
        );
        out.push_str(&format!(
            "gpuwatch_remote_write_requests_total {}\n",
            get(&self.requests)
        ));
        out.push_str(
            "# HELP gpuwatch_remote_write_samples_total Remote write samples by outcome\n\
             # TYPE gpuwatch_remote_write_samples_total counter\n",
        );
        for (outcome, c) in [
            ("stored", &self.samples),
            ("stale_marker", &self.stale),
            ("duplicate", &self.duplicates),
            ("rejected_non_finite", &self.non_finite),
            ("rejected_out_of_range", &self.out_of_range),
            ("rejected_unnamed", &self.unnamed),
        ] {
            out.push_str(&format!(
                "gpuwatch_remote_write_samples_total{{outcome=\"{outcome}\"}} {}\n",
                get(c)
            ));
        }
    }
}

/// The handler.
pub async fn handle(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let store = match app.writable() {
        Ok(s) => s,
        Err(refused) => return refused.response(),
    };
    let limit = app.max_body_bytes;
    let Some(body) = read_body(body, limit).await else {
        return store_error(&gpuwatch_store::Error::TooLarge { limit });
    };
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = text(header::CONTENT_TYPE);
    let encoding = text(header::CONTENT_ENCODING);
    let now = app.clock.now_nanos();
    let span = tracing::info_span!("ingest", protocol = "remote_write", bytes = body.len());
    let work = tokio::task::spawn_blocking(move || {
        let _ingest = span.enter();
        let (batch, stats) = tracing::info_span!("decode").in_scope(|| {
            decode_request(
                content_type.as_deref(),
                encoding.as_deref(),
                &body,
                limit,
                now,
            )
        })?;
        store.write(&batch)?;
        Ok::<_, gpuwatch_store::Error>(stats)
    });
    match work.await {
        Ok(Ok(stats)) => {
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
        Ok(Err(e)) => store_error(&e),
        Err(e) => {
            tracing::error!(error = %e, "remote write task failed");
            error_response(Status::Internal, "internal error while storing the write")
        }
    }
}
