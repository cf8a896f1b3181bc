//! The one write path. Every protocol (OTLP/HTTP, OTLP/gRPC, Prometheus remote write) is a
//! decoder into the store's rows ([`WriteBatch`]) and a route; [`write`] does the rest the same
//! way for all: it checks that the server takes writes now (role, WAL replayed, memory ceiling),
//! reads the request within `--max-body-bytes`, decodes it within a memory reservation of the
//! ceiling taken before each step is inflated ([`WriteBudget`]; 503 + Retry-After or 413 when
//! there is no room, see `gpuwatch_query::memory`) and writes it off the async threads
//! (the answer waits for the WAL fsync), counts it, and returns an [`IngestError`] that each
//! protocol turns into its status once ([`IngestError::response`], [`IngestError::grpc_status`]).
//!
//! Adding a protocol: a decoder (`store/src/ingest/`), a handler that calls [`write`] and writes
//! its answer, and a route.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::server::sql::error_response;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use gpuwatch_query::Status;
use gpuwatch_query::memory::{DecodeRefused, DecodeReservation};
use gpuwatch_store::Store;
use gpuwatch_store::ingest::{DecodeBudget, WriteBatch};
use tracing::Instrument;

use super::{App, WriteRefused};

/// The protocols that write, as spans and metrics name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    /// OTLP over HTTP (`/v1/metrics`).
    OtlpHttp,
    /// OTLP over gRPC (`MetricsService/Export`).
    OtlpGrpc,
    /// Prometheus remote write 1.0 (`/api/v1/write`).
    RemoteWrite,
}

impl Protocol {
    /// The name in spans and metric labels.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Protocol::OtlpHttp => "otlp_http",
            Protocol::OtlpGrpc => "otlp_grpc",
            Protocol::RemoteWrite => "remote_write",
        }
    }
}

