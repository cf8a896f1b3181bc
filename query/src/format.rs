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
    /// Whether answers in this format are text (an error line can end them).
    pub fn is_text(self) -> bool {
        matches!(self, Format::Json | Format::Jsonl | Format::Csv)
    }

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

/// A `Write` whose bytes are taken out after each batch, so an answer streams.
#[derive(Debug, Clone, Default)]
struct SharedBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedBuf {
    fn take(&self) -> Vec<u8> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *g)
    }
}

impl std::io::Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rows per Parquet row group of an answer: the encoder holds at most one group in memory.
const PARQUET_ROW_GROUP: usize = 64 * 1024;

enum Writer {
    Json(Box<arrow::json::Writer<SharedBuf, arrow::json::writer::JsonArray>>),
    Jsonl(Box<arrow::json::Writer<SharedBuf, arrow::json::writer::LineDelimited>>),
    Csv(Box<arrow::csv::Writer<SharedBuf>>, SchemaRef),
    Arrow(Box<arrow::ipc::writer::StreamWriter<SharedBuf>>),
    Parquet(Box<parquet::arrow::ArrowWriter<SharedBuf>>),
}

/// Encodes an answer batch by batch: each call returns the bytes ready to send, so the whole
/// answer never sits in memory.
pub struct Encoder {
    writer: Writer,
    buf: SharedBuf,
    rows: usize,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("rows", &self.rows).finish()
    }
}

fn parquet_error(e: parquet::errors::ParquetError) -> Error {
    Error::Internal(e.to_string())
}

impl Encoder {
    /// An encoder of rows of `schema` in `format`.
    pub fn new(schema: &SchemaRef, format: Format) -> Result<Self> {
        let buf = SharedBuf::default();
        let writer = match format {
            Format::Json => Writer::Json(Box::new(
                arrow::json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build(buf.clone()),
            )),
            Format::Jsonl => Writer::Jsonl(Box::new(
                arrow::json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build(buf.clone()),
            )),
            Format::Csv => {
                let flat = flat_schema(schema);
                let mut w = arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(buf.clone());
                w.write(&RecordBatch::new_empty(Arc::clone(&flat)))?;
                Writer::Csv(Box::new(w), flat)
            }
            Format::Arrow => Writer::Arrow(Box::new(arrow::ipc::writer::StreamWriter::try_new(
                buf.clone(),
                schema,
            )?)),
            Format::Parquet => {
                let props = parquet::file::properties::WriterProperties::builder()
                    .set_max_row_group_row_count(Some(PARQUET_ROW_GROUP))
                    .build();
                Writer::Parquet(Box::new(
                    parquet::arrow::ArrowWriter::try_new(
                        buf.clone(),
                        Arc::clone(schema),
                        Some(props),
                    )
                    .map_err(parquet_error)?,
                ))
            }
        };
        Ok(Self {
            writer,
            buf,
            rows: 0,
        })
    }

    /// Encodes one batch; returns the bytes ready to send (maybe none).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<Vec<u8>> {
        self.rows += batch.num_rows();
        match &mut self.writer {
            Writer::Json(w) => w.write(batch)?,
            Writer::Jsonl(w) => w.write(batch)?,
            Writer::Csv(w, flat) => w.write(&flatten(batch, flat)?)?,
            Writer::Arrow(w) => w.write(batch)?,
            Writer::Parquet(w) => w.write(batch).map_err(parquet_error)?,
        }
        Ok(self.buf.take())
    }

    /// Ends the answer; returns the last bytes.
    pub fn finish(self) -> Result<Vec<u8>> {
        match self.writer {
            Writer::Json(_) if self.rows == 0 => return Ok(b"[]".to_vec()),
            Writer::Json(mut w) => w.finish()?,
            Writer::Jsonl(mut w) => w.finish()?,
            Writer::Csv(..) => {}
            Writer::Arrow(mut w) => w.finish()?,
            Writer::Parquet(w) => {
                w.close().map_err(parquet_error)?;
            }
        }
        Ok(self.buf.take())
    }
}

/// Encodes a whole answer.
pub fn encode(result: &QueryResult, format: Format) -> Result<Vec<u8>> {
    let mut enc = Encoder::new(&result.schema, format)?;
    let mut out = Vec::new();
    for b in &result.batches {
        out.extend(enc.write(b)?);
    }
    out.extend(enc.finish()?);
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
