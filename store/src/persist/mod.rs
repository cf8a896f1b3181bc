//! Persistence: buffered batches written as Parquet files, one per table and hour.
//!
//! Layout: `<data-dir>/tables/<table>/<YYYY-MM-DD>/<HH>/<wal-seq:020>.parquet`, rows sorted by the
//! table's sort columns (host, gpu_uuid, time for `gpu_metrics`), zstd, dictionary-encoded labels,
//! delta-encoded timestamps. The name carries the last WAL segment the file covers, so names never
//! collide and a leftover of an interrupted persist is recognisable. With an object store the same
//! layout sits under the prefix, each name followed by `-<writer id>` ([`storage`]).

mod catalog;
pub mod storage;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use bytes::Bytes;

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::compute::{
    SortColumn, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch,
};
use arrow::datatypes::TimestampNanosecondType;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::WriterProperties;

pub use catalog::{CATALOG_FILE, Catalog, FileMeta, Retired};
pub use storage::Storage;

use crate::schema::Table;
use crate::{Error, Result};

const NANOS_PER_HOUR: i64 = 3_600_000_000_000;

/// The directory holding a table's files.
pub fn table_dir(data_dir: &Path, table: Table) -> std::path::PathBuf {
    data_dir.join("tables").join(table.name())
}

/// Sorts batches by the table's sort columns.
pub fn sort_batch(table: Table, batch: &RecordBatch) -> Result<RecordBatch> {
    let columns: Vec<SortColumn> = table
        .sort_columns()
        .iter()
        .filter_map(|name| batch.column_by_name(name))
        .map(|c| SortColumn {
            values: c.clone(),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&columns, None)?;
    Ok(take_record_batch(batch, &indices)?)
}

fn writer_properties(table: Table, batch: &RecordBatch) -> WriterProperties {
    let schema = batch.schema();
    let sorting: Vec<SortingColumn> = table
        .sort_columns()
        .iter()
        .filter_map(|name| schema.index_of(name).ok())
        .map(|i| SortingColumn {
            column_idx: i as i32,
            descending: false,
            nulls_first: false,
        })
        .collect();
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap_or_default()))
        .set_max_row_group_row_count(Some(256 * 1024))
        .set_sorting_columns(Some(sorting))
        .set_column_dictionary_enabled("time".into(), false)
        .set_column_encoding("time".into(), Encoding::DELTA_BINARY_PACKED);
    for f in schema.fields() {
        match f.data_type() {
            arrow::datatypes::DataType::Int64 => {
                props = props
                    .set_column_dictionary_enabled(f.name().as_str().into(), false)
                    .set_column_encoding(f.name().as_str().into(), Encoding::DELTA_BINARY_PACKED);
            }
            // Measured on simulated H100 telemetry (docs/benchmarks.md): noisy gauges have too
            // many distinct values for a dictionary, which the writer then abandons after its
            // first page; plain values with zstd are 11% smaller overall. Byte-stream-split was
            // larger (the values are rounded decimals, which zstd finds as repeats).
            arrow::datatypes::DataType::Float64 => {
                props = props
                    .set_column_dictionary_enabled(f.name().as_str().into(), false)
                    .set_column_encoding(f.name().as_str().into(), Encoding::PLAIN);
            }
            _ => {}
        }
    }
    props.build()
}

/// Writes one table's batches as Parquet files, one per hour, named after `seq`. Each file is
/// durable before this returns ([`Storage::put_new`]); the catalog is not touched.
pub fn write_table(
    storage: &Storage,
    table: Table,
    batches: &[RecordBatch],
    seq: u64,
) -> Result<Vec<FileMeta>> {
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    let all = concat_batches(&table.schema(), batches)?;
    if all.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let sorted = sort_batch(table, &all)?;
    let times = sorted.column(0).as_primitive::<TimestampNanosecondType>();
    let mut hours: BTreeMap<i64, ()> = BTreeMap::new();
    for t in times.values() {
        hours.insert(t.div_euclid(NANOS_PER_HOUR), ());
    }
    let mut out = Vec::with_capacity(hours.len());
    for hour in hours.keys() {
        let mask: BooleanArray = times
            .values()
            .iter()
            .map(|t| Some(t.div_euclid(NANOS_PER_HOUR) == *hour))
            .collect();
        let part = if hours.len() == 1 {
            sorted.clone()
        } else {
            filter_record_batch(&sorted, &mask)?
        };
        out.push(write_file(
            storage,
            table,
            &part,
            *hour,
            &storage.file_name(&format!("{seq:020}")),
        )?);
    }
    Ok(out)
}

/// Writes `batch` (rows of one hour, sorted) as `tables/<table>/<date>/<HH>/<name>.parquet`,
/// durable before this returns ([`Storage::put_new`]); the catalog is not touched.
pub fn write_file(
    storage: &Storage,
    table: Table,
    batch: &RecordBatch,
    hour: i64,
    name: &str,
) -> Result<FileMeta> {
    let start = chrono::DateTime::from_timestamp(hour * 3600, 0).unwrap_or_default();
    let rel = format!(
        "tables/{}/{}/{}/{name}.parquet",
        table.name(),
        start.format("%Y-%m-%d"),
        start.format("%H")
    );
    let mut buf = Vec::new();
    let mut writer = ArrowWriter::try_new(
        &mut buf,
        batch.schema(),
        Some(writer_properties(table, batch)),
    )?;
    writer.write(batch)?;
    writer.close()?;
    let bytes = buf.len() as u64;
    storage.put_new(&rel, Bytes::from(buf))?;
    let times = batch.column(0).as_primitive::<TimestampNanosecondType>();
    let min_time = times.values().iter().copied().min().unwrap_or_default();
    let max_time = times.values().iter().copied().max().unwrap_or_default();
    Ok(FileMeta {
        table: table.name().to_string(),
        path: rel,
        min_time,
        max_time,
        rows: batch.num_rows() as u64,
        bytes,
        level: 0,
    })
}

/// Removes files just written whose catalog update failed (best effort: a leftover is removed at
/// the next start).
pub fn remove_files(storage: &Storage, files: &[FileMeta]) {
    for f in files {
        if let Err(e) = storage.delete(&f.path) {
            tracing::warn!(error = %e, "could not remove a file whose catalog update failed");
        }
    }
}

/// Removes files under `tables/` that the catalog does not name (leftovers of an interrupted
/// persist). Returns how many were removed.
pub fn remove_orphans(data_dir: &Path, catalog: &Catalog) -> Result<usize> {
    let known: std::collections::HashSet<&str> =
        catalog.files.iter().map(|f| f.path.as_str()).collect();
    let root = data_dir.join("tables");
    let mut removed = 0;
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(data_dir)
                .ok()
                .and_then(|p| p.to_str())
                .map(|p| p.replace('\\', "/"))
                .unwrap_or_default();
            if !known.contains(rel.as_str()) {
                tracing::warn!(file = %path.display(), "removing a file no catalog entry names (left by an interrupted persist)");
                fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}
