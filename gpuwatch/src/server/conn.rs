//! The HTTP listeners' connections (main and OTLP/HTTP): a header timeout that also closes
//! idle keep-alive connections, and a cap per listener below the process's open-file limit.
//!
//! At the cap the connection idle longest (no request in flight; the oldest among equals) is
//! closed to take the new one, so a crowd of idle or half-open connections cannot keep health
//! checks, writes or queries out; when every connection is busy, the listener holds one more and
//! new ones wait in the kernel's backlog (they hold no file) until a request finishes.
//! The default cap leaves a quarter of the file limit (at least 256) to the store and the other
//! listeners and shares the rest among the four listeners (docs/operations.md); the gRPC and
//! Postgres listeners ([`raw`]) hold two descriptors per connection and take half as many.

pub(crate) mod raw;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{Notify, watch};
use tower_service::Service;

/// The open-file limit of the process (the soft `RLIMIT_NOFILE`, from /proc/self/limits),
/// `None` when unknown or unlimited.
pub(crate) fn file_limit() -> Option<u64> {
    gpuwatch_common::metrics::open_file_limit()
}

/// The default connection cap per listener for an open-file limit.
pub(crate) fn default_cap(file_limit: Option<u64>) -> usize {
    let Some(n) = file_limit else {
        return 16_384;
    };
    let reserve = (n / 4).max(256);
    let cap = n.saturating_sub(reserve) / 4;
    usize::try_from(cap.clamp(16, 16_384)).unwrap_or(16_384)
}

/// How long an evicted connection may take to finish what it is doing.
const EVICTION_GRACE: Duration = Duration::from_secs(1);

/// How a listener's connections are bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub header_timeout: Duration,
    pub cap: usize,
}

/// One open connection, as the cap sees it.
#[derive(Debug)]
struct Conn {
    in_flight: AtomicUsize,
    /// Milliseconds since the listener started, at the end of the last request (or the
    /// connection's start).
    idle_since: AtomicU64,
    /// Asked to close (it no longer counts against the cap).
    evicted: AtomicBool,
    close: Notify,
}

/// The open connections of one listener.
#[derive(Debug)]
struct Conns {
    start: Instant,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Conns {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Connections that count against the cap.
    fn len(&self) -> usize {
        self.open
            .lock()
            .map(|m| {
                m.values()
                    .filter(|c| !c.evicted.load(Ordering::Acquire))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Asks the connection idle longest (the oldest first among equals) other than `newest` to
    /// close; false when every one is busy.
    fn evict_idlest(&self, newest: u64) -> bool {
        let Ok(open) = self.open.lock() else {
            return false;
        };
        let idlest = open
            .iter()
            .filter(|(id, c)| **id != newest && !c.evicted.load(Ordering::Acquire))
            .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|(id, c)| (c.idle_since.load(Ordering::Relaxed), **id))
            .map(|(_, c)| c);
        match idlest {
            Some(c) => {
                c.evicted.store(true, Ordering::Release);
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    fn remove(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&id);
        }
    }
}

/// Serves `router` on `listener` until `rx` changes.
pub(super) fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ConnLimits,
    mut rx: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
{
    let conns = Arc::new(Conns {
        start: Instant::now(),
        next: AtomicU64::new(0),
        open: Mutex::new(HashMap::new()),
    });
    tokio::spawn(async move {
        loop {
            if conns.len() > limits.cap {
                // Every connection is busy: new ones wait in the backlog until one finishes.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = rx.changed() => break,
                }
            }
            let (io, _) = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = rx.changed() => break,
            };
            let id = conns.next.fetch_add(1, Ordering::Relaxed);
            let conn = Arc::new(Conn {
                in_flight: AtomicUsize::new(0),
                idle_since: AtomicU64::new(conns.now_ms()),
                evicted: AtomicBool::new(false),
                close: Notify::new(),
            });
            if let Ok(mut open) = conns.open.lock() {
                open.insert(id, Arc::clone(&conn));
            }
            // Over the cap: the connection idle longest makes room for this one. When none is
            // idle, this one is served and the loop above waits for a busy one to finish.
            if conns.len() > limits.cap {
                conns.evict_idlest(id);
            }
            let (router, conns, rx) = (router.clone(), Arc::clone(&conns), rx.clone());
            tokio::spawn(async move {
                connection(io, router, limits, &conn, &conns, rx).await;
                conns.remove(id);
            });
        }
        // Stopping: each connection finishes its request and closes; wait for them, so that
        // the store persists after the last answer.
        while conns.open.lock().map(|m| !m.is_empty()).unwrap_or(false) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Serves one connection until it ends, idles past the header timeout, is evicted, or the
/// server stops.
async fn connection<I>(
    io: I,
    router: Router,
    limits: ConnLimits,
    conn: &Arc<Conn>,
    conns: &Arc<Conns>,
    mut rx: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::clone(conn);
    let clock = Arc::clone(conns);
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut router = router.clone();
        let state = Arc::clone(&state);
        let clock = Arc::clone(&clock);
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        async move {
            let resp = router.call(req.map(axum::body::Body::new)).await;
            state.idle_since.store(clock.now_ms(), Ordering::Relaxed);
            state.in_flight.fetch_sub(1, Ordering::AcqRel);
            resp
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let result = tokio::select! {
        r = served.as_mut() => r,
        _ = conn.close.notified() => {
            // Evicted: close at once between requests; a connection still sending a request's
            // headers (or, rarely, finishing an answer's body) gets a moment, then is dropped.
            served.as_mut().graceful_shutdown();
            match tokio::time::timeout(EVICTION_GRACE, served.as_mut()).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
        _ = rx.changed() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "http connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_file_limit() {
        assert_eq!(default_cap(Some(1024)), 192);
        assert_eq!(default_cap(Some(65_536)), 12_288);
        assert_eq!(default_cap(Some(100)), 16);
        assert_eq!(default_cap(None), 16_384);
        for n in [512_u64, 1024, 4096, 65_536, 1 << 20] {
            let four = 4 * default_cap(Some(n)) as u64;
            assert!(four + 256 <= n.max(4 * 16 + 256), "{n}");
        }
    }
}
