//! Errors of the PromQL engine, and their Prometheus error types.

/// Everything that can go wrong answering a Prometheus API request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed parameter or query, or something gpuwatch does not support (`bad_data`, 400).
    #[error("{0}")]
    BadData(String),

    /// The query is valid but cannot be evaluated on this data (`execution`, 422): duplicate
    /// series, many-to-many matching, too many samples.
    #[error("{0}")]
    Execution(String),

    /// The query ran past its time limit (`timeout`, 503).
    #[error(
        "query timed out in {0}: narrow the time range, raise the step, or raise --query-timeout"
    )]
    Timeout(&'static str),

    /// The answer is larger than `--max-answer-bytes` (`execution`, 422).
    #[error(
        "the answer is larger than --max-answer-bytes ({0} bytes): select fewer series, raise the step, or aggregate"
    )]
    AnswerTooLarge(usize),

    /// The SQL engine under the selection failed.
    #[error(transparent)]
    Query(#[from] gpuwatch_query::Error),

    /// Reading a batch of the selection failed.
    #[error("reading the selected samples: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

/// `Result` with this crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Prometheus's `errorType` and the HTTP status that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// 400
    BadData,
    /// 422
    Execution,
    /// 503
    Timeout,
    /// 503 (the server sheds load or is not ready)
    Unavailable,
    /// 500
    Internal,
}

impl ErrorType {
    /// The `errorType` text.
    pub fn name(self) -> &'static str {
        match self {
            ErrorType::BadData => "bad_data",
            ErrorType::Execution => "execution",
            ErrorType::Timeout => "timeout",
            ErrorType::Unavailable => "unavailable",
            ErrorType::Internal => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            ErrorType::BadData => 400,
            ErrorType::Execution => 422,
            ErrorType::Timeout | ErrorType::Unavailable => 503,
            ErrorType::Internal => 500,
        }
    }
}

impl Error {
    /// The Prometheus error type of this error.
    pub fn error_type(&self) -> ErrorType {
        use gpuwatch_query::Status;
        match self {
            Error::BadData(_) => ErrorType::BadData,
            Error::Execution(_) | Error::AnswerTooLarge(_) => ErrorType::Execution,
            Error::Timeout(_) => ErrorType::Timeout,
            Error::Arrow(_) => ErrorType::Internal,
            Error::Query(q) => match q {
                gpuwatch_query::Error::Timeout(_) => ErrorType::Timeout,
                gpuwatch_query::Error::ResourcesExhausted(_)
                | gpuwatch_query::Error::ValueTooLarge(_)
                | gpuwatch_query::Error::AnswerTooLarge(_) => ErrorType::Execution,
                other => match other.status() {
                    Status::BadRequest | Status::Forbidden | Status::PayloadTooLarge => {
                        ErrorType::BadData
                    }
                    Status::TooManyRequests | Status::Unavailable => ErrorType::Unavailable,
                    Status::Timeout => ErrorType::Timeout,
                    Status::Internal => ErrorType::Internal,
                },
            },
        }
    }
}

/// A `bad_data` error.
pub(crate) fn bad(msg: impl Into<String>) -> Error {
    Error::BadData(msg.into())
}

/// An `execution` error.
pub(crate) fn exec(msg: impl Into<String>) -> Error {
    Error::Execution(msg.into())
}
