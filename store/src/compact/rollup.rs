//! Rollups: `gpu_metrics` and `gpu_processes` rows of one hour aggregated per time bucket (a
//! minute, an hour) and per distinct set of labels: the number of samples (for processes, the
//! first and last time seen too), and the min, max, avg and last (the value at the latest `time`)
//! of every value column ([`RollupSpec`]). Nulls are skipped; a column with no value in a group is
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
use crate::schema::{RollupSpec, Table, ValueType};

fn aggregate<T: ArrowPrimitiveType>(
    column: &ArrayRef,
    times: &[i64],
    group_of: &[usize],
    groups: usize,
    to_f64: impl Fn(T::Native) -> f64,
) -> [ArrayRef; 5]
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
        Arc::new(Int64Array::from_iter_values(
            count.iter().map(|&c| c as i64),
        )),
    ]
}

/// Rolls `batch` (rows of a table with rollups: `gpu_metrics`, `gpu_processes`) up into
/// `table`, one of its rollups.
pub fn rollup(batch: &RecordBatch, table: Table) -> Result<RecordBatch> {
    let width = table.rollup_nanos().unwrap_or(60_000_000_000);
    let spec = table
        .rollup_source()
        .and_then(RollupSpec::of)
        .ok_or_else(|| crate::Error::BadRows(format!("{} is not a rollup table", table.name())))?;
    let schema = table.schema();
    let times = batch
        .column(0)
        .as_primitive::<TimestampNanosecondType>()
        .values();
    let labels: Vec<ArrayRef> = (1..=spec.labels)
        .map(|i| Arc::clone(batch.column(i)))
        .collect();
    let Groups {
        of,
        firsts,
        buckets,
        samples,
        first_seen,
        last_seen,
    } = Groups::of(&labels, times, width)?;
    let n = firsts.len();
    let firsts = UInt32Array::from(firsts);
    let mut columns: Vec<ArrayRef> = vec![Arc::new(
        TimestampNanosecondArray::from(buckets).with_timezone("UTC"),
    )];
    for l in &labels {
        columns.push(take(l.as_ref(), &firsts, None)?);
    }
    columns.push(Arc::new(Int64Array::from(samples)));
    if spec.seen {
        for seen in [first_seen, last_seen] {
            columns.push(Arc::new(
                TimestampNanosecondArray::from(seen).with_timezone("UTC"),
            ));
        }
    }
    for (i, (_, ty)) in spec.values.iter().enumerate() {
        let column = batch.column(1 + spec.labels + i);
        let aggs = match ty {
            ValueType::Float => aggregate::<Float64Type>(column, times, &of, n, |v| v),
            ValueType::Int => aggregate::<Int64Type>(column, times, &of, n, |v| v as f64),
        };
        let [min, max, avg, last, count] = aggs;
        columns.extend([min, max, avg, last]);
        if spec.seen {
            columns.push(count);
        }
    }
    let out = RecordBatch::try_new(schema, columns)?;
    sort_batch(table, &out)
}

/// The groups of a batch: one per time bucket and distinct set of label values.
struct Groups {
    /// Per row, its group.
    of: Vec<usize>,
    /// Per group, its first row, bucket start, rows, and first and last raw time.
    firsts: Vec<u32>,
    buckets: Vec<i64>,
    samples: Vec<i64>,
    first_seen: Vec<i64>,
    last_seen: Vec<i64>,
}

