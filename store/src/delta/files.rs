//! Data files as Delta `add` actions, and back.
//!
//! Each `add` carries the file's statistics in Delta's JSON form (`numRecords`, and per column
//! `minValues`, `maxValues`, `nullCount`) so that every engine skips files by them, and two tags
//! of gpuwatch's own: `gpuwatch.level` (1 once compaction merged the file's hour and built its
//! rollups) and nothing else; the file's time range comes from the statistics, so files another
//! engine writes (an `OPTIMIZE` from Spark, say) are understood too.

use std::collections::HashMap;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::kernels::aggregate;
use arrow::datatypes::{
    DataType, Float64Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType,
};
use deltalake_core::kernel::{Add, Remove};
use serde_json::{Map, Value, json};

use super::schema::PARTITION_COLUMN;
use crate::persist::FileMeta;
use crate::schema::Table;

/// The tag holding a file's compaction level.
pub const LEVEL_TAG: &str = "gpuwatch.level";

/// Delta's text form of a microsecond timestamp.
pub fn timestamp_text(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// Longest string kept as a statistic (Delta's own writers cut at 32 characters; a string that
/// long is left out rather than cut, so the bounds stay exact).
const MAX_STAT_STRING: usize = 32;

fn finite(v: f64) -> Option<Value> {
    v.is_finite().then(|| json!(v))
}

/// Min and max of one column, as Delta writes them; `None` where there is nothing to say.
fn bounds(column: &dyn Array) -> Option<(Value, Value)> {
    match column.data_type() {
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            let a = column.as_primitive::<TimestampMicrosecondType>();
            Some((
                json!(timestamp_text(aggregate::min(a)?)),
                json!(timestamp_text(aggregate::max(a)?)),
            ))
        }
        DataType::Int64 => {
            let a = column.as_primitive::<Int64Type>();
            Some((json!(aggregate::min(a)?), json!(aggregate::max(a)?)))
        }
        DataType::Int32 => {
            let a = column.as_primitive::<Int32Type>();
            Some((json!(aggregate::min(a)?), json!(aggregate::max(a)?)))
        }
        DataType::Float64 => {
            let a = column.as_primitive::<Float64Type>();
            if a.values()
                .iter()
                .zip(0..)
                .any(|(v, i)| a.is_valid(i) && v.is_nan())
            {
                return None;
            }
            Some((finite(aggregate::min(a)?)?, finite(aggregate::max(a)?)?))
        }
        DataType::Utf8 => {
            let a = column.as_string::<i32>();
            let (lo, hi) = (aggregate::min_string(a)?, aggregate::max_string(a)?);
            (lo.len() <= MAX_STAT_STRING && hi.len() <= MAX_STAT_STRING)
                .then(|| (json!(lo), json!(hi)))
        }
        _ => None,
    }
}

/// Delta statistics of a data file's batch (in the file schema).
pub fn stats(batch: &RecordBatch) -> String {
    let mut min = Map::new();
    let mut max = Map::new();
    let mut nulls = Map::new();
    let schema = batch.schema();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if matches!(field.data_type(), DataType::Map(_, _)) {
            continue;
        }
        nulls.insert(field.name().clone(), json!(column.null_count()));
        if let Some((lo, hi)) = bounds(column.as_ref()) {
            min.insert(field.name().clone(), lo);
            max.insert(field.name().clone(), hi);
        }
    }
    json!({
        "numRecords": batch.num_rows(),
        "minValues": min,
        "maxValues": max,
        "nullCount": nulls,
    })
    .to_string()
}

/// The `add` of a file written at `path_in_table` (relative to the table's directory).
pub fn add(
    path_in_table: String,
    date: &str,
    size: u64,
    stats: String,
    level: u8,
    now_millis: i64,
) -> Add {
    Add {
        path: path_in_table,
        partition_values: HashMap::from([(PARTITION_COLUMN.to_string(), Some(date.to_string()))]),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        modification_time: now_millis,
        data_change: true,
        stats: Some(stats),
        tags: Some(HashMap::from([(
            LEVEL_TAG.to_string(),
            Some(level.to_string()),
        )])),
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
        clustering_provider: None,
    }
}

