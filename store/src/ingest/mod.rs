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

/// Memory a decoder asks for before it inflates or decodes a request body (the server's
/// `--memory-limit`): [`DecodeBudget::inflated`] is called with a number of inflated bytes
/// *before* they exist, and an error (the budget cannot cover them) stops the decode there.
pub trait DecodeBudget {
    /// Asks for room for `bytes` more inflated bytes and what decoding them builds.
    fn inflated(&mut self, bytes: usize) -> crate::Result<()>;
}

/// No budget: every request is decoded (tests, fuzzing, offline tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct Unbounded;

impl DecodeBudget for Unbounded {
    fn inflated(&mut self, _bytes: usize) -> crate::Result<()> {
        Ok(())
    }
}

/// How many bytes a gzip body is inflated by at a time: room for each step is asked for
/// before it is inflated.
pub const INFLATE_STEP: usize = 256 * 1024;
