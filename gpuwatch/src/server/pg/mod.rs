//! The PostgreSQL wire protocol front end (`--pg-addr`): psql, Grafana's PostgreSQL data source,
//! and any other Postgres client read the same tables as the HTTP SQL API.
//!
//! Data flow: a connection is accepted (TLS negotiated when configured), the startup handler
//! checks the password when tokens are configured, then each statement is parsed by the
//! Postgres-compatible parser of `datafusion-postgres`, passed through the same read-only gate as
//! HTTP ([`gpuwatch_query::gate::check_parsed`]) plus the few session statements Postgres clients send
//! (`SET`, `BEGIN`/`COMMIT`), and executed by `datafusion-postgres` over a session that shares
//! the engine's tables and adds a `pg_catalog` schema (for `\dt`, `\d` and Grafana's table
//! lists) and an `information_schema` that names types as Postgres does
//! ([`super::information_schema`]). Every query, and every open cursor until it is closed
//! ([`session::CursorSlots`]), takes one of the engine's `--max-concurrent-queries` slots; a query is cut
//! off at `--query-timeout` (or the client's lower `statement_timeout`) and, as over HTTP, runs
//! with a memory pool of its own of `--query-memory-limit` bytes ([`session::Ready::session`]).
//! DataFusion's errors become Postgres errors with a SQLSTATE ([`sqlstate`]).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::Statement as Sql;
use datafusion_postgres::pgwire;
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::auth::{
    DefaultServerParameterProvider, LoginInfo, StartupHandler, finish_authentication,
    protocol_negotiation, save_startup_parameters_to_metadata,
};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::Portal;
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, Response};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    ErrorHandler, PgWireConnectionState, PgWireServerHandlers, PidSecretKeyGenerator,
    RandomPidSecretKeyGenerator, Type,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::server::sql::EngineSlot;
use gpuwatch_query::QueryEngine;
use gpuwatch_query::{Error, lower_first};

pub(crate) use pgwire::tokio::tokio_rustls::TlsAcceptor;

/// The database (DataFusion catalog) name clients see, e.g. in `current_database()`.
pub(crate) const DATABASE: &str = "gpuwatch";

/// Why a password is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denied {
    /// Not a configured token (SQLSTATE 28P01).
    InvalidPassword,
    /// A valid token that may not run queries (SQLSTATE 28000), with the reason.
    NotAllowed(String),
}

/// Checks the password a client sends at startup: the server's bearer tokens.
pub(crate) trait PasswordCheck: Send + Sync + fmt::Debug {
    /// `Ok` when `password` lets `user` run queries.
    fn check(&self, user: &str, password: &str) -> Result<(), Denied>;
}

