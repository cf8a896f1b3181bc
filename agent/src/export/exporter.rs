//! The exporter: one ordered retry spool in front of either wire protocol.
//!
//! Every request is encoded once (protobuf, gzip) and goes to the back of the [`Spool`] — the
//! in-memory queue or the disk spool of `--buffer-dir`, the same for both protocols. Then the
//! spool is drained oldest-first, in batches, until it is empty or a send fails:
//!
//! - **Batching.** When requests have piled up (the endpoint was down), up to
//!   [`MAX_BATCH_REQUESTS`] of the oldest, at most [`MAX_BATCH_BYTES`] as spooled, are merged
//!   into one `ExportMetricsServiceRequest` (their `resource_metrics` one after the other, so
//!   nothing changes in what is stored) and sent in one call. A single request goes out as it
//!   was queued. They leave the spool only once the endpoint has answered.
//! - **Retries with backoff.** A failure that may pass (connect error, timeout, HTTP 429/5xx,
//!   gRPC `UNAVAILABLE` and the other retryable codes) keeps the batch and everything behind it.
//!   The next attempt waits [`INITIAL_BACKOFF`], doubling at each failure up to
//!   [`MAX_BACKOFF`] (±20 % jitter so that a fleet of agents does not come back at once); until
//!   then new requests are only queued. The first success resets the delay. The shutdown
//!   [`flush`](Exporter::flush) does not wait for the backoff.
//! - **Rejections.** An answer that will never change (HTTP 4xx other than 401, 403 and 429;
//!   gRPC `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, …) drops the request, logged with the answer
//!   and counted. A rejected batch of several requests is first split: its requests are sent one
//!   by one, so only the bad one is dropped.
//! - **A refused token.** HTTP 401/403 and gRPC `UNAUTHENTICATED`/`PERMISSION_DENIED` say the
//!   bearer token ([`TokenFile`], `--auth-token-file`) is missing, wrong or lacks the `ingest`
//!   scope: not the data's fault. The batch and everything behind it stay in the spool and are
//!   retried with the backoff, each refusal logged as an error naming the fix and counted in
//!   `gpuwatch_agent_export_auth_refused_total`. The token file is read again at once, and at
//!   every later send when it changed; a new token is tried at the next send without waiting for
//!   the backoff.
//! - **Partial success.** An OTLP answer with `partial_success.rejected_data_points > 0` counts
//!   as delivered; the rejected points are logged with the server's message and counted in
//!   `gpuwatch_agent_export_rejected_points_total`.

use std::io::Read;
use std::time::{Duration, Instant};

use flate2::read::GzDecoder;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;
use tracing::{debug, error, warn};

use crate::config::Protocol;
use crate::error::{Error, Result};
use crate::export::grpc::GrpcTransport;
use crate::export::http::{Gzip, HttpTransport, encode_body};
use crate::export::options::ExportOptions;
use crate::export::queue::{Encoded, MemoryQueue, Spool};
use crate::export::token::{Bearer, TokenFile};

/// Most queued requests merged into one send.
pub const MAX_BATCH_REQUESTS: usize = 64;
/// Most spooled (gzip) bytes merged into one send. OTLP protobuf compresses 5–10×, so a batch
/// stays far below the server's default `--max-body-bytes` (64 MiB).
pub const MAX_BATCH_BYTES: u64 = 1 << 20;
/// Delay after the first failed send.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest delay between two attempts while the endpoint keeps failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What the endpoint made of one send.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Accepted; `rejected_points` of it refused (OTLP partial success), with the reason.
    Sent {
        rejected_points: i64,
        message: String,
    },
    /// Will never succeed: drop it. `status` names the answer (`http 400`, `grpc
    /// InvalidArgument`), `body` is the server's text.
    Rejected { status: String, body: String },
    /// The bearer token was refused (`http 401`/`403`, `grpc Unauthenticated`/
    /// `PermissionDenied`): keep it, the token is at fault, not the data.
    Refused { status: String, body: String },
    /// May succeed later: keep it.
    Retry(String),
}

