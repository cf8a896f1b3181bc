//! The PostgreSQL wire protocol front end (`--pg-addr`): psql, Grafana's PostgreSQL data source,
//! and any other Postgres client read the same tables as the HTTP SQL API.
//!
//! Data flow: a connection is accepted (TLS negotiated when configured), the startup handler
//! checks the password when tokens are configured, then each statement is parsed by the
//! Postgres-compatible parser of `datafusion-postgres`, passed through the same read-only gate as
//! HTTP ([`crate::gate::check_parsed`]) plus the few session statements Postgres clients send
//! (`SET`, `BEGIN`/`COMMIT`), and executed by `datafusion-postgres` over a session that shares
//! the engine's tables and adds a `pg_catalog` schema (for `\dt`, `\d` and Grafana's table
//! lists) and an `information_schema` that names types as Postgres does
//! ([`crate::pg_information_schema`]). Every query, and every open cursor until it is closed
//! ([`CursorSlots`]), takes one of the engine's `--max-concurrent-queries` slots; a query is cut
//! off at `--query-timeout` (or the client's lower `statement_timeout`) and, as over HTTP, runs
//! with a memory pool of its own of `--query-memory-limit` bytes ([`Ready::session`]).
//! DataFusion's errors become Postgres errors with a SQLSTATE ([`sqlstate`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::catalog::information_schema::INFORMATION_SCHEMA;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{Set, Statement as Sql};
use datafusion_postgres::DfSessionService;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
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
    RandomPidSecretKeyGenerator, SessionExtensions, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{Error, lower_first};
use crate::http::EngineSlot;
use crate::pg_information_schema::PgInformationSchema;
use crate::{QueryEngine, gate};

pub use pgwire::tokio::tokio_rustls::TlsAcceptor;

/// The database (DataFusion catalog) name clients see, e.g. in `current_database()`.
pub const DATABASE: &str = "gpuwatch";

/// Why a password is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// Not a configured token (SQLSTATE 28P01).
    InvalidPassword,
    /// A valid token that may not run queries (SQLSTATE 28000), with the reason.
    NotAllowed(String),
}

/// Checks the password a client sends at startup: the server's bearer tokens.
pub trait PasswordCheck: Send + Sync + fmt::Debug {
    /// `Ok` when `password` lets `user` run queries.
    fn check(&self, user: &str, password: &str) -> Result<(), Denied>;
}

/// How the Postgres listener runs.
#[derive(Clone, Default)]
pub struct PgOptions {
    /// When set, clients log in with a cleartext password checked here; otherwise anyone
    /// reaching the listener is let in (the server only binds loopback then).
    pub auth: Option<Arc<dyn PasswordCheck>>,
    /// TLS for `sslmode=require` clients, then required of every client; `None`: plain
    /// connections only.
    pub tls: Option<TlsAcceptor>,
}

impl fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOptions")
            .field("auth", &self.auth.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

fn error(severity: &str, code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        severity.to_owned(),
        code.to_owned(),
        message.into(),
    )))
}

/// The SQLSTATE of a DataFusion error.
pub fn sqlstate(e: &DataFusionError) -> &'static str {
    let root = e.find_root();
    let text = root.to_string().to_ascii_lowercase();
    match root {
        DataFusionError::SQL(..) => "42601",
        DataFusionError::SchemaError(inner, _) => match inner.as_ref() {
            datafusion::common::SchemaError::FieldNotFound { .. } => "42703",
            datafusion::common::SchemaError::AmbiguousReference { .. } => "42702",
            _ => "42P18",
        },
        DataFusionError::Plan(_) if text.contains("table") && text.contains("not found") => "42P01",
        DataFusionError::Plan(_)
            if text.contains("invalid function")
                || text.contains("function") && text.contains("not found") =>
        {
            "42883"
        }
        DataFusionError::Plan(_) if text.contains("no field named") => "42703",
        DataFusionError::Plan(_) => "42804",
        DataFusionError::NotImplemented(_) => "0A000",
        DataFusionError::ResourcesExhausted(_) => "53200",
        DataFusionError::ArrowError(inner, _) => match inner.as_ref() {
            arrow::error::ArrowError::DivideByZero => "22012",
            arrow::error::ArrowError::ArithmeticOverflow(_) => "22003",
            arrow::error::ArrowError::CastError(_) | arrow::error::ArrowError::ParseError(_) => {
                "22P02"
            }
            arrow::error::ArrowError::ComputeError(_)
            | arrow::error::ArrowError::InvalidArgumentError(_) => "22023",
            _ => "XX000",
        },
        DataFusionError::Execution(_) if text.contains("divide by zero") => "22012",
        DataFusionError::Execution(_) => "22000",
        _ => "XX000",
    }
}