/// How the Postgres listener runs.
#[derive(Clone, Default)]
pub(crate) struct PgOptions {
    /// When set, clients log in with a cleartext password checked here; otherwise anyone
    /// reaching the listener is let in (the server only binds loopback then).
    pub auth: Option<Arc<dyn PasswordCheck>>,
    /// TLS for `sslmode=require` clients, then required of every client; `None`: plain
    /// connections only.
    pub tls: Option<TlsAcceptor>,
    /// Where connections run: the query runtime, so that a client's statements (planning,
    /// execution, and the encoding of its rows) never hold up the server's own runtime.
    pub executor: gpuwatch_query::executor::Executor,
    /// The bounds of the listener's connections (`--header-timeout`, `--idle-timeout`,
    /// `--max-connections`); `None`: unbounded.
    pub conns: Option<Arc<crate::server::conn::raw::RawConns>>,
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("auth", &self.auth.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

mod admit;
mod errors;
pub(crate) mod functions;
pub(crate) mod information_schema;
pub(crate) mod rewrite;
mod session;

use admit::{Verdict, admit, admit_all};

use errors::{classify, engine_error, error};
use session::{CursorSlots, Shared, has_portal, sweep_cursors};

/// The time limit of the next query: `--query-timeout`, or the client's `statement_timeout`
/// when lower.
fn time_limit<C: ClientInfo + ?Sized>(client: &C, engine: &QueryEngine) -> Duration {
    let server = engine.query_timeout();
    client
        .metadata()
        .get("statement_timeout_ms")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(|ms| server.min(Duration::from_millis(ms)))
        .unwrap_or(server)
}

/// Runs `work`, stopped at `deadline` (`57014`, `limit` in the message).
async fn within<T>(
    deadline: tokio::time::Instant,
    limit: Duration,
    work: impl Future<Output = PgWireResult<T>>,
) -> PgWireResult<T> {
    match tokio::time::timeout_at(deadline, work).await {
        Ok(r) => r,
        Err(_) => Err(engine_error(&Error::Timeout(limit))),
    }
}

/// Holds a query's slot until its rows are sent, stops it at the deadline or when its rows
/// pass `max_bytes` (`54000`), and classifies errors raised while rows stream.
fn guard(
    response: Response,
    slot: Option<Arc<gpuwatch_query::engine::QuerySlot>>,
    deadline: tokio::time::Instant,
    limit: Duration,
    max_bytes: usize,
    checks: Checks,
) -> Response {
    let Response::Query(mut q) = response else {
        return response;
    };
    let rows = std::mem::replace(&mut q.data_rows, Box::pin(futures::stream::empty()));
    let stream = futures::stream::unfold(
        (rows, slot, false, 0usize),
        move |(mut rows, slot, done, sent)| {
            let checks = checks.clone();
            async move {
                if done {
                    return None;
                }
                match tokio::time::timeout_at(deadline, rows.next()).await {
                    Ok(Some(Ok(row))) => {
                        let sent = sent.saturating_add(row.data.len());
                        if sent > max_bytes {
                            return Some((
                                Err(engine_error(&Error::AnswerTooLarge(max_bytes))),
                                (rows, None, true, sent),
                            ));
                        }
                        Some((Ok(row), (rows, slot, false, sent)))
                    }
                    Ok(Some(Err(e))) => {
                        Some((Err(checks.damage_found(e).await), (rows, None, true, sent)))
                    }
                    Ok(None) => None,
                    Err(_) => Some((
                        Err(engine_error(&Error::Timeout(limit))),
                        (rows, None, true, sent),
                    )),
                }
            }
        },
    );
    q.data_rows = Box::pin(stream);
    Response::Query(q)
}

/// What a statement's scans read and left out, and the store to check damaged files with.
#[derive(Clone)]
struct Checks {
    store: Arc<dyn gpuwatch_store::ReadStore>,
    notes: Arc<gpuwatch_query::skipped::ScanNotes>,
}

impl Checks {
    fn new(engine: &QueryEngine) -> Self {
        Self {
            store: Arc::clone(engine.store()),
            notes: Arc::default(),
        }
    }

    /// Sends the warnings of the statement's scans (data its answer leaves out) as notices.
    async fn notify<C>(&self, client: &mut C) -> PgWireResult<()>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        for w in self.notes.warnings() {
            let notice = pgwire::error::ErrorInfo::new("WARNING".into(), "01000".into(), w);
            client
                .send(PgWireBackendMessage::NoticeResponse(notice.into()))
                .await?;
        }
        Ok(())
    }

    /// The error of a statement whose rows failed: when a damaged data file made it fail, the
    /// file is found (and skipped by later statements) and named (`XX001`, data corrupted).
    async fn damage_found(&self, e: PgWireError) -> PgWireError {
        let damage = match &e {
            PgWireError::ApiError(inner) => inner
                .downcast_ref::<datafusion::error::DataFusionError>()
                .is_some_and(gpuwatch_query::skipped::may_be_damage),
            _ => false,
        };
        if !damage {
            return classify(e);
        }
        let before = self.notes.warnings().len();
        if gpuwatch_query::skipped::verify_scanned(&self.store, &self.notes).await == 0 {
            return classify(e);
        }
        let found = self.notes.warnings().split_off(before).join("; ");
        error(
            "ERROR",
            "XX001",
            format!(
                "the answer was cut short by a damaged data file, which later statements skip: {found}"
            ),
        )
    }
}

/// The handlers of one listener.
pub(crate) struct Front {
    shared: Arc<Shared>,
    parser: Arc<GatedParser>,
}

impl Front {
    /// Handlers over the engine in `engine` (set once the store is open).
    pub(crate) fn new(
        engine: EngineSlot,
        auth: Option<Arc<dyn PasswordCheck>>,
        require_tls: bool,
    ) -> Self {
        let shared = Arc::new(Shared {
            engine,
            ready: OnceLock::new(),
            auth,
            require_tls,
            connections: Arc::new(ConnectionManager::new()),
            keys: RandomPidSecretKeyGenerator::default(),
        });
        Self {
            parser: Arc::new(GatedParser {
                shared: Arc::clone(&shared),
            }),
            shared,
        }
    }

