//! The DataFusion session over the store.
//!
//! Each table is a [`StoreTable`]: at scan time it takes a consistent [`TableSnapshot`] of the
//! store (buffered batches plus persisted Parquet files) and plans a union of an in-memory scan
//! and a Parquet scan, so a query sees every acknowledged row exactly once.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::{
    Between, BinaryExpr, Expr, Operator, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::union::UnionExec;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use gpuwatch_store::schema::Table;
use gpuwatch_store::{ReadStore, TableSnapshot};

use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::executor::{AbortOnDrop, Executor};
use crate::memory::Ceiling;
use crate::skipped::{ScanNotes, may_be_damage, verify_scanned};
use crate::{Result, gate};

/// A table of the store, as DataFusion sees it.
pub struct StoreTable {
    table: Table,
    /// The table's schema as queries see it: [`view_schema`] of the store's.
    schema: SchemaRef,
    store: Arc<dyn ReadStore>,
    stats: Arc<ScanStats>,
}

impl fmt::Debug for StoreTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTable")
            .field("table", &self.table)
            .finish()
    }
}

impl StoreTable {
    /// A provider for `table`.
    pub fn new(table: Table, store: Arc<dyn ReadStore>) -> Self {
        Self::with_stats(table, store, Arc::default())
    }

    /// The same provider with the table's schema as it is now (`job_ledger`'s columns are
    /// declared by the cost accounting, possibly after the engine was built).
    pub fn with_current_schema(&self) -> Self {
        Self::with_stats(self.table, Arc::clone(&self.store), Arc::clone(&self.stats))
    }

    /// A provider for `table` that counts the files it scans and skips in `stats`.
    pub fn with_stats(table: Table, store: Arc<dyn ReadStore>, stats: Arc<ScanStats>) -> Self {
        Self {
            table,
            schema: view_schema(&table.schema()),
            store,
            stats,
        }
    }
}

#[async_trait]
impl TableProvider for StoreTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let TableSnapshot {
            batches,
            files,
            warnings,
        } = self.store.snapshot(self.table);
        // Prune by the catalog's time range of each file: a file that cannot hold a row passing
        // the `time` filters is never opened.
        let (lo, hi) = time_range(filters);
        let before = files.len();
        let files: Vec<_> = files
            .into_iter()
            .filter(|(_, meta)| meta.max_time >= lo && meta.min_time <= hi)
            .collect();
        self.stats
            .files_pruned
            .fetch_add((before - files.len()) as u64, Ordering::Relaxed);
        self.stats
            .files_scanned
            .fetch_add(files.len() as u64, Ordering::Relaxed);
        if let Some(notes) = state.config().get_extension::<ScanNotes>() {
            // Only what a row passing the `time` filters could have been in.
            let left_out: Vec<String> = warnings
                .into_iter()
                .filter(|w| w.max_time >= lo && w.min_time <= hi)
                .map(|w| w.text)
                .collect();
            notes.record(self.table, &left_out, files.iter().map(|(l, _)| l));
        }
        let schema = Arc::clone(&self.schema);
        let batches = batches
            .iter()
            .map(|b| to_view_batch(&schema, b))
            .collect::<DfResult<Vec<_>>>()?;
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();

        // Buffered rows: spread over partitions so that large buffers scan in parallel.
        let parts = state
            .config()
            .target_partitions()
            .max(1)
            .min(batches.len().max(1));
        let mut partitions: Vec<Vec<RecordBatch>> = vec![Vec::new(); parts];
        for (i, b) in batches.into_iter().enumerate() {
            partitions[i % parts].push(b);
        }
        let mem = MemTable::try_new(Arc::clone(&schema), partitions)?;
        inputs.push(mem.scan(state, projection, filters, limit).await?);

        if !files.is_empty() {
            let urls = files
                .iter()
                .map(|(location, _)| ListingTableUrl::parse(location))
                .collect::<DfResult<Vec<_>>>()?;
            let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
                .with_file_extension(".parquet");
            let config = ListingTableConfig::new_with_multi_paths(urls)
                .with_listing_options(options)
                .with_schema(Arc::clone(&schema))
                // The files' times are microseconds: read into nanoseconds by a multiplication.
                .with_expr_adapter_factory(Arc::new(crate::micros::MicrosAdapterFactory));
            // File statistics are kept between queries (files are immutable; an entry is
            // checked against the file's size and modification time before use).
            let listing = ListingTable::try_new(config)?
                .with_cache(state.runtime_env().cache_manager.get_file_statistic_cache());
            inputs.push(listing.scan(state, projection, filters, limit).await?);
        }
        UnionExec::try_new(inputs)
    }
}

