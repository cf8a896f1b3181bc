//! `gpuwatch serve`: builds the store and the query engine and serves them.
//!
//! Listeners are bound first (so `/healthz` answers at once), then the store replays its WAL in
//! the background; `/readyz`, writes and queries answer 503 until it is done.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use gpuwatch_query::http::{EngineSlot, error_response};
use gpuwatch_query::memory::Ceiling;
use gpuwatch_query::{EngineConfig, Status};
use gpuwatch_store::clock::{Clock, SystemClock};
use gpuwatch_store::ingest::http::decode_request;
use gpuwatch_store::{Store, StoreConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{Error, Result};

pub mod auth;
mod background;
mod grpc;
mod metrics;
mod remote_write;
pub mod tls;

pub use metrics::Sample;

/// How `serve` runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Main HTTP listener.
    pub http_addr: SocketAddr,
    /// OTLP/HTTP listener.
    pub otlp_http_addr: SocketAddr,
    /// OTLP/gRPC listener.
    pub otlp_grpc_addr: SocketAddr,
    /// PostgreSQL wire protocol listener; `None`: off.
    pub pg_addr: Option<SocketAddr>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// `s3://bucket/prefix` holding the Parquet files and the catalog, if not the data directory.
    pub object_store: Option<String>,
    /// How often the buffer is persisted to Parquet.
    pub persist_interval: Duration,
    /// Largest request body, compressed or not.
    pub max_body_bytes: usize,
    /// Query time limit.
    pub query_timeout: Duration,
    /// Allow non-loopback listeners without auth.
    pub insecure_no_auth: bool,
    /// When a write is fsynced.
    pub wal_sync: WalSync,
    /// With `--wal-sync interval`, how often the WAL is fsynced.
    pub wal_sync_interval: Duration,
    /// Cap of the in-memory write buffer.
    pub max_buffer_bytes: usize,
    /// How often compaction, rollups and retention run.
    pub compaction_interval: Duration,
    /// Retention per table.
    pub retention: gpuwatch_store::RetentionConfig,
    /// Rules, receivers, routes and prices.
    pub alerts: crate::alerts_wiring::AlertsConfig,
    /// What this server does.
    pub role: Role,
    /// Run compaction, rollups, retention and vacuum here.
    pub maintenance: bool,
    /// How often the tables are read again for other servers' commits.
    pub refresh_interval: Duration,
    /// Memory one query may use (`--query-memory-limit`); `None`: unbounded.
    pub query_memory_limit: Option<usize>,
    /// Queries at once (`--max-concurrent-queries`); `None`: unbounded.
    pub max_concurrent_queries: Option<usize>,
    /// The process's memory ceiling in bytes (`--memory-limit`); `None`: none.
    pub memory_limit: Option<usize>,
    /// The largest value a SQL function may build (`--max-value-bytes`).
    pub max_value_bytes: usize,
    /// The largest answer sent (`--max-answer-bytes`); `None`: unbounded.
    pub max_answer_bytes: Option<usize>,
    /// Where queries run (the query runtime).
    pub executor: gpuwatch_query::executor::Executor,
    /// TLS on every listener (`--tls-cert`, `--tls-key`); `None`: plain TCP.
    pub tls: Option<tls::Tls>,
    /// Bearer tokens (`--auth-tokens`); `None`: no auth, loopback only unless insecure.
    pub auth_tokens: Option<Arc<auth::Tokens>>,
}

/// `--wal-sync`: when the WAL is fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalSync {
    /// Before every acknowledgement (group commit: concurrent writes share one fsync).
    Always,
    /// Every `--wal-sync-interval`: a machine crash may lose the last interval's acknowledged
    /// writes (a process crash loses nothing).
    Interval,
}

/// `--role`: what a server does (docs/scale-out.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Ingest, persist, SQL, alerts: everything in one process.
    All,
    /// Takes writes (WAL) and persists them to the shared tables; serves SQL over its buffer
    /// and the tables too.
    Ingest,
    /// No WAL, no writes: serves SQL, Postgres and the console over the tables, refreshed every
    /// `--refresh-interval`.
    Query,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// Shared by the handlers.