    fn register<C: ClientInfo>(&self, client: &mut C) {
        let (pid, key) = self.shared.keys.generate(client);
        client.set_pid_and_secret_key(pid, key.clone());
        let (handle, guard) = self.shared.connections.register(pid, key);
        client
            .session_extensions()
            .insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert::<ConnectionGuard>(guard);
    }
}

fn parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = functions::SERVER_VERSION.to_owned();
    p.is_superuser = false;
    p.default_transaction_read_only = true;
    p
}

#[async_trait]
impl StartupHandler for Front {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if self.shared.require_tls && !client.is_secure() {
                    return Err(error(
                        "FATAL",
                        "28000",
                        "this server requires TLS: connect with sslmode=require (or verify-full)",
                    ));
                }
                // Before the password, so that a client learns at once the server is starting.
                self.shared.ready()?;
                if self.shared.auth.is_some() {
                    client.set_state(PgWireConnectionState::AuthenticationInProgress);
                    client
                        .send(PgWireBackendMessage::Authentication(
                            Authentication::CleartextPassword,
                        ))
                        .await?;
                } else {
                    self.register(client);
                    finish_authentication(client, &parameters()).await?;
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(pwd) => {
                let Some(auth) = &self.shared.auth else {
                    return Err(error("FATAL", "08P01", "unexpected password message"));
                };
                let pwd = pwd.into_password()?;
                let login = LoginInfo::from_client_info(client);
                let user = login.user().unwrap_or("").to_owned();
                match auth.check(&user, &pwd.password) {
                    Ok(()) => {
                        self.register(client);
                        finish_authentication(client, &parameters()).await?;
                    }
                    Err(Denied::InvalidPassword) => {
                        tracing::info!(user = %user, "postgres login refused: invalid token");
                        return Err(error(
                            "FATAL",
                            "28P01",
                            format!(
                                "password authentication failed for user \"{user}\": the password must be a token with the query scope from the server's --auth-tokens file"
                            ),
                        ));
                    }
                    Err(Denied::NotAllowed(why)) => {
                        tracing::info!(user = %user, "postgres login refused: {why}");
                        return Err(error("FATAL", "28000", why));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[async_trait]
impl SimpleQueryHandler for Front {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let rewritten = rewrite::rewrite(query);
        let query: &str = &rewritten;
        let ready = self.shared.ready()?;
        let verdicts = admit_all(&ready.parser, query)?;
        if verdicts.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        if verdicts.iter().all(|v| *v == Verdict::IgnoredSet) {
            return Ok(verdicts
                .iter()
                .map(|_| Response::Execution(pgwire::api::results::Tag::new("SET")))
                .collect());
        }
        sweep_cursors(client);
        // Cursor statements run one at a time, each with its slot (see `CursorSlots`).
        let cursors = verdicts
            .iter()
            .any(|v| matches!(v, Verdict::Declare(_) | Verdict::Close));
        let one_at_a_time = cursors
            || verdicts
                .iter()
                .any(|v| matches!(v, Verdict::IgnoredSet | Verdict::Fetch));
        let mut slot = if verdicts.contains(&Verdict::Query) && !cursors {
            Some(Arc::new(
                ready.engine.try_slot().map_err(|e| engine_error(&e))?,
            ))
        } else {
            None
        };
        let limit = time_limit(client, &ready.engine);
        let checks = Checks::new(&ready.engine);
        // Cursors are not bound by the time limit once declared: no deadline in their plans.
        let service = ready.session(
            client.session_extensions(),
            (!cursors).then_some(limit),
            &checks.notes,
        )?;
        let deadline = tokio::time::Instant::now() + limit;
        let max_bytes = ready.engine.max_answer_bytes().unwrap_or(usize::MAX);
        let responses = if !one_at_a_time {
            within(
                deadline,
                limit,
                SimpleQueryHandler::do_query(service.as_ref(), client, query),
            )
            .await
        } else {
            let at = Deadline {
                at: deadline,
                limit,
            };
            each_statement(client, ready, &service, query, &verdicts, at, &mut slot).await
        };
        // Planning reads the files' footers: a damaged one is found and named here too.
        let responses = match responses {
            Ok(r) => r,
            Err(e) => return Err(checks.damage_found(e).await),
        };
        checks.notify(client).await?;
        Ok(responses
            .into_iter()
            .map(|r| guard(r, slot.clone(), deadline, limit, max_bytes, checks.clone()))
            .collect())
    }
}

/// When a statement's time is up.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: tokio::time::Instant,
    limit: Duration,
}

/// Runs the statements of a simple query one at a time: when it declares or closes cursors,
/// fetches, or carries session `SET`s the engine ignores. Cursor statements get their slots
/// (`CursorSlots`); the queries share one slot, taken at the first of them.
async fn each_statement<C>(
    client: &mut C,
    ready: &session::Ready,
    service: &Arc<datafusion_postgres::DfSessionService>,
    query: &str,
    verdicts: &[Verdict],
    at: Deadline,
    slot: &mut Option<Arc<gpuwatch_query::engine::QuerySlot>>,
) -> PgWireResult<Vec<Response>>
where
    C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
    C::PortalStore: PortalStore,
    C::Error: fmt::Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let (deadline, limit) = (at.at, at.limit);
    let statements = ready
        .parser
        .parse(query)
        .map_err(|e| error("ERROR", "42601", lower_first(&e.to_string())))?;
    let mut out = Vec::new();
    for (statement, verdict) in statements.iter().zip(verdicts) {
        let sql = statement.to_string();
        let service = service.as_ref();
        match verdict {
            Verdict::IgnoredSet => {
                out.push(Response::Execution(pgwire::api::results::Tag::new("SET")));
            }
            // Rows a cursor has read on are the client's: a FETCH is not cut off half way.
            Verdict::Fetch => {
                out.extend(SimpleQueryHandler::do_query(service, client, &sql).await?);
            }
            Verdict::Declare(name) => {
                let cursors = CursorSlots::of(client.session_extensions());
                let own = cursors
                    .take(name, &ready.engine)
                    .map_err(|e| engine_error(&e))?;
                let r = within(
                    deadline,
                    limit,
                    SimpleQueryHandler::do_query(service, client, &sql),
                )
                .await;
                cursors.settle(name.clone(), own, has_portal(client, name));
                out.extend(r?);
            }
            Verdict::Close => {
                let r = within(
                    deadline,
                    limit,
                    SimpleQueryHandler::do_query(service, client, &sql),
                )
                .await;
                sweep_cursors(client);
                out.extend(r?);
            }
            Verdict::Query | Verdict::Session => {
                // The queries of a simple query share one slot, taken at the first of them
                // (after the cursors closed before it).
                if *verdict == Verdict::Query && slot.is_none() {
                    *slot = Some(Arc::new(
                        ready.engine.try_slot().map_err(|e| engine_error(&e))?,
                    ));
                }
                out.extend(
                    within(
                        deadline,
                        limit,
                        SimpleQueryHandler::do_query(service, client, &sql),
                    )
                    .await?,
                );
            }
        }
    }
    Ok(out)
}

type DfStatement = (String, Option<(Sql, LogicalPlan)>);

/// The extended-protocol parser: the gate, then `datafusion-postgres`'s parser and planner.
pub(crate) struct GatedParser {
    shared: Arc<Shared>,
}

#[async_trait]
impl QueryParser for GatedParser {
    type Statement = DfStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let rewritten = rewrite::rewrite(sql);
        let sql: &str = &rewritten;
        let ready = self.shared.ready()?;
        let verdicts = admit_all(&ready.parser, sql)?;
        if verdicts.len() > 1 {
            return Err(error(
                "ERROR",
                "42601",
                "cannot insert multiple commands into a prepared statement",
            ));
        }
        if verdicts.first() == Some(&Verdict::IgnoredSet) {
            // Planned as an empty statement; executing it answers SET and changes nothing.
            return Ok(Some((sql.to_owned(), None)));
        }
        let inner = ExtendedQueryHandler::query_parser(ready.service.as_ref());
        inner.parse_sql(client, sql, types).await.map_err(classify)
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        let ready = self.shared.ready()?;
        ExtendedQueryHandler::query_parser(ready.service.as_ref()).get_parameter_types(stmt)
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        column_format: Option<&pgwire::api::portal::Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let ready = self.shared.ready()?;
        ExtendedQueryHandler::query_parser(ready.service.as_ref())
            .get_result_schema(stmt, column_format)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Front {
    type Statement = DfStatement;
    type QueryParser = GatedParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::clone(&self.parser)
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: fmt::Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let ready = self.shared.ready()?;
        let verdict = match &portal.statement.statement.1 {
            None => {
                let sql = &portal.statement.statement.0;
                if sql.trim().is_empty() {
                    return Ok(Response::EmptyQuery);
                }
                return Ok(Response::Execution(pgwire::api::results::Tag::new("SET")));
            }
            Some((statement, _)) => admit(statement).map_err(|e| engine_error(&e))?,
        };
        let checks = Checks::new(&ready.engine);
        let service = ready.session(
            client.session_extensions(),
            (verdict == Verdict::Query).then(|| time_limit(client, &ready.engine)),
            &checks.notes,
        )?;
        sweep_cursors(client);
        match verdict {
            Verdict::Query => {}
            Verdict::Declare(name) => {
                // The cursor's slot (see `CursorSlots`).
                let cursors = CursorSlots::of(client.session_extensions());
                let own = cursors
                    .take(&name, &ready.engine)
                    .map_err(|e| engine_error(&e))?;
                let r = ExtendedQueryHandler::do_query(service.as_ref(), client, portal, max_rows)
                    .await;
                let opened = has_portal(client, &name);
                cursors.settle(name, own, opened);
                return r.map_err(classify);
            }
            _ => {
                let r = ExtendedQueryHandler::do_query(service.as_ref(), client, portal, max_rows)
                    .await;
                sweep_cursors(client);
                return r.map_err(classify);
            }
        }
        let slot = Arc::new(ready.engine.try_slot().map_err(|e| engine_error(&e))?);
        let limit = time_limit(client, &ready.engine);
        let deadline = tokio::time::Instant::now() + limit;
        match tokio::time::timeout_at(
            deadline,
            ExtendedQueryHandler::do_query(service.as_ref(), client, portal, max_rows),
        )
        .await
        {
            Ok(r) => {
                let r = match r {
                    Ok(r) => r,
                    Err(e) => return Err(checks.damage_found(e).await),
                };
                checks.notify(client).await?;
                Ok(guard(
                    r,
                    Some(slot),
                    deadline,
                    limit,
                    ready.engine.max_answer_bytes().unwrap_or(usize::MAX),
                    checks,
                ))
            }
            Err(_) => Err(engine_error(&Error::Timeout(limit))),
        }
    }
}

struct LogErrors;

impl ErrorHandler for LogErrors {
    fn on_error<C: ClientInfo>(&self, client: &C, error: &mut PgWireError) {
        tracing::debug!(client = %client.socket_addr(), error = %error, "postgres error sent");
    }
}

/// Everything `pgwire` asks of a server, for one listener.
pub(crate) struct Handlers {
    front: Arc<Front>,
    cancel: Arc<DefaultCancelHandler>,
}

impl Handlers {
    /// Handlers over `engine`, checking passwords with `auth` when set, refusing plain
    /// connections when `require_tls`.
    pub(crate) fn new(
        engine: EngineSlot,
        auth: Option<Arc<dyn PasswordCheck>>,
        require_tls: bool,
    ) -> Self {
        let front = Arc::new(Front::new(engine, auth, require_tls));
        let cancel = Arc::new(DefaultCancelHandler::new(Arc::clone(
            &front.shared.connections,
        )));
        Self { front, cancel }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::clone(&self.front)
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::clone(&self.front)
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::clone(&self.front)
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::clone(&self.cancel)
    }
}

/// Serves the Postgres protocol on `listener` until `shutdown` changes.
pub(crate) fn serve(
    listener: TcpListener,
    engine: EngineSlot,
    options: PgOptions,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let handlers = Arc::new(Handlers::new(engine, options.auth, options.tls.is_some()));
    let tls = options.tls;
    let executor = options.executor;
    let conns = options.conns;
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.changed() => return,
            };
            let (socket, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "postgres listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = socket.set_nodelay(true);
            let slot = conns.as_ref().map(|c| c.admit(&socket));
            let handlers = Arc::clone(&handlers);
            let tls = tls.clone();
            executor.spawn(async move {
                let _slot = slot;
                if let Err(e) = pgwire::tokio::process_socket(socket, tls, handlers).await {
                    tracing::debug!(peer = %peer, error = %e, "postgres connection ended with an error");
                }
            });
        }
    })
}
