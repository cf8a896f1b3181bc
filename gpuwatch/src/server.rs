//! `gpuwatch serve`: builds the store and the query engine and serves them.
//!
//! Listeners are bound first (so `/healthz` answers at once), then the store replays its WAL in
//! the background; `/readyz`, writes and queries answer 503 until it is done.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::server::sql::{EngineSlot, error_response};
use axum::http::StatusCode;
use axum::response::Response;
use gpuwatch_query::Status;
use gpuwatch_query::memory::Ceiling;
use gpuwatch_store::Store;
use gpuwatch_store::clock::{Clock, SystemClock};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Role, ServeConfig};
use crate::error::{Error, Result};

pub(crate) mod auth;
mod background;
mod browser;
mod conn;
mod grpc;
mod ingest;
mod metrics;
mod otlp_http;
pub(crate) mod pg;
mod readiness;
mod remote_write;
mod routes;
pub(crate) mod sql;
pub(crate) mod tls;

/// Shared by the handlers.
#[derive(Debug, Clone)]
struct App {
    store: Arc<OnceLock<Arc<Store>>>,
    engine: EngineSlot,
    max_body_bytes: usize,
    clock: Arc<dyn Clock>,
    alerting: crate::alerts_wiring::AlertingSlot,
    remote_write: Arc<remote_write::Counters>,
    metrics: metrics::Metrics,
    ceiling: Option<Arc<Ceiling>>,
    role: Role,
}

impl App {
    /// The store, when it takes writes now: a server that ingests, open, and the process not at
    /// its memory ceiling.
    fn writable(&self) -> std::result::Result<Arc<Store>, WriteRefused> {
        if self.role == Role::Query {
            return Err(WriteRefused::QueryNode);
        }
        let Some(store) = self.store.get().cloned() else {
            return Err(WriteRefused::NotReady);
        };
        if let Some(ceiling) = &self.ceiling {
            ceiling.admit_write().map_err(WriteRefused::Memory)?;
        }
        Ok(store)
    }
}

/// Why a write is refused before it is read.
#[derive(Debug)]
pub(crate) enum WriteRefused {
    NotReady,
    Memory(gpuwatch_query::memory::Pressure),
    QueryNode,
}

impl WriteRefused {
    fn message(&self) -> String {
        match self {
            WriteRefused::NotReady => {
                gpuwatch_store::Error::NotReady(gpuwatch_store::startup::reason()).to_string()
            }
            WriteRefused::QueryNode => gpuwatch_store::Error::ReadOnly.to_string(),
            WriteRefused::Memory(p) => {
                format!("{p}: write not stored, retry after the Retry-After delay")
            }
        }
    }

    fn response(&self) -> Response {
        match self {
            WriteRefused::QueryNode => error_response(Status::Forbidden, &self.message()),
            _ => error_response(Status::Unavailable, &self.message()),
        }
    }

    fn grpc_status(&self) -> tonic::Status {
        match self {
            WriteRefused::QueryNode => tonic::Status::permission_denied(self.message()),
            _ => tonic::Status::unavailable(self.message()),
        }
    }
}

