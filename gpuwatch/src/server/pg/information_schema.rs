//! `information_schema` as the Postgres front end shows it: DataFusion's own tables, except that
//! `information_schema.columns` names each column's type as a Postgres server would
//! (`double precision`, `bigint`, `text`, `timestamp with time zone`), not as Arrow does
//! (`Float64`, `Int64`, `Utf8View`, `Timestamp(ns, "UTC")`).
//!
//! Grafana's PostgreSQL query builder reads `data_type` from `information_schema.columns` to
//! decide which columns are times and which can be aggregated. The name given is the one of the
//! type the wire protocol sends for the column (`datafusion-postgres`'s own mapping,
//! [`field_into_pg_type`]), so what the catalog says and what a `SELECT` returns agree; `\d`
//! (through `pg_catalog`) says the same. The numeric, character and datetime columns of the
//! table follow Postgres too (`numeric_precision` 53 for `double precision`, `ordinal_position`
//! from 1), and `udt_name` gives the type's internal name (`float8`, `timestamptz`).
//!
//! The session of the Postgres front end turns DataFusion's built-in `information_schema` off
//! and registers [`PgInformationSchema`] as the catalog's `information_schema` schema instead;
//! the HTTP API keeps DataFusion's.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{RecordBatch, StringBuilder, UInt64Builder};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::information_schema::{INFORMATION_SCHEMA, InformationSchemaProvider};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{CatalogProviderList, SchemaProvider, TableFunction, TableProvider};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion_postgres::arrow_pg::datatypes::field_into_pg_type;
use datafusion_postgres::pgwire::api::Type;

/// The `information_schema` schema of the Postgres front end's catalog.
pub(crate) struct PgInformationSchema {
    /// DataFusion's tables (`tables`, `views`, `schemata`, `df_settings`, `routines`, …).
    inner: InformationSchemaProvider,
    catalogs: Arc<dyn CatalogProviderList>,
}

impl fmt::Debug for PgInformationSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgInformationSchema")
            .finish_non_exhaustive()
    }
}

impl PgInformationSchema {
    /// The schema over every catalog of `catalogs`, listing `table_functions` in `routines`.
    pub(crate) fn new(
        catalogs: Arc<dyn CatalogProviderList>,
        table_functions: HashMap<String, Arc<TableFunction>>,
    ) -> Self {
        Self {
            inner: InformationSchemaProvider::new(Arc::clone(&catalogs))
                .with_table_functions(table_functions),
            catalogs,
        }
    }
}

#[async_trait]
impl SchemaProvider for PgInformationSchema {
    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if !name.eq_ignore_ascii_case("columns") {
            return self.inner.table(name).await;
        }
        let columns = Arc::new(Columns {
            schema: columns_schema(),
            catalogs: Arc::clone(&self.catalogs),
        });
        let table = StreamingTable::try_new(Arc::clone(&columns.schema), vec![columns])?;
        Ok(Some(Arc::new(table)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// The columns of `information_schema.columns`: DataFusion's, then `udt_name`.
fn columns_schema() -> SchemaRef {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let number = |name: &str, nullable: bool| Field::new(name, DataType::UInt64, nullable);
    Arc::new(Schema::new(vec![
        text("table_catalog", false),
        text("table_schema", false),
        text("table_name", false),
        text("column_name", false),
        number("ordinal_position", false),
        text("column_default", true),
        text("is_nullable", false),
        text("data_type", false),
        number("character_maximum_length", true),
        number("character_octet_length", true),
        number("numeric_precision", true),
        number("numeric_precision_radix", true),
        number("numeric_scale", true),
        number("datetime_precision", true),
        text("interval_type", true),
        text("udt_name", false),
    ]))
}

/// `information_schema.columns`, computed when scanned.
#[derive(Debug)]
struct Columns {
    schema: SchemaRef,
    catalogs: Arc<dyn CatalogProviderList>,
}

impl PartitionStream for Columns {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let catalogs = Arc::clone(&self.catalogs);
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(async move { columns(schema, catalogs.as_ref()).await }),
        ))
    }
}

/// Every column of every table outside `information_schema`, one row each.
async fn columns(schema: SchemaRef, catalogs: &dyn CatalogProviderList) -> Result<RecordBatch> {
    let mut rows = ColumnRows::default();
    for catalog_name in catalogs.catalog_names() {
        let Some(catalog) = catalogs.catalog(&catalog_name) else {
            continue;
        };
        for schema_name in catalog.schema_names() {
            if schema_name == INFORMATION_SCHEMA {
                continue;
            }
            let Some(tables) = catalog.schema(&schema_name) else {
                continue;
            };
            for table_name in tables.table_names() {
                let Some(table) = tables.table(&table_name).await? else {
                    continue;
                };
                for (i, field) in table.schema().fields().iter().enumerate() {
                    rows.push(&catalog_name, &schema_name, &table_name, i + 1, field);
                }
            }
        }
    }
    rows.finish(schema)
}

