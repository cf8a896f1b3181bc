//! The agent's error type.
//!
//! Messages are lowercase, carry no trailing period and say what to do. [`Error::exit_code`]
//! maps each variant to the process exit code documented in the README: 2 for configuration and
//! usage errors (including NVML being unavailable), 1 for every other failure.

use std::path::PathBuf;

/// Result with the agent's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line could not be parsed (or `--help` / `--version` was asked for).
    #[error("{0}")]
    Usage(#[from] clap::Error),

    /// A `--label` (or `GPUWATCH_LABEL`, or `label` in the config file) without `=`.
    #[error("invalid label {value:?}: expected key=value, e.g. --label cluster=prod")]
    BadLabel {
        /// The offending text.
        value: String,
    },

    /// A label that would overwrite an attribute the agent sets itself.
    #[error("label key {key:?} is reserved: set the host with --host instead")]
    ReservedLabel {
        /// The reserved key.
        key: String,
    },

    /// A duration that humantime could not parse.
    #[error("invalid duration {value:?} ({reason}): use e.g. 5s, 500ms or 1m")]
    BadDuration {
        /// The offending text.
        value: String,
        /// humantime's explanation.
        reason: String,
    },

    /// A value from an environment variable that does not parse.
    #[error("invalid value {value:?} in environment variable {var}: {reason}")]
    BadEnv {
        /// The variable name, e.g. `GPUWATCH_INTERVAL`.
        var: String,
        /// The value found.
        value: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The config file could not be read.
    #[error("cannot read config file {}: {source}; check the path given to --config", path.display())]
    ConfigRead {
        /// The path given to `--config`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// The config file is not valid TOML or holds an unknown key or a bad value.
    #[error("invalid config file {}: {message}", path.display())]
    ConfigParse {
        /// The path given to `--config`.
        path: PathBuf,
        /// What is wrong, with line and column where known.
        message: String,
    },

    /// A setting's declaration or the log filter (see the cause).
    #[error(transparent)]
    Settings(gpuwatch_common::Error),

    /// Any other invalid option value (e.g. an interval of zero).
    #[error("invalid option: {0}")]
    Invalid(String),

    /// `libnvidia-ml.so.1` could not be loaded or initialised.
    #[error(
        "NVML is not available (libnvidia-ml.so.1 could not be loaded: {cause}); on a machine without NVIDIA GPUs run with --source synthetic"
    )]
    NvmlUnavailable {
        /// NVML's own error text.
        cause: String,
    },

    /// NVML loaded but a call that the whole source depends on failed.
    #[error("nvml call failed while {context}: {source}; check the driver with nvidia-smi")]
    Nvml {
        /// What the agent was doing.
        context: &'static str,
        /// NVML's error.
        source: nvml_wrapper::error::NvmlError,
    },

    /// The HTTP client could not be built.
    #[error("cannot build the http client: {0}")]
    HttpClient(#[source] reqwest::Error),

    /// The endpoint URL is not usable.
    #[error("invalid endpoint {endpoint:?}: {reason}; use e.g. http://127.0.0.1:4318")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },

    /// The endpoint could not be reached or answered 429/5xx: the request stays queued.
    #[error(
        "export to {url} failed ({reason}); kept in the retry queue ({queued} queued), will retry next tick"
    )]
    ExportRetry {
        /// Where the request went.
        url: String,
        /// Connect error, timeout, HTTP status or gRPC code, or the backoff still running.
        reason: String,
        /// Requests now waiting in the queue.
        queued: usize,
    },

    /// The endpoint answered 4xx (not 429), or a gRPC code that will not change: the request
    /// was dropped because it will never succeed.
    #[error(
        "export to {url} rejected ({status}): {body}; the request was dropped, check the endpoint and the agent version"
    )]
    ExportRejected {
        /// Where the request went.
        url: String,
        /// The answer: `http 400`, `grpc InvalidArgument`, …
        status: String,
        /// The start of the response body.
        body: String,
    },

    /// The endpoint refused the bearer token (HTTP 401/403, gRPC `UNAUTHENTICATED` /
    /// `PERMISSION_DENIED`): not the data's fault, so the requests stay queued and are retried.
    #[error(
        "export to {url} refused the bearer token ({status}): {body}; kept in the retry queue ({queued} queued); give the agent a token with the ingest scope in --auth-token-file (read again before each send, no restart needed)"
    )]
    ExportRefused {
        /// Where the request went.
        url: String,
        /// The answer: `http 401`, `grpc Unauthenticated`, …
        status: String,
        /// The start of the response body.
        body: String,
        /// Requests now waiting in the queue.
        queued: usize,
    },

    /// The file of `--auth-token-file` is unreadable, empty, or does not hold one token.
    #[error(
        "bearer token file {}: {reason}; write one token (e.g. an ingest-scope token of the server's --auth-tokens file) into it, or leave --auth-token-file out", path.display()
    )]
    AuthToken {
        /// The `--auth-token-file`.
        path: PathBuf,
        /// What is wrong; never the token itself.
        reason: String,
    },

    /// Encoding the samples failed.
    #[error("cannot encode samples: {0}")]
    Encode(String),

    /// Writing to stdout (for `--once`) failed.
    #[error("cannot write to stdout: {0}")]
    Io(#[from] std::io::Error),

    /// The disk spool of `--buffer-dir` could not be opened.
    #[error("cannot open the disk spool in {}: {message}", path.display())]
    Spool {
        /// The `--buffer-dir`.
        path: PathBuf,
        /// What went wrong and what to do.
        message: String,
    },

    /// The async runtime could not be started.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl From<gpuwatch_common::Error> for Error {
    /// Settings errors keep the agent's variants (and exit codes).
    fn from(e: gpuwatch_common::Error) -> Self {
        use gpuwatch_common::Error as E;
        match e {
            E::Usage(e) => Error::Usage(e),
            E::BadEnv { var, value, reason } => Error::BadEnv { var, value, reason },
            E::ConfigRead { path, source } => Error::ConfigRead { path, source },
            E::ConfigParse { path, message } => Error::ConfigParse { path, message },
            other => Error::Settings(other),
        }
    }
}

