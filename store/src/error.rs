//! Errors of the store. Messages are lowercase and say what to do; causes are kept as typed
//! sources (`io::Error`, `object_store::Error`, `DeltaTableError`, `ParquetError`, `ArrowError`),
//! so a full disk, a commit conflict or a missing object is matched by type, never by text.

use std::path::PathBuf;

use deltalake_core::DeltaTableError;

use crate::schema::Table;

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

    /// The memory budget of decoding (`--memory-limit`) cannot cover the request; the source
    /// says whether it could later (503) or never (413).
    #[error("{0}")]
    DecodeRefused(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The store is not open yet; the text says why (see [`crate::startup`]).
    #[error("the store is not ready yet: {0}")]
    NotReady(String),

    /// The write buffer holds `--max-buffer-bytes` and a persist has not freed it yet.
    #[error(
        "write buffer full ({held} of {limit} bytes held until the next persist finishes){why}: retry after a few seconds, or raise --max-buffer-bytes"
    )]
    BufferFull {
        held: usize,
        limit: usize,
        /// Why a persist cannot free it (a table whose log is damaged), or empty.
        why: String,
    },

    /// An I/O failure on a file of the store.
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file of the store's own (the earlier releases' catalog, the writer id) is unreadable.
    #[error("{path} is unreadable: {detail}; restore it from a backup or move it away")]
    Catalog { path: PathBuf, detail: String },

    /// A JSON file of the store could not be parsed.
    #[error("{path} is not valid JSON ({source}); restore it from a backup or move it away")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },

    /// `--object-store` is not usable.
    #[error("object store {url}: {detail}")]
    ObjectStoreConfig {
        url: String,
        detail: String,
        #[source]
        source: Option<object_store::Error>,
    },

    /// An object store request failed.
    #[error("object store error on {location}: {source}")]
    ObjectStore {
        location: String,
        #[source]
        source: object_store::Error,
    },

    /// The storage client cannot run requests (its runtime stopped).
    #[error("storage client for {location} unavailable: {detail}")]
    StorageClient { location: String, detail: String },

    /// A Delta table's log could not be read or written.
    #[error("delta log of table {} at {location}: {source}", table.name())]
    Delta {
        table: Table,
        location: String,
        #[source]
        source: DeltaTableError,
    },

    /// A table schema has no Delta form (a bug: every table's schema is fixed in code).
    #[error("delta schema: {0}")]
    DeltaSchema(String),

    /// A Delta commit kept meeting concurrent commits it conflicts with (two maintainers, or
    /// retention racing a persist): nothing was written; the work is retried at the next pass.
    #[error("delta commit to table {} met concurrent commits, nothing written, retried at the next pass: {source}", table.name())]
    DeltaConflict {
        table: Table,
        #[source]
        source: DeltaTableError,
    },

    /// Rows handed to [`crate::Store::replace_hours`] that do not fit the table or the hour.
    #[error("{0}")]
    BadRows(String),

    /// Files a rewrite read were replaced meanwhile (a refold, another maintainer): nothing was
    /// written; the work is retried at the next pass.
    #[error("table {} changed while its files were rewritten: nothing written, retried at the next pass", table.name())]
    Changed { table: Table },

    /// A table's Delta log has damaged versions: no commit (and no vacuum) runs on it until it
    /// is repaired; the message names the files and what to do.
    #[error("{0}")]
    LogDamaged(String),

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

    /// Parquet failed to encode or decode a file.
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
    /// space is freed. Looks through the whole chain of causes for an `io::Error` saying so.
    pub fn is_disk_full(&self) -> bool {
        chain_is_disk_full(self)
    }

    /// True when the error says an object or file does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Self::ObjectStore { source, .. } => {
                matches!(source, object_store::Error::NotFound { .. })
            }
            Self::Delta {
                source: DeltaTableError::ObjectStore { source },
                ..
            } => matches!(source, object_store::Error::NotFound { .. }),
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

/// True when `e` or any of its causes is an `io::Error` of a full disk or quota (`ENOSPC`,
/// `EDQUOT`).
pub(crate) fn chain_is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io_is_disk_full(io) {
                return true;
            }
            // A custom io::Error's `source` skips the error it wraps: look at it too.
            if let Some(inner) = io.get_ref()
                && chain_is_disk_full(inner)
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

fn io_is_disk_full(e: &std::io::Error) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// Result with the store's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_found_through_wrapped_causes() {
        let enospc = std::io::Error::from_raw_os_error(28);
        assert!(Error::io("/x", enospc).is_disk_full());
        let wrapped = object_store::Error::Generic {
            store: "test",
            source: Box::new(std::io::Error::other(std::io::Error::from(
                std::io::ErrorKind::StorageFull,
            ))),
        };
        let e = Error::ObjectStore {
            location: "x".into(),
            source: wrapped,
        };
        assert!(e.is_disk_full(), "{e}");
        let other = Error::io("/x", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(!other.is_disk_full());
        assert!(other.is_not_found());
    }
}
