//! The tables' Delta schemas, and the Arrow schema of their data files.
//!
//! Delta's `timestamp` type has microsecond precision, so the data files hold `time` (and every
//! other timestamp) as `TIMESTAMP(MICROS, UTC)`: Spark, Trino, Athena and Databricks read them
//! as they read any Delta table. Ingest keeps times to whole microseconds, so nothing is lost;
//! the query engine reads the files through the SQL schema (nanoseconds), casting on read.
//! Maps are written with Parquet's standard `key_value` / `key` / `value` names. Every table is
//! partitioned by `date` (the UTC day of `time`), a Delta partition column that lives in the log,
//! not in the files, so external engines prune whole days.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, MapArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use deltalake_core::kernel::{DataType as DeltaType, MapType, StructField};

use crate::schema::Table;
use crate::{Error, Result};

/// The partition column of every table.
pub const PARTITION_COLUMN: &str = "date";

fn delta_type(table: Table, field: &Field) -> Result<DeltaType> {
    Ok(match field.data_type() {
        DataType::Timestamp(_, Some(_)) => DeltaType::TIMESTAMP,
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => DeltaType::STRING,
        DataType::Int32 => DeltaType::INTEGER,
        DataType::Int64 => DeltaType::LONG,
        DataType::Float64 => DeltaType::DOUBLE,
        DataType::Boolean => DeltaType::BOOLEAN,
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(unsupported(table, field));
            };
            let value_nullable = kv.get(1).is_none_or(|v| v.is_nullable());
            MapType::new(DeltaType::STRING, DeltaType::STRING, value_nullable).into()
        }
        _ => return Err(unsupported(table, field)),
    })
}

fn unsupported(table: Table, field: &Field) -> Error {
    Error::DeltaSchema(format!(
        "column {}.{} has type {}, which has no Delta equivalent here",
        table.name(),
        field.name(),
        field.data_type()
    ))
}

/// The Delta columns of `table`: its SQL columns, then `date`.
pub fn delta_columns(table: Table) -> Result<Vec<StructField>> {
    let schema = table.schema();
    let mut out = Vec::with_capacity(schema.fields().len() + 1);
    for f in schema.fields() {
        out.push(StructField::new(
            f.name().clone(),
            delta_type(table, f)?,
            f.is_nullable(),
        ));
    }
    out.push(StructField::new(PARTITION_COLUMN, DeltaType::DATE, false));
    Ok(out)
}

fn file_type(ty: &DataType) -> DataType {
    match ty {
        DataType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        DataType::Map(entries, sorted) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return ty.clone();
            };
            let names = ["key", "value"];
            let fields: Fields = kv
                .iter()
                .zip(names)
                .map(|(f, name)| {
                    Arc::new(Field::new(name, file_type(f.data_type()), f.is_nullable()))
                })
                .collect();
            DataType::Map(
                Arc::new(Field::new("key_value", DataType::Struct(fields), false)),
                *sorted,
            )
        }
        other => other.clone(),
    }
}

/// The Arrow schema of `table`'s data files (timestamps in microseconds, standard map names).
pub fn file_schema(table: Table) -> SchemaRef {
    let schema = table.schema();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(file_type(f.data_type())))
        .collect();
    Arc::new(Schema::new(fields))
}

/// `batch` (in the table's SQL schema) in the file schema.
pub fn to_file_batch(table: Table, batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = file_schema(table);
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| convert(c, f.data_type()))
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn convert(column: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if column.data_type() == to {
        return Ok(Arc::clone(column));
    }
    if let (DataType::Map(_, _), DataType::Map(entries, sorted)) = (column.data_type(), to) {
        // A map's field names are not something `cast` renames: rebuild it around the same
        // buffers with the file's names.
        let map = column
            .as_any()
            .downcast_ref::<MapArray>()
            .ok_or_else(|| Error::DeltaSchema("a map column is not a map array".into()))?;
        let DataType::Struct(fields) = entries.data_type() else {
            return Err(Error::DeltaSchema("a map type without entries".into()));
        };
        let kv = arrow::array::StructArray::try_new(
            fields.clone(),
            map.entries().columns().to_vec(),
            map.entries().nulls().cloned(),
        )?;
        let out = MapArray::try_new(
            Arc::clone(entries),
            map.offsets().clone(),
            kv,
            map.nulls().cloned(),
            *sorted,
        )?;
        return Ok(Arc::new(out));
    }
    Ok(cast(column, to)?)
}

/// A batch read from a data file (microsecond or, in files of earlier releases, nanosecond
/// times; any map field names) in `table`'s SQL schema. Columns the file lacks are null; a
/// column of an incompatible type is refused rather than read back as nulls.
pub fn from_file_batch(table: Table, batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = table.schema();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let Some(c) = batch.column_by_name(field.name()) else {
            columns.push(arrow::array::new_null_array(
                field.data_type(),
                batch.num_rows(),
            ));
            continue;
        };
        let compatible = match (c.data_type(), field.data_type()) {
            (a, b) if a == b => true,
            (DataType::Timestamp(_, _), DataType::Timestamp(_, _)) => true,
            (DataType::Map(_, _), DataType::Map(_, _)) => true,
            (DataType::Utf8View | DataType::LargeUtf8, DataType::Utf8) => true,
            _ => false,
        };
        if !compatible {
            return Err(Error::malformed(
                "parquet file",
                format!(
                    "column {} is {} where {} is expected; the file is left as it is so that no value is lost",
                    field.name(),
                    c.data_type(),
                    field.data_type()
                ),
            ));
        }
        columns.push(convert(c, field.data_type())?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_a_delta_schema_and_a_file_schema_in_microseconds() {
        for table in Table::ALL {
            let cols = delta_columns(table).expect("delta columns");
            assert_eq!(cols.len(), table.schema().fields().len() + 1);
            assert_eq!(cols.last().map(|c| c.name().as_str()), Some("date"));
            let fs = file_schema(table);
            assert_eq!(
                fs.field(0).data_type(),
                &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            );
        }
    }
}