/// `schema` with its string columns as `Utf8View`. Strings are read from Parquet as views into
/// the decoded pages (a dictionary-encoded label costs a 16-byte view per row, not a copy of its
/// bytes), and filters, hashing and comparisons in aggregations work on views; DataFusion's own
/// Parquet tables read strings the same way.
pub fn view_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 => {
                f.as_ref().clone().with_data_type(DataType::Utf8View)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// A buffered batch with the columns of `schema` ([`view_schema`] of its own).
fn to_view_batch(schema: &SchemaRef, batch: &RecordBatch) -> DfResult<RecordBatch> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                arrow::compute::cast(c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Files a scan read and skipped, over the engine's life (exposed on `/metrics`).
#[derive(Debug, Default)]
pub struct ScanStats {
    /// Parquet files handed to a scan.
    pub files_scanned: AtomicU64,
    /// Parquet files skipped because their time range cannot match the query's `time` filters.
    pub files_pruned: AtomicU64,
    /// Answers that left data out (a damaged file, unread versions of a damaged log) and said
    /// so.
    pub answers_with_skipped_data: AtomicU64,
    /// Queries run again after their read found a damaged file.
    pub retried_after_damage: AtomicU64,
}

/// Nanoseconds since the epoch of a timestamp literal.
fn literal_nanos(e: &Expr) -> Option<i64> {
    let Expr::Literal(v, _) = e else {
        return None;
    };
    match v {
        ScalarValue::TimestampNanosecond(Some(t), _) => Some(*t),
        ScalarValue::TimestampMicrosecond(Some(t), _) => t.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(t), _) => t.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(t), _) => t.checked_mul(1_000_000_000),
        _ => None,
    }
}

fn is_time(e: &Expr) -> bool {
    matches!(e, Expr::Column(c) if c.name == "time")
}

/// Narrows `[lo, hi]` (inclusive, ns) to what rows passing `e` can have as `time`. Anything it
/// does not understand leaves the range as it is (the filter is applied to the rows anyway).
fn narrow(e: &Expr, lo: &mut i64, hi: &mut i64) {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            if *op == Operator::And {
                narrow(left, lo, hi);
                narrow(right, lo, hi);
                return;
            }
            let (op, t) = if is_time(left) {
                match literal_nanos(right) {
                    Some(t) => (*op, t),
                    None => return,
                }
            } else if is_time(right) {
                match (literal_nanos(left), op.swap()) {
                    (Some(t), Some(op)) => (op, t),
                    _ => return,
                }
            } else {
                return;
            };
            match op {
                Operator::Gt => *lo = (*lo).max(t.saturating_add(1)),
                Operator::GtEq => *lo = (*lo).max(t),
                Operator::Lt => *hi = (*hi).min(t.saturating_sub(1)),
                Operator::LtEq => *hi = (*hi).min(t),
                Operator::Eq => {
                    *lo = (*lo).max(t);
                    *hi = (*hi).min(t);
                }
                _ => {}
            }
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) if is_time(expr) => {
            if let Some(t) = literal_nanos(low) {
                *lo = (*lo).max(t);
            }
            if let Some(t) = literal_nanos(high) {
                *hi = (*hi).min(t);
            }
        }
        _ => {}
    }
}

/// The inclusive `time` range (ns) rows must be in to pass every filter.
pub fn time_range(filters: &[Expr]) -> (i64, i64) {
    let (mut lo, mut hi) = (i64::MIN, i64::MAX);
    for f in filters {
        narrow(f, &mut lo, &mut hi);
    }
    (lo, hi)
}

