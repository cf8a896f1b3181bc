//! Errors of the `gpuwatch` command. Each keeps its cause as a typed source; only the
//! messages that have no cause (a bad flag combination, a server's own error answer) are text.

/// What can stop the command.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Bad flags or config file: exit code 2.
    #[error("{0}")]
    Config(String),
    /// Flags, variables or the config file (exit code 2).
    #[error(transparent)]
    Settings(#[from] gpuwatch_common::Error),
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] gpuwatch_store::Error),
    /// The query engine could not be built.
    #[error(transparent)]
    Query(#[from] gpuwatch_query::Error),
    /// Alerting could not be started.
    #[error(transparent)]
    Alerts(#[from] gpuwatch_alerts::Error),
    /// The demo's simulated agents failed.
    #[error(transparent)]
    Agent(#[from] gpuwatch_agent::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({flag}): {source}; choose another address with {flag}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The flag that gave it.
        flag: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An operating-system call while starting a component.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client of the command line could not be built.
    #[error("cannot build an http client: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// The server could not be reached, or its answer broke off.
    #[error("{what} {server} ({source}){hint}")]
    Unreachable {
        /// What failed.
        what: &'static str,
        /// The server asked.
        server: String,
        /// What to do.
        hint: &'static str,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server's answer could not be read.
    #[error("malformed {what}: {source}")]
    Malformed {
        /// What was read.
        what: &'static str,
        /// The decoder's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The server answered with an error (its own message).
    #[error("{0}")]
    Remote(String),
    /// `gpuwatch check` found damage (exit code 1); the report was printed.
    #[error("{0}")]
    Damaged(String),
    /// A report could not be encoded (`--format json`).
    #[error("cannot encode the {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// Self-telemetry could not be set up.
    #[error("cannot install the trace exporter: {0}")]
    Telemetry(#[source] tracing_subscriber::reload::Error),
    /// Rules files that do not validate (`gpuwatch rules check`), one message per file.
    #[error("{0}")]
    Rules(String),
}

impl Error {
    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Settings(_) => 2,
            _ => 1,
        }
    }
}

/// Result with this crate's error.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
