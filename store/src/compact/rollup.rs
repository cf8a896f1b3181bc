//! Rollups: `gpu_metrics` rows of one hour aggregated per time bucket (a minute, an hour) and per
//! distinct set of labels: the number of samples, and the min, max, avg and last (the value at the
//! latest `time`) of every value column. Nulls are skipped; a column with no value in a group is
//! null in every aggregate.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, PrimitiveArray, RecordBatch,
    TimestampNanosecondArray, UInt32Array,
};
use arrow::compute::take;
use arrow::datatypes::{ArrowPrimitiveType, Float64Type, Int64Type, TimestampNanosecondType};
use arrow::row::{RowConverter, SortField};

use crate::Result;
use crate::persist::sort_batch;
use crate::schema::{LABEL_COLUMNS, Table, VALUE_COLUMNS, ValueType};

fn aggregate<T: ArrowPrimitiveType>(
    column: &ArrayRef,
    times: &[i64],
    group_of: &[usize],
    groups: usize,
    to_f64: impl Fn(T::Native) -> f64,
) -> [ArrayRef; 4]
where
    T::Native: PartialOrd,
{
    let values = column.as_primitive::<T>();
    let mut min: Vec<Option<T::Native>> = vec![None; groups];
    let mut max: Vec<Option<T::Native>> = vec![None; groups];
    let mut sum = vec![0f64; groups];
    let mut count = vec![0u64; groups];
    let mut last: Vec<Option<(i64, T::Native)>> = vec![None; groups];
    for (i, &g) in group_of.iter().enumerate() {
        if values.is_null(i) {
            continue;
        }
        let v = values.value(i);
        if min[g].is_none_or(|m| v < m) {
            min[g] = Some(v);
        }
        if max[g].is_none_or(|m| v > m) {
            max[g] = Some(v);
        }
        sum[g] += to_f64(v);
        count[g] += 1;
        if last[g].is_none_or(|(t, _)| times[i] >= t) {
            last[g] = Some((times[i], v));
        }
    }
    let avg: Float64Array = sum
        .iter()
        .zip(&count)
        .map(|(s, c)| (*c > 0).then(|| s / *c as f64))
        .collect();
    [
        Arc::new(min.into_iter().collect::<PrimitiveArray<T>>()),
        Arc::new(max.into_iter().collect::<PrimitiveArray<T>>()),
        Arc::new(avg),
        Arc::new(
            last.into_iter()
                .map(|l| l.map(|(_, v)| v))
                .collect::<PrimitiveArray<T>>(),
        ),
    ]
}

