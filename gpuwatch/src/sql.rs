//! `gpuwatch sql`: runs a statement against a server and prints the answer.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::ipc::reader::StreamReader;

use crate::error::{Error, Result};

/// Output formats of `gpuwatch sql`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// An aligned table.
    Table,
    /// CSV with a header row.
    Csv,
    /// A JSON array of objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// Runs `sql` on `server` and returns what to print.
pub async fn run(
    server: &str,
    sql: &str,
    format: OutputFormat,
    timeout: Duration,
) -> Result<Vec<u8>> {
    let wire = match format {
        OutputFormat::Table => "arrow",
        OutputFormat::Csv => "csv",
        OutputFormat::Json => "json",
        OutputFormat::Jsonl => "jsonl",
    };
    let url = format!("{}/api/v1/sql", server.trim_end_matches('/'));
    let body = serde_json::json!({ "sql": sql, "format": wire }).to_string();
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| Error::Other(format!("cannot build an http client: {e}")))?;
    let resp = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| Error::Remote(format!("cannot reach gpuwatch at {server} ({e}): is `gpuwatch serve` running there? set --server")))?;
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| Error::Remote(format!("the answer from {server} broke off: {e}")))?;
    if !status.is_success() {
        let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        return Err(Error::Remote(format!("{} ({})", msg, status.as_u16())));
    }
    match format {
        OutputFormat::Table => render_table(&bytes),
        _ => {
            let mut out = bytes.to_vec();
            if !out.ends_with(b"\n") {
                out.push(b'\n');
            }
            Ok(out)
        }
    }
}

fn render_table(ipc: &[u8]) -> Result<Vec<u8>> {
    let reader = StreamReader::try_new(std::io::Cursor::new(ipc), None)
        .map_err(|e| Error::Remote(format!("malformed arrow answer: {e}")))?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Remote(format!("malformed arrow answer: {e}")))?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let table = if batches.is_empty() {
        arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(schema)])
    } else {
        arrow::util::pretty::pretty_format_batches(&batches)
    }
    .map_err(|e| Error::Other(format!("cannot format the answer: {e}")))?;
    Ok(format!(
        "{table}\n({rows} row{})\n",
        if rows == 1 { "" } else { "s" }
    )
    .into_bytes())
}
