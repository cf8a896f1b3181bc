//! Errors of the query engine, and the one place they become HTTP statuses.

use datafusion::error::DataFusionError;

/// Everything that can go wrong running a query.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is malformed (not the SQL).
    #[error("{0}")]
    BadRequest(String),

    /// The SQL does not parse or plan.
    #[error("{0}")]
    BadSql(String),

    /// The statement is not a read-only query.
    #[error("{0}")]
    NotAllowed(String),

    /// The query ran past the time limit.
    #[error("query ran longer than {0:?}: narrow the time range or raise --query-timeout")]
    Timeout(std::time::Duration),

    /// The query needed more resources than allowed.
    #[error("{0}")]
    ResourcesExhausted(String),

    /// Too many queries run at once.
    #[error(
        "{0} queries are running already (--max-concurrent-queries): retry after the Retry-After delay"
    )]
    Busy(usize),

    /// A function would build a value larger than `--max-value-bytes`.
    #[error("{0}")]
    ValueTooLarge(String),

    /// The answer is larger than `--max-answer-bytes`.
    #[error(
        "the answer is larger than --max-answer-bytes ({0} bytes): select fewer rows or columns, aggregate, or raise the limit"
    )]
    AnswerTooLarge(usize),

    /// The statement's text is longer than the server reads.
    #[error("the statement is {0} bytes long, more than {1} bytes: send a shorter statement")]
    StatementTooLong(usize, usize),

    /// The server is near its `--memory-limit`.
    #[error(
        "the server is near its --memory-limit ({0} bytes in use of {1}): the query was refused or stopped; retry after the Retry-After delay"
    )]
    MemoryPressure(usize, usize),

    /// The server is not ready yet; the text says why ([`gpuwatch_store::startup`]).
    #[error("the server is not ready yet: {0}")]
    NotReady(String),

    /// DataFusion failed in a way that is not the query's fault; the cause is kept.
    #[error("{message}")]
    Engine {
        /// The root cause's text, lowercased.
        message: String,
        /// DataFusion's error.
        #[source]
        source: Box<DataFusionError>,
    },

    /// Arrow failed encoding or decoding a batch; the cause is kept.
    #[error("{message}")]
    Arrow {
        /// The cause's text, lowercased.
        message: String,
        /// Arrow's error.
        #[source]
        source: arrow::error::ArrowError,
    },

    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

/// The HTTP status class of an error, decided once here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// 400
    BadRequest,
    /// 403
    Forbidden,
    /// 413
    PayloadTooLarge,
    /// 429
    TooManyRequests,
    /// 503
    Unavailable,
    /// 504
    Timeout,
    /// 500
    Internal,
}

impl Status {
    /// The numeric HTTP status.
    pub fn code(self) -> u16 {
        match self {
            Status::BadRequest => 400,
            Status::Forbidden => 403,
            Status::PayloadTooLarge => 413,
            Status::TooManyRequests => 429,
            Status::Unavailable => 503,
            Status::Timeout => 504,
            Status::Internal => 500,
        }
    }
}

impl Error {
    /// The HTTP status class.
    pub fn status(&self) -> Status {
        match self {
            Error::BadRequest(_) | Error::BadSql(_) | Error::ValueTooLarge(_) => Status::BadRequest,
            Error::AnswerTooLarge(_) | Error::StatementTooLong(..) => Status::PayloadTooLarge,
            Error::MemoryPressure(..) => Status::Unavailable,
            Error::NotAllowed(_) => Status::Forbidden,
            Error::Timeout(_) => Status::Timeout,
            Error::ResourcesExhausted(_) | Error::NotReady(_) => Status::Unavailable,
            Error::Busy(_) => Status::TooManyRequests,
            Error::Internal(_) | Error::Engine { .. } | Error::Arrow { .. } => Status::Internal,
        }
    }
}

/// Lowercases the first letter, as error messages here start lowercase.
pub fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

impl Error {
    /// A query over `--query-memory-limit`, with DataFusion's message `msg`.
    pub fn out_of_memory(msg: &str) -> Self {
        Error::ResourcesExhausted(format!(
            "{msg}: the query needs more memory than --query-memory-limit allows; narrow the time range or aggregate more"
        ))
    }
}

impl From<DataFusionError> for Error {
    fn from(e: DataFusionError) -> Self {
        if let Some(v) = crate::bounded::ValueTooLarge::find(&e) {
            return Error::ValueTooLarge(v.to_string());
        }
        if let Some(d) = crate::deadline::DeadlinePassed::find(&e) {
            return Error::Timeout(d.0);
        }
        if let Some(p) = crate::memory::Pressure::find(&e) {
            return Error::MemoryPressure(p.used, p.limit);
        }
        let root = e.find_root();
        let msg = lower_first(root.to_string().trim());
        let bad_sql = match root {
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Execution(_) => true,
            DataFusionError::ResourcesExhausted(_) => return Error::out_of_memory(&msg),
            DataFusionError::ArrowError(inner, _) => matches!(
                inner.as_ref(),
                arrow::error::ArrowError::CastError(_)
                    | arrow::error::ArrowError::ComputeError(_)
                    | arrow::error::ArrowError::ArithmeticOverflow(_)
                    | arrow::error::ArrowError::DivideByZero
                    | arrow::error::ArrowError::InvalidArgumentError(_)
                    | arrow::error::ArrowError::ParseError(_)
            ),
            _ => false,
        };
        if bad_sql {
            Error::BadSql(msg)
        } else {
            Error::Engine {
                message: msg,
                source: Box::new(e),
            }
        }
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::Arrow {
            message: lower_first(&e.to_string()),
            source: e,
        }
    }
}

/// Result with the query engine's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
