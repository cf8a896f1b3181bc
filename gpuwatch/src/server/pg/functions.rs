//! Postgres functions that clients of the Postgres wire protocol call and DataFusion lacks.
//!
//! - `current_setting(name [, missing_ok])`: Grafana's PostgreSQL data source asks for
//!   `current_setting('server_version_num')` when it is set up, and its query builder for
//!   `current_setting('search_path')`. The values are the ones the server announces at login.
//! - `pg_typeof(x)`: the Postgres name of a value's type, as the wire protocol reports it.
//!
//! Grafana's macros otherwise expand to SQL DataFusion runs as it is (`extract(epoch from …)`,
//! `floor`, `BETWEEN '<RFC 3339>' AND …`, casts), see docs/postgres.md.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StringArray};
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// The Postgres version the server presents itself as (`server_version` at login).
pub(crate) const SERVER_VERSION: &str = "16.6";
/// The same, as `server_version_num`.
pub(crate) const SERVER_VERSION_NUM: &str = "160006";

/// Registers the functions in `ctx`.
pub(crate) fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(CurrentSetting::new()));
    ctx.register_udf(ScalarUDF::from(PgTypeof::new()));
}

/// The value of a run-time setting, as `SHOW` would give it; `None` for unknown names.
fn setting(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "server_version" => SERVER_VERSION,
        "server_version_num" => SERVER_VERSION_NUM,
        "search_path" => "public",
        "timezone" => "UTC",
        "datestyle" => "ISO, MDY",
        "intervalstyle" => "postgres",
        "client_encoding" | "server_encoding" => "UTF8",
        "standard_conforming_strings" | "integer_datetimes" => "on",
        "transaction_read_only" | "default_transaction_read_only" => "on",
        "is_superuser" => "off",
        "max_identifier_length" => "63",
        "max_index_keys" => "32",
        "lc_collate" | "lc_ctype" => "C.UTF-8",
        _ => return None,
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentSetting {
    signature: Signature,
}

impl CurrentSetting {
    fn new() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Stable),
        }
    }
}

impl ScalarUDFImpl for CurrentSetting {
    fn name(&self) -> &str {
        "current_setting"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let text =
            |t: &DataType| matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8);
        match args {
            [name] if text(name) => Ok(DataType::Utf8),
            [name, DataType::Boolean] if text(name) => Ok(DataType::Utf8),
            _ => plan_err!(
                "current_setting takes a setting name (text) and optionally missing_ok (boolean)"
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let missing_ok = match args.args.get(1) {
            Some(ColumnarValue::Scalar(ScalarValue::Boolean(b))) => b.unwrap_or(false),
            Some(_) => return exec_err!("current_setting: missing_ok must be a constant"),
            None => false,
        };
        let lookup = |name: Option<&str>| -> Result<Option<&'static str>> {
            let Some(name) = name else { return Ok(None) };
            match setting(name) {
                Some(v) => Ok(Some(v)),
                None if missing_ok => Ok(None),
                None => exec_err!("unrecognized configuration parameter \"{name}\""),
            }
        };
        match &args.args[0] {
            ColumnarValue::Scalar(s) => {
                let name = match s {
                    ScalarValue::Utf8(v) | ScalarValue::Utf8View(v) | ScalarValue::LargeUtf8(v) => {
                        v.as_deref()
                    }
                    _ => return exec_err!("current_setting: the name must be text"),
                };
                Ok(ColumnarValue::Scalar(ScalarValue::Utf8(
                    lookup(name)?.map(str::to_string),
                )))
            }
            ColumnarValue::Array(a) => {
                let names = arrow::compute::cast(a, &DataType::Utf8)?;
                let Some(names) = names.as_any().downcast_ref::<StringArray>() else {
                    return exec_err!("current_setting: the name must be text");
                };
                let values = (0..names.len())
                    .map(|i| lookup(names.is_valid(i).then(|| names.value(i))))
                    .collect::<Result<StringArray>>()?;
                Ok(ColumnarValue::Array(Arc::new(values) as ArrayRef))
            }
        }
    }
}

/// The Postgres type name the wire protocol reports for `t`.
fn pg_type_name(t: &DataType) -> String {
    match t {
        DataType::Null => "unknown".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => "bigint".into(),
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => "numeric".into(),
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => "text".into(),
        DataType::Binary
        | DataType::BinaryView
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_) => "bytea".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        DataType::Timestamp(_, None) => "timestamp without time zone".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time without time zone".into(),
        DataType::Interval(_)
        | DataType::Duration(
            TimeUnit::Second | TimeUnit::Millisecond | TimeUnit::Microsecond | TimeUnit::Nanosecond,
        ) => "interval".into(),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::FixedSizeList(f, _)
        | DataType::ListView(f)
        | DataType::LargeListView(f) => {
            format!("{}[]", pg_type_name(f.data_type()))
        }
        DataType::Dictionary(_, v) => pg_type_name(v),
        DataType::Struct(_) | DataType::Map(..) => "json".into(),
        _ => "text".into(),
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct PgTypeof {
    signature: Signature,
}

impl PgTypeof {
    fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for PgTypeof {
    fn name(&self) -> &str {
        "pg_typeof"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some(field) = args.arg_fields.first() else {
            return exec_err!("pg_typeof takes one argument");
        };
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            pg_type_name(field.data_type()),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;

    async fn one(ctx: &SessionContext, sql: &str) -> Result<String> {
        let batches = ctx.sql(sql).await?.collect().await?;
        let col = arrow::compute::cast(batches[0].column(0), &DataType::Utf8)?;
        Ok(col.as_string::<i32>().value(0).to_string())
    }

    #[tokio::test]
    async fn settings_and_type_names() {
        let ctx = SessionContext::new();
        register(&ctx);
        assert_eq!(
            one(
                &ctx,
                "SELECT current_setting('server_version_num')::int/100"
            )
            .await
            .expect("version"),
            "1600"
        );
        assert_eq!(
            one(&ctx, "SELECT current_setting('search_path')")
                .await
                .expect("path"),
            "public"
        );
        let e = one(&ctx, "SELECT current_setting('no_such')")
            .await
            .expect_err("unknown");
        assert!(
            e.to_string()
                .contains("unrecognized configuration parameter"),
            "{e}"
        );
        let missing = ctx
            .sql("SELECT current_setting('no_such', true) IS NULL")
            .await
            .expect("plan")
            .collect()
            .await
            .expect("run");
        assert!(missing[0].column(0).as_boolean().value(0));
        for (sql, want) in [
            ("SELECT pg_typeof(1::bigint)", "bigint"),
            ("SELECT pg_typeof(1.5::double)", "double precision"),
            ("SELECT pg_typeof('x')", "text"),
            (
                "SELECT pg_typeof(CAST(now() AS TIMESTAMP))",
                "timestamp without time zone",
            ),
        ] {
            assert_eq!(one(&ctx, sql).await.expect(sql), want, "{sql}");
        }
    }
}