/// Why a write was not stored.
#[derive(Debug, thiserror::Error)]
pub(super) enum IngestError {
    /// Refused before it was read: a query node, the WAL replaying, the memory ceiling.
    #[error("{}", .0.message())]
    Refused(WriteRefused),
    /// The request is malformed or too large, or the store could not keep it.
    #[error(transparent)]
    Store(#[from] gpuwatch_store::Error),
    /// The blocking task that decodes and writes failed.
    #[error("internal error while storing the write")]
    Task(#[source] tokio::task::JoinError),
}

impl IngestError {
    /// The outcome label of the request counter.
    pub(super) fn outcome(&self) -> &'static str {
        use gpuwatch_store::Error as E;
        match self {
            IngestError::Refused(WriteRefused::QueryNode) => "forbidden",
            IngestError::Refused(_) => "unavailable",
            IngestError::Store(E::DecodeRefused(_)) => "memory",
            IngestError::Store(E::TooLarge { .. }) => "too_large",
            IngestError::Store(e) if e.is_disk_full() => "disk_full",
            IngestError::Store(e) if e.is_client_error() => "bad_request",
            IngestError::Store(_) => "unavailable",
            IngestError::Task(_) => "internal",
        }
    }

    /// The HTTP answer (OTLP/HTTP and remote write).
    pub(super) fn response(&self) -> Response {
        use gpuwatch_store::Error as E;
        match self {
            IngestError::Refused(refused) => refused.response(),
            IngestError::Store(E::DecodeRefused(why)) => decode_refused(why.as_ref()),
            IngestError::Store(e @ E::TooLarge { .. }) => {
                error_response(Status::PayloadTooLarge, &e.to_string())
            }
            IngestError::Store(e @ (E::NotReady(_) | E::BufferFull { .. })) => {
                error_response(Status::Unavailable, &e.to_string())
            }
            IngestError::Store(e) if e.is_disk_full() => disk_full(e),
            IngestError::Store(e) if e.is_client_error() => {
                error_response(Status::BadRequest, &e.to_string())
            }
            IngestError::Store(e) => {
                tracing::error!(error = %e, "write failed");
                error_response(Status::Unavailable, &format!("write not stored: {e}"))
            }
            IngestError::Task(e) => {
                tracing::error!(error = %e, "ingest task failed");
                error_response(Status::Internal, &self.to_string())
            }
        }
    }

    /// The gRPC status (OTLP/gRPC): `INVALID_ARGUMENT` for malformed data,
    /// `RESOURCE_EXHAUSTED` above `--max-body-bytes`, `UNAVAILABLE` (retryable) otherwise.
    pub(super) fn grpc_status(&self) -> tonic::Status {
        use gpuwatch_store::Error as E;
        match self {
            IngestError::Refused(refused) => refused.grpc_status(),
            IngestError::Store(E::DecodeRefused(why)) => {
                match why.downcast_ref::<DecodeRefused>() {
                    Some(r) if r.never_fits() => tonic::Status::resource_exhausted(r.to_string()),
                    _ => tonic::Status::unavailable(why.to_string()),
                }
            }
            IngestError::Store(e @ E::TooLarge { .. }) => {
                tonic::Status::resource_exhausted(e.to_string())
            }
            IngestError::Store(e @ E::NotReady(_)) => tonic::Status::unavailable(e.to_string()),
            IngestError::Store(e) if e.is_client_error() => {
                tonic::Status::invalid_argument(e.to_string())
            }
            IngestError::Store(e) => {
                tracing::error!(error = %e, "otlp/grpc write failed");
                tonic::Status::unavailable(format!("write not stored: {e}"))
            }
            IngestError::Task(e) => {
                tracing::error!(error = %e, "otlp/grpc ingest task failed");
                tonic::Status::internal(self.to_string())
            }
        }
    }
}

/// The answer to a write refused because the disk is full: 503 with `Retry-After` (OTLP
/// exporters and Prometheus retry it; the write was not acknowledged, nothing acknowledged
/// before is lost, and writes are taken again as soon as space is freed).
fn disk_full(e: &gpuwatch_store::Error) -> Response {
    tracing::error!(error = %e, "disk full: refusing writes until space is freed");
    let mut resp = error_response(
        Status::Unavailable,
        &format!(
            "disk full, write not stored: free space where the data directory is; writes are taken again once there is room ({e})"
        ),
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    resp
}

/// The answer to a write whose decode found no room under `--memory-limit`: 413 when the
/// request alone needs more than decoding may ever hold (split it), otherwise 503 with
/// `Retry-After` (room comes back as other writes finish).
fn decode_refused(why: &(dyn std::error::Error + Send + Sync + 'static)) -> Response {
    let never = why
        .downcast_ref::<DecodeRefused>()
        .is_some_and(DecodeRefused::never_fits);
    if never {
        return error_response(Status::PayloadTooLarge, &why.to_string());
    }
    tracing::warn!(error = %why, "write refused: no room to decode it under --memory-limit");
    let mut resp = error_response(Status::Unavailable, &why.to_string());
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The memory a write's decode holds: a reservation of the ceiling (none without
/// `--memory-limit`), kept until the rows are written and given back when dropped.
#[derive(Debug)]
pub(super) struct WriteBudget(Option<DecodeReservation>);

impl WriteBudget {
    /// An empty reservation of `app`'s ceiling.
    pub(super) fn new(app: &App) -> Self {
        Self(app.ceiling.as_ref().map(|c| c.reserve_decode()))
    }
}

impl DecodeBudget for WriteBudget {
    fn inflated(&mut self, bytes: usize) -> gpuwatch_store::Result<()> {
        match &mut self.0 {
            None => Ok(()),
            Some(r) => r
                .inflated(bytes)
                .map_err(|e| gpuwatch_store::Error::DecodeRefused(Box::new(e))),
        }
    }
}

/// Stores one request of `protocol`: admits it, awaits `read` (the request, within the body
/// limit), decodes it with `decode` and writes the rows, all of it counted and timed. `decode`
/// gets the request, the time of arrival (ns) and the budget to reserve its memory in before it
/// inflates or decodes, and returns the rows and what the protocol answers with.
pub(super) async fn write<R, S, D>(
    app: &App,
    protocol: Protocol,
    read: impl Future<Output = Result<R, gpuwatch_store::Error>>,
    decode: D,
) -> Result<S, IngestError>
where
    R: Send + 'static,
    S: Send + 'static,
    D: FnOnce(R, i64, &mut WriteBudget) -> gpuwatch_store::Result<(WriteBatch, S)> + Send + 'static,
{
    write_within(app, protocol, read, decode, WriteBudget::new(app)).await
}

/// [`write`] with memory already reserved for the request (an OTLP/gRPC message inflated
/// before tonic decoded it), held until the rows are written.
pub(super) async fn write_within<R, S, D>(
    app: &App,
    protocol: Protocol,
    read: impl Future<Output = Result<R, gpuwatch_store::Error>>,
    decode: D,
    budget: WriteBudget,
) -> Result<S, IngestError>
where
    R: Send + 'static,
    S: Send + 'static,
    D: FnOnce(R, i64, &mut WriteBudget) -> gpuwatch_store::Result<(WriteBatch, S)> + Send + 'static,
{
    let started = Instant::now();
    let result = admit_and_store(app, protocol, read, decode, budget).await;
    app.metrics.ingest(
        protocol,
        result.as_ref().err().map_or("ok", IngestError::outcome),
        started.elapsed(),
    );
    result
}

async fn admit_and_store<R, S, D>(
    app: &App,
    protocol: Protocol,
    read: impl Future<Output = Result<R, gpuwatch_store::Error>>,
    decode: D,
    mut budget: WriteBudget,
) -> Result<S, IngestError>
where
    R: Send + 'static,
    S: Send + 'static,
    D: FnOnce(R, i64, &mut WriteBudget) -> gpuwatch_store::Result<(WriteBatch, S)> + Send + 'static,
{
    let store: Arc<Store> = app.writable().map_err(IngestError::Refused)?;
    let span = tracing::info_span!(
        "ingest",
        protocol = protocol.as_str(),
        bytes = tracing::field::Empty
    );
    let request = read.instrument(span.clone()).await?;
    let now = app.clock.now_nanos();
    let work = tokio::task::spawn_blocking(move || {
        let _ingest = span.enter();
        let (batch, stats) =
            tracing::info_span!("decode").in_scope(|| decode(request, now, &mut budget))?;
        store.write(&batch)?;
        drop(budget);
        Ok::<_, gpuwatch_store::Error>(stats)
    });
    match work.await {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err(e)) => Err(IngestError::Store(e)),
        Err(e) => Err(IngestError::Task(e)),
    }
}

/// The body of an HTTP write, at most `limit` bytes (before decompression: the decoders keep
/// the limit after it). A larger one is read to its end and dropped (up to a bound), so the
/// client gets the 413 answer instead of a broken connection.
pub(super) async fn read_body(body: Body, limit: usize) -> Result<Bytes, gpuwatch_store::Error> {
    use futures::StreamExt;
    const DRAIN_AT_MOST: usize = 1 << 30;
    let too_large = || gpuwatch_store::Error::TooLarge { limit };
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| too_large())?;
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            buf.extend_from_slice(&chunk);
        } else {
            buf = Vec::new();
            if seen > DRAIN_AT_MOST {
                return Err(too_large());
            }
        }
    }
    if seen > limit {
        return Err(too_large());
    }
    tracing::Span::current().record("bytes", seen);
    Ok(buf.into())
}

/// A header's text, if it is text.
pub(super) fn header_text(
    headers: &axum::http::HeaderMap,
    name: header::HeaderName,
) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
