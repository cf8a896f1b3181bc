//! Export: samples → OTLP protobuf ([`otlp::encode`]) → gzip → the retry spool
//! ([`queue::Spool`]) → OTLP/HTTP POST ([`http`]) or OTLP/gRPC `Export` ([`grpc`]), batched and
//! retried with backoff by the [`Exporter`], with the bearer token of `--auth-token-file`
//! ([`token`]).

pub mod exporter;
pub mod grpc;
pub mod http;
pub mod options;
pub mod otlp;
pub mod prometheus;
pub mod queue;
pub mod token;

pub use exporter::Exporter;
pub use grpc::{DEFAULT_GRPC_ENDPOINT, grpc_url};
pub use http::metrics_url;
pub(crate) use options::read_pem;
pub use options::{Compression, ExportOptions};
pub use otlp::encode;
pub use queue::{Encoded, MemoryQueue, Spool};
pub use token::TokenFile;