enum Transport {
    Http(HttpTransport),
    Grpc(GrpcTransport),
}

impl Transport {
    fn url(&self) -> &str {
        match self {
            Transport::Http(t) => t.url(),
            Transport::Grpc(t) => t.url(),
        }
    }

    async fn deliver(&mut self, batch: &[Encoded], bearer: Option<&Bearer>) -> Outcome {
        match self {
            // A single queued request goes out with the body it was spooled with.
            Transport::Http(t) if batch.len() == 1 => t.post(batch[0].body.clone(), bearer).await,
            Transport::Http(t) => match merge(batch).and_then(|req| encode_body(&req)) {
                Ok(body) => t.post(body, bearer).await,
                Err(e) => undecodable(&e),
            },
            Transport::Grpc(t) => match merge(batch) {
                Ok(req) => t.export(req, bearer).await,
                Err(e) => undecodable(&e),
            },
        }
    }
}

fn undecodable(e: &Error) -> Outcome {
    Outcome::Rejected {
        status: "unreadable request".to_string(),
        body: e.to_string(),
    }
}

/// Decode a spooled body: gzip, then protobuf.
pub fn decode_body(body: &[u8]) -> Result<ExportMetricsServiceRequest> {
    let mut raw = Vec::with_capacity(body.len() * 4);
    GzDecoder::new(body)
        .read_to_end(&mut raw)
        .map_err(|e| Error::Encode(format!("spooled request is not gzip: {e}")))?;
    ExportMetricsServiceRequest::decode(&raw[..])
        .map_err(|e| Error::Encode(format!("spooled request is not OTLP protobuf: {e}")))
}

/// One request holding every request of `batch`, in order.
fn merge(batch: &[Encoded]) -> Result<ExportMetricsServiceRequest> {
    let mut out = ExportMetricsServiceRequest::default();
    for item in batch {
        out.resource_metrics
            .extend(decode_body(&item.body)?.resource_metrics);
    }
    Ok(out)
}

/// When the next attempt may be made.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    not_before: Option<Instant>,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: Duration::ZERO,
            not_before: None,
        }
    }

    /// Time left before the next attempt, if any.
    fn wait_left(&self, now: Instant) -> Option<Duration> {
        self.not_before
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    fn failed(&mut self, now: Instant) {
        self.current = if self.current.is_zero() {
            self.initial
        } else {
            (self.current * 2).min(self.max)
        };
        // ±20 % jitter from the clock's low bits: no random generator needed.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let factor = 0.8 + 0.4 * f64::from(nanos % 1000) / 1000.0;
        self.not_before = Some(now + self.current.mul_f64(factor));
    }

    fn succeeded(&mut self) {
        self.current = Duration::ZERO;
        self.not_before = None;
    }
}

/// Sends OTLP requests over HTTP or gRPC, keeping the ones that fail for a later retry.
pub struct Exporter {
    transport: Transport,
    spool: Box<dyn Spool>,
    next_seq: u64,
    rejected: u64,
    rejected_points: u64,
    backoff: Backoff,
    /// After a batch was rejected: send one by one up to this seq, to find the bad request.
    solo_through: Option<u64>,
    /// Kept between requests (see [`Gzip`]).
    gzip: Gzip,
    /// A request sent directly, not yet answered.
    in_flight: Option<Encoded>,
    /// The bearer token sent with every request, if any.
    token: Option<TokenFile>,
    /// The last answer was a refused token.
    refused: bool,
    /// Send attempts refused for the token.
    auth_refusals: u64,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("url", &self.transport.url())
            .field("queued", &self.spool.len())
            .field("dropped", &self.spool.dropped())
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// An OTLP/HTTP exporter to `endpoint` (see [`crate::export::metrics_url`]) with the
    /// default in-memory queue.
    pub fn new(endpoint: &str) -> Result<Self> {
        Self::with_spool(endpoint, Box::new(MemoryQueue::default()))
    }

