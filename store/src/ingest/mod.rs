//! Ingest: protocol payloads decoded into Arrow batches of the table schemas.
//!
//! `otlp` turns an OTLP metrics export into [`WriteBatch`]: GPU points are pivoted into one
//! `gpu_metrics` row per GPU and sample, everything else becomes `metrics` rows. `http` holds the
//! request-level handling (content type, gzip, size limits) shared by every HTTP listener.

pub mod http;
pub mod otlp;
pub mod otlp_json;
mod otlp_proto;
pub mod remote_write;
mod rows;

pub use rows::{Cell, EventRow, GpuRow, MetricRow, ProcessRow, WriteBatch};
