//! `gpuwatch cost --by account --month 2026-11`: a monthly statement from a server's
//! `GET /api/v1/cost` (docs/cost.md "Statements").

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float64Type;
use arrow::ipc::reader::StreamReader;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::jobs::encode;

/// Output formats of `gpuwatch cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CostFormat {
    /// An aligned table with a total line.
    Table,
    /// CSV with a header row.
    Csv,
    /// A JSON array of objects.
    Json,
    /// A Parquet file, written to standard output (redirect it to a file).
    Parquet,
}

/// The statement `by` and `month` (the server's current month when `None`) as `format`.
pub(crate) async fn statement(
    client: &Client,
    by: &str,
    month: Option<&str>,
    format: CostFormat,
) -> Result<Vec<u8>> {
    let wire = match format {
        CostFormat::Table => "arrow",
        CostFormat::Csv => "csv",
        CostFormat::Json => "json",
        CostFormat::Parquet => "parquet",
    };
    let mut q = format!("/api/v1/cost?by={}&format={wire}", encode(by));
    if let Some(m) = month {
        q.push_str(&format!("&month={}", encode(m)));
    }
    let body = client.get(&q).await?;
    match format {
        CostFormat::Table => table(&body),
        CostFormat::Parquet => Ok(body),
        CostFormat::Csv | CostFormat::Json => {
            let mut out = body;
            if !out.ends_with(b"\n") {
                out.push(b'\n');
            }
            Ok(out)
        }
    }
}

/// The statement as a table, then its totals.
fn table(ipc: &[u8]) -> Result<Vec<u8>> {
    let malformed = |e: arrow::error::ArrowError| Error::Malformed {
        what: "statement",
        source: Box::new(e),
    };
    let reader = StreamReader::try_new(std::io::Cursor::new(ipc), None).map_err(malformed)?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(malformed)?;
    let mut out = crate::sql::render_table(&batches, schema)?;
    let total = |name: &str| -> f64 {
        batches
            .iter()
            .filter_map(|b| b.column_by_name(name))
            .filter_map(|c| c.as_primitive_opt::<Float64Type>())
            .flat_map(|c| c.iter().flatten())
            .sum()
    };
    out.extend_from_slice(
        format!(
            "total: {:.2} GPU-hours ({:.2} idle), {:.2} kWh, {:.2} USD ({:.2} USD idle)\n",
            total("gpu_hours"),
            total("idle_gpu_hours"),
            total("energy_kwh"),
            total("cost_usd"),
            total("idle_cost_usd"),
        )
        .as_bytes(),
    );
    Ok(out)
}