/// A query engine error as a Postgres error.
fn engine_error(e: &Error) -> PgWireError {
    let code = match e {
        Error::BadRequest(_) | Error::BadSql(_) => "42601",
        Error::NotAllowed(_) => "42501",
        Error::Timeout(_) => "57014",
        Error::ResourcesExhausted(_) => "53200",
        Error::Busy(_) => "53000",
        Error::NotReady => "57P03",
        Error::Internal(_) => "XX000",
    };
    error("ERROR", code, e.to_string())
}

/// Gives errors from `datafusion-postgres` (DataFusion and parser errors, wrapped as
/// `ApiError`, which would all read XX000) their SQLSTATE and a lowercase message.
fn classify(e: PgWireError) -> PgWireError {
    let inner = match e {
        PgWireError::ApiError(inner) => inner,
        PgWireError::UserError(info)
            if info.code == "XX000" && info.message.contains("Unsupported Datatype") =>
        {
            return unsupported_type(&info.message);
        }
        other => return other,
    };
    if let Some(df) = inner.downcast_ref::<DataFusionError>() {
        let message = lower_first(df.find_root().to_string().trim());
        let code = sqlstate(df);
        if code == "53200" {
            // The words the HTTP API answers with.
            return engine_error(&Error::out_of_memory(&message));
        }
        return error("ERROR", code, message);
    }
    if let Some(p) = inner.downcast_ref::<datafusion::sql::sqlparser::parser::ParserError>() {
        return error("ERROR", "42601", lower_first(&p.to_string()));
    }
    let text = inner.to_string();
    if text.contains("Unsupported Datatype") {
        return unsupported_type(&text);
    }
    error("ERROR", "XX000", lower_first(&text))
}

/// A column whose Arrow type has no Postgres counterpart here (maps).
fn unsupported_type(text: &str) -> PgWireError {
    error(
        "ERROR",
        "0A000",
        format!(
            "{}: this column type cannot be sent over the postgres protocol; select single map entries such as labels['host']",
            lower_first(text)
        ),
    )
}

/// Session variables `datafusion-postgres` keeps per connection; every other `SET` is accepted
/// and ignored, except DataFusion's own settings, which would change the shared session.
const SESSION_SETTINGS: &[&str] = &[
    "statement_timeout",
    "datestyle",
    "bytea_output",
    "intervalstyle",
    "application_name",
    "extra_float_digits",
    "search_path",
];

/// What the front end does with a statement.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A query: runs under a slot and the time limit.
    Query,
    /// A session statement handled without touching the data (SET, BEGIN, SHOW).
    Session,
    /// `FETCH`: reads on under the slot its cursor holds, not bound by the time limit.
    Fetch,
    /// A `SET` of something the session does not keep: answered `SET`, changes nothing.
    IgnoredSet,
    /// `DECLARE name CURSOR FOR <gated query>`: the cursor holds a slot until it is closed
    /// ([`CursorSlots`]).
    Declare(String),
    /// `CLOSE name` or `CLOSE ALL`: frees the slots of the cursors it closes.
    Close,
}

/// The read-only gate, as the Postgres front end applies it.
fn admit(statement: &Sql) -> Result<Verdict, Error> {
    match statement {
        Sql::Set(set) => match set {
            Set::SetTimeZone { .. } => Ok(Verdict::IgnoredSet),
            Set::SingleAssignment { variable, .. } => {
                let name = variable.to_string().to_ascii_lowercase();
                if name.starts_with("datafusion.") {
                    Err(Error::NotAllowed(format!(
                        "statement SET {name} is not allowed: DataFusion settings are fixed by the server"
                    )))
                } else if SESSION_SETTINGS.contains(&name.as_str()) {
                    Ok(Verdict::Session)
                } else {
                    Ok(Verdict::IgnoredSet)
                }
            }
            _ => Ok(Verdict::IgnoredSet),
        },
        Sql::StartTransaction { .. } | Sql::Commit { .. } | Sql::Rollback { .. } => {
            Ok(Verdict::Session)
        }
        Sql::ShowVariable { .. } => Ok(Verdict::Session),
        Sql::Declare { stmts } => {
            for d in stmts {
                if let Some(q) = &d.for_query {
                    gate::check_parsed(&Sql::Query(q.clone()))?;
                }
            }
            // `datafusion-postgres` names the cursor after the first name of each DECLARE; the
            // Postgres grammar has one DECLARE with one name per statement.
            match stmts.as_slice() {
                [one] => Ok(Verdict::Declare(
                    one.names
                        .first()
                        .map(|n| n.value.clone())
                        .unwrap_or_default(),
                )),
                _ => Err(Error::BadSql(
                    "declare one cursor per DECLARE statement".to_string(),
                )),
            }
        }
        Sql::Fetch { .. } => Ok(Verdict::Fetch),
        Sql::Close { .. } => Ok(Verdict::Close),
        other => {
            gate::check_parsed(other)?;
            Ok(Verdict::Query)
        }
    }
}