/// A running server.
#[derive(Debug)]
pub(crate) struct Running {
    /// The bound main HTTP address.
    pub http_addr: SocketAddr,
    /// The bound OTLP/HTTP address.
    pub otlp_http_addr: SocketAddr,
    /// The bound OTLP/gRPC address.
    pub otlp_grpc_addr: SocketAddr,
    /// The bound PostgreSQL wire protocol address, if on.
    pub pg_addr: Option<SocketAddr>,
    store: Arc<OnceLock<Arc<Store>>>,
    app: App,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `allowed`: auth tokens are configured, or `--insecure-no-auth` was given.
fn check_bind(addr: SocketAddr, allowed: bool, flag: &str) -> Result<()> {
    if addr.ip().is_loopback() || allowed {
        return Ok(());
    }
    Err(Error::Config(format!(
        "refusing to listen on {addr} ({flag}) without authentication: bind a loopback address, \
         configure bearer tokens with --auth-tokens FILE, or pass --insecure-no-auth to accept \
         unauthenticated traffic from the network"
    )))
}

fn local_addr(source: std::io::Error) -> Error {
    Error::Io {
        what: "read a listener's address",
        source,
    }
}

async fn bind(addr: SocketAddr, flag: &'static str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, flag, source })
}

/// The listeners, bound, and their addresses.
struct Bound {
    http: TcpListener,
    otlp: TcpListener,
    grpc: TcpListener,
    pg: Option<TcpListener>,
}

impl Bound {
    /// Checks and binds every listener of `config` (so `/healthz` answers at once).
    async fn bind(config: &ServeConfig) -> Result<Self> {
        let l = &config.settings.listeners;
        let open = l.insecure_no_auth || config.auth_tokens.is_some();
        check_bind(l.http_addr, open, "--http-addr")?;
        check_bind(l.otlp_http_addr, open, "--otlp-http-addr")?;
        check_bind(l.otlp_grpc_addr, open, "--otlp-grpc-addr")?;
        if let Some(addr) = l.pg_addr.0 {
            check_bind(addr, open, "--pg-addr")?;
        }
        let http = bind(l.http_addr, "--http-addr").await?;
        let grpc = bind(l.otlp_grpc_addr, "--otlp-grpc-addr").await?;
        let otlp = bind(l.otlp_http_addr, "--otlp-http-addr").await?;
        let pg = match l.pg_addr.0 {
            Some(addr) => Some(bind(addr, "--pg-addr").await?),
            None => None,
        };
        Ok(Self {
            http,
            otlp,
            grpc,
            pg,
        })
    }
}

/// Starts the memory watch of `--memory-limit`.
fn memory_ceiling(limit: Option<usize>) -> Result<Option<Arc<Ceiling>>> {
    let Some(limit) = limit else {
        return Ok(None);
    };
    let ceiling = Ceiling::new(limit);
    ceiling.watch().map_err(|source| Error::Io {
        what: "start the memory watch",
        source,
    })?;
    Ok(Some(ceiling))
}

/// Binds the listeners, opens the store in the background, and serves until [`Running::shutdown`].
pub(crate) async fn start(config: ServeConfig) -> Result<Running> {
    let rules = crate::alerts_wiring::load_rules(&config.alerts)?;
    let bound = Bound::bind(&config).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let app = App {
        alerting: Arc::new(OnceLock::new()),
        store: Arc::new(OnceLock::new()),
        engine: Arc::new(OnceLock::new()),
        max_body_bytes: config.settings.limits.max_body_bytes,
        clock: Arc::clone(&clock),
        remote_write: Arc::default(),
        metrics: metrics::Metrics::default(),
        ceiling: memory_ceiling(config.memory_limit)?,
        role: config.settings.role.role,
    };
    let (shutdown, rx) = watch::channel(false);
    let addrs = [
        bound.http.local_addr().map_err(local_addr)?,
        bound.otlp.local_addr().map_err(local_addr)?,
        bound.grpc.local_addr().map_err(local_addr)?,
    ];
    let pg_addr = match &bound.pg {
        Some(l) => Some(l.local_addr().map_err(local_addr)?),
        None => None,
    };
    let mut tasks = listen(&config, &app, bound, &rx)?;
    let work = background::Background::new(&config, &app, clock, rules, rx);
    tasks.push(tokio::spawn(background::run(work)));
    Ok(Running {
        http_addr: addrs[0],
        otlp_http_addr: addrs[1],
        otlp_grpc_addr: addrs[2],
        pg_addr,
        store: Arc::clone(&app.store),
        app,
        shutdown,
        tasks,
    })
}

/// Serves every front end on its listener: HTTP (and OTLP/HTTP), OTLP/gRPC, Postgres.
fn listen(
    config: &ServeConfig,
    app: &App,
    bound: Bound,
    rx: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let (main, ingest) = routes::routers(config, app);
    let ingest = ingest.fallback(not_found);
    let http_alpn: &[&[u8]] = &[b"http/1.1"];
    let limits = connection_limits(config);
    let mut tasks = Vec::new();
    match &config.tls {
        None => {
            tasks.push(conn::serve(bound.http, main, limits, rx.clone()));
            tasks.push(conn::serve(bound.otlp, ingest, limits, rx.clone()));
        }
        Some(t) => {
            let http = tls::TlsIncoming::new(bound.http, t.acceptor(http_alpn)?, "http")?;
            let otlp = tls::TlsIncoming::new(bound.otlp, t.acceptor(http_alpn)?, "otlp-http")?;
            tasks.push(conn::serve(http, main, limits, rx.clone()));
            tasks.push(conn::serve(otlp, ingest, limits, rx.clone()));
        }
    }
    let grpc_tls = match &config.tls {
        Some(t) => Some(t.acceptor(&[b"h2"])?),
        None => None,
    };
    let tokens = config.auth_tokens.clone();
    let raw = raw_limits(config, limits);
    tasks.push(grpc::serve(
        bound.grpc,
        grpc_tls,
        app.clone(),
        tokens,
        conn::raw::RawConns::new("otlp-grpc", raw),
        rx.clone(),
    ));
    if let Some(listener) = bound.pg {
        let options = pg::PgOptions {
            auth: config
                .auth_tokens
                .clone()
                .map(|t| t as Arc<dyn pg::PasswordCheck>),
            tls: match &config.tls {
                Some(t) => Some(t.acceptor(&[])?),
                None => None,
            },
            executor: config.executor.clone(),
            conns: Some(conn::raw::RawConns::new("postgres", raw)),
        };
        tasks.push(pg::serve(
            listener,
            Arc::clone(&app.engine),
            options,
            rx.clone(),
        ));
    }
    Ok(tasks)
}

/// The HTTP listeners' connection bounds: `--header-timeout`, and `--max-connections` or a cap
/// derived from the open-file limit (logged at start).
fn connection_limits(config: &ServeConfig) -> conn::ConnLimits {
    let l = &config.settings.limits;
    let files = conn::file_limit();
    let cap = match l.max_connections {
        0 => conn::default_cap(files),
        n => n,
    };
    tracing::info!(
        open_file_limit = files,
        connections_per_listener = cap,
        header_timeout = ?l.header_timeout.get(),
        idle_timeout = ?l.idle_timeout.get(),
        "connections bounded (grpc and postgres listeners: half as many when derived)"
    );
    conn::ConnLimits {
        header_timeout: l.header_timeout.get(),
        cap,
    }
}

/// The gRPC and Postgres listeners' bounds: the HTTP ones, `--idle-timeout`, and half the
/// derived cap (each of their connections holds two descriptors) unless `--max-connections`
/// sets it.
fn raw_limits(config: &ServeConfig, http: conn::ConnLimits) -> conn::raw::RawLimits {
    let l = &config.settings.limits;
    let cap = match l.max_connections {
        0 => (http.cap / 2).max(8),
        n => n,
    };
    conn::raw::RawLimits {
        header_timeout: http.header_timeout,
        idle_timeout: l.idle_timeout.get(),
        cap,
    }
}

impl Running {
    /// Reads the server's own metrics, for as long as it is kept.
    pub(crate) fn sampler(&self) -> crate::telemetry::Sampler {
        let app = self.app.clone();
        Arc::new(move || metrics::samples(&app))
    }

    /// Stops the listeners, persists what is buffered, and waits for the tasks.
    pub(crate) async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        if let Some(store) = self.store.get() {
            background::persist(store, &self.app.metrics.persist_seconds).await;
        }
    }

    /// Waits until the store is open (the WAL replayed).
    pub(crate) async fn ready(&self) {
        while self.store.get().is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn not_found() -> Response {
    let mut resp = error_response(Status::BadRequest, "no such endpoint: see docs/http-api.md");
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_needs_tokens_or_the_insecure_flag() {
        let lan: SocketAddr = "0.0.0.0:9500".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:9500".parse().expect("addr");
        assert!(check_bind(local, false, "--http-addr").is_ok());
        let err = check_bind(lan, false, "--http-addr").expect_err("refused");
        assert!(err.to_string().contains("--auth-tokens"), "{err}");
        assert!(check_bind(lan, true, "--http-addr").is_ok());
    }
}
