//! Errors of the `gpuwatch` command.

/// What can stop the command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flags or config file: exit code 2.
    #[error("{0}")]
    Config(String),
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] gpuwatch_store::Error),
    /// The query engine could not be built.
    #[error(transparent)]
    Query(#[from] gpuwatch_query::Error),
    /// A listener could not be bound or served.
    #[error("{0}")]
    Listen(String),
    /// The server answered with an error (for `gpuwatch sql`).
    #[error("{0}")]
    Remote(String),
    /// `gpuwatch check` found damage: exit code 1.
    #[error("{0}")]
    Damaged(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) => 2,
            _ => 1,
        }
    }
}

/// Result with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