#[derive(Default)]
struct ColumnRows {
    catalog: StringBuilder,
    schema: StringBuilder,
    table: StringBuilder,
    column: StringBuilder,
    ordinal: UInt64Builder,
    default: StringBuilder,
    nullable: StringBuilder,
    data_type: StringBuilder,
    char_max: UInt64Builder,
    octets: UInt64Builder,
    precision: UInt64Builder,
    radix: UInt64Builder,
    scale: UInt64Builder,
    datetime_precision: UInt64Builder,
    interval_type: StringBuilder,
    udt: StringBuilder,
}

impl ColumnRows {
    fn push(&mut self, catalog: &str, schema: &str, table: &str, ordinal: usize, field: &FieldRef) {
        let t = PgColumnType::of(field);
        self.catalog.append_value(catalog);
        self.schema.append_value(schema);
        self.table.append_value(table);
        self.column.append_value(field.name());
        self.ordinal.append_value(ordinal as u64);
        self.default.append_null();
        self.nullable
            .append_value(if field.is_nullable() { "YES" } else { "NO" });
        self.data_type.append_value(t.data_type);
        self.char_max.append_null();
        self.octets.append_option(t.octets);
        self.precision.append_option(t.numeric.map(|n| n.0));
        self.radix.append_option(t.numeric.map(|n| n.1));
        self.scale.append_option(t.numeric.and_then(|n| n.2));
        self.datetime_precision.append_option(t.datetime_precision);
        self.interval_type.append_null();
        self.udt.append_value(&t.udt_name);
    }

    fn finish(mut self, schema: SchemaRef) -> Result<RecordBatch> {
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(self.catalog.finish()),
            Arc::new(self.schema.finish()),
            Arc::new(self.table.finish()),
            Arc::new(self.column.finish()),
            Arc::new(self.ordinal.finish()),
            Arc::new(self.default.finish()),
            Arc::new(self.nullable.finish()),
            Arc::new(self.data_type.finish()),
            Arc::new(self.char_max.finish()),
            Arc::new(self.octets.finish()),
            Arc::new(self.precision.finish()),
            Arc::new(self.radix.finish()),
            Arc::new(self.scale.finish()),
            Arc::new(self.datetime_precision.finish()),
            Arc::new(self.interval_type.finish()),
            Arc::new(self.udt.finish()),
        ];
        RecordBatch::try_new(schema, columns)
            .map_err(|e| DataFusionError::ArrowError(Box::new(e), None))
    }
}

/// How `information_schema.columns` describes a column's type.
#[derive(Debug, PartialEq, Eq)]
struct PgColumnType {
    /// `data_type`: the SQL name (`double precision`), `ARRAY` for arrays and `USER-DEFINED`
    /// for types without a built-in name, as Postgres writes them.
    data_type: &'static str,
    /// `udt_name`: the type's internal name (`float8`, `_text` for `text[]`).
    udt_name: String,
    /// `character_octet_length`.
    octets: Option<u64>,
    /// `numeric_precision`, `numeric_precision_radix`, `numeric_scale`.
    numeric: Option<(u64, u64, Option<u64>)>,
    /// `datetime_precision`.
    datetime_precision: Option<u64>,
}

