//! Errors of the alerting crate.

use std::path::PathBuf;

/// An alerting error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A rules file that does not parse or validate; `line` is 1-based.
    #[error("{path}:{line}:{column}: {message}")]
    Rules {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong and what to do.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A rule's query failed.
    #[error("rule {rule}: query failed: {message}")]
    Query {
        /// The alert name.
        rule: String,
        /// The engine's message.
        message: String,
    },
    /// A configuration value is wrong.
    #[error("{0}")]
    Config(String),
    /// A state or queue file is corrupt.
    #[error("{}: {source}; move the file away to start from an empty state", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// A damaged state file could not be moved to quarantine.
    #[error("cannot move the damaged {} to quarantine: {source}", path.display())]
    Quarantine {
        /// The file.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: gpuwatch_store::Error,
    },
    /// A state could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What was being saved.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
