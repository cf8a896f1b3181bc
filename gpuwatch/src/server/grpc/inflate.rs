//! OTLP/gRPC messages inflated within the memory ceiling *before* tonic sees them: the message
//! frame is read (at most `--max-body-bytes`), room is reserved for the inflated bytes (and what
//! decoding them builds) one step at a time as the gzip is inflated — the same code as an
//! OTLP/HTTP body ([`gpuwatch_store::ingest::http::decompress_within`]) — and tonic gets the
//! plain frame. The reservation travels with the request ([`Reserved`]) and is held by the
//! export until its rows are written. A message that cannot be given room is answered here:
//! `RESOURCE_EXHAUSTED` when it could never fit (or is above `--max-body-bytes`), `UNAVAILABLE`
//! (retryable) when it does not fit now.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{BoxFuture, Context, Poll, Service};

use super::super::App;
use super::super::ingest::{IngestError, Protocol, WriteBudget};

/// The reservation made for a request's message, taken by the export.
#[derive(Debug, Clone, Default)]
pub(in crate::server) struct Reserved(Arc<Mutex<Option<WriteBudget>>>);

impl Reserved {
    /// The reservation, once.
    pub(in crate::server) fn take(&self) -> Option<WriteBudget> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The layer: inflates each request's message before `S` (tonic) decodes it.
#[derive(Debug, Clone)]
pub(in crate::server) struct InflateFirst<S> {
    inner: S,
    app: App,
}

impl<S> InflateFirst<S> {
    pub(in crate::server) fn new(inner: S, app: App) -> Self {
        Self { inner, app }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for InflateFirst<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<tonic::body::Body>> for InflateFirst<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        // The clone that was made ready is the one called (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let app = self.app.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            match inflate(&app, req).await {
                Ok(req) => inner.call(req).await,
                Err(e) => {
                    app.metrics
                        .ingest(Protocol::OtlpGrpc, e.outcome(), started.elapsed());
                    Ok(e.grpc_status().into_http())
                }
            }
        })
    }
}

/// The gRPC message frame header: compressed flag and length.
const HEADER: usize = 5;

/// `req` with its message inflated and the reservation attached; the request unchanged where
/// it is not one gzip or plain frame (tonic answers it).
async fn inflate(
    app: &App,
    req: Request<tonic::body::Body>,
) -> Result<Request<tonic::body::Body>, IngestError> {
    let (mut parts, body) = req.into_parts();
    let max = app.max_body_bytes;
    let too_large = || IngestError::Store(gpuwatch_store::Error::TooLarge { limit: max });
    let bytes = axum::body::to_bytes(axum::body::Body::new(body), max.saturating_add(HEADER))
        .await
        .map_err(|_| too_large())?;
    let encoding = parts
        .headers
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    let frame = match frame_of(&bytes) {
        Some((true, _)) if encoding.as_deref() != Some("gzip") => None,
        other => other,
    };
    let Some((compressed, message)) = frame else {
        return Ok(Request::from_parts(parts, rebuilt(bytes)));
    };
    let mut budget = WriteBudget::new(app);
    let message = message.clone();
    let inflated = tokio::task::spawn_blocking(move || {
        let encoding = compressed.then_some("gzip");
        gpuwatch_store::ingest::http::decompress_within(encoding, &message, max, &mut budget)
            .map(|m| (m, budget))
    })
    .await
    .map_err(IngestError::Task)?;
    let (message, budget) = inflated.map_err(IngestError::Store)?;
    let len = u32::try_from(message.len()).map_err(|_| too_large())?;
    let mut plain = Vec::with_capacity(HEADER + message.len());
    plain.push(0);
    plain.extend_from_slice(&len.to_be_bytes());
    plain.extend_from_slice(&message);
    drop(message);
    parts.headers.remove("grpc-encoding");
    parts
        .extensions
        .insert(Reserved(Arc::new(Mutex::new(Some(budget)))));
    Ok(Request::from_parts(parts, rebuilt(Bytes::from(plain))))
}

/// One frame's compressed flag and message, when `bytes` is exactly one frame.
fn frame_of(bytes: &Bytes) -> Option<(bool, Bytes)> {
    let header = bytes.get(..HEADER)?;
    let compressed = match header[0] {
        0 => false,
        1 => true,
        _ => return None,
    };
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    (bytes.len() - HEADER == len).then(|| (compressed, bytes.slice(HEADER..)))
}

fn rebuilt(bytes: Bytes) -> tonic::body::Body {
    tonic::body::Body::new(axum::body::Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_frame_is_read_and_anything_else_left_to_tonic() {
        let frame = |flag: u8, msg: &[u8], len: u32| {
            let mut v = vec![flag];
            v.extend_from_slice(&len.to_be_bytes());
            v.extend_from_slice(msg);
            Bytes::from(v)
        };
        assert_eq!(
            frame_of(&frame(0, b"abc", 3)),
            Some((false, Bytes::from_static(b"abc")))
        );
        assert_eq!(
            frame_of(&frame(1, b"abc", 3)),
            Some((true, Bytes::from_static(b"abc")))
        );
        assert_eq!(frame_of(&frame(0, b"abc", 4)), None, "short");
        assert_eq!(frame_of(&frame(0, b"abcd", 3)), None, "two frames");
        assert_eq!(frame_of(&frame(2, b"abc", 3)), None, "bad flag");
        assert_eq!(frame_of(&Bytes::from_static(b"\0\0")), None, "no header");
    }
}
