//! Postgres errors: the SQLSTATE of every error the engine and DataFusion raise.

use datafusion::error::DataFusionError;
use datafusion_postgres::pgwire::error::{ErrorInfo, PgWireError};

use gpuwatch_query::{Error, lower_first};

pub(super) fn error(severity: &str, code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        severity.to_owned(),
        code.to_owned(),
        message.into(),
    )))
}

/// The SQLSTATE of a DataFusion error.
pub(super) fn sqlstate(e: &DataFusionError) -> &'static str {
    if gpuwatch_query::bounded::ValueTooLarge::find(e).is_some() {
        return "54000";
    }
    if gpuwatch_query::memory::Pressure::find(e).is_some() {
        return "53200";
    }
    if gpuwatch_query::deadline::DeadlinePassed::find(e).is_some() {
        return "57014";
    }
    let root = e.find_root();
    let text = root.to_string().to_ascii_lowercase();
    match root {
        DataFusionError::SQL(..) => "42601",
        DataFusionError::SchemaError(inner, _) => match inner.as_ref() {
            datafusion::common::SchemaError::FieldNotFound { .. } => "42703",
            datafusion::common::SchemaError::AmbiguousReference { .. } => "42702",
            _ => "42P18",
        },
        DataFusionError::Plan(_) if text.contains("table") && text.contains("not found") => "42P01",
        DataFusionError::Plan(_)
            if text.contains("invalid function")
                || text.contains("function") && text.contains("not found") =>
        {
            "42883"
        }
        DataFusionError::Plan(_) if text.contains("no field named") => "42703",
        DataFusionError::Plan(_) => "42804",
        DataFusionError::NotImplemented(_) => "0A000",
        DataFusionError::ResourcesExhausted(_) => "53200",
        DataFusionError::ArrowError(inner, _) => match inner.as_ref() {
            arrow::error::ArrowError::DivideByZero => "22012",
            arrow::error::ArrowError::ArithmeticOverflow(_) => "22003",
            arrow::error::ArrowError::CastError(_) | arrow::error::ArrowError::ParseError(_) => {
                "22P02"
            }
            arrow::error::ArrowError::ComputeError(_)
            | arrow::error::ArrowError::InvalidArgumentError(_) => "22023",
            _ => "XX000",
        },
        DataFusionError::Execution(_) if text.contains("divide by zero") => "22012",
        DataFusionError::Execution(_) => "22000",
        _ => "XX000",
    }
}

/// A query engine error as a Postgres error.
pub(super) fn engine_error(e: &Error) -> PgWireError {
    let code = match e {
        Error::BadRequest(_) | Error::BadSql(_) => "42601",
        Error::NotAllowed(_) => "42501",
        Error::Timeout(_) => "57014",
        Error::ResourcesExhausted(_) | Error::MemoryPressure(..) => "53200",
        Error::ValueTooLarge(_) | Error::AnswerTooLarge(_) | Error::StatementTooLong(..) => "54000",
        Error::Busy(_) => "53000",
        Error::NotReady(_) => "57P03",
        Error::Internal(_) | Error::Engine { .. } | Error::Arrow { .. } => "XX000",
    };
    error("ERROR", code, e.to_string())
}

/// Gives errors from `datafusion-postgres` (DataFusion and parser errors, wrapped as
/// `ApiError`, which would all read XX000) their SQLSTATE and a lowercase message.
pub(super) fn classify(e: PgWireError) -> PgWireError {
    let inner = match e {
        PgWireError::ApiError(inner) => inner,
        PgWireError::UserError(info)
            if info.code == "XX000" && info.message.contains("Unsupported Datatype") =>
        {
            return unsupported_type(&info.message);
        }
        other => return other,
    };
    if let Some(df) = inner.downcast_ref::<DataFusionError>() {
        if let Some(v) = gpuwatch_query::bounded::ValueTooLarge::find(df) {
            return engine_error(&Error::ValueTooLarge(v.to_string()));
        }
        if let Some(p) = gpuwatch_query::memory::Pressure::find(df) {
            return engine_error(&Error::MemoryPressure(p.used, p.limit));
        }
        if let Some(d) = gpuwatch_query::deadline::DeadlinePassed::find(df) {
            return engine_error(&Error::Timeout(d.0));
        }
        let message = lower_first(df.find_root().to_string().trim());
        let code = sqlstate(df);
        if code == "53200" {
            // The words the HTTP API answers with.
            return engine_error(&Error::out_of_memory(&message));
        }
        return error("ERROR", code, message);
    }
    if let Some(p) = inner.downcast_ref::<datafusion::sql::sqlparser::parser::ParserError>() {
        return error("ERROR", "42601", lower_first(&p.to_string()));
    }
    let text = inner.to_string();
    if text.contains("Unsupported Datatype") {
        return unsupported_type(&text);
    }
    error("ERROR", "XX000", lower_first(&text))
}

/// A column whose Arrow type has no Postgres counterpart here (maps).
pub(super) fn unsupported_type(text: &str) -> PgWireError {
    error(
        "ERROR",
        "0A000",
        format!(
            "{}: this column type cannot be sent over the postgres protocol; select single map entries such as labels['host']",
            lower_first(text)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datafusion_errors_get_sqlstates() {
        let cases = [
            (
                DataFusionError::Plan("table 'gpuwatch.public.nope' not found".into()),
                "42P01",
            ),
            (
                DataFusionError::Plan("Invalid function 'nope'.".into()),
                "42883",
            ),
            (DataFusionError::NotImplemented("x".into()), "0A000"),
            (DataFusionError::ResourcesExhausted("x".into()), "53200"),
            (
                DataFusionError::ArrowError(Box::new(arrow::error::ArrowError::DivideByZero), None),
                "22012",
            ),
        ];
        for (e, code) in cases {
            assert_eq!(sqlstate(&e), code, "{e}");
        }
    }
}