#[derive(Debug, Clone)]
struct App {
    store: Arc<OnceLock<Arc<Store>>>,
    engine: EngineSlot,
    max_body_bytes: usize,
    clock: Arc<dyn Clock>,
    alerting: crate::alerts_wiring::AlertingSlot,
    remote_write: Arc<remote_write::Counters>,
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
enum WriteRefused {
    NotReady,
    Memory(gpuwatch_query::memory::Pressure),
    QueryNode,
}

impl WriteRefused {
    fn message(&self) -> String {
        match self {
            WriteRefused::NotReady => gpuwatch_store::Error::NotReady.to_string(),
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
pub struct Running {
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

async fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        Error::Listen(format!(
            "cannot listen on {addr} ({flag}): {e}; choose another address with {flag}"
        ))
    })
}

/// Binds the listeners, opens the store in the background, and serves until [`Running::shutdown`].
pub async fn start(config: ServeConfig) -> Result<Running> {
    let rules = crate::alerts_wiring::load_rules(&config.alerts)?;
    let open = config.insecure_no_auth || config.auth_tokens.is_some();
    check_bind(config.http_addr, open, "--http-addr")?;
    check_bind(config.otlp_http_addr, open, "--otlp-http-addr")?;
    check_bind(config.otlp_grpc_addr, open, "--otlp-grpc-addr")?;
    if let Some(addr) = config.pg_addr {
        check_bind(addr, open, "--pg-addr")?;
    }
    let http = bind(config.http_addr, "--http-addr").await?;
    let grpc = bind(config.otlp_grpc_addr, "--otlp-grpc-addr").await?;
    let otlp_grpc_addr = grpc
        .local_addr()
        .map_err(|e| Error::Listen(e.to_string()))?;
    let otlp = bind(config.otlp_http_addr, "--otlp-http-addr").await?;
    let pg = match config.pg_addr {
        Some(addr) => Some(bind(addr, "--pg-addr").await?),
        None => None,
    };
    let pg_addr = match &pg {
        Some(l) => Some(l.local_addr().map_err(|e| Error::Listen(e.to_string()))?),
        None => None,
    };
    let http_addr = http
        .local_addr()
        .map_err(|e| Error::Listen(e.to_string()))?;
    let otlp_http_addr = otlp
        .local_addr()
        .map_err(|e| Error::Listen(e.to_string()))?;

    let ceiling = match config.memory_limit {
        Some(limit) => {
            let ceiling = Ceiling::new(limit);
            ceiling
                .watch()
                .map_err(|e| Error::Other(format!("cannot start the memory watch: {e}")))?;
            Some(ceiling)
        }
        None => None,
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let alerting_slot: crate::alerts_wiring::AlertingSlot = Arc::new(OnceLock::new());
    let app = App {
        alerting: Arc::clone(&alerting_slot),
        store: Arc::new(OnceLock::new()),
        engine: Arc::new(OnceLock::new()),
        max_body_bytes: config.max_body_bytes,
        clock: Arc::clone(&clock),
        remote_write: Arc::default(),
        ceiling: ceiling.clone(),
        role: config.role,
    };
    let (shutdown, rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let guard = |scope| {
        axum::middleware::from_fn_with_state(
            auth::Guard {
                tokens: config.auth_tokens.clone(),
                scope,
            },
            auth::require,
        )
    };
    let ingest = Router::new()
        .route("/v1/metrics", post(otlp_metrics))
        .route_layer(guard(auth::Scope::Ingest))
        .with_state(app.clone());
    let prometheus = Router::new()
        .route("/api/v1/write", post(remote_write::handle))
        .route_layer(guard(auth::Scope::Ingest))
        .with_state(app.clone());
    let main = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::self_metrics))
        .with_state(app.clone())
        .merge(ingest.clone())
        .merge(prometheus)
        .merge(
            gpuwatch_query::http::router(Arc::clone(&app.engine))
                .route_layer(guard(auth::Scope::Query)),
        )
        .merge(
            crate::jobs::router(
                Arc::clone(&app.engine),
                config.alerts.cost.clone(),
                config.alerts.jobs.advice.clone(),
            )
            .route_layer(guard(auth::Scope::Query)),
        )
        .merge(
            crate::alerts_wiring::router(Arc::clone(&alerting_slot))
                .route_layer(guard(auth::Scope::Admin)),
        )
        // The web console's static files (no data: every figure it shows comes from the APIs
        // above, with the caller's token).
        .merge(gpuwatch_console::router())
        .fallback(not_found);
    let http_alpn: &[&[u8]] = &[b"http/1.1"];
    match &config.tls {
        None => {
            tasks.push(serve(http, main, rx.clone()));
            tasks.push(serve(otlp, ingest.fallback(not_found), rx.clone()));
        }
        Some(t) => {
            let http = tls::TlsIncoming::new(http, t.acceptor(http_alpn)?, "http")?;
            let otlp = tls::TlsIncoming::new(otlp, t.acceptor(http_alpn)?, "otlp-http")?;
            tasks.push(serve(http, main, rx.clone()));
            tasks.push(serve(otlp, ingest.fallback(not_found), rx.clone()));
        }
    }
    let grpc_tls = match &config.tls {
        Some(t) => Some(t.acceptor(&[b"h2"])?),
        None => None,
    };
    tasks.push(grpc::serve(
        grpc,
        grpc_tls,
        app.clone(),
        config.auth_tokens.clone(),
        rx.clone(),
    ));

    if let Some(listener) = pg {
        let auth = config
            .auth_tokens
            .clone()
            .map(|t| t as Arc<dyn gpuwatch_query::pg::PasswordCheck>);
        tasks.push(gpuwatch_query::pg::serve(
            listener,
            Arc::clone(&app.engine),
            gpuwatch_query::pg::PgOptions {
                auth,
                tls: match &config.tls {
                    Some(t) => Some(t.acceptor(&[])?),
                    None => None,
                },
                executor: config.executor.clone(),
            },
            rx.clone(),
        ));
    }

    // Open the store (WAL replay) off the async threads, then start the background loops.
    let store_config = StoreConfig {
        ingest: config.role != Role::Query,
        wal_sync: config.wal_sync == WalSync::Always,
        // The buffer's share of the memory ceiling, when that is lower.
        max_buffer_bytes: ceiling.as_ref().map_or(config.max_buffer_bytes, |c| {
            config.max_buffer_bytes.min(c.buffer_bytes())
        }),
        retention: config.retention.clone(),
        compaction: gpuwatch_store::CompactionConfig {
            // Replaced files outlive every query that may still read them, here or on a query
            // node that has not refreshed yet.
            grace: gpuwatch_store::CompactionConfig::default()
                .grace
                .max(config.query_timeout * 2 + config.refresh_interval * 2),
            ..Default::default()
        },
        object_store: config.object_store.clone(),
        ..StoreConfig::new(config.data_dir.clone())
    };
    let engine_config = EngineConfig {
        query_timeout: config.query_timeout,
        memory_limit: config.query_memory_limit,
        max_concurrent_queries: config.max_concurrent_queries,
        max_value_bytes: config.max_value_bytes,
        max_answer_bytes: config.max_answer_bytes,
        executor: config.executor.clone(),
        ceiling: ceiling.clone(),
    };
    tasks.push(tokio::spawn(background::run(background::Background {
        store_slot: Arc::clone(&app.store),
        engine_slot: Arc::clone(&app.engine),
        alerts_slot: Arc::clone(&alerting_slot),
        store_config,
        engine_config,
        clock,
        rules,
        alerts: config.alerts.clone(),
        data_dir: config.data_dir.clone(),
        ingest: config.role != Role::Query,
        persist_every: config.persist_interval,
        sync_every: (config.wal_sync == WalSync::Interval).then_some(config.wal_sync_interval),
        maintain_every: config.maintenance.then_some(config.compaction_interval),
        refresh_every: config.refresh_interval,
        stop: rx.clone(),
    })));
    Ok(Running {
        http_addr,
        otlp_http_addr,
        otlp_grpc_addr,
        pg_addr,
        store: Arc::clone(&app.store),
        app,
        shutdown,
        tasks,
    })
}

fn serve<L>(
    listener: L,
    router: Router,
    mut rx: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        let result = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = rx.changed().await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "http listener failed");
        }
    })
}