    /// An OTLP/HTTP exporter to `endpoint` keeping failed requests in `spool`.
    pub fn with_spool(endpoint: &str, spool: Box<dyn Spool>) -> Result<Self> {
        Self::for_protocol(Protocol::Http, endpoint, spool)
    }

    /// An exporter speaking `protocol` to `endpoint`, keeping failed requests in `spool`. For
    /// gRPC no connection is made here: the channel connects on the first send and reconnects
    /// by itself.
    pub fn for_protocol(protocol: Protocol, endpoint: &str, spool: Box<dyn Spool>) -> Result<Self> {
        Self::with_options(protocol, endpoint, spool, &ExportOptions::default())
    }

    /// [`Exporter::for_protocol`] with headers, timeout, compression and TLS of `options`.
    pub fn with_options(
        protocol: Protocol,
        endpoint: &str,
        spool: Box<dyn Spool>,
        options: &ExportOptions,
    ) -> Result<Self> {
        let transport = match protocol {
            Protocol::Http => Transport::Http(HttpTransport::with_options(endpoint, options)?),
            Protocol::Grpc => Transport::Grpc(GrpcTransport::with_options(endpoint, options)?),
        };
        let next_seq = spool.last_seq().map_or(0, |s| s + 1);
        // A spool replayed from disk shows on /metrics before the first send.
        crate::metrics::spool_state(spool.len(), spool.bytes(), spool.dropped());
        Ok(Exporter {
            transport,
            spool,
            next_seq,
            rejected: 0,
            rejected_points: 0,
            backoff: Backoff::new(INITIAL_BACKOFF, MAX_BACKOFF),
            solo_through: None,
            gzip: Gzip::new(),
            in_flight: None,
            token: None,
            refused: false,
            auth_refusals: 0,
        })
    }

    /// Send the token of `token` with every request (`Authorization: Bearer` over HTTP, the
    /// `authorization` metadata over gRPC), reading the file again when it changes.
    pub fn set_token_file(&mut self, token: TokenFile) {
        self.token = Some(token);
    }

    /// Send attempts the endpoint refused for the bearer token (the requests stayed queued).
    pub fn auth_refusals(&self) -> u64 {
        self.auth_refusals
    }

    /// Look at the token file; a new token after a refusal is tried without waiting for the
    /// backoff.
    fn refresh_token(&mut self, force: bool) {
        let Some(token) = self.token.as_mut() else {
            return;
        };
        if token.refresh(force) && self.refused {
            self.backoff.succeeded();
        }
    }

    /// Log, count and report a refused token; the batch stays queued.
    fn token_refused(
        &mut self,
        url: String,
        status: String,
        body: String,
        requests: usize,
    ) -> Error {
        self.refused = true;
        self.auth_refusals += 1;
        crate::metrics::export_auth_refused();
        crate::metrics::export_failed();
        self.backoff.failed(Instant::now());
        let fix = match &self.token {
            Some(t) => format!(
                "the token in {} is wrong, or lacks the ingest scope: put a valid one there (it is read again before each send)",
                t.path().display()
            ),
            None => {
                "the endpoint wants a bearer token: give one with --auth-token-file".to_string()
            }
        };
        error!(
            url = %url,
            status = %status,
            body = %body,
            requests,
            queued = self.queued(),
            "endpoint refused the bearer token; the requests stay queued and are retried: {fix}"
        );
        self.refresh_token(true);
        Error::ExportRefused {
            url,
            status,
            body,
            queued: self.queued(),
        }
    }

    /// Change the retry delays (first one, longest one). `Duration::ZERO` retries at every
    /// call.
    pub fn set_backoff(&mut self, initial: Duration, max: Duration) {
        self.backoff = Backoff::new(initial, max.max(initial));
    }

    /// Where requests go.
    pub fn url(&self) -> &str {
        self.transport.url()
    }

    /// Requests waiting for a retry (a cancelled direct send included).
    pub fn queued(&self) -> usize {
        self.spool.len() + usize::from(self.in_flight.is_some())
    }

