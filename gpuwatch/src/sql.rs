//! `gpuwatch sql`: runs a statement against a server and prints the answer.

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;

use crate::client::Client;
use crate::error::{Error, Result};

/// Output formats of `gpuwatch sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OutputFormat {
    /// An aligned table.
    Table,
    /// CSV with a header row.
    Csv,
    /// A JSON array of objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// Runs `sql` through `client` and returns what to print.
pub(crate) async fn run(client: &Client, sql: &str, format: OutputFormat) -> Result<Vec<u8>> {
    let wire = match format {
        OutputFormat::Table => "arrow",
        OutputFormat::Csv => "csv",
        OutputFormat::Json => "json",
        OutputFormat::Jsonl => "jsonl",
    };
    let body = serde_json::json!({ "sql": sql, "format": wire }).to_string();
    let bytes = client.post_json("/api/v1/sql", body).await?;
    match format {
        OutputFormat::Table => render_arrow(&bytes),
        _ => {
            let mut out = bytes;
            if !out.ends_with(b"\n") {
                out.push(b'\n');
            }
            Ok(out)
        }
    }
}

fn render_arrow(ipc: &[u8]) -> Result<Vec<u8>> {
    let reader =
        StreamReader::try_new(std::io::Cursor::new(ipc), None).map_err(|e| Error::Malformed {
            what: "arrow answer",
            source: Box::new(e),
        })?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> =
        reader
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Malformed {
                what: "arrow answer",
                source: Box::new(e),
            })?;
    render_table(&batches, schema)
}

/// `batches` (of `schema`) as an aligned table and a row count.
pub(crate) fn render_table(
    batches: &[RecordBatch],
    schema: arrow::datatypes::SchemaRef,
) -> Result<Vec<u8>> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let table = if batches.is_empty() {
        arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(schema)])
    } else {
        arrow::util::pretty::pretty_format_batches(batches)
    }
    .map_err(|e| Error::Malformed {
        what: "answer (cannot format it)",
        source: Box::new(e),
    })?;
    Ok(format!(
        "{table}\n({rows} row{})\n",
        if rows == 1 { "" } else { "s" }
    )
    .into_bytes())
}
