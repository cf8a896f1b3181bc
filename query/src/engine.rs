//! The DataFusion session over the store.
//!
//! Each table is a [`StoreTable`]: at scan time it takes a consistent [`TableSnapshot`] of the
//! store (buffered batches plus persisted Parquet files) and plans a union of an in-memory scan
//! and a Parquet scan, so a query sees every acknowledged row exactly once.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::Result as DfResult;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::union::UnionExec;
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::StreamExt;
use gpuwatch_store::schema::Table;
use gpuwatch_store::{ReadStore, TableSnapshot};

use crate::error::Error;
use crate::{Result, gate};

/// A table of the store, as DataFusion sees it.
pub struct StoreTable {
    table: Table,
    store: Arc<dyn ReadStore>,
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
        Self { table, store }
    }
}

#[async_trait]
impl TableProvider for StoreTable {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
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
        let TableSnapshot { batches, files } = self.store.snapshot(self.table);
        let schema = self.table.schema();
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
                .map(|(path, _)| ListingTableUrl::parse(path.to_string_lossy()))
                .collect::<DfResult<Vec<_>>>()?;
            let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
                .with_file_extension(".parquet");
            let config = ListingTableConfig::new_with_multi_paths(urls)
                .with_listing_options(options)
                .with_schema(Arc::clone(&schema));
            let listing = ListingTable::try_new(config)?;
            inputs.push(listing.scan(state, projection, filters, limit).await?);
        }
        UnionExec::try_new(inputs)
    }
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            query_timeout: Duration::from_secs(30),
            memory_limit: None,
            max_concurrent_queries: None,
        }
    }
}

/// A query's answer.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// The schema of the rows.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

/// The SQL engine over the store.
#[derive(Clone)]
pub struct QueryEngine {
    ctx: SessionContext,
    config: EngineConfig,
    slots: Option<Arc<tokio::sync::Semaphore>>,
}

/// A running query's place among the `--max-concurrent-queries`; freed on drop.
#[derive(Debug)]
pub struct QuerySlot(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>);

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
        let ctx = SessionContext::new_with_config(session);
        for table in Table::ALL {
            ctx.register_table(
                table.name(),
                Arc::new(StoreTable::new(table, Arc::clone(&store))),
            )
            .map_err(Error::from)?;
        }
        let slots = config
            .max_concurrent_queries
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1))));
        Ok(Self { ctx, config, slots })
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

    /// The session a query runs in: the shared one, or one with its own memory pool when
    /// `memory_limit` is set (so one query cannot starve the others).
    fn session(&self) -> Result<SessionContext> {
        let Some(limit) = self.config.memory_limit else {
            return Ok(self.ctx.clone());
        };
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_limit(limit, 1.0)
            .build_arc()
            .map_err(Error::from)?;
        let state = datafusion::execution::SessionStateBuilder::new_from_existing(self.ctx.state())
            .with_runtime_env(runtime)
            .build();
        Ok(SessionContext::new_with_state(state))
    }

    /// The DataFusion context (for other front ends such as the Postgres wire protocol).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Plans a read-only statement and starts it, as a stream of batches.
    pub async fn stream(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        gate::check(sql)?;
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let df = self.session()?.sql_with_options(sql, options).await?;
        Ok(df.execute_stream().await?)
    }

    /// The time limit of a query.
    pub fn query_timeout(&self) -> Duration {
        self.config.query_timeout
    }

    /// Takes a query slot, plans `sql` within the time limit and starts it: the caller pulls the
    /// batches (and keeps the slot until it is done).
    pub async fn start(&self, sql: &str) -> Result<(QuerySlot, SendableRecordBatchStream)> {
        let slot = self.try_slot()?;
        let limit = self.config.query_timeout;
        match tokio::time::timeout(limit, self.stream(sql)).await {
            Ok(stream) => Ok((slot, stream?)),
            Err(_) => Err(Error::Timeout(limit)),
        }
    }

    /// Runs a read-only statement to completion within the time limit.
    pub async fn query(&self, sql: &str) -> Result<QueryResult> {
        let _slot = self.try_slot()?;
        let limit = self.config.query_timeout;
        let run = async {
            let mut stream = self.stream(sql).await?;
            let schema = stream.schema();
            let mut batches = Vec::new();
            while let Some(b) = stream.next().await {
                batches.push(b.map_err(Error::from)?);
            }
            Ok(QueryResult { schema, batches })
        };
        match tokio::time::timeout(limit, run).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(limit)),
        }
    }
}

#[cfg(test)]
mod tests;
