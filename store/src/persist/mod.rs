//! Persistence: buffered batches written as Parquet data files of the Delta tables, one file per
//! table and hour.
//!
//! Layout: `<root>/tables/<table>/date=<YYYY-MM-DD>/h<HH>-<kind><n>-<writer>.parquet` (`kind`
//! `p` for a persist, whose `n` is the last WAL segment it covers; `c` for compaction and
//! rollups), rows sorted by the table's sort columns (host, gpu_uuid, time for `gpu_metrics`),
//! zstd, dictionary-encoded labels, delta-encoded timestamps and counters, `time` in
//! microseconds (`delta::schema`). Writing a file does not make it part of a table: the Delta
//! commit that names it does (`delta`).

pub mod legacy;
pub mod storage;

use std::collections::BTreeMap;

use bytes::Bytes;

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::compute::{
    LexicographicalComparator, SortColumn, concat_batches, filter_record_batch, lexsort_to_indices,
    take_record_batch,
};
use arrow::datatypes::TimestampNanosecondType;
use deltalake_core::kernel::Add;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::WriterProperties;

pub use storage::Storage;

use crate::Result;
use crate::delta::{files, schema};
use crate::schema::Table;

const NANOS_PER_HOUR: i64 = 3_600_000_000_000;

/// One data file of a table, as the store and the query engine see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    /// Table name.
    pub table: String,
    /// Path relative to the data directory or prefix, `/`-separated
    /// (`tables/<table>/date=…/….parquet`).
    pub path: String,
    /// Smallest `time` in the file (ns); `i64::MIN` when unknown.
    pub min_time: i64,
    /// Largest `time` in the file (ns), or a little above; `i64::MAX` when unknown.
    pub max_time: i64,
    /// Rows.
    pub rows: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// 0: written by a persist; 1: the result of compacting a closed hour (whose rollups exist).
    pub level: u8,
}

impl FileMeta {
    /// The file's path relative to its table's directory, as Delta names it.
    pub fn path_in_table(&self) -> &str {
        let dir = format!("tables/{}/", self.table);
        self.path.strip_prefix(dir.as_str()).unwrap_or(&self.path)
    }

    /// The `date` partition of the file, from its path.
    pub fn date(&self) -> Option<&str> {
        self.path.split('/').find_map(|p| p.strip_prefix("date="))
    }

    /// True when the statistics gave the file's time range.
    pub fn has_time_range(&self) -> bool {
        self.min_time != i64::MIN && self.max_time != i64::MAX
    }
}

/// A file written, and the `add` that makes it part of its table.
#[derive(Debug, Clone)]
pub struct Written {
    /// What the store keeps of it.
    pub meta: FileMeta,
    /// Its Delta action.
    pub add: Add,
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
    if is_sorted(&columns, batch.num_rows())? {
        return Ok(batch.clone());
    }
    let indices = lexsort_to_indices(&columns, None)?;
    Ok(take_record_batch(batch, &indices)?)
}

/// Whether the rows are already in order: one comparison a row, where sorting a batch that is
/// (a single persisted file, rows built in order) would copy every column.
fn is_sorted(columns: &[SortColumn], rows: usize) -> Result<bool> {
    if columns.is_empty() {
        return Ok(true);
    }
    let cmp = LexicographicalComparator::try_new(columns)?;
    Ok((1..rows).all(|i| cmp.compare(i - 1, i) != std::cmp::Ordering::Greater))
}

/// The most rows a Parquet row group holds.
const ROW_GROUP_ROWS: usize = 256 * 1024;

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
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
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
    if let Some(ndv) = job_bloom_ndv(table, batch) {
        props = props
            .set_column_bloom_filter_enabled(JOB_COLUMN.into(), true)
            .set_column_bloom_filter_max_ndv(JOB_COLUMN.into(), ndv)
            .set_column_bloom_filter_fpp(JOB_COLUMN.into(), JOB_BLOOM_FPP);
    }
    props.build()
}

/// The column a job's questions look rows up by (`job_id = '…'`: the Job dashboard, job
/// reports).
const JOB_COLUMN: &str = "job_id";
/// The bloom filter's false-positive rate: a file without the job is read anyway once in a
/// hundred.
const JOB_BLOOM_FPP: f64 = 0.01;

/// The most distinct jobs a rollup file's row group may hold, which sizes its `job_id` bloom
/// filter before the writer folds it down to the jobs it saw (`None`: no filter). A rollup
/// file holds a day (or an hour) of the whole fleet's jobs, and its rows are sorted by GPU, so
/// the column's min/max statistics span nearly every job: a bloom filter is what lets one
/// job's question over a year skip the days the job did not run (about 10 bits a job once
/// folded: 24 KB for a day of 20,000 jobs). Raw files are left as they are (written on the
/// ingest path, and read for the last hours only).
fn job_bloom_ndv(table: Table, batch: &RecordBatch) -> Option<u64> {
    table.rollup_nanos()?;
    batch.column_by_name(JOB_COLUMN)?;
    Some(batch.num_rows().clamp(1, ROW_GROUP_ROWS) as u64)
}

