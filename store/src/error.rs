//! Errors of the store. Messages are lowercase and say what to do.

use std::path::PathBuf;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request body could not be decoded.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },

    /// The request body (or its decompressed form) is larger than allowed.
    #[error("request body larger than {limit} bytes: split the batch or raise --max-body-bytes")]
    TooLarge { limit: usize },

    /// The content type is not one the endpoint speaks.
    #[error("unsupported content type {0:?}: send application/x-protobuf or application/json")]
    UnsupportedContentType(String),

    /// The content encoding is not one the endpoint speaks.
    #[error("unsupported content encoding {0:?}: send identity or gzip")]
    UnsupportedContentEncoding(String),

    /// The store is still replaying its WAL.
    #[error("the store is not ready yet (write-ahead log replay in progress): retry shortly")]
    NotReady,

    /// The write buffer holds `--max-buffer-bytes` and a persist has not freed it yet.
    #[error(
        "write buffer full ({held} of {limit} bytes held until the next persist finishes): retry after a few seconds, or raise --max-buffer-bytes"
    )]
    BufferFull { held: usize, limit: usize },

    /// An I/O failure on a file of the store.
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The catalog file cannot be read.
    #[error(
        "catalog {path} is unreadable: {detail}; restore it from a backup or move it away to rebuild from the WAL"
    )]
    Catalog { path: PathBuf, detail: String },

    /// `--object-store` is not usable.
    #[error("object store {url}: {detail}")]
    ObjectStoreConfig { url: String, detail: String },

    /// An object store request failed.
    #[error("object store error on {location}: {detail}")]
    ObjectStore { location: String, detail: String },

    /// A Delta table's log could not be read or written.
    #[error("delta log: {0}")]
    Delta(String),

    /// A Delta commit kept meeting concurrent commits it conflicts with (two maintainers, or
    /// retention racing a persist): nothing was written; the work is retried at the next pass.
    #[error("delta commit conflict, nothing written, retried at the next pass: {0}")]
    DeltaConflict(String),

    /// Another process commits under this server's writer id (a copied data directory): this
    /// server stopped persisting to protect the data; writes are refused.
    #[error("persistence stopped: {0}")]
    Fenced(String),

    /// The server is a query node: it takes no writes.
    #[error(
        "this server runs with --role query and takes no writes: send them to a server with --role ingest or all"
    )]
    ReadOnly,

    /// Arrow failed to build or encode a batch.
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),

    /// Parquet failed to encode a file.
    #[error("parquet error: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
}

impl Error {
    /// Shorthand for an I/O error on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// Shorthand for a decoding error.
    pub fn malformed(what: &'static str, detail: impl std::fmt::Display) -> Self {
        Self::Malformed {
            what,
            detail: detail.to_string().to_lowercase(),
        }
    }

    /// True when the disk (or quota) is full: the write was not stored and may be retried once
    /// space is freed.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Self::Io { source, .. } => {
                source.kind() == std::io::ErrorKind::StorageFull
                    || source.kind() == std::io::ErrorKind::QuotaExceeded
                    || source.raw_os_error() == Some(28)
            }
            Self::Parquet(e) => e.to_string().contains("No space left on device"),
            _ => false,
        }
    }

    /// True when the error is the client's fault (a 4xx at the HTTP edge).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::Malformed { .. }
                | Self::TooLarge { .. }
                | Self::UnsupportedContentType(_)
                | Self::UnsupportedContentEncoding(_)
        )
    }
}

/// Result with the store's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