/// Limits and settings of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// A query running longer than this is cancelled (504).
    pub query_timeout: Duration,
    /// Memory one query may hold in DataFusion's memory pool (sorts, joins and aggregations
    /// spill or fail with an answer beyond it); `None`: unbounded.
    pub memory_limit: Option<usize>,
    /// Queries running at once; one more is refused at once with 429 (`None`: unbounded).
    pub max_concurrent_queries: Option<usize>,
    /// The largest value a function may build (`--max-value-bytes`, [`crate::bounded`]).
    pub max_value_bytes: usize,
    /// The largest answer sent (`--max-answer-bytes`); `None`: unbounded.
    pub max_answer_bytes: Option<usize>,
    /// Where queries run ([`Executor::dedicated`] in the server).
    pub executor: Executor,
    /// The process's memory ceiling (`--memory-limit`): the pool every query's own pool is
    /// part of, and the resident-memory watch that refuses and stops queries; `None`: none.
    pub ceiling: Option<Arc<Ceiling>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            query_timeout: Duration::from_secs(30),
            memory_limit: None,
            max_concurrent_queries: None,
            max_value_bytes: crate::bounded::DEFAULT_MAX_VALUE_BYTES,
            max_answer_bytes: None,
            executor: Executor::current(),
            ceiling: None,
        }
    }
}

/// A runtime like `base` but with `pool` as its memory pool, for one query.
///
/// Only the memory pool is the query's own. The object stores, the caches (Parquet footers, file
/// statistics) and the spill directory are `base`'s: a fresh cache per query would read every
/// file's footer again at each query.
pub fn own_pool(base: &RuntimeEnv, pool: Arc<dyn MemoryPool>) -> Result<Arc<RuntimeEnv>> {
    let mut runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::clone(&base.object_store_registry))
        .with_memory_pool(pool)
        .build()
        .map_err(Error::from)?;
    runtime.cache_manager = Arc::clone(&base.cache_manager);
    runtime.disk_manager = Arc::clone(&base.disk_manager);
    Ok(Arc::new(runtime))
}

/// A query's answer.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// The schema of the rows.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
    /// What the answer left out (damaged files, unread log versions).
    pub warnings: Vec<String>,
}

/// The SQL engine over the store.
#[derive(Clone)]
pub struct QueryEngine {
    ctx: SessionContext,
    store: Arc<dyn ReadStore>,
    config: EngineConfig,
    stats: Arc<ScanStats>,
    slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// How many times a query runs again after its read found damaged data files.
const DAMAGE_RETRIES: usize = 3;

/// A started query: its slot, its batches, and what its answer leaves out.
pub struct Started {
    /// Its place among the `--max-concurrent-queries` (freed on drop).
    pub slot: QuerySlot,
    /// The batches.
    pub stream: SendableRecordBatchStream,
    /// What the answer leaves out (damaged files, unread log versions), for the client.
    pub warnings: Vec<String>,
}

/// A running query's place among the `--max-concurrent-queries`; freed on drop.
#[derive(Debug)]
pub struct QuerySlot(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>);

impl fmt::Debug for Started {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Started")
            .field("slot", &self.slot)
            .field("schema", &self.stream.schema())
            .field("warnings", &self.warnings)
            .finish()
    }
}

impl fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryEngine")
            .field("config", &self.config)
            .finish()
    }
}