impl Running {
    /// Reads the server's own metrics, for as long as it is kept.
    pub fn sampler(&self) -> crate::telemetry::Sampler {
        let app = self.app.clone();
        Arc::new(move || metrics::samples(&app))
    }

    /// Stops the listeners, persists what is buffered, and waits for the tasks.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        if let Some(store) = self.store.get() {
            background::persist(store).await;
        }
    }

    /// Waits until the store is open (the WAL replayed).
    pub async fn ready(&self) {
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

async fn readyz(State(app): State<App>) -> Response {
    if let Some(why) = app.store.get().and_then(|s| s.fenced()) {
        return error_response(Status::Unavailable, &format!("not ready: {why}"));
    }
    if app.store.get().is_some() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        error_response(
            Status::Unavailable,
            "not ready: write-ahead log replay in progress",
        )
    }
}

fn store_error(e: &gpuwatch_store::Error) -> Response {
    use gpuwatch_store::Error as E;
    match e {
        E::TooLarge { .. } => error_response(Status::PayloadTooLarge, &e.to_string()),
        E::NotReady => error_response(Status::Unavailable, &e.to_string()),
        E::BufferFull { .. } => error_response(Status::Unavailable, &e.to_string()),
        _ if e.is_disk_full() => {
            tracing::error!(error = %e, "disk full: refusing writes until space is freed");
            let mut resp = error_response(
                Status::Unavailable,
                &format!(
                    "disk full, write not stored: free space in the data directory and retry ({e})"
                ),
            );
            *resp.status_mut() = StatusCode::INSUFFICIENT_STORAGE;
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            resp
        }
        _ if e.is_client_error() => error_response(Status::BadRequest, &e.to_string()),
        _ => {
            tracing::error!(error = %e, "write failed");
            error_response(Status::Unavailable, &format!("write not stored: {e}"))
        }
    }
}

