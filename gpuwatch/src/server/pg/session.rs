//! The session statements run in: built once over the engine, a memory pool of its own per
//! statement, and the query slots of open cursors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::catalog::information_schema::INFORMATION_SCHEMA;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::session_state::SessionState;
use datafusion::prelude::SessionContext;
use datafusion_postgres::DfSessionService;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use datafusion_postgres::pgwire::api::store::PortalStore;
use datafusion_postgres::pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionManager, RandomPidSecretKeyGenerator,
    SessionExtensions,
};
use datafusion_postgres::pgwire::error::PgWireResult;

use super::errors::{engine_error, error};
use super::information_schema::PgInformationSchema;
use super::{DATABASE, PasswordCheck};
use crate::server::sql::EngineSlot;
use gpuwatch_query::Error;
use gpuwatch_query::QueryEngine;
use gpuwatch_query::skipped::ScanNotes;

/// The per-process state behind every connection, built when the engine is ready.
pub(super) struct Ready {
    pub(super) engine: QueryEngine,
    /// Parses and plans every statement; runs them too when there is no memory limit.
    pub(super) service: Arc<DfSessionService>,
    /// The session state every statement's own session is made from (tables, functions,
    /// `pg_catalog`, `information_schema`; the engine's runtime).
    pub(super) state: SessionState,
    pub(super) parser: PostgresCompatibilityParser,
}

impl Ready {
    /// The session a connection's next statement runs in: the connection's own session, its
    /// state made afresh from [`Ready::statement_state`] for each statement, so that each
    /// statement has its own notes and, with `--query-memory-limit`, a memory pool of its own,
    /// as each HTTP query does: one query cannot starve the queries of other connections, and
    /// a cursor left open does not take from the next statement of its own connection. Costs
    /// (debug build): about 0.3 ms a statement, as over HTTP, plus about 1.5 ms at a
    /// connection's first statement for its service; a session made from scratch (with its own
    /// `pg_catalog`) would cost about 60 ms.
    /// `limit`: the statement's time limit, kept inside its plan ([`gpuwatch_query::deadline`]);
    /// `None` for cursors.
    pub(super) fn session(
        &self,
        extensions: &SessionExtensions,
        limit: Option<std::time::Duration>,
        notes: &Arc<ScanNotes>,
    ) -> PgWireResult<Arc<DfSessionService>> {
        let state = self
            .statement_state(limit, notes)
            .map_err(|e| engine_error(&e))?;
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

    /// The state of one statement's session: the shared state with the statement's time
    /// limit and its [`ScanNotes`] (what its scans leave out, sent as notices), and with
    /// `--query-memory-limit` a runtime whose memory pool (inside the ceiling's, when there is
    /// one) is the statement's own (the engine's object stores, caches and spill directory
    /// otherwise). Made from a copy of the shared state, not from scratch: `pg_catalog`'s
    /// tables and the function registries are shared.
    pub(super) fn statement_state(
        &self,
        limit: Option<std::time::Duration>,
        notes: &Arc<ScanNotes>,
    ) -> Result<SessionState, Error> {
        let mut builder = SessionStateBuilder::new_from_existing(self.state.clone());
        if let Some(pool) = self.engine.query_pool() {
            self.engine.admit()?;
            let runtime = gpuwatch_query::engine::own_pool(self.state.runtime_env(), pool)?;
            builder = builder.with_runtime_env(runtime);
        }
        let mut state = builder.build();
        if let Some(limit) = limit {
            state
                .config_mut()
                .set_extension(Arc::new(gpuwatch_query::deadline::Deadline::after(limit)));
        }
        state.config_mut().set_extension(Arc::clone(notes));
        Ok(state)
    }
}

/// A connection's session when statements have a memory limit (in its session extensions).
pub(super) struct ConnectionSession {
    pub(super) ctx: Arc<SessionContext>,
    pub(super) service: Arc<DfSessionService>,
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
pub(super) struct CursorSlots(Mutex<HashMap<String, gpuwatch_query::engine::QuerySlot>>);

impl CursorSlots {
    pub(super) fn of(extensions: &SessionExtensions) -> Arc<Self> {
        extensions.get_or_insert_with(Self::default)
    }