/// The `remove` of a file of the table (`path_in_table`) at `now_millis`.
pub fn remove(
    path_in_table: &str,
    size: u64,
    date: Option<&str>,
    data_change: bool,
    now_millis: i64,
) -> Remove {
    Remove {
        path: path_in_table.to_string(),
        data_change,
        deletion_timestamp: Some(now_millis),
        extended_file_metadata: Some(true),
        partition_values: date
            .map(|d| HashMap::from([(PARTITION_COLUMN.to_string(), Some(d.to_string()))])),
        size: Some(i64::try_from(size).unwrap_or(i64::MAX)),
        tags: None,
        deletion_vector: None,
        base_row_id: None,
        default_row_commit_version: None,
    }
}

/// Parses a timestamp statistic to nanoseconds: `(lowest, highest)` the text may stand for.
/// Delta timestamps have microsecond precision, so a statistic with microseconds is exact; some
/// writers (Spark) keep only milliseconds and truncate, so such a maximum is widened to the end
/// of its millisecond.
fn parse_timestamp(text: &str) -> Option<(i64, i64)> {
    let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    let ns = t.timestamp_nanos_opt()?;
    let digits = text
        .split_once('.')
        .map(|(_, f)| f.chars().take_while(char::is_ascii_digit).count())
        .unwrap_or(0);
    let unit: i64 = if digits <= 3 { 1_000_000 } else { 1 };
    Some((ns, ns.saturating_add(unit - 1)))
}

/// What the store keeps of one file of a Delta table: `path_in_table` relative to the table's
/// directory, its statistics and tags.
pub fn file_meta(
    table: Table,
    path_in_table: &str,
    size: i64,
    stats: Option<&str>,
    level: Option<&str>,
) -> FileMeta {
    let parsed: Option<Value> = stats.and_then(|s| serde_json::from_str(s).ok());
    let time = |which: &str| {
        parsed
            .as_ref()?
            .get(which)?
            .get("time")?
            .as_str()
            .and_then(parse_timestamp)
    };
    let rows = parsed
        .as_ref()
        .and_then(|v| v.get("numRecords"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let path = if path_in_table.contains("://") {
        path_in_table.to_string()
    } else {
        format!("tables/{}/{path_in_table}", table.name())
    };
    FileMeta {
        table: table.name().to_string(),
        path,
        min_time: time("minValues").map(|(lo, _)| lo).unwrap_or(i64::MIN),
        max_time: time("maxValues").map(|(_, hi)| hi).unwrap_or(i64::MAX),
        rows,
        bytes: u64::try_from(size).unwrap_or(0),
        level: level.and_then(|l| l.parse().ok()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    #[test]
    fn statistics_round_trip_to_the_file_time_range() {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "time",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("host", DataType::Utf8, false),
            Field::new("v", DataType::Float64, true),
            Field::new("w", DataType::Float64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(
                    TimestampMicrosecondArray::from(vec![
                        1_795_554_004_039_826,
                        1_795_557_216_242_225,
                    ])
                    .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from(vec!["b", "a"])),
                Arc::new(Float64Array::from(vec![Some(0.5), None])),
                Arc::new(Float64Array::from(vec![Some(f64::NAN), Some(1.0)])),
            ],
        )
        .expect("batch");
        let s = stats(&batch);
        let v: Value = serde_json::from_str(&s).expect("json");
        assert_eq!(v["numRecords"], 2);
        assert_eq!(v["minValues"]["host"], "a");
        assert_eq!(v["maxValues"]["v"], 0.5);
        assert_eq!(v["nullCount"]["v"], 1);
        assert!(v["minValues"].get("w").is_none(), "NaN has no bound: {s}");
        assert_eq!(v["minValues"]["time"], "2026-11-24T21:00:04.039826Z");
        let meta = file_meta(
            Table::GpuMetrics,
            "date=2026-11-24/x.parquet",
            10,
            Some(&s),
            Some("1"),
        );
        assert_eq!(meta.min_time, 1_795_554_004_039_826_000);
        assert_eq!(meta.max_time, 1_795_557_216_242_225_000);
        assert_eq!((meta.rows, meta.level), (2, 1));
        assert_eq!(meta.path, "tables/gpu_metrics/date=2026-11-24/x.parquet");
        let spark = file_meta(
            Table::GpuMetrics,
            "p",
            1,
            Some(
                r#"{"numRecords":1,"minValues":{"time":"2026-11-24T18:53:24.039Z"},"maxValues":{"time":"2026-11-24T18:53:24.039Z"}}"#,
            ),
            None,
        );
        assert_eq!(spark.max_time - spark.min_time, 999_999);
        let bare = file_meta(Table::GpuMetrics, "p", 1, None, None);
        assert_eq!((bare.min_time, bare.max_time), (i64::MIN, i64::MAX));
    }
}