async fn otlp_metrics(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let store = match app.writable() {
        Ok(s) => s,
        Err(refused) => return refused.response(),
    };
    let limit = app.max_body_bytes;
    let Some(body) = read_body(body, limit).await else {
        return store_error(&gpuwatch_store::Error::TooLarge { limit });
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let now = app.clock.now_nanos();
    let span = tracing::info_span!("ingest", protocol = "otlp_http", bytes = body.len());
    let work = tokio::task::spawn_blocking(move || {
        let _ingest = span.enter();
        let (batch, stats, format) = tracing::info_span!("decode").in_scope(|| {
            decode_request(
                content_type.as_deref(),
                encoding.as_deref(),
                &body,
                limit,
                now,
            )
        })?;
        store.write(&batch)?;
        Ok::<_, gpuwatch_store::Error>((stats, format))
    });
    match work.await {
        Ok(Ok((stats, format))) => {
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
        Ok(Err(e)) => store_error(&e),
        Err(e) => {
            tracing::error!(error = %e, "ingest task failed");
            error_response(Status::Internal, "internal error while storing the write")
        }
    }
}

/// Reads a body of at most `limit` bytes. A larger one is read to its end and dropped (up to a
/// bound), so the client gets the 413 answer instead of a broken connection.
async fn read_body(body: Body, limit: usize) -> Option<axum::body::Bytes> {
    use futures::StreamExt;
    const DRAIN_AT_MOST: usize = 1 << 30;
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return None;
        };
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            buf.extend_from_slice(&chunk);
        } else {
            buf = Vec::new();
            if seen > DRAIN_AT_MOST {
                return None;
            }
        }
    }
    (seen <= limit).then(|| buf.into())
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