    /// Requests dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.spool.dropped()
    }

    /// Requests dropped because the endpoint rejected them for good.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Data points the endpoint refused in partial-success answers.
    pub fn rejected_points(&self) -> u64 {
        self.rejected_points
    }

    /// Bytes waiting in the spool.
    pub fn queued_bytes(&self) -> u64 {
        self.spool.bytes()
    }

    /// Queue `req` behind anything still waiting, then send the queue oldest-first.
    ///
    /// `Ok` when everything queued was delivered. [`Error::ExportRetry`] when a send failed in
    /// a way that may pass, or the exporter is waiting out its backoff: the request stays
    /// queued and goes out, in order, on a later call to `send` or [`flush`](Self::flush).
    /// [`Error::ExportRejected`] when the endpoint refused this very request for good.
    /// Cancel-safe: a request leaves the queue only once answered.
    pub async fn send(&mut self, req: &ExportMetricsServiceRequest) -> Result<()> {
        self.send_protobuf(&req.encode_to_vec()).await
    }

    /// [`send`](Self::send) for a request already encoded as protobuf (by
    /// [`crate::export::otlp::encode_collection_to`]).
    pub async fn send_protobuf(&mut self, protobuf: &[u8]) -> Result<()> {
        let body = self.gzip.encode(protobuf)?;
        self.refresh_token(false);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.requeue_in_flight();
        if self.spool.is_empty() && self.backoff.wait_left(Instant::now()).is_none() {
            return self.send_direct(Encoded { seq, body }).await;
        }
        self.push(Encoded { seq, body });
        if let Some(left) = self.backoff.wait_left(Instant::now()) {
            crate::metrics::spool_state(self.spool.len(), self.spool.bytes(), self.spool.dropped());
            return Err(Error::ExportRetry {
                url: self.transport.url().to_string(),
                reason: format!(
                    "backing off after failures, next attempt in {}",
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                    ))
                ),
                queued: self.spool.len(),
            });
        }
        self.drain(Some(seq)).await
    }

    /// Send whatever is queued, oldest first, without waiting for the backoff.
    pub async fn flush(&mut self) -> Result<()> {
        self.refresh_token(false);
        self.requeue_in_flight();
        self.drain(None).await
    }

    /// Queue `item` behind everything waiting, dropping the oldest when the spool is full.
    fn push(&mut self, item: Encoded) {
        if let Some(evicted) = self.spool.push(item) {
            warn!(
                request = evicted.seq,
                dropped_total = self.spool.dropped(),
                "retry queue full: dropped the oldest request"
            );
        }
    }

    /// A direct send that was cancelled before its answer (shutdown during a tick) goes to the
    /// spool, ahead of anything newer.
    fn requeue_in_flight(&mut self) {
        if let Some(item) = self.in_flight.take() {
            self.push(item);
        }
    }

    /// With nothing waiting, a request goes out at once and reaches the spool only if the send
    /// fails: writing, syncing and re-reading every request through the disk spool while the
    /// endpoint is up cost a third of the agent's CPU on a one-GPU host. Until it is answered
    /// it is held in `in_flight`, so a cancelled send is queued again, not lost; a crash during
    /// the send loses that one request, as it loses the collection not yet made.
    async fn send_direct(&mut self, item: Encoded) -> Result<()> {
        let seq = item.seq;
        let url = self.transport.url().to_string();
        let batch = [item];
        self.in_flight = Some(batch[0].clone());
        let bearer = self.token.as_ref().map(TokenFile::bearer);
        let outcome = self.transport.deliver(&batch, bearer).await;
        let [item] = batch;
        self.in_flight = None;
        let result = match outcome {
            Outcome::Sent {
                rejected_points,
                message,
            } => {
                debug!(request = seq, url = %url, "exported");
                self.backoff.succeeded();
                self.refused = false;
                crate::metrics::exported();
                if rejected_points > 0 {
                    self.count_rejected_points(rejected_points);
                    warn!(
                        request = seq,
                        url = %url,
                        rejected_points,
                        message = %message,
                        "endpoint accepted the request but rejected some of its points"
                    );
                }
                Ok(())
            }
            Outcome::Rejected { status, body } => {
                error!(
                    request = seq,
                    url = %url,
                    status = %status,
                    body = %body,
                    "endpoint rejected the request; dropping it, it will never succeed"
                );
                self.rejected += 1;
                crate::metrics::export_rejected();
                Err(Error::ExportRejected { url, status, body })
            }
            Outcome::Refused { status, body } => {
                self.push(item);
                Err(self.token_refused(url, status, body, 1))
            }
            Outcome::Retry(reason) => {
                self.push(item);
                Err(self.retry_later(url, reason))
            }
        };
        crate::metrics::spool_state(self.spool.len(), self.spool.bytes(), self.spool.dropped());
        result
    }

    async fn drain(&mut self, mine: Option<u64>) -> Result<()> {
        let result = self.drain_inner(mine).await;
        crate::metrics::spool_state(self.spool.len(), self.spool.bytes(), self.spool.dropped());
        result
    }

    /// Sends the spool oldest-first, batch after batch, until it is empty or a send fails; an
    /// error too when the endpoint rejected `mine` (the request the caller just queued).
    async fn drain_inner(&mut self, mine: Option<u64>) -> Result<()> {
        let mut mine_rejected = None;
        loop {
            let batch = self.next_batch();
            let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
                break;
            };
            let (first, last, n) = (first.seq, last.seq, batch.len());
            let url = self.transport.url().to_string();
            let bearer = self.token.as_ref().map(TokenFile::bearer);
            match self.transport.deliver(&batch, bearer).await {
                Outcome::Sent {
                    rejected_points,
                    message,
                } => {
                    debug!(first, last, requests = n, url = %url, "exported");
                    self.batch_sent(n);
                    if rejected_points > 0 {
                        self.count_rejected_points(rejected_points);
                        warn!(
                            first,
                            last,
                            url = %url,
                            rejected_points,
                            message = %message,
                            "endpoint accepted the request but rejected some of its points"
                        );
                    }
                }
                Outcome::Rejected { status, body } if n > 1 => {
                    warn!(
                        first,
                        last,
                        url = %url,
                        status = %status,
                        body = %body,
                        "endpoint rejected a batch; sending its requests one by one"
                    );
                    self.solo_through = Some(last);
                }
                Outcome::Rejected { status, body } => {
                    let e = self.drop_rejected_front(first, url, status, body);
                    if Some(first) == mine {
                        mine_rejected = Some(e);
                    }
                }
                Outcome::Refused { status, body } => {
                    return Err(self.token_refused(url, status, body, n));
                }
                Outcome::Retry(reason) => return Err(self.retry_later(url, reason)),
            }
        }
        mine_rejected.map_or(Ok(()), Err)
    }

    /// The next batch to send: the oldest requests, or the front alone while a rejected batch
    /// is being sent one by one.
    fn next_batch(&mut self) -> Vec<Encoded> {
        let solo = match (self.solo_through, self.spool.front()) {
            (Some(last), Some(front)) if front.seq <= last => true,
            _ => {
                self.solo_through = None;
                false
            }
        };
        let max_items = if solo { 1 } else { MAX_BATCH_REQUESTS };
        self.spool.peek(max_items, MAX_BATCH_BYTES)
    }

    /// The endpoint took the `n` oldest requests: they leave the spool, the backoff resets.
    fn batch_sent(&mut self, n: usize) {
        self.backoff.succeeded();
        self.refused = false;
        for _ in 0..n {
            self.spool.pop_front();
            crate::metrics::exported();
        }
        // While a long backlog drains, /metrics follows it batch by batch.
        crate::metrics::spool_state(self.spool.len(), self.spool.bytes(), self.spool.dropped());
    }

    /// Counts the points a partial-success answer refused.
    fn count_rejected_points(&mut self, rejected_points: i64) {
        let points = u64::try_from(rejected_points).unwrap_or(0);
        self.rejected_points += points;
        crate::metrics::export_rejected_points(points);
    }

    /// Logs, counts and drops the front request (`request`), rejected for good; the error that
    /// reports it.
    fn drop_rejected_front(
        &mut self,
        request: u64,
        url: String,
        status: String,
        body: String,
    ) -> Error {
        error!(
            request,
            url = %url,
            status = %status,
            body = %body,
            "endpoint rejected the request; dropping it, it will never succeed"
        );
        self.spool.pop_front();
        self.rejected += 1;
        crate::metrics::export_rejected();
        Error::ExportRejected { url, status, body }
    }

    /// Counts a send that may pass later and starts (or lengthens) the backoff; the error that
    /// reports it, with what stays queued.
    fn retry_later(&mut self, url: String, reason: String) -> Error {
        crate::metrics::export_failed();
        self.backoff.failed(Instant::now());
        self.refused = false;
        Error::ExportRetry {
            url,
            reason,
            queued: self.spool.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_bound_with_jitter() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let now = Instant::now();
        assert_eq!(b.wait_left(now), None);
        let mut waits = Vec::new();
        for _ in 0..5 {
            b.failed(now);
            waits.push(b.wait_left(now).map_or(0.0, |d| d.as_secs_f64()));
        }
        for (w, nominal) in waits.iter().zip([1.0, 2.0, 4.0, 5.0, 5.0]) {
            assert!(
                *w >= nominal * 0.79 && *w <= nominal * 1.21,
                "waits {waits:?}"
            );
        }
        assert_eq!(b.wait_left(now + Duration::from_secs(7)), None);
        b.succeeded();
        assert_eq!(b.wait_left(now), None);
        b.failed(now);
        assert!(
            b.wait_left(now)
                .is_some_and(|d| d <= Duration::from_millis(1200))
        );
    }

    #[test]
    fn merge_keeps_every_resource_in_order() {
        let items: Vec<Encoded> = (0..3u64)
            .map(|i| {
                let req =
                    crate::export::otlp::encode(&[], &[("host.name".into(), format!("h{i}"))]);
                Encoded {
                    seq: i,
                    body: encode_body(&req).unwrap(),
                }
            })
            .collect();
        let merged = merge(&items).unwrap();
        let hosts: Vec<String> = merged
            .resource_metrics
            .iter()
            .map(|rm| {
                let attr = &rm.resource.as_ref().unwrap().attributes[0];
                format!("{:?}", attr.value)
            })
            .collect();
        assert_eq!(hosts.len(), 3);
        assert!(
            hosts[0].contains("h0") && hosts[2].contains("h2"),
            "{hosts:?}"
        );
        let bad = Encoded {
            seq: 9,
            body: b"not gzip".to_vec(),
        };
        assert!(merge(&[bad]).is_err());
    }
}