/// Parses `sql` as the executing parser will, and runs every statement through the gate.
fn admit_all(parser: &PostgresCompatibilityParser, sql: &str) -> PgWireResult<Vec<Verdict>> {
    let statements = parser
        .parse(sql)
        .map_err(|e| error("ERROR", "42601", lower_first(&e.to_string())))?;
    statements
        .iter()
        .map(|s| admit(s).map_err(|e| engine_error(&e)))
        .collect()
}

/// The per-process state behind every connection, built when the engine is ready.
struct Ready {
    engine: QueryEngine,
    /// Parses and plans every statement; runs them too when there is no memory limit.
    service: Arc<DfSessionService>,
    /// The session state every statement's own session is made from (tables, functions,
    /// `pg_catalog`, `information_schema`; the engine's runtime).
    state: SessionState,
    parser: PostgresCompatibilityParser,
}

impl Ready {
    /// The session a connection's next statement runs in. With `--query-memory-limit`, the
    /// connection's own session, its state made afresh from [`Ready::statement_state`] for each
    /// statement: the statement's memory pool is its alone, as each HTTP query's is, so one
    /// query cannot starve the queries of other connections, and a cursor left open does not
    /// take from the next statement of its own connection. Without a limit, the shared
    /// session. Costs (debug build): about 0.3 ms a statement, as over HTTP, plus about 1.5 ms
    /// at a connection's first statement for its service; a session made from scratch (with
    /// its own `pg_catalog`) would cost about 60 ms.
    fn session(&self, extensions: &SessionExtensions) -> PgWireResult<Arc<DfSessionService>> {
        let Some(state) = self.statement_state().map_err(|e| engine_error(&e))? else {
            return Ok(Arc::clone(&self.service));
        };
        if let Some(own) = extensions.get::<ConnectionSession>() {
            // A connection runs one statement at a time: nothing else uses its state now. A
            // statement still streaming (an open cursor) keeps the runtime it started with.
            *own.ctx.state_ref().write() = state;
            return Ok(Arc::clone(&own.service));
        }
        // Made once per connection: the service parses its rewrite rules when made.
        let ctx = Arc::new(SessionContext::new_with_state(state));
        let service = Arc::new(DfSessionService::new(Arc::clone(&ctx)));
        extensions.insert(ConnectionSession {
            ctx,
            service: Arc::clone(&service),
        });
        Ok(service)
    }

    /// The state of one statement's session: the shared state with a runtime whose memory pool
    /// of `--query-memory-limit` bytes is the statement's own (the engine's object stores,
    /// caches and spill directory otherwise). Made from a copy of the shared state, not from
    /// scratch: `pg_catalog`'s tables and the function registries are shared. `None` without a
    /// memory limit.
    fn statement_state(&self) -> Result<Option<SessionState>, Error> {
        let Some(limit) = self.engine.memory_limit() else {
            return Ok(None);
        };
        let runtime = crate::engine::own_pool(self.state.runtime_env(), limit)?;
        Ok(Some(
            SessionStateBuilder::new_from_existing(self.state.clone())
                .with_runtime_env(runtime)
                .build(),
        ))
    }
}

/// A connection's session when statements have a memory limit (in its session extensions).
struct ConnectionSession {
    ctx: Arc<SessionContext>,
    service: Arc<DfSessionService>,
}