impl Groups {
    fn of(labels: &[ArrayRef], times: &[i64], width: i64) -> Result<Groups> {
        let converter = RowConverter::new(
            labels
                .iter()
                .map(|c| SortField::new(c.data_type().clone()))
                .collect(),
        )?;
        let rows = converter.convert_columns(labels)?;
        let mut index: HashMap<(i64, &[u8]), usize> = HashMap::new();
        let mut g = Groups {
            of: Vec::with_capacity(times.len()),
            firsts: Vec::new(),
            buckets: Vec::new(),
            samples: Vec::new(),
            first_seen: Vec::new(),
            last_seen: Vec::new(),
        };
        for (i, &t) in times.iter().enumerate() {
            let bucket = t.div_euclid(width) * width;
            let next = g.firsts.len();
            let k = *index.entry((bucket, rows.row(i).data())).or_insert(next);
            if k == next {
                g.firsts.push(i as u32);
                g.buckets.push(bucket);
                g.samples.push(0);
                g.first_seen.push(t);
                g.last_seen.push(t);
            }
            g.samples[k] += 1;
            g.first_seen[k] = g.first_seen[k].min(t);
            g.last_seen[k] = g.last_seen[k].max(t);
            g.of.push(k);
        }
        Ok(g)
    }
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

    #[test]
    fn processes_roll_up_per_process_with_first_and_last_seen() {
        use crate::ingest::ProcessRow;
        let t0 = 1_800_000_000_000_000_000i64;
        let s = 1_000_000_000i64;
        let p = |t: i64, pid: i64, mem: i64, sm: Option<f64>| ProcessRow {
            time: t0 + t * s,
            host: "h".into(),
            gpu_uuid: "GPU-a".into(),
            pid,
            process_name: Some("python".into()),
            job_id: Some("42".into()),
            job_user: Some("ana".into()),
            used_memory_bytes: Some(mem),
            sm_utilization: sm,
        };
        // pid 7 in minutes 0 and 1; pid 8 only in minute 1.
        let rows = [
            p(5, 7, 100, Some(0.5)),
            p(35, 7, 300, None),
            p(65, 7, 200, Some(0.9)),
            p(70, 8, 50, Some(0.1)),
        ];
        let mut wb = WriteBatch::from_rows(&[], &[]).expect("batch");
        wb.add_processes_and_events(&rows, &[]).expect("rows");
        let batch = wb.batches[0].1.clone();
        let m = rollup(&batch, Table::GpuProcesses1m).expect("rollup");
        assert_eq!(m.schema(), Table::GpuProcesses1m.schema());
        assert_eq!(m.num_rows(), 3);
        let pids = col(&m, "pid").as_primitive::<Int64Type>().clone();
        let times = m
            .column(0)
            .as_primitive::<TimestampNanosecondType>()
            .clone();
        let g = (0..3)
            .find(|&k| pids.value(k) == 7 && times.value(k) == t0)
            .expect("pid 7, minute 0");
        let ts = |name: &str| {
            col(&m, name)
                .as_primitive::<TimestampNanosecondType>()
                .value(g)
        };
        assert_eq!(ts("first_seen"), t0 + 5 * s);
        assert_eq!(ts("last_seen"), t0 + 35 * s);
        let i = |name: &str| col(&m, name).as_primitive::<Int64Type>().value(g);
        assert_eq!(i("samples"), 2);
        assert_eq!(i("used_memory_bytes_max"), 300);
        assert_eq!(i("used_memory_bytes_last"), 300);
        let sm = col(&m, "sm_utilization_avg").as_primitive::<Float64Type>();
        assert_eq!(sm.value(g), 0.5, "nulls are skipped");
        assert_eq!(i("sm_utilization_count"), 1, "values, not rows");
        assert_eq!(i("used_memory_bytes_count"), 2);
        let h = rollup(&batch, Table::GpuProcesses1h).expect("rollup");
        assert_eq!(h.num_rows(), 2, "one per process in the hour");
        let pids = col(&h, "pid").as_primitive::<Int64Type>();
        let g = (0..2).find(|&k| pids.value(k) == 7).expect("pid 7");
        let seen = |name: &str| {
            col(&h, name)
                .as_primitive::<TimestampNanosecondType>()
                .value(g)
        };
        assert_eq!(
            (seen("first_seen"), seen("last_seen")),
            (t0 + 5 * s, t0 + 65 * s)
        );
        assert!(
            rollup(&batch, Table::GpuProcesses).is_err(),
            "not a rollup table"
        );
    }
}