impl Error {
    /// The process exit code for this error: 2 for configuration or usage errors and for NVML
    /// being unavailable, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(e) => {
                if e.use_stderr() {
                    2
                } else {
                    0
                }
            }
            Error::BadLabel { .. }
            | Error::ReservedLabel { .. }
            | Error::BadDuration { .. }
            | Error::BadEnv { .. }
            | Error::ConfigRead { .. }
            | Error::ConfigParse { .. }
            | Error::Invalid(_)
            | Error::Settings(_)
            | Error::BadEndpoint { .. }
            | Error::AuthToken { .. }
            | Error::NvmlUnavailable { .. } => 2,
            Error::Nvml { .. }
            | Error::HttpClient(_)
            | Error::ExportRetry { .. }
            | Error::ExportRejected { .. }
            | Error::ExportRefused { .. }
            | Error::Encode(_)
            | Error::Io(_)
            | Error::Spool { .. }
            | Error::Runtime(_) => 1,
        }
    }

    /// Whether the process should exit with this error's code (true for everything but a
    /// transient export failure or a refused token, which the run loop only logs).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::ExportRetry { .. } | Error::ExportRefused { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(Error::BadLabel { value: "x".into() }.exit_code(), 2);
        assert_eq!(Error::NvmlUnavailable { cause: "x".into() }.exit_code(), 2);
        assert_eq!(Error::Encode("x".into()).exit_code(), 1);
    }

    #[test]
    fn nvml_message_names_the_fix() {
        let msg = Error::NvmlUnavailable {
            cause: "libnvidia-ml.so.1: cannot open shared object file".into(),
        }
        .to_string();
        assert!(msg.starts_with("NVML is not available (libnvidia-ml.so.1 could not be loaded: "));
        assert!(msg.ends_with("run with --source synthetic"));
    }
}
