//! Export: samples → OTLP protobuf ([`otlp::encode`]) → gzip → HTTP POST ([`http::Exporter`]),
//! with failed requests kept in a bounded retry queue ([`queue::Spool`]).

pub mod http;
pub mod otlp;
pub mod prometheus;
pub mod queue;

pub use http::{Exporter, metrics_url};
pub use otlp::encode;
pub use queue::{Encoded, MemoryQueue, Spool};
