//! Encoding of query answers: json, jsonl, csv, arrow (IPC stream) and parquet.

use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::engine::QueryResult;
use crate::error::{Error, Result};

/// An answer format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// A JSON array of objects (the default).
    #[default]
    Json,
    /// One JSON object per line.
    Jsonl,
    /// CSV with a header row.
    Csv,
    /// Arrow IPC stream.
    Arrow,
    /// A Parquet file.
    Parquet,
}

impl FromStr for Format {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "" | "json" => Ok(Format::Json),
            "jsonl" | "ndjson" => Ok(Format::Jsonl),
            "csv" => Ok(Format::Csv),
            "arrow" => Ok(Format::Arrow),
            "parquet" => Ok(Format::Parquet),
            other => Err(Error::BadRequest(format!(
                "unknown format {other:?}: use json, jsonl, csv, arrow or parquet"
            ))),
        }
    }
}

impl Format {
    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Jsonl => "application/x-ndjson",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Arrow => "application/vnd.apache.arrow.stream",
            Format::Parquet => "application/vnd.apache.parquet",
        }
    }
}

/// Encodes a whole answer.
pub fn encode(result: &QueryResult, format: Format) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match format {
        Format::Json => {
            let rows: usize = result.batches.iter().map(|b| b.num_rows()).sum();
            if rows == 0 {
                return Ok(b"[]".to_vec());
            }
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::JsonArray>(&mut out);
            for b in &result.batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        Format::Jsonl => {
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut out);
            for b in &result.batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        Format::Csv => {
            let schema = flat_schema(&result.schema);
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            w.write(&RecordBatch::new_empty(Arc::clone(&schema)))?;
            for b in &result.batches {
                w.write(&flatten(b, &schema)?)?;
            }
        }
        Format::Arrow => {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &result.schema)?;
            for b in &result.batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        Format::Parquet => {
            let mut w =
                parquet::arrow::ArrowWriter::try_new(&mut out, Arc::clone(&result.schema), None)
                    .map_err(|e| Error::Internal(e.to_string()))?;
            for b in &result.batches {
                w.write(b).map_err(|e| Error::Internal(e.to_string()))?;
            }
            w.close().map_err(|e| Error::Internal(e.to_string()))?;
        }
    }
    Ok(out)
}

fn is_nested(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Map(..)
            | DataType::Struct(_)
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
    )
}

/// CSV cannot hold nested values: they become their text form.
fn flat_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if is_nested(f.data_type()) {
                Field::new(f.name(), DataType::Utf8, true)
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

fn flatten(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let options = FormatOptions::default();
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> Result<ArrayRef> {
            if !is_nested(c.data_type()) {
                return Ok(Arc::clone(c));
            }
            let fmt = ArrayFormatter::try_new(c.as_ref(), &options)?;
            let texts: StringArray = (0..c.len())
                .map(|i| (!c.is_null(i)).then(|| fmt.value(i).to_string()))
                .collect();
            Ok(Arc::new(texts))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}