impl PgColumnType {
    /// The description of `field`, from the Postgres type its values are sent as.
    fn of(field: &FieldRef) -> Self {
        let Ok(pg) = field_into_pg_type(field) else {
            // No Postgres type (maps): what Postgres says of an extension's type.
            let udt_name = match field.data_type() {
                DataType::Map(..) => "map".to_string(),
                other => other.to_string(),
            };
            return Self {
                data_type: "USER-DEFINED",
                udt_name,
                octets: None,
                numeric: None,
                datetime_precision: None,
            };
        };
        let numeric = match field.data_type() {
            DataType::Decimal32(p, s)
            | DataType::Decimal64(p, s)
            | DataType::Decimal128(p, s)
            | DataType::Decimal256(p, s) => {
                Some((u64::from(*p), 10, Some(u64::try_from(*s).unwrap_or(0))))
            }
            // 64-bit unsigned integers are sent as numeric: 20 digits.
            DataType::UInt64 => Some((20, 10, Some(0))),
            _ => None,
        };
        let udt_name = pg.name().to_string();
        match field.data_type() {
            DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_) => Self::plain("ARRAY", udt_name),
            _ => Self::named(&pg, udt_name, numeric),
        }
    }

    /// The description of a column sent as `pg`; `decimal` is the precision of a numeric.
    fn named(pg: &Type, udt_name: String, decimal: Option<(u64, u64, Option<u64>)>) -> Self {
        match *pg {
            Type::BOOL => Self::plain("boolean", udt_name),
            Type::INT2 => Self::number("smallint", udt_name, 16),
            Type::INT4 => Self::number("integer", udt_name, 32),
            Type::INT8 => Self::number("bigint", udt_name, 64),
            Type::FLOAT4 => Self::float("real", udt_name, 24),
            Type::FLOAT8 => Self::float("double precision", udt_name, 53),
            Type::NUMERIC => Self {
                numeric: decimal,
                ..Self::plain("numeric", udt_name)
            },
            Type::TEXT => Self::string("text", udt_name),
            Type::VARCHAR => Self::string("character varying", udt_name),
            Type::BPCHAR => Self::string("character", udt_name),
            Type::CHAR => Self::plain("\"char\"", udt_name),
            Type::NAME => Self::plain("name", udt_name),
            Type::BYTEA => Self::plain("bytea", udt_name),
            Type::DATE => Self::datetime("date", udt_name, 0),
            Type::TIME => Self::datetime("time without time zone", udt_name, 6),
            Type::TIMETZ => Self::datetime("time with time zone", udt_name, 6),
            Type::TIMESTAMP => Self::datetime("timestamp without time zone", udt_name, 6),
            Type::TIMESTAMPTZ => Self::datetime("timestamp with time zone", udt_name, 6),
            Type::INTERVAL => Self::datetime("interval", udt_name, 6),
            Type::JSON => Self::plain("json", udt_name),
            Type::JSONB => Self::plain("jsonb", udt_name),
            Type::UUID => Self::plain("uuid", udt_name),
            Type::OID => Self::plain("oid", udt_name),
            Type::REGCLASS => Self::plain("regclass", udt_name),
            Type::REGTYPE => Self::plain("regtype", udt_name),
            Type::REGPROC => Self::plain("regproc", udt_name),
            Type::UNKNOWN => Self::plain("unknown", udt_name),
            _ => Self::plain("USER-DEFINED", udt_name),
        }
    }

    fn plain(data_type: &'static str, udt_name: String) -> Self {
        Self {
            data_type,
            udt_name,
            octets: None,
            numeric: None,
            datetime_precision: None,
        }
    }

    /// An integer of `bits` bits (binary precision, scale 0).
    fn number(data_type: &'static str, udt_name: String, bits: u64) -> Self {
        Self {
            numeric: Some((bits, 2, Some(0))),
            ..Self::plain(data_type, udt_name)
        }
    }

    /// A float with a mantissa of `bits` bits (binary precision, no scale).
    fn float(data_type: &'static str, udt_name: String, bits: u64) -> Self {
        Self {
            numeric: Some((bits, 2, None)),
            ..Self::plain(data_type, udt_name)
        }
    }

    /// Text without a declared length: at most 1 GiB, as Postgres says.
    fn string(data_type: &'static str, udt_name: String) -> Self {
        Self {
            octets: Some(1 << 30),
            ..Self::plain(data_type, udt_name)
        }
    }

    /// A date or time with `digits` fractional digits of seconds.
    fn datetime(data_type: &'static str, udt_name: String, digits: u64) -> Self {
        Self {
            datetime_precision: Some(digits),
            ..Self::plain(data_type, udt_name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::TimeUnit;

    fn described(t: DataType) -> PgColumnType {
        PgColumnType::of(&Arc::new(Field::new("c", t, true)))
    }

    #[test]
    fn types_are_named_as_postgres_names_them() {
        let cases = [
            (DataType::Float64, "double precision", "float8"),
            (DataType::Float32, "real", "float4"),
            (DataType::Int64, "bigint", "int8"),
            (DataType::UInt32, "bigint", "int8"),
            (DataType::Int32, "integer", "int4"),
            (DataType::Int16, "smallint", "int2"),
            (DataType::UInt64, "numeric", "numeric"),
            (DataType::Boolean, "boolean", "bool"),
            (DataType::Utf8View, "text", "text"),
            (DataType::Utf8, "text", "text"),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                "timestamp with time zone",
                "timestamptz",
            ),
            (
                DataType::Timestamp(TimeUnit::Microsecond, None),
                "timestamp without time zone",
                "timestamp",
            ),
            (DataType::Date32, "date", "date"),
            (
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                "ARRAY",
                "_text",
            ),
        ];
        for (arrow_type, data_type, udt) in cases {
            let t = described(arrow_type.clone());
            assert_eq!(t.data_type, data_type, "{arrow_type}");
            assert_eq!(t.udt_name, udt, "{arrow_type}");
        }
        assert_eq!(described(DataType::Float64).numeric, Some((53, 2, None)));
        assert_eq!(described(DataType::Int64).numeric, Some((64, 2, Some(0))));
        assert_eq!(
            described(DataType::Decimal128(12, 3)).numeric,
            Some((12, 10, Some(3)))
        );
        assert_eq!(described(DataType::Utf8View).octets, Some(1 << 30));
        assert_eq!(
            described(DataType::Timestamp(TimeUnit::Nanosecond, None)).datetime_precision,
            Some(6)
        );
    }

    #[test]
    fn a_type_the_protocol_cannot_send_is_user_defined() {
        // The map of `metrics.labels`.
        let schema = gpuwatch_store::schema::Table::Metrics.schema();
        let map = schema
            .field_with_name("labels")
            .expect("metrics.labels")
            .data_type()
            .clone();
        assert!(matches!(map, DataType::Map(..)), "{map}");
        let t = described(map);
        assert_eq!(t.data_type, "USER-DEFINED");
        assert_eq!(t.numeric, None);
    }
}