/// Rolls `batch` (rows of `gpu_metrics`) up into `table` (`gpu_metrics_1m` or `gpu_metrics_1h`).
pub fn rollup(batch: &RecordBatch, table: Table) -> Result<RecordBatch> {
    let width = table.rollup_nanos().unwrap_or(60_000_000_000);
    let schema = table.schema();
    let times = batch
        .column(0)
        .as_primitive::<TimestampNanosecondType>()
        .values();
    let labels: Vec<ArrayRef> = (1..=LABEL_COLUMNS.len())
        .map(|i| Arc::clone(batch.column(i)))
        .collect();
    let converter = RowConverter::new(
        labels
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect(),
    )?;
    let rows = converter.convert_columns(&labels)?;
    let mut index: HashMap<(i64, &[u8]), usize> = HashMap::new();
    let mut group_of = Vec::with_capacity(batch.num_rows());
    let mut firsts: Vec<u32> = Vec::new();
    let mut buckets: Vec<i64> = Vec::new();
    let mut samples: Vec<i64> = Vec::new();
    for (i, t) in times.iter().enumerate() {
        let bucket = t.div_euclid(width) * width;
        let next = firsts.len();
        let g = *index.entry((bucket, rows.row(i).data())).or_insert(next);
        if g == next {
            firsts.push(i as u32);
            buckets.push(bucket);
            samples.push(0);
        }
        samples[g] += 1;
        group_of.push(g);
    }
    let groups = firsts.len();
    let firsts = UInt32Array::from(firsts);
    let mut columns: Vec<ArrayRef> = vec![Arc::new(
        TimestampNanosecondArray::from(buckets).with_timezone("UTC"),
    )];
    for l in &labels {
        columns.push(take(l.as_ref(), &firsts, None)?);
    }
    columns.push(Arc::new(Int64Array::from(samples)));
    for (i, c) in VALUE_COLUMNS.iter().enumerate() {
        let column = batch.column(1 + LABEL_COLUMNS.len() + i);
        let aggs = match c.ty {
            ValueType::Float => aggregate::<Float64Type>(column, times, &group_of, groups, |v| v),
            ValueType::Int => {
                aggregate::<Int64Type>(column, times, &group_of, groups, |v| v as f64)
            }
        };
        columns.extend(aggs);
    }
    let out = RecordBatch::try_new(schema, columns)?;
    sort_batch(table, &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::{Cell, GpuRow, WriteBatch};
    use crate::schema::value_index;

    fn col<'a>(b: &'a RecordBatch, name: &str) -> &'a ArrayRef {
        b.column_by_name(name).expect(name)
    }

    #[test]
    fn min_max_avg_last_per_minute_and_labels() {
        let power = value_index("hw.power").expect("power");
        let mem = value_index("hw.gpu.memory.usage").expect("mem");
        let t0 = 1_800_000_000_000_000_000i64; // on a minute boundary
        let s = 1_000_000_000i64;
        let mut rows = Vec::new();
        // GPU-a, job 1: 3 samples in minute 0 (one without power), 1 in minute 1.
        for (t, p, m) in [
            (0, Some(10.0), 5),
            (20, Some(30.0), 7),
            (40, None, 6),
            (70, Some(50.0), 1),
        ] {
            let mut r = GpuRow::new(t0 + t * s);
            r.labels[0] = Some("h".into());
            r.labels[1] = Some("GPU-a".into());
            r.labels[5] = Some("job-1".into());
            r.values[power] = p.map(Cell::F);
            r.values[mem] = Some(Cell::I(m));
            rows.push(r);
        }
        // Same GPU, another job in minute 0: its own group.
        let mut r = GpuRow::new(t0 + 50 * s);
        r.labels[0] = Some("h".into());
        r.labels[1] = Some("GPU-a".into());
        r.labels[5] = Some("job-2".into());
        r.values[power] = Some(Cell::F(99.0));
        rows.push(r);
        let batch = WriteBatch::from_rows(&rows, &[]).expect("batch").batches[0]
            .1
            .clone();
        let m = rollup(&batch, Table::GpuMetrics1m).expect("rollup");
        assert_eq!(m.schema(), Table::GpuMetrics1m.schema());
        assert_eq!(m.num_rows(), 3);
        let jobs = col(&m, "job_id").as_string::<i32>();
        let times = m.column(0).as_primitive::<TimestampNanosecondType>();
        let f = |name: &str| col(&m, name).as_primitive::<Float64Type>().clone();
        let i = |name: &str| col(&m, name).as_primitive::<Int64Type>().clone();
        let g = (0..3)
            .find(|&k| jobs.value(k) == "job-1" && times.value(k) == t0)
            .expect("group");
        assert_eq!(i("samples").value(g), 3);
        assert_eq!(f("power_watts_min").value(g), 10.0);
        assert_eq!(f("power_watts_max").value(g), 30.0);
        assert_eq!(f("power_watts_avg").value(g), 20.0);
        assert_eq!(f("power_watts_last").value(g), 30.0, "last non-null value");
        assert_eq!(i("memory_used_bytes_last").value(g), 6);
        assert_eq!(i("memory_used_bytes_min").value(g), 5);
        assert_eq!(f("memory_used_bytes_avg").value(g), 6.0);
        assert!(f("temperature_celsius_avg").is_null(g));
        let h = rollup(&batch, Table::GpuMetrics1h).expect("rollup");
        assert_eq!(h.num_rows(), 2, "one per job in the hour");
        let jobs = col(&h, "job_id").as_string::<i32>();
        let g = (0..2).find(|&k| jobs.value(k) == "job-1").expect("group");
        assert_eq!(
            h.column_by_name("power_watts_avg")
                .expect("avg")
                .as_primitive::<Float64Type>()
                .value(g),
            30.0
        );
        assert_eq!(
            h.column_by_name("power_watts_last")
                .expect("last")
                .as_primitive::<Float64Type>()
                .value(g),
            50.0
        );
    }
}
