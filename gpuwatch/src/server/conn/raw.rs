//! The connections of the OTLP/gRPC and Postgres listeners, bounded like the HTTP ones: a
//! connection that sends nothing within `--header-timeout`, or goes silent (no bytes either
//! way) for `--idle-timeout`, is closed, and at the cap the connection silent longest is closed
//! to take a new one.
//!
//! Their protocols are served by libraries that own the socket (tonic's HTTP/2, pgwire), so
//! each connection is watched from outside: a duplicate of its descriptor is kept, the kernel's
//! `TCP_INFO` says how long the socket has been silent, and closing it is a `shutdown` of the
//! socket, which the library reads as the peer's end. The duplicate is why these listeners
//! count two descriptors per connection in the default cap.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How a gRPC or Postgres listener's connections are bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawLimits {
    /// A connection that has sent no byte by then is closed.
    pub header_timeout: Duration,
    /// A connection silent this long (no byte either way) is closed.
    pub idle_timeout: Duration,
    /// Open connections at most; one more closes the one silent longest.
    pub cap: usize,
}

/// How often the connections are looked at.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug)]
struct Entry {
    ctl: std::net::TcpStream,
    opened: Instant,
    closed: bool,
}

/// The open connections of one listener.
#[derive(Debug)]
pub(crate) struct RawConns {
    what: &'static str,
    limits: RawLimits,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Entry>>,
}

/// One connection's place among its listener's; dropping it (when the connection ends)
/// gives the place back.
#[derive(Debug)]
pub(crate) struct Slot {
    conns: Arc<RawConns>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.conns.open.lock() {
            open.remove(&self.id);
        }
    }
}

/// How long a socket has been silent, and whether it ever received a byte, from `TCP_INFO`.
#[allow(unsafe_code)]
fn silence(socket: &std::net::TcpStream) -> Option<(Duration, bool)> {
    // SAFETY: getsockopt writes at most `len` bytes into `info`, a plain C struct that is
    // valid when zeroed; the descriptor is owned by `socket` for the duration of the call.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let quiet_ms = info.tcpi_last_data_recv.min(info.tcpi_last_data_sent);
    Some((
        Duration::from_millis(u64::from(quiet_ms)),
        info.tcpi_bytes_received > 0,
    ))
}

impl RawConns {
    /// The connections of listener `what`, swept until the last [`Slot`] and the listener let
    /// go of them.
    pub(crate) fn new(what: &'static str, limits: RawLimits) -> Arc<Self> {
        let conns = Arc::new(Self {
            what,
            limits,
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&conns);
        tokio::spawn(sweep(weak));
        conns
    }

    /// Takes a new connection; over the cap, the one silent longest is closed.
    pub(crate) fn admit(self: &Arc<Self>, socket: &tokio::net::TcpStream) -> Slot {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            conns: Arc::clone(self),
            id,
        };
        let ctl = match socket.as_fd().try_clone_to_owned() {
            Ok(fd) => std::net::TcpStream::from(fd),
            Err(e) => {
                tracing::warn!(listener = self.what, error = %e, "cannot watch a connection");
                return slot;
            }
        };
        let Ok(mut open) = self.open.lock() else {
            return slot;
        };
        open.insert(
            id,
            Entry {
                ctl,
                opened: Instant::now(),
                closed: false,
            },
        );
        if open.values().filter(|e| !e.closed).count() > self.limits.cap {
            let idlest = open
                .iter_mut()
                .filter(|(other, e)| **other != id && !e.closed)
                .max_by_key(|(other, e)| (silence(&e.ctl).map(|s| s.0), u64::MAX - **other))
                .map(|(_, e)| e);
            if let Some(e) = idlest {
                tracing::debug!(
                    listener = self.what,
                    "connection cap reached: closing the connection silent longest"
                );
                close(e);
            }
        }
        slot
    }

    /// Closes the connections past their timeouts.
    fn sweep_once(&self) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        for e in open.values_mut().filter(|e| !e.closed) {
            let Some((quiet, spoke)) = silence(&e.ctl) else {
                continue;
            };
            let expired = if spoke {
                quiet >= self.limits.idle_timeout
            } else {
                e.opened.elapsed() >= self.limits.header_timeout
            };
            if expired {
                tracing::debug!(listener = self.what, spoke, "closing a silent connection");
                close(e);
            }
        }
    }
}

fn close(e: &mut Entry) {
    e.closed = true;
    let _ = e.ctl.shutdown(std::net::Shutdown::Both);
}

async fn sweep(conns: Weak<RawConns>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        match conns.upgrade() {
            Some(c) => c.sweep_once(),
            None => return,
        }
    }
}

/// A connection handed to tonic, holding its [`Slot`] for as long as tonic keeps it.
#[derive(Debug)]
pub(crate) struct Held<T> {
    io: T,
    /// Kept for its `Drop`.
    _slot: Slot,
}

impl<T> Held<T> {
    /// `io`, holding `slot` until it is dropped.
    pub(crate) fn new(io: T, slot: Slot) -> Self {
        Self { io, _slot: slot }
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Held<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
