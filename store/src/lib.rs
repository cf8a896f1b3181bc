//! gpuwatch's store.
//!
//! Data flow: an ingest protocol ([`ingest`]) decodes a request into a [`WriteBatch`] of Arrow
//! batches in the table schemas ([`schema`]). [`Store::write`] appends it to the write-ahead log
//! ([`wal`]), fsyncs, and adds it to the in-memory [`buffer`], where queries see it at once.
//! [`Store::persist`], run periodically by the server, writes the buffer as sorted, zstd-compressed
//! Parquet files ([`persist`]), records them in the catalog and truncates the WAL. At start,
//! [`Store::open`] replays whatever the catalog does not cover. The query engine reads through the
//! narrow [`ReadStore`] trait.

pub mod buffer;
pub mod clock;
mod error;
pub mod ingest;
pub mod persist;
pub mod schema;
mod store;
pub mod wal;

pub use error::{Error, Result};
pub use ingest::WriteBatch;
pub use store::{PersistReport, ReadStore, Store, StoreConfig, StoreStats, TableSnapshot};
