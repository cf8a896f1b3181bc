//! Errors of the shared plumbing.

use std::path::PathBuf;

/// What can go wrong reading settings or setting up logging.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line does not parse (or `--help` / `--version` was asked for).
    #[error("{0}")]
    Usage(#[from] clap::Error),

    /// An environment variable holds a value its setting does not take.
    #[error("invalid value {value:?} in environment variable {var}: {reason}")]
    BadEnv {
        /// The variable, e.g. `GPUWATCH_INTERVAL`.
        var: String,
        /// The value found.
        value: String,
        /// Why it was refused.
        reason: String,
    },

    /// The config file cannot be read.
    #[error("cannot read config file {}: {source}; check the path given to --config", path.display())]
    ConfigRead {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// The config file is not TOML, or holds an unknown key or a bad value.
    #[error("invalid config file {}: {message}", path.display())]
    ConfigParse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key and its line where known.
        message: String,
    },

    /// A setting's declaration cannot be read back (a bug in a declaration, caught by tests).
    #[error("setting {key:?}: {source}")]
    Declaration {
        /// The setting.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },

    /// The log filter does not parse.
    #[error("invalid --log-level {level:?}: {source}; use e.g. info, or debug,hyper=info")]
    LogFilter {
        /// The filter as given.
        level: String,
        /// The cause.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },

    /// A global log subscriber was installed already.
    #[error("cannot set up logging: {0}")]
    LogInit(#[from] tracing_subscriber::util::TryInitError),
}

/// Result with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
