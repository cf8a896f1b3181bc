//! TLS on every listener (`--tls-cert FILE --tls-key FILE`, PEM).
//!
//! One certificate and key serve the main HTTP listener, OTLP/HTTP, OTLP/gRPC and the Postgres
//! wire protocol. For HTTP and gRPC the TCP listener is wrapped: accepted connections do their
//! handshake in their own task (a slow or broken client never holds up the others) and only
//! finished TLS streams reach the server. The Postgres listener hands the acceptor to `pgwire`,
//! which answers the protocol's `SSLRequest` (psql `sslmode=require`).

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::{Error, Result};

/// A client has this long to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate chain and key, loaded and checked at start.
#[derive(Clone)]
pub(crate) struct Tls {
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("certs", &self.certs.len())
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Reads a PEM certificate chain and private key; every problem is a startup error that
    /// names the file.
    pub(crate) fn load(cert: &Path, key: &Path) -> Result<Self> {
        let bytes = std::fs::read(cert).map_err(|e| {
            Error::Config(format!("cannot read --tls-cert {}: {e}", cert.display()))
        })?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::Config(format!(
                    "--tls-cert {}: not a PEM certificate chain ({e})",
                    cert.display()
                ))
            })?;
        if certs.is_empty() {
            return Err(Error::Config(format!(
                "--tls-cert {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                cert.display()
            )));
        }
        let bytes = std::fs::read(key)
            .map_err(|e| Error::Config(format!("cannot read --tls-key {}: {e}", key.display())))?;
        let private = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
            Error::Config(format!(
                "--tls-key {}: no PEM private key found (PKCS#8, PKCS#1 or SEC1): {e}",
                key.display()
            ))
        })?;
        let tls = Self {
            certs,
            key: Arc::new(private),
        };
        // Builds once so that a key that does not match the certificate fails at start.
        tls.config(&[]).map_err(|e| {
            Error::Config(format!(
                "--tls-cert {} and --tls-key {} do not work together: {e}",
                cert.display(),
                key.display()
            ))
        })?;
        Ok(tls)
    }

    fn config(&self, alpn: &[&[u8]]) -> std::result::Result<ServerConfig, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.certs.clone(), self.key.clone_key())?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// An acceptor offering the ALPN protocols `alpn` (none for Postgres).
    pub(crate) fn acceptor(&self, alpn: &[&[u8]]) -> Result<TlsAcceptor> {
        let config = self
            .config(alpn)
            .map_err(|e| Error::Config(format!("tls: {e}")))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Accepts TCP connections, does the TLS handshakes in their own tasks, and yields the
/// finished streams.
pub(crate) struct TlsIncoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsIncoming {
    /// Wraps `listener`.
    pub(crate) fn new(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        what: &'static str,
    ) -> Result<Self> {
        let local = listener.local_addr().map_err(|source| Error::Io {
            what: "read the listener's address",
            source,
        })?;
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(listener = what, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(listener = what, peer = %peer, error = %e, "tls handshake failed")
                        }
                        Err(_) => {
                            tracing::debug!(listener = what, peer = %peer, "tls handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(Self { rx, local, task })
    }

    /// The next finished connection; `None` once the accept task has stopped.
    pub(crate) async fn next(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.rx.recv().await
    }
}

impl axum::serve::Listener for TlsIncoming {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.next().await {
            Some(c) => c,
            // The accept task only stops when the listener is dropped: wait for shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS connection as tonic's server takes it.
pub(crate) struct GrpcTlsStream(pub TlsStream<TcpStream>);

impl tonic::transport::server::Connected for GrpcTlsStream {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for GrpcTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_startup_errors_that_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").expect("write");
        let e = Tls::load(&missing, &junk)
            .expect_err("missing cert")
            .to_string();
        assert!(e.contains("--tls-cert") && e.contains("missing.pem"), "{e}");
        let e = Tls::load(&junk, &junk).expect_err("junk cert").to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
    }
}
