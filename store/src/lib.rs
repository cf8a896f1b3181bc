//! gpuwatch's store.
//!
//! Data flow: an ingest protocol ([`ingest`]) decodes a request into a [`WriteBatch`] of Arrow
//! batches in the table schemas ([`schema`]). [`Store::write`] appends it to the write-ahead log
//! ([`wal`]), fsyncs, and adds it to the in-memory [`buffer`], where queries see it at once.
//! [`Store::persist`], run periodically by the server, writes the buffer as sorted, zstd-compressed
//! Parquet files ([`persist`]), commits them to the tables' Delta logs ([`delta`]) and truncates
//! the WAL. At start, [`Store::open`] replays whatever the commits do not cover. The query engine reads through the
//! narrow [`ReadStore`] trait. [`Store::maintain`], run periodically, merges the small files of
//! each hour ([`compact`]), builds the `gpu_metrics_1m` and `gpu_metrics_1h` rollups of closed
//! hours, and drops files past their table's retention.

pub mod buffer;
pub mod check;
pub mod clock;
pub mod compact;
pub mod delta;
mod error;
pub mod ingest;
pub mod persist;
pub mod quarantine;
pub mod schema;
pub mod startup;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wal;

pub use compact::{CompactionConfig, MaintenanceReport, RetentionConfig};
pub use error::{Error, Result};
pub use ingest::WriteBatch;
pub use store::{
    DamagedFile, PersistReport, ReadStore, Skipped, Store, StoreConfig, StoreStats, TableSnapshot,
    check_presence, verify_file,
};