/// The query slots of a connection's open cursors, by cursor name (in its session extensions,
/// so they are freed when the connection ends). A cursor's stream runs whenever it is fetched
/// from and keeps its memory (a hash table, a sort) while it is open: it counts against
/// `--max-concurrent-queries` from its `DECLARE` until it is closed, and its `FETCH`es run
/// under its slot. A cursor's slot is kept while the connection's portal store holds a portal of
/// its name (looked at after each `DECLARE` and `CLOSE`, and before each statement), so every
/// way a cursor goes (`CLOSE name`, `CLOSE ALL`, the connection's end) frees its slot; a
/// `DECLARE` that replaces a cursor takes over its slot. `COMMIT` and `ROLLBACK` leave cursors
/// open, as `datafusion-postgres` does.
#[derive(Default)]
struct CursorSlots(Mutex<HashMap<String, crate::engine::QuerySlot>>);

impl CursorSlots {
    fn of(extensions: &SessionExtensions) -> Arc<Self> {
        extensions.get_or_insert_with(Self::default)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, crate::engine::QuerySlot>> {
        // A panic while the map was locked leaves it consistent (inserts and removals only).
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot a `DECLARE` of `name` runs under: the slot of the cursor of that name it
    /// replaces, otherwise a free one (refused with [`Error::Busy`] when there is none).
    fn take(&self, name: &str, engine: &QueryEngine) -> Result<crate::engine::QuerySlot, Error> {
        if let Some(slot) = self.slots().remove(name) {
            return Ok(slot);
        }
        engine.try_slot()
    }

    /// After a `DECLARE` of `name` ran under `slot`: the slot stays with the cursor when the
    /// cursor is open (`opened`: the portal store holds it; a failed `DECLARE` that would have
    /// replaced a cursor leaves that one open), and is freed otherwise.
    fn settle(&self, name: String, slot: crate::engine::QuerySlot, opened: bool) {
        if opened {
            self.slots().insert(name, slot);
        }
    }

    /// Frees the slots of cursors that are no longer open (`open` says which are).
    fn sweep(&self, open: impl Fn(&str) -> bool) {
        self.slots().retain(|name, _| open(name));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots().len()
    }
}

/// Whether the connection's portal store holds a portal named `name`.
fn has_portal<C: ClientPortalStore>(client: &C, name: &str) -> bool
where
    C::PortalStore: PortalStore,
{
    client.portal_store().get_portal(name).is_some()
}

/// Frees the slots of the connection's cursors that are gone from its portal store.
fn sweep_cursors<C: ClientInfo + ClientPortalStore>(client: &C)
where
    C::PortalStore: PortalStore,
{
    if let Some(cursors) = client.session_extensions().get::<CursorSlots>() {
        cursors.sweep(|name| has_portal(client, name));
    }
}

/// Builds the session the Postgres front end plans in: the engine's tables (the same schema
/// object, so the same data), a `pg_catalog`, an `information_schema` with Postgres type names,
/// over the engine's runtime (object stores, caches).
fn build(engine: &QueryEngine) -> Result<Ready, String> {
    let base = engine.context();
    // DataFusion's own information_schema is replaced by the one registered below.
    let config = base.copied_config().with_information_schema(false);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(base.runtime_env())
        .with_default_features()
        // The engine's own physical rules (the run aggregation among them), not a copy of them.
        .with_physical_optimizer_rules(base.state().physical_optimizers().to_vec())
        .build();
    let ctx = SessionContext::new_with_state(state);
    let catalog = base
        .catalog(DATABASE)
        .ok_or_else(|| format!("catalog {DATABASE} missing"))?;
    let public = catalog
        .schema("public")
        .ok_or_else(|| "schema public missing".to_string())?;
    let own = ctx
        .catalog(DATABASE)
        .ok_or_else(|| format!("catalog {DATABASE} missing in the postgres session"))?;
    own.register_schema("public", public)
        .map_err(|e| e.to_string())?;
    crate::pg_functions::register(&ctx);
    // The same time-series aggregates as over HTTP.
    ctx.register_udaf(crate::udf::increase());
    ctx.register_udaf(crate::udf::rate());
    setup_pg_catalog(&ctx, DATABASE, EmptyContextProvider).map_err(|e| e.to_string())?;
    let state = ctx.state();
    let information_schema = PgInformationSchema::new(
        Arc::clone(state.catalog_list()),
        state.table_functions().clone(),
    );
    own.register_schema(INFORMATION_SCHEMA, Arc::new(information_schema))
        .map_err(|e| e.to_string())?;
    let service = Arc::new(DfSessionService::new(Arc::new(ctx)));
    Ok(Ready {
        engine: engine.clone(),
        service,
        state,
        parser: PostgresCompatibilityParser::new(),
    })
}

/// State shared by the handlers of every connection.
struct Shared {
    engine: EngineSlot,
    ready: OnceLock<Result<Ready, String>>,
    auth: Option<Arc<dyn PasswordCheck>>,
    require_tls: bool,
    connections: Arc<ConnectionManager>,
    keys: RandomPidSecretKeyGenerator,
}

impl Shared {
    fn ready(&self) -> PgWireResult<&Ready> {
        let result = match self.ready.get() {
            Some(r) => r,
            None => {
                let Some(engine) = self.engine.get() else {
                    return Err(engine_error(&Error::NotReady));
                };
                self.ready.get_or_init(|| {
                    let r = build(engine);
                    if let Err(e) = &r {
                        tracing::error!(error = %e, "cannot build the postgres session");
                    }
                    r
                })
            }
        };
        result.as_ref().map_err(|e| {
            error(
                "FATAL",
                "XX000",
                format!("postgres front end unavailable: {e}"),
            )
        })
    }
}

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

/// Holds a query's slot until its rows are sent, stops it at the deadline, and classifies
/// errors raised while rows stream.
fn guard(
    response: Response,
    slot: Option<Arc<crate::engine::QuerySlot>>,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> Response {
    let Response::Query(mut q) = response else {
        return response;
    };
    let rows = std::mem::replace(&mut q.data_rows, Box::pin(futures::stream::empty()));
    let stream = futures::stream::unfold(
        (rows, slot, false),
        move |(mut rows, slot, done)| async move {
            if done {
                return None;
            }
            match tokio::time::timeout_at(deadline, rows.next()).await {
                Ok(Some(Ok(row))) => Some((Ok(row), (rows, slot, false))),
                Ok(Some(Err(e))) => Some((Err(classify(e)), (rows, None, true))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(engine_error(&Error::Timeout(limit))),
                    (rows, None, true),
                )),
            }
        },
    );
    q.data_rows = Box::pin(stream);
    Response::Query(q)
}

/// The handlers of one listener.
pub struct Front {
    shared: Arc<Shared>,
    parser: Arc<GatedParser>,
}

impl Front {
    /// Handlers over the engine in `engine` (set once the store is open).
    pub fn new(
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
    p.server_version = crate::pg_functions::SERVER_VERSION.to_owned();
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
        let rewritten = crate::pg_rewrite::rewrite(query);
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
        let service = ready.session(client.session_extensions())?;
        let limit = time_limit(client, &ready.engine);
        let deadline = tokio::time::Instant::now() + limit;
        let responses = if !one_at_a_time {
            within(
                deadline,
                limit,
                SimpleQueryHandler::do_query(service.as_ref(), client, query),
            )
            .await
        } else {
            let run = async {
                let statements = ready
                    .parser
                    .parse(query)
                    .map_err(|e| error("ERROR", "42601", lower_first(&e.to_string())))?;
                let mut out = Vec::new();
                for (statement, verdict) in statements.iter().zip(&verdicts) {
                    let sql = statement.to_string();
                    let service = service.as_ref();
                    match verdict {
                        Verdict::IgnoredSet => {
                            out.push(Response::Execution(pgwire::api::results::Tag::new("SET")));
                        }
                        // Rows a cursor has read on are the client's: a FETCH is not cut off
                        // half way.
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
                            // The queries of a simple query share one slot, taken at the first
                            // of them (after the cursors closed before it).
                            if *verdict == Verdict::Query && slot.is_none() {
                                slot = Some(Arc::new(
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
            };
            run.await
        }
        .map_err(classify)?;
        Ok(responses
            .into_iter()
            .map(|r| guard(r, slot.clone(), deadline, limit))
            .collect())
    }
}

type DfStatement = (String, Option<(Sql, LogicalPlan)>);

/// The extended-protocol parser: the gate, then `datafusion-postgres`'s parser and planner.
pub struct GatedParser {
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
        let rewritten = crate::pg_rewrite::rewrite(sql);
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
        let service = ready.session(client.session_extensions())?;
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
            Ok(r) => Ok(guard(r.map_err(classify)?, Some(slot), deadline, limit)),
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
pub struct Handlers {
    front: Arc<Front>,
    cancel: Arc<DefaultCancelHandler>,
}

impl Handlers {
    /// Handlers over `engine`, checking passwords with `auth` when set, refusing plain
    /// connections when `require_tls`.
    pub fn new(
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
pub fn serve(
    listener: TcpListener,
    engine: EngineSlot,
    options: PgOptions,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let handlers = Arc::new(Handlers::new(engine, options.auth, options.tls.is_some()));
    let tls = options.tls;
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
            let handlers = Arc::clone(&handlers);
            let tls = tls.clone();
            tokio::spawn(async move {
                if let Err(e) = pgwire::tokio::process_socket(socket, tls, handlers).await {
                    tracing::debug!(peer = %peer, error = %e, "postgres connection ended with an error");
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(sql: &str) -> Result<Verdict, Error> {
        let parser = PostgresCompatibilityParser::new();
        let statements = parser.parse(sql).expect("parses");
        assert_eq!(statements.len(), 1, "{sql}");
        admit(&statements[0])
    }

    #[test]
    fn the_gate_applies_to_postgres_statements() {
        for sql in [
            "SELECT 1",
            "SELECT * FROM gpu_metrics",
            "SELECT c.relname FROM pg_catalog.pg_class c",
            "EXPLAIN SELECT 1",
        ] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Query, "{sql}");
        }
        for sql in [
            "SET statement_timeout = 1000",
            "SET application_name = 'psql'",
            "BEGIN",
            "COMMIT",
            "SHOW server_version",
        ] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Session, "{sql}");
        }
        for sql in ["FETCH NEXT FROM c", "FETCH 10 FROM c", "FETCH ALL FROM c"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Fetch, "{sql}");
        }
        assert_eq!(
            verdict("DECLARE c CURSOR FOR SELECT 1").expect("declare"),
            Verdict::Declare("c".to_string())
        );
        assert_eq!(
            verdict("DECLARE \"Big\" CURSOR FOR SELECT 1").expect("declare"),
            Verdict::Declare("Big".to_string())
        );
        for sql in ["CLOSE c", "CLOSE ALL"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::Close, "{sql}");
        }
        for sql in ["SET client_encoding = 'UTF8'", "SET TIME ZONE 'UTC'"] {
            assert_eq!(verdict(sql).expect(sql), Verdict::IgnoredSet, "{sql}");
        }
        for sql in [
            "INSERT INTO gpu_metrics (host) VALUES ('x')",
            "CREATE TABLE t AS SELECT 1",
            "DROP TABLE gpu_metrics",
            "COPY gpu_metrics TO '/tmp/x.csv'",
            "SET datafusion.execution.target_partitions = 1",
            "DECLARE c CURSOR FOR SELECT * FROM '/etc/passwd'",
            "SELECT * FROM read_parquet('/tmp/x.parquet')",
            "DELETE FROM gpu_metrics",
        ] {
            match verdict(sql) {
                Err(Error::NotAllowed(msg)) => assert!(msg.contains("not allowed"), "{msg}"),
                other => panic!("{sql}: expected a refusal, got {other:?}"),
            }
        }
    }

    #[derive(Debug)]
    struct NoRows;

    impl gpuwatch_store::ReadStore for NoRows {
        fn snapshot(&self, _: gpuwatch_store::schema::Table) -> gpuwatch_store::TableSnapshot {
            gpuwatch_store::TableSnapshot {
                batches: Vec::new(),
                files: Vec::new(),
            }
        }
    }

    fn ready(memory_limit: Option<usize>) -> Ready {
        let engine = QueryEngine::new(
            Arc::new(NoRows),
            crate::EngineConfig {
                memory_limit,
                ..crate::EngineConfig::default()
            },
        )
        .expect("engine");
        build(&engine).expect("postgres session")
    }

    async fn texts(ctx: &SessionContext, sql: &str) -> Vec<Vec<String>> {
        let batches = ctx.sql(sql).await.expect(sql).collect().await.expect(sql);
        let mut rows = Vec::new();
        for b in &batches {
            let columns: Vec<_> = b
                .columns()
                .iter()
                .map(|c| arrow::compute::cast(c, &arrow::datatypes::DataType::Utf8).expect("text"))
                .collect();
            for i in 0..b.num_rows() {
                rows.push(
                    columns
                        .iter()
                        .map(|c| {
                            arrow::array::AsArray::as_string::<i32>(c.as_ref())
                                .value(i)
                                .to_string()
                        })
                        .collect(),
                );
            }
        }
        rows
    }

    /// Each statement's memory pool is its own and as large as the limit, whichever connection
    /// it comes from; the caches, spill directory and object stores are the engine's.
    #[tokio::test]
    async fn each_statement_gets_a_memory_pool_of_its_own() {
        use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
        let limit = 1 << 20;
        let share = limit * 6 / 10;
        let ready = ready(Some(limit));
        // The session of a connection's next statement.
        let next = |connection: &SessionExtensions| -> Arc<SessionContext> {
            ready.session(connection).expect("session");
            Arc::clone(
                &connection
                    .get::<ConnectionSession>()
                    .expect("the connection's session")
                    .ctx,
            )
        };
        let (one, two) = (SessionExtensions::new(), SessionExtensions::new());
        // A statement of connection one holds 60% of the limit (as a cursor left open does).
        let first = next(&one);
        let first_pool: Arc<dyn MemoryPool> = Arc::clone(&first.runtime_env().memory_pool);
        let held = MemoryConsumer::new("held").register(&first_pool);
        held.try_grow(share).expect("60% of the limit fits");
        // So may a statement of connection two, and the next statement of connection one.
        for ctx in [next(&two), next(&one)] {
            let other = MemoryConsumer::new("other").register(&ctx.runtime_env().memory_pool);
            other
                .try_grow(share)
                .expect("another statement's 60% fits beside the first");
        }
        // One statement's pool holds no more than the limit.
        let more = MemoryConsumer::new("more").register(&first_pool);
        more.try_grow(share)
            .expect_err("120% of the limit in one statement's pool is refused");
        assert_eq!(first_pool.reserved(), share);

        // A connection's service is made once.
        assert!(Arc::ptr_eq(
            &ready.session(&one).expect("session"),
            &ready.session(&one).expect("session")
        ));
        let engine = ready.engine.context().runtime_env();
        let rt = next(&one).runtime_env();
        assert!(Arc::ptr_eq(&rt.cache_manager, &engine.cache_manager));
        assert!(Arc::ptr_eq(&rt.disk_manager, &engine.disk_manager));
        assert!(Arc::ptr_eq(
            &rt.object_store_registry,
            &engine.object_store_registry
        ));
        // The statement's session plans and runs like the shared one.
        let ctx = next(&two);
        assert_eq!(
            texts(&ctx, "SELECT count(*) FROM gpu_metrics").await,
            vec![vec!["0".to_string()]]
        );
        assert_eq!(
            texts(&ctx, "SELECT current_database(), pg_typeof(1.5)").await,
            vec![vec![DATABASE.to_string(), "double precision".to_string()]]
        );

        // Without a limit, statements run in the shared session.
        let unlimited = self::ready(None);
        let connection = SessionExtensions::new();
        assert!(Arc::ptr_eq(
            &unlimited.session(&connection).expect("session"),
            &unlimited.service
        ));
        assert!(connection.get::<ConnectionSession>().is_none());
    }

    /// An open cursor holds a slot: a DECLARE takes a free one or the one of the cursor it
    /// replaces; the slot is freed when the cursor is gone or the connection ends.
    #[test]
    fn open_cursors_hold_query_slots() {
        let engine = QueryEngine::new(
            Arc::new(NoRows),
            crate::EngineConfig {
                max_concurrent_queries: Some(1),
                ..crate::EngineConfig::default()
            },
        )
        .expect("engine");
        let connection = SessionExtensions::new();
        let cursors = CursorSlots::of(&connection);
        assert!(Arc::ptr_eq(&cursors, &CursorSlots::of(&connection)));

        let c = cursors.take("c", &engine).expect("a free slot");
        cursors.settle("c".to_string(), c, true);
        assert!(matches!(engine.try_slot(), Err(Error::Busy(1))));
        assert!(matches!(cursors.take("d", &engine), Err(Error::Busy(1))));
        // A DECLARE of c again runs under c's slot; when it fails, c stays open with it.
        let again = cursors.take("c", &engine).expect("c's own slot");
        assert_eq!(cursors.len(), 0);
        cursors.settle("c".to_string(), again, true);
        assert_eq!(cursors.len(), 1);
        assert!(matches!(engine.try_slot(), Err(Error::Busy(1))));
        // A DECLARE that opened nothing frees its slot.
        let d = cursors.take("c", &engine).expect("c's own slot");
        cursors.settle("c".to_string(), d, false);
        assert_eq!(cursors.len(), 0);
        drop(engine.try_slot().expect("free again"));

        // A sweep frees the slots of the cursors that are gone, and only those.
        let e = cursors.take("e", &engine).expect("a free slot");
        cursors.settle("e".to_string(), e, true);
        cursors.sweep(|name| name == "e");
        assert!(matches!(engine.try_slot(), Err(Error::Busy(1))));
        cursors.sweep(|_| false);
        drop(engine.try_slot().expect("free after the sweep"));

        // The connection's end frees its cursors' slots.
        let f = cursors.take("f", &engine).expect("a free slot");
        cursors.settle("f".to_string(), f, true);
        drop(cursors);
        assert!(matches!(engine.try_slot(), Err(Error::Busy(1))));
        drop(connection);
        drop(engine.try_slot().expect("free after the connection's end"));
    }

    /// `information_schema.columns` names types as Postgres does over this front end, and as
    /// DataFusion does over HTTP; the other information_schema tables and `SHOW` still work.
    #[tokio::test]
    async fn information_schema_gives_postgres_type_names() {
        let ready = ready(None);
        let ctx = SessionContext::new_with_state(ready.state.clone());
        let columns = texts(
            &ctx,
            "SELECT column_name, data_type, udt_name, ordinal_position FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = 'gpu_metrics' ORDER BY ordinal_position",
        )
        .await;
        let find = |name: &str| {
            columns
                .iter()
                .find(|r| r[0] == name)
                .unwrap_or_else(|| panic!("{name} missing in {columns:?}"))
                .clone()
        };
        assert_eq!(
            columns[0],
            ["time", "timestamp with time zone", "timestamptz", "1"]
        );
        assert_eq!(
            find("gpu_utilization")[1..3],
            ["double precision", "float8"]
        );
        assert_eq!(find("host")[1..3], ["text", "text"]);
        for row in &columns {
            assert!(
                !row[1].chars().next().is_some_and(char::is_uppercase) || row[1] == "USER-DEFINED",
                "an Arrow name: {row:?}"
            );
        }
        let labels = texts(
            &ctx,
            "SELECT data_type FROM information_schema.columns WHERE table_name = 'metrics' AND column_name = 'labels'",
        )
        .await;
        assert_eq!(labels, vec![vec!["USER-DEFINED".to_string()]]);

        // Over HTTP, DataFusion's names.
        let http = ready
            .engine
            .query("SELECT data_type FROM information_schema.columns WHERE table_name = 'gpu_metrics' AND column_name = 'time'")
            .await
            .expect("http information_schema");
        let http_type = arrow::array::AsArray::as_string::<i32>(http.batches[0].column(0).as_ref())
            .value(0)
            .to_string();
        assert!(http_type.starts_with("Timestamp("), "{http_type}");

        // information_schema lists its own tables once, and SHOW still finds its settings.
        let own = texts(
            &ctx,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'information_schema' AND table_name = 'columns'",
        )
        .await;
        assert_eq!(own.len(), 1, "{own:?}");
        let tables = texts(
            &ctx,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_name = 'gpu_metrics'",
        )
        .await;
        assert_eq!(tables.len(), 1, "{tables:?}");
        let shown = texts(&ctx, "SHOW datafusion.execution.time_zone").await;
        assert_eq!(shown.len(), 1, "{shown:?}");
    }

    /// Postgres clients get the same physical optimizer rules as HTTP, the run aggregation
    /// among them.
    #[test]
    fn plans_with_the_engines_physical_rules() {
        let ready = ready(None);
        let names = |rules: &[Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>]| {
            rules.iter().map(|r| r.name().to_string()).collect::<Vec<_>>()
        };
        let pg = names(ready.state.physical_optimizers());
        let http = names(ready.engine.context().state().physical_optimizers());
        assert!(pg.iter().any(|n| n == "run_aggregate"), "{pg:?}");
        assert_eq!(pg, http);
    }

    #[test]
    fn datafusion_errors_get_sqlstates() {
        let cases = [
            (
                DataFusionError::Plan("table 'gpuwatch.public.nope' not found".into()),
                "42P01",
            ),
            (
                DataFusionError::Plan("Invalid function 'nope'.".into()),
                "42883",
            ),
            (DataFusionError::NotImplemented("x".into()), "0A000"),
            (DataFusionError::ResourcesExhausted("x".into()), "53200"),
            (
                DataFusionError::ArrowError(Box::new(arrow::error::ArrowError::DivideByZero), None),
                "22012",
            ),
        ];
        for (e, code) in cases {
            assert_eq!(sqlstate(&e), code, "{e}");
        }
    }
}