impl QueryEngine {
    /// An engine with every store table registered.
    pub fn new(store: Arc<dyn ReadStore>, config: EngineConfig) -> Result<Self> {
        let session = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("gpuwatch", "public");
        let runtime = RuntimeEnvBuilder::new()
            .with_metadata_cache_limit(crate::memory::metadata_cache_bytes(
                config.ceiling.as_deref(),
            ))
            .build_arc()
            .map_err(Error::from)?;
        // Partial aggregations over runs of equal keys (the files are sorted by host and GPU).
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_config(session)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(crate::run_aggregate::RunAggregateRule))
            // The time limit inside running plans, from each query's session (see `session`).
            .with_physical_optimizer_rule(Arc::new(crate::deadline::DeadlineRule))
            .build();
        let ctx = SessionContext::new_with_state(state);
        // Files in an object store are read through it: registered once, under `s3://bucket`.
        if let Some((base, object_store)) = store.object_store() {
            let url = datafusion::execution::object_store::ObjectStoreUrl::parse(&base)
                .map_err(Error::from)?;
            ctx.runtime_env()
                .register_object_store(url.as_ref(), object_store);
        }
        ctx.register_udaf(crate::udf::increase());
        ctx.register_udaf(crate::udf::rate());
        crate::bounded::register(&ctx, config.max_value_bytes);
        let stats = Arc::new(ScanStats::default());
        for table in Table::ALL {
            ctx.register_table(
                table.name(),
                Arc::new(StoreTable::with_stats(
                    table,
                    Arc::clone(&store),
                    Arc::clone(&stats),
                )),
            )
            .map_err(Error::from)?;
        }
        ctx.register_table(
            crate::files_table::NAME,
            Arc::new(crate::files_table::FilesTable(Arc::clone(&store))),
        )
        .map_err(Error::from)?;
        let slots = config
            .max_concurrent_queries
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1))));
        Ok(Self {
            ctx,
            store,
            config,
            stats,
            slots,
        })
    }

    /// Files scanned and pruned so far.
    pub fn scan_stats(&self) -> &ScanStats {
        &self.stats
    }

    /// Takes a query slot, or refuses at once when `--max-concurrent-queries` run already.
    pub fn try_slot(&self) -> Result<QuerySlot> {
        let Some(slots) = &self.slots else {
            return Ok(QuerySlot(None));
        };
        match Arc::clone(slots).try_acquire_owned() {
            Ok(permit) => Ok(QuerySlot(Some(permit))),
            Err(_) => Err(Error::Busy(self.config.max_concurrent_queries.unwrap_or(0))),
        }
    }

    /// The memory pool of one query: its own `--query-memory-limit` inside the ceiling's
    /// shared pool, or alone; `None` when neither is set.
    pub fn query_pool(&self) -> Option<Arc<dyn MemoryPool>> {
        match (&self.config.ceiling, self.config.memory_limit) {
            (Some(ceiling), limit) => Some(ceiling.query_pool(limit)),
            (None, Some(limit)) => Some(crate::memory::standalone_pool(limit)),
            (None, None) => None,
        }
    }

    /// Refuses a query while the process is near its memory ceiling.
    pub fn admit(&self) -> Result<()> {
        if let Some(ceiling) = &self.config.ceiling {
            ceiling
                .admit_query()
                .map_err(|p| Error::MemoryPressure(p.used, p.limit))?;
        }
        Ok(())
    }

    /// The session a query runs in: the shared one, or one with its own memory pool when
    /// a memory limit or ceiling is set (so one query cannot starve the others).
    fn session(&self, notes: &Arc<ScanNotes>) -> Result<SessionContext> {
        let mut state =
            datafusion::execution::SessionStateBuilder::new_from_existing(self.ctx.state());
        if let Some(pool) = self.query_pool() {
            state = state.with_runtime_env(own_pool(&self.ctx.runtime_env(), pool)?);
        }
        let mut state = state.build();
        // The query's time limit, kept inside its plan by the deadline rule.
        state
            .config_mut()
            .set_extension(Arc::new(crate::deadline::Deadline::after(
                self.config.query_timeout,
            )));
        state.config_mut().set_extension(Arc::clone(notes));
        Ok(SessionContext::new_with_state(state))
    }

    /// The DataFusion context (for other front ends such as the Postgres wire protocol).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Plans a read-only statement and starts it, as a stream of batches, on the caller's
    /// runtime (see [`QueryEngine::start`] for the query runtime). Its scans record what they
    /// read and left out in `notes`.
    pub async fn stream(
        &self,
        sql: &str,
        notes: &Arc<ScanNotes>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(self.plan(sql, notes).await??)
    }

    /// Like [`QueryEngine::stream`], as one stream per partition of the plan (files split
    /// between them, no order across them), for a caller that reads them in parallel.
    pub async fn stream_partitions(
        &self,
        sql: &str,
        notes: &Arc<ScanNotes>,
    ) -> Result<Vec<SendableRecordBatchStream>> {
        Ok(self
            .plan_with(sql, notes, |df| async move {
                df.execute_stream_partitioned().await
            })
            .await??)
    }

    /// Plans `sql` and starts it. The outer error refuses the statement before DataFusion sees
    /// it; the inner one is DataFusion's (planning reads the files' footers too).
    async fn plan(
        &self,
        sql: &str,
        notes: &Arc<ScanNotes>,
    ) -> Result<DfResult<SendableRecordBatchStream>> {
        self.plan_with(sql, notes, |df| async move { df.execute_stream().await })
            .await
    }

    /// Plans `sql` and hands the plan to `execute`.
    async fn plan_with<T, F, Fut>(
        &self,
        sql: &str,
        notes: &Arc<ScanNotes>,
        execute: F,
    ) -> Result<DfResult<T>>
    where
        F: FnOnce(datafusion::dataframe::DataFrame) -> Fut,
        Fut: std::future::Future<Output = DfResult<T>>,
    {
        gate::check(sql)?;
        self.admit()?;
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let session = self.session(notes)?;
        Ok(async {
            let df = session.sql_with_options(sql, options).await?;
            execute(df).await
        }
        .await)
    }

    /// The store the engine reads.
    pub fn store(&self) -> &Arc<dyn ReadStore> {
        &self.store
    }

    /// Plans and runs `sql` up to its first batch. A read that fails on a data file the store
    /// did not know to be damaged has the files it read checked; when some were damaged, the
    /// query runs again without them (at most [`DAMAGE_RETRIES`] times), its notes naming them.
    async fn first_batch(
        &self,
        sql: &str,
    ) -> Result<(
        SendableRecordBatchStream,
        Option<DfResult<RecordBatch>>,
        Arc<ScanNotes>,
    )> {
        let mut attempt = 0;
        loop {
            let notes = Arc::new(ScanNotes::default());
            let (stream, first) = match self.plan(sql, &notes).await? {
                Ok(mut s) => {
                    let first = s.next().await;
                    (Some(s), first)
                }
                Err(e) => (None, Some(Err(e))),
            };
            if let Some(Err(e)) = &first
                && may_be_damage(e)
                && attempt < DAMAGE_RETRIES
                && verify_scanned(&self.store, &notes).await > 0
            {
                attempt += 1;
                self.stats
                    .retried_after_damage
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "a query's read failed on a damaged data file: run again without it");
                continue;
            }
            return match (stream, first) {
                (Some(s), first) => Ok((s, first, notes)),
                (None, Some(Err(e))) => Err(Error::from(e)),
                (None, _) => Err(Error::Internal("a query without a plan".into())),
            };
        }
    }

    /// Memory one query may hold (`--query-memory-limit`); `None`: unbounded.
    pub fn memory_limit(&self) -> Option<usize> {
        self.config.memory_limit
    }

    /// The time limit of a query.
    pub fn query_timeout(&self) -> Duration {
        self.config.query_timeout
    }

    /// The largest value a function may build (`--max-value-bytes`).
    pub fn max_value_bytes(&self) -> usize {
        self.config.max_value_bytes
    }

    /// Where queries run.
    pub fn executor(&self) -> &Executor {
        &self.config.executor
    }

    /// The largest answer sent (`--max-answer-bytes`); `None`: unbounded.
    pub fn max_answer_bytes(&self) -> Option<usize> {
        self.config.max_answer_bytes
    }

    /// The process's memory ceiling, if it has one.
    pub fn ceiling(&self) -> Option<&Arc<Ceiling>> {
        self.config.ceiling.as_ref()
    }

    /// Takes a query slot, plans `sql` within the time limit and starts it on the query runtime:
    /// the caller pulls the batches (and keeps the slot until it is done). Dropping the stream
    /// stops the query; so does the memory ceiling, with a [`crate::memory::Pressure`] error.
    /// The first batch is read before this returns, so the warnings (data the answer leaves
    /// out, [`crate::skipped`]) are known before the answer starts.
    pub async fn start(&self, sql: &str) -> Result<Started> {
        let slot = self.try_slot()?;
        let limit = self.config.query_timeout;
        let (started_tx, started_rx) =
            tokio::sync::oneshot::channel::<Result<(SchemaRef, Vec<String>)>>();
        let (tx, rx) = tokio::sync::mpsc::channel::<DfResult<RecordBatch>>(2);
        let engine = self.clone();
        let sql = sql.to_owned();
        let task = self.config.executor.spawn(async move {
            let (stream, first, notes) = match engine.first_batch(&sql).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let warnings = notes.warnings();
            if !warnings.is_empty() {
                engine
                    .stats
                    .answers_with_skipped_data
                    .fetch_add(1, Ordering::Relaxed);
            }
            if started_tx.send(Ok((stream.schema(), warnings))).is_err() {
                return;
            }
            if let Some(first) = first
                && tx.send(first).await.is_err()
            {
                return;
            }
            engine.pump(stream, tx, &notes).await;
        });
        let task = AbortOnDrop(task);
        let (schema, warnings) = match tokio::time::timeout(limit, started_rx).await {
            Err(_) => return Err(Error::Timeout(limit)),
            Ok(Err(_)) => return Err(Error::Internal("the query task ended early".into())),
            Ok(Ok(r)) => r?,
        };
        let batches = futures::stream::unfold((rx, task), |(mut rx, task)| async move {
            let b = rx.recv().await?;
            Some((b, (rx, task)))
        });
        Ok(Started {
            slot,
            stream: Box::pin(RecordBatchStreamAdapter::new(schema, batches)),
            warnings,
        })
    }

    /// Sends `stream`'s batches to `tx` until the end, until the receiver is gone, or until the
    /// memory ceiling stops running queries. A read that fails on a damaged file past the
    /// first batch ends the answer; the file is found and left out of later queries.
    async fn pump(
        &self,
        mut stream: SendableRecordBatchStream,
        tx: mpsc::Sender<DfResult<RecordBatch>>,
        notes: &ScanNotes,
    ) {
        let mut stops = self.config.ceiling.as_ref().map(|c| c.stops());
        loop {
            let stop = async {
                match stops.as_mut() {
                    Some(s) => s.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                b = stream.next() => {
                    let Some(b) = b else { return };
                    let b = match b {
                        Err(e) if may_be_damage(&e) => Err(self.damage_found(e, notes).await),
                        other => other,
                    };
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
                true = stop => {
                    if let Some(c) = &self.config.ceiling {
                        let _ = tx.send(Err(c.stopped())).await;
                    }
                    return;
                }
            }
        }
    }

    /// `e`, a read failure past the first batch, with the damaged files it found named.
    async fn damage_found(
        &self,
        e: datafusion::error::DataFusionError,
        notes: &ScanNotes,
    ) -> datafusion::error::DataFusionError {
        let before = notes.warnings().len();
        if verify_scanned(&self.store, notes).await == 0 {
            return e;
        }
        let found = notes.warnings().split_off(before).join("; ");
        datafusion::error::DataFusionError::Context(
            format!(
                "the answer was cut short by a damaged data file, which later queries skip: {found}"
            ),
            Box::new(e),
        )
    }

    /// Runs a read-only statement to completion within the time limit.
    pub async fn query(&self, sql: &str) -> Result<QueryResult> {
        let deadline = tokio::time::Instant::now() + self.config.query_timeout;
        let limit = self.config.query_timeout;
        let Started {
            slot: _slot,
            mut stream,
            warnings,
        } = self.start(sql).await?;
        let schema = stream.schema();
        let mut batches = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return Err(Error::Timeout(limit)),
                Ok(None) => break,
                Ok(Some(b)) => batches.push(b.map_err(Error::from)?),
            }
        }
        Ok(QueryResult {
            schema,
            batches,
            warnings,
        })
    }
}

#[cfg(test)]
mod tests;
