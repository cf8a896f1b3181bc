//! gpuwatch's query engine.
//!
//! An engine only: the front ends that take SQL (HTTP, the Postgres wire protocol) live with the
//! server's other listeners (`gpuwatch/src/server/`).
//!
//! Data flow: a SQL statement arrives from a front end; the statement gate ([`gate`]) lets only
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
pub mod memory;
pub mod micros;
pub mod run_aggregate;
pub mod skipped;
pub mod udf;

pub use engine::{EngineConfig, QueryEngine, QueryResult};
pub use error::{Error, Result, Status, lower_first};