    fn slots(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, gpuwatch_query::engine::QuerySlot>> {
        // A panic while the map was locked leaves it consistent (inserts and removals only).
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot a `DECLARE` of `name` runs under: the slot of the cursor of that name it
    /// replaces, otherwise a free one (refused with [`Error::Busy`] when there is none).
    pub(super) fn take(
        &self,
        name: &str,
        engine: &QueryEngine,
    ) -> Result<gpuwatch_query::engine::QuerySlot, Error> {
        if let Some(slot) = self.slots().remove(name) {
            return Ok(slot);
        }
        engine.try_slot()
    }

    /// After a `DECLARE` of `name` ran under `slot`: the slot stays with the cursor when the
    /// cursor is open (`opened`: the portal store holds it; a failed `DECLARE` that would have
    /// replaced a cursor leaves that one open), and is freed otherwise.
    pub(super) fn settle(
        &self,
        name: String,
        slot: gpuwatch_query::engine::QuerySlot,
        opened: bool,
    ) {
        if opened {
            self.slots().insert(name, slot);
        }
    }

    /// Frees the slots of cursors that are no longer open (`open` says which are).
    pub(super) fn sweep(&self, open: impl Fn(&str) -> bool) {
        self.slots().retain(|name, _| open(name));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots().len()
    }
}

/// Whether the connection's portal store holds a portal named `name`.
pub(super) fn has_portal<C: ClientPortalStore>(client: &C, name: &str) -> bool
where
    C::PortalStore: PortalStore,
{
    client.portal_store().get_portal(name).is_some()
}

/// Frees the slots of the connection's cursors that are gone from its portal store.
pub(super) fn sweep_cursors<C: ClientInfo + ClientPortalStore>(client: &C)
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
pub(super) fn build(engine: &QueryEngine) -> Result<Ready, String> {
    let base = engine.context();
    // DataFusion's own information_schema is replaced by the one registered below.
    let config = base.copied_config().with_information_schema(false);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(base.runtime_env())
        .with_default_features()
        // The engine's own physical rules (the run aggregation among them), not a copy of them.
        // The engine's own rules: the run aggregation, and the deadline rule, whose limit each
        // statement's session sets (see `session`).
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
    super::functions::register(&ctx);
    // The same time-series aggregates as over HTTP.
    ctx.register_udaf(gpuwatch_query::udf::increase());
    ctx.register_udaf(gpuwatch_query::udf::rate());
    gpuwatch_query::bounded::register(&ctx, engine.max_value_bytes());
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
pub(super) struct Shared {
    pub(super) engine: EngineSlot,
    pub(super) ready: OnceLock<Result<Ready, String>>,
    pub(super) auth: Option<Arc<dyn PasswordCheck>>,
    pub(super) require_tls: bool,
    pub(super) connections: Arc<ConnectionManager>,
    pub(super) keys: RandomPidSecretKeyGenerator,
}

impl Shared {
    pub(super) fn ready(&self) -> PgWireResult<&Ready> {
        let result = match self.ready.get() {
            Some(r) => r,
            None => {
                let Some(engine) = self.engine.get() else {
                    return Err(engine_error(&Error::NotReady(
                        gpuwatch_store::startup::reason(),
                    )));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct NoRows;

    impl gpuwatch_store::ReadStore for NoRows {
        fn snapshot(&self, _: gpuwatch_store::schema::Table) -> gpuwatch_store::TableSnapshot {
            gpuwatch_store::TableSnapshot {
                batches: Vec::new(),
                files: Vec::new(),
                warnings: Vec::new(),
            }
        }
    }

    pub(super) fn ready(memory_limit: Option<usize>) -> Ready {
        let engine = QueryEngine::new(
            Arc::new(NoRows),
            gpuwatch_query::EngineConfig {
                memory_limit,
                ..gpuwatch_query::EngineConfig::default()
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
            ready
                .session(connection, None, &Arc::new(ScanNotes::default()))
                .expect("session");
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
        let notes = Arc::new(ScanNotes::default());
        assert!(Arc::ptr_eq(
            &ready.session(&one, None, &notes).expect("session"),
            &ready.session(&one, None, &notes).expect("session")
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

        // Without a limit, statements have a session of their own (for their notes) with the
        // engine's runtime and pool.
        let unlimited = self::ready(None);
        let connection = SessionExtensions::new();
        unlimited
            .session(&connection, None, &notes)
            .expect("session");
        let own = connection
            .get::<ConnectionSession>()
            .expect("the connection's session");
        assert!(Arc::ptr_eq(
            &own.ctx.runtime_env().memory_pool,
            &unlimited.engine.context().runtime_env().memory_pool
        ));
    }

    /// An open cursor holds a slot: a DECLARE takes a free one or the one of the cursor it
    /// replaces; the slot is freed when the cursor is gone or the connection ends.
    #[test]
    fn open_cursors_hold_query_slots() {
        let engine = QueryEngine::new(
            Arc::new(NoRows),
            gpuwatch_query::EngineConfig {
                max_concurrent_queries: Some(1),
                ..gpuwatch_query::EngineConfig::default()
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
        let names = |rules: &[Arc<
            dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync,
        >]| {
            rules
                .iter()
                .map(|r| r.name().to_string())
                .collect::<Vec<_>>()
        };
        let pg = names(ready.state.physical_optimizers());
        let http = names(ready.engine.context().state().physical_optimizers());
        assert!(pg.iter().any(|n| n == "run_aggregate"), "{pg:?}");
        // The same rules, the statement deadline's last.
        assert_eq!(pg.last().map(String::as_str), Some("deadline"));
        assert_eq!(pg, http);
    }

    /// A statement's time limit is kept inside its plan: a join that never yields stops with
    /// the deadline error; a statement without a limit (a cursor) has none.
    #[tokio::test]
    async fn statements_stop_at_their_deadline_inside_the_plan() {
        let ready = ready(Some(64 << 20));
        let limit = std::time::Duration::from_millis(300);
        let notes = Arc::new(ScanNotes::default());
        let state = ready
            .statement_state(Some(limit), &notes)
            .expect("a state of its own");
        let ctx = SessionContext::new_with_state(state);
        let err = ctx
            .sql("SELECT sum(a.value * b.value) FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 100000) b")
            .await
            .expect("plan")
            .collect()
            .await
            .expect_err("stopped");
        assert_eq!(
            gpuwatch_query::deadline::DeadlinePassed::find(&err),
            Some(gpuwatch_query::deadline::DeadlinePassed(limit)),
            "{err}"
        );
        let state = ready.statement_state(None, &notes).expect("own");
        let ctx = SessionContext::new_with_state(state);
        let n = texts(
            &ctx,
            "SELECT count(*) FROM generate_series(1, 1000) a CROSS JOIN generate_series(1, 10) b",
        )
        .await;
        assert_eq!(n, vec![vec!["10000".to_string()]]);
    }
}
