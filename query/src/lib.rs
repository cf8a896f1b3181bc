//! gpuwatch's query engine.
//!
//! Data flow: a SQL request arrives over HTTP ([`http`]); the statement gate ([`gate`]) lets only
//! read-only statements through; DataFusion plans it over [`engine::StoreTable`] providers, each
//! of which reads a consistent snapshot of the store (in-memory batches plus Parquet files)
//! through the narrow [`gpuwatch_store::ReadStore`] trait; the answer is encoded in the requested
//! [`format`]. Time-series aggregates (`increase`, `rate`) live in [`udf`].

pub mod bounded;
pub mod deadline;
pub mod engine;
mod error;
pub mod executor;
pub mod files_table;
pub mod format;
pub mod gate;
pub mod http;
pub mod memory;
pub mod micros;
pub mod pg;
pub mod pg_functions;
pub mod pg_information_schema;
pub mod pg_rewrite;
pub mod run_aggregate;
pub mod skipped;
pub mod udf;

pub use engine::{EngineConfig, QueryEngine, QueryResult};
pub use error::{Error, Result, Status};