/// Writes one table's batches as Parquet files, one per hour, named `h<HH>-<name>-<writer>`.
/// Each file is durable before this returns ([`Storage::put_new`]); no table names it yet.
pub fn write_table(
    storage: &Storage,
    table: Table,
    batches: &[RecordBatch],
    name: &str,
    now_millis: i64,
) -> Result<Vec<Written>> {
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
            storage, table, &part, *hour, name, 0, now_millis,
        )?);
    }
    Ok(out)
}

/// Writes `batch` (rows of one hour, sorted, in the table's SQL schema) as
/// `tables/<table>/date=<date>/h<HH>-<name>-<writer>.parquet`, durable before this returns.
pub fn write_file(
    storage: &Storage,
    table: Table,
    batch: &RecordBatch,
    hour: i64,
    name: &str,
    level: u8,
    now_millis: i64,
) -> Result<Written> {
    let start = chrono::DateTime::from_timestamp(hour * 3600, 0).unwrap_or_default();
    let date = start.format("%Y-%m-%d").to_string();
    let path_in_table = format!(
        "date={date}/h{}-{name}-{}.parquet",
        start.format("%H"),
        storage.writer().id
    );
    let rel = format!("tables/{}/{path_in_table}", table.name());
    let file_batch = schema::to_file_batch(table, batch)?;
    let mut buf = Vec::new();
    let mut writer = ArrowWriter::try_new(
        &mut buf,
        file_batch.schema(),
        Some(writer_properties(table, &file_batch)),
    )?;
    writer.write(&file_batch)?;
    writer.close()?;
    let bytes = buf.len() as u64;
    storage.put_new(&rel, Bytes::from(buf))?;
    let stats = files::stats(&file_batch);
    let times = batch.column(0).as_primitive::<TimestampNanosecondType>();
    let min_time = times.values().iter().copied().min().unwrap_or_default();
    let max_time = times.values().iter().copied().max().unwrap_or_default();
    Ok(Written {
        meta: FileMeta {
            table: table.name().to_string(),
            path: rel,
            min_time,
            max_time,
            rows: batch.num_rows() as u64,
            bytes,
            level,
        },
        add: files::add(path_in_table, &date, bytes, stats, level, now_millis),
    })
}

/// Removes files just written whose commit failed (best effort: the maintainer's vacuum removes
/// what is left after the grace period).
pub fn remove_files(storage: &Storage, files: &[Written]) {
    for f in files {
        if let Err(e) = storage.delete(&f.meta.path) {
            tracing::warn!(error = %e, "could not remove a file whose commit failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampNanosecondArray};
    use arrow::datatypes::DataType;
    use parquet::file::properties::ReaderProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::file::serialized_reader::ReadOptionsBuilder;

    use super::*;

    /// Rows of `table` with the given jobs, one a row; the other columns zero or empty.
    fn rows(table: Table, jobs: &[&str]) -> RecordBatch {
        let schema = table.schema();
        let n = jobs.len();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                let text = |v: Vec<String>| -> ArrayRef {
                    let a = StringArray::from(v);
                    arrow::compute::cast(&a, f.data_type()).expect("text")
                };
                match (f.name().as_str(), f.data_type()) {
                    ("time", dt) => {
                        arrow::compute::cast(&TimestampNanosecondArray::from(vec![0; n]), dt)
                            .expect("time")
                    }
                    ("job_id", _) => text(jobs.iter().map(|j| j.to_string()).collect()),
                    (_, DataType::Utf8 | DataType::Utf8View) => text(vec!["x".into(); n]),
                    (_, dt) => {
                        arrow::compute::cast(&Int64Array::from(vec![0; n]), dt).expect("zero")
                    }
                }
            })
            .collect();
        RecordBatch::try_new(schema, columns).expect("batch")
    }

    /// The `job_id` bloom filter of the first row group of the file at `rel`.
    fn job_bloom(storage: &Storage, rel: &str) -> Option<parquet::bloom_filter::Sbbf> {
        let options = ReadOptionsBuilder::new()
            .with_reader_properties(
                ReaderProperties::builder()
                    .set_read_bloom_filter(true)
                    .build(),
            )
            .build();
        let reader =
            SerializedFileReader::new_with_options(storage.read(rel).expect("read"), options)
                .expect("reader");
        let rg = reader.get_row_group(0).expect("row group");
        let idx = reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.name() == "job_id")
            .expect("job_id");
        rg.get_column_bloom_filter(idx).cloned()
    }

    #[test]
    fn rollup_files_carry_a_job_bloom_filter_and_raw_files_none() {
        let jobs: Vec<String> = (0..500).map(|i| format!("job-{i}")).collect();
        let ids: Vec<&str> = jobs.iter().map(String::as_str).collect();
        for (table, bloom) in [
            (Table::GpuMetrics1h, true),
            (Table::GpuProcesses1m, true),
            (Table::GpuMetrics, false),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let storage = Storage::local(dir.path(), false).expect("storage");
            let w = write_file(&storage, table, &rows(table, &ids), 0, "t", 0, 0).expect("write");
            let filter = job_bloom(&storage, &w.meta.path);
            assert_eq!(filter.is_some(), bloom, "{table:?}");
            let Some(f) = filter else { continue };
            assert!(ids.iter().all(|j| f.check(j)), "every job is in the filter");
            let absent = (1000..2000)
                .filter(|i| f.check(&format!("job-{i}").as_str()))
                .count();
            assert!(absent < 50, "{absent} of 1,000 absent jobs pass the filter");
        }
    }
}