#[cfg(test)]
mod direct_send_tests {
    use super::*;
    use crate::collect::GpuSample;
    use crate::export::otlp::encode;

    fn request(marker: u64) -> ExportMetricsServiceRequest {
        let mut s = GpuSample::empty(marker, "GPU-t".into(), 0, "test".into());
        s.gpu_utilization = Some(0.5);
        encode(&[s], &[("host.name".into(), "t".into())])
    }

    #[tokio::test]
    async fn a_cancelled_direct_send_is_queued_not_lost() {
        // A server that accepts and never answers: the send hangs until cancelled.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let mut e = Exporter::new(&format!("http://{addr}")).expect("exporter");
        assert_eq!(e.queued(), 0);
        let cancelled = tokio::time::timeout(Duration::from_millis(300), e.send(&request(1))).await;
        assert!(cancelled.is_err(), "the send was still waiting");
        assert_eq!(e.queued(), 1, "the cancelled request is still held");
        // The next send finds it and queues it first, in order.
        held.abort();
        let _ = tokio::time::timeout(Duration::from_millis(300), e.send(&request(2))).await;
        assert_eq!(e.queued(), 2);
        let waiting: Vec<u64> = e.spool.peek(10, u64::MAX).iter().map(|x| x.seq).collect();
        assert_eq!(waiting, vec![0, 1]);
    }
}
