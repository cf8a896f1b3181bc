//! Rollups: `gpu_metrics` and `gpu_processes` rows of one hour aggregated per time bucket (a
//! minute, an hour) and per distinct set of labels: the number of samples (for processes, the
//! first and last time seen too), and the min, max, avg and last (the value at the latest `time`)
//! of every value column ([`RollupSpec`]); for `gpu_metrics`, the samples whose clock-event
//! reasons have each bit set. Nulls are skipped; a column with no value in a group is null in
//! every aggregate.

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
use crate::schema::{
    CLOCK_REASON_BITS, CLOCK_REASON_SOURCE, LABEL_COLUMNS, ROLLUP_SUFFIXES, RollupSpec, Table,
    ValueType,
};

/// Per group, the parts of one value column's rollup as they are gathered: the smallest and
/// largest value, the weighted sum and weight of the mean, and the value at the latest time.
struct Parts<N> {
    lo: Vec<Option<N>>,
    hi: Vec<Option<N>>,
    sum: Vec<f64>,
    weight: Vec<i64>,
    latest: Vec<Option<(i64, N)>>,
}

impl<N: Copy + PartialOrd> Parts<N> {
    fn new(groups: usize) -> Self {
        Self {
            lo: vec![None; groups],
            hi: vec![None; groups],
            sum: vec![0.0; groups],
            weight: vec![0; groups],
            latest: vec![None; groups],
        }
    }

    fn low(&mut self, g: usize, v: N) {
        if self.lo[g].is_none_or(|m| v < m) {
            self.lo[g] = Some(v);
        }
    }

    fn high(&mut self, g: usize, v: N) {
        if self.hi[g].is_none_or(|m| v > m) {
            self.hi[g] = Some(v);
        }
    }

    fn at(&mut self, g: usize, t: i64, v: N) {
        if self.latest[g].is_none_or(|(seen, _)| t >= seen) {
            self.latest[g] = Some((t, v));
        }
    }

    fn mean(&mut self, g: usize, v: f64, weight: i64) {
        self.sum[g] += v * weight as f64;
        self.weight[g] = self.weight[g].saturating_add(weight);
    }

    /// `min`, `max`, `avg`, `last`, and the weight behind each mean.
    fn finish<T: ArrowPrimitiveType<Native = N>>(self) -> ([ArrayRef; 4], Vec<i64>) {
        let avg: Float64Array = self
            .sum
            .iter()
            .zip(&self.weight)
            .map(|(s, w)| (*w > 0).then(|| s / *w as f64))
            .collect();
        let last: PrimitiveArray<T> = self.latest.into_iter().map(|l| l.map(|(_, v)| v)).collect();
        (
            [
                Arc::new(self.lo.into_iter().collect::<PrimitiveArray<T>>()),
                Arc::new(self.hi.into_iter().collect::<PrimitiveArray<T>>()),
                Arc::new(avg),
                Arc::new(last),
            ],
            self.weight,
        )
    }
}

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
    let mut parts = Parts::new(groups);
    for (i, &g) in group_of.iter().enumerate() {
        if values.is_null(i) {
            continue;
        }
        let v = values.value(i);
        parts.low(g, v);
        parts.high(g, v);
        parts.mean(g, to_f64(v), 1);
        parts.at(g, times[i], v);
    }
    let ([min, max, avg, last], count) = parts.finish::<T>();
    [min, max, avg, last, Arc::new(Int64Array::from(count))]
}

/// The `time` values of a batch of a rollup's source and its `labels` label columns after it.
fn times_and_labels(batch: &RecordBatch, labels: usize) -> (&[i64], Vec<ArrayRef>) {
    let times = batch
        .column(0)
        .as_primitive::<TimestampNanosecondType>()
        .values();
    let columns = (1..=labels).map(|i| Arc::clone(batch.column(i))).collect();
    (times, columns)
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
    let (times, labels) = times_and_labels(batch, spec.labels);
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
    if spec.reasons {
        columns.extend(reason_counts(batch, &of, n)?);
    }
    let out = RecordBatch::try_new(schema, columns)?;
    sort_batch(table, &out)
}

/// Rolls rows of an hourly rollup (`gpu_metrics_1h`) up into its daily one (`table`,
/// `gpu_metrics_1d`, the same columns): one row per day and GPU (the label columns before
/// `job_id`: host, UUID, index, model, MIG instance), whatever jobs held it. Its job labels are
/// those of the latest hourly row with a job (null when no job held the GPU that day), so
/// `job_id IS NULL` still tells a day without a job; per-job questions read the hourly rows.
/// Values: the sum of `samples`, the min of the minima, the max of the maxima, the mean
/// weighted by each row's samples, the last value of the latest row that has one, and the
/// clock-event reasons' counts summed (null if a row reported reasons it did not count). A
/// weighted mean over the daily rows equals the one over the hourly rows unless a value is null
/// in some of a day's hours only (the rows count samples, not values). Only for rollups without
/// value counts (not `gpu_processes`').
pub fn rollup_rollups(batch: &RecordBatch, table: Table) -> Result<RecordBatch> {
    let (width, spec) = table
        .rollup_nanos()
        .zip(
            table
                .summarises()
                .and_then(Table::summarises)
                .and_then(RollupSpec::of)
                .filter(|spec| !spec.seen),
        )
        .ok_or_else(|| crate::Error::BadRows(format!("{} is not a daily rollup", table.name())))?;
    let (times, labels) = times_and_labels(batch, spec.labels);
    let job = LABEL_COLUMNS
        .iter()
        .position(|(name, _)| *name == "job_id")
        .filter(|&j| j < labels.len())
        .ok_or_else(|| crate::Error::BadRows("rollup rows without job_id".into()))?;
    let groups = Groups::of(&labels[..job], times, width)?;
    let n = groups.firsts.len();
    let picks = UInt32Array::from(latest_with_job(&labels[job], times, &groups.of, n));
    let mut columns: Vec<ArrayRef> = vec![Arc::new(
        TimestampNanosecondArray::from(groups.buckets.clone()).with_timezone("UTC"),
    )];
    for l in &labels {
        columns.push(take(l.as_ref(), &picks, None)?);
    }
    let column = |i: usize| batch.column(i).as_primitive::<Int64Type>();
    let samples = column(spec.labels + 1);
    columns.push(Arc::new(sums(samples, &groups.of, n)));
    let mut at = spec.labels + 2;
    for (_, ty) in &spec.values {
        let parts: [&ArrayRef; 4] = std::array::from_fn(|k| batch.column(at + k));
        let [min, max, avg, last] = match ty {
            ValueType::Float => regroup::<Float64Type>(parts, samples, times, &groups.of, n),
            ValueType::Int => regroup::<Int64Type>(parts, samples, times, &groups.of, n),
        };
        columns.extend([min, max, avg, last]);
        at += ROLLUP_SUFFIXES.len();
    }
    if spec.reasons {
        let reported = batch
            .column_by_name(&format!("{CLOCK_REASON_SOURCE}_max"))
            .ok_or_else(|| crate::Error::BadRows("rollup rows without reasons".into()))?;
        for k in 0..CLOCK_REASON_BITS.len() {
            let counts = batch.column(at + k);
            columns.push(Arc::new(count_sums(counts, reported, &groups.of, n)?));
        }
    }
    let out = RecordBatch::try_new(table.schema(), columns)?;
    sort_batch(table, &out)
}

/// Per group, its latest row with a job (non-null `jobs`), or its latest row when none has one.
fn latest_with_job(jobs: &ArrayRef, times: &[i64], of: &[usize], groups: usize) -> Vec<u32> {
    let mut pick: Vec<Option<(bool, i64, u32)>> = vec![None; groups];
    for (i, &g) in of.iter().enumerate() {
        let key = (jobs.is_valid(i), times[i], i as u32);
        if pick[g].is_none_or(|p| key > p) {
            pick[g] = Some(key);
        }
    }
    pick.into_iter()
        .map(|p| p.map_or(0, |(_, _, i)| i))
        .collect()
}

/// Per group, the sum of `values`.
fn sums(values: &Int64Array, of: &[usize], groups: usize) -> Int64Array {
    let mut sum = vec![0i64; groups];
    for (i, &g) in of.iter().enumerate() {
        sum[g] = sum[g].saturating_add(values.value(i));
    }
    Int64Array::from(sum)
}

/// Per group, the sum of a reason's `counts`: null where no row reported reasons, and where a
/// row reported some (`reported`, its largest bitmask, is set) without counting them (rolled up
/// before the counts existed), since a sum over some of the day's hours would read as the day's.
fn count_sums(
    counts: &ArrayRef,
    reported: &ArrayRef,
    of: &[usize],
    groups: usize,
) -> Result<Int64Array> {
    let counts = counts
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| crate::Error::BadRows("a reason count that is not Int64".into()))?;
    let mut sum: Vec<Option<i64>> = vec![None; groups];
    let mut uncounted = vec![false; groups];
    for (i, &g) in of.iter().enumerate() {
        if counts.is_valid(i) {
            sum[g] = Some(sum[g].unwrap_or(0).saturating_add(counts.value(i)));
        } else if reported.is_valid(i) {
            uncounted[g] = true;
        }
    }
    Ok(sum
        .into_iter()
        .zip(uncounted)
        .map(|(s, u)| s.filter(|_| !u))
        .collect())
}

/// Per group and bit of [`CLOCK_REASON_BITS`], the samples of `batch` (raw `gpu_metrics` rows)
/// whose `clock_event_reasons` has the bit set; null in a group where no sample reported them.
fn reason_counts(batch: &RecordBatch, of: &[usize], groups: usize) -> Result<Vec<ArrayRef>> {
    let masks = batch
        .column_by_name(CLOCK_REASON_SOURCE)
        .and_then(|c| c.as_primitive_opt::<Int64Type>())
        .ok_or_else(|| crate::Error::BadRows(format!("rows without {CLOCK_REASON_SOURCE}")))?;
    let mut counts: Vec<Option<[i64; CLOCK_REASON_BITS.len()]>> = vec![None; groups];
    for (i, &g) in of.iter().enumerate() {
        if masks.is_null(i) {
            continue;
        }
        let mask = masks.value(i);
        let count = counts[g].get_or_insert_default();
        for (k, bit) in CLOCK_REASON_BITS.iter().enumerate() {
            if mask & bit != 0 {
                count[k] += 1;
            }
        }
    }
    Ok((0..CLOCK_REASON_BITS.len())
        .map(|k| {
            let column: Int64Array = counts.iter().map(|c| c.map(|c| c[k])).collect();
            Arc::new(column) as ArrayRef
        })
        .collect())
}

/// One value column's rollup parts (`min`, `max`, `avg`, `last`) of several rows regrouped:
/// the min, max, mean weighted by `weights`, and the latest last.
fn regroup<T: ArrowPrimitiveType>(
    [min, max, avg, last]: [&ArrayRef; 4],
    weights: &Int64Array,
    times: &[i64],
    of: &[usize],
    groups: usize,
) -> [ArrayRef; 4]
where
    T::Native: PartialOrd,
{
    let (min, max, last) = (
        min.as_primitive::<T>(),
        max.as_primitive::<T>(),
        last.as_primitive::<T>(),
    );
    let avg = avg.as_primitive::<Float64Type>();
    let mut parts = Parts::new(groups);
    for (i, &g) in of.iter().enumerate() {
        if min.is_valid(i) {
            parts.low(g, min.value(i));
        }
        if max.is_valid(i) {
            parts.high(g, max.value(i));
        }
        if last.is_valid(i) {
            parts.at(g, times[i], last.value(i));
        }
        if avg.is_valid(i) {
            parts.mean(g, avg.value(i), weights.value(i));
        }
    }
    parts.finish::<T>().0
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

    /// Raw samples of two GPUs over 30 hours (crossing a UTC midnight), one value missing in a
    /// whole hour: the daily rows rolled from the hourly ones hold each day's count, min, max,
    /// last and mean of the raw samples.
    #[test]
    fn a_day_rolled_from_hours_has_the_days_raw_figures() {
        let power = value_index("hw.power").expect("power");
        let mem = value_index("hw.gpu.memory.usage").expect("mem");
        let day = 86_400_000_000_000i64;
        let t0 = 20_833 * day + 18 * 3_600_000_000_000; // 18:00 UTC
        let step = 600_000_000_000i64; // 10 minutes
        let mut rows = Vec::new();
        for k in 0..180i64 {
            for gpu in ["GPU-a", "GPU-b"] {
                let t = t0 + k * step;
                let mut r = GpuRow::new(t);
                r.labels[0] = Some("h".into());
                r.labels[1] = Some(gpu.into());
                // The hour from 20:00 has no power reading (the mean skips it, as the hours do).
                let hour = (t - t0) / 3_600_000_000_000;
                let p = (k * 37 % 101) as f64 + if gpu == "GPU-b" { 1000.0 } else { 0.0 };
                r.values[power] = (hour != 2).then_some(Cell::F(p));
                r.values[mem] = Some(Cell::I(k * 3 % 17));
                // GPU-a: job j1 until 05:40 (mid-hour), j2 until 14:00, then none; GPU-b never.
                if gpu == "GPU-a" && k < 120 {
                    r.labels[5] = Some(if k < 70 { "j1" } else { "j2" }.into());
                }
                rows.push((gpu, t, r));
            }
        }
        let raw: Vec<GpuRow> = rows.iter().map(|(_, _, r)| r.clone()).collect();
        let batch = WriteBatch::from_rows(&raw, &[]).expect("batch").batches[0]
            .1
            .clone();
        let hourly = rollup(&batch, Table::GpuMetrics1h).expect("hourly");
        let daily = rollup_rollups(&hourly, Table::GpuMetrics1d).expect("daily");
        assert_eq!(daily.schema(), Table::GpuMetrics1d.schema());
        assert_eq!(
            daily.num_rows(),
            4,
            "a row a GPU and day, whatever its jobs"
        );
        assert_eq!(hourly.num_rows(), 61, "an hourly row a GPU, hour and job");
        let jobs = col(&daily, "job_id").as_string::<i32>();
        let times = daily.column(0).as_primitive::<TimestampNanosecondType>();
        let gpus = col(&daily, "gpu_uuid").as_string::<i32>();
        let f = |name: &str, g: usize| col(&daily, name).as_primitive::<Float64Type>().value(g);
        let i = |name: &str, g: usize| col(&daily, name).as_primitive::<Int64Type>().value(g);
        for g in 0..daily.num_rows() {
            let start = times.value(g);
            assert_eq!(start.rem_euclid(day), 0, "a row a UTC day");
            // The job labels of the day's latest hour with a job.
            let job = (gpus.value(g) == "GPU-a").then_some(if start < t0 { "j1" } else { "j2" });
            assert_eq!(jobs.is_valid(g).then(|| jobs.value(g)), job);
            let of: Vec<&GpuRow> = rows
                .iter()
                .filter(|(gpu, t, _)| *gpu == gpus.value(g) && (start..start + day).contains(t))
                .map(|(_, _, r)| r)
                .collect();
            let powers: Vec<f64> = of
                .iter()
                .filter_map(|r| match r.values[power] {
                    Some(Cell::F(v)) => Some(v),
                    _ => None,
                })
                .collect();
            assert_eq!(i("samples", g), of.len() as i64);
            let min = powers.iter().copied().fold(f64::INFINITY, f64::min);
            let max = powers.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(f("power_watts_min", g), min);
            assert_eq!(f("power_watts_max", g), max);
            assert_eq!(f("power_watts_last", g), *powers.last().expect("some"));
            let mean = powers.iter().sum::<f64>() / powers.len() as f64;
            assert!(
                (f("power_watts_avg", g) - mean).abs() < 1e-9,
                "mean of the values"
            );
            let last_mem = match of.last().expect("rows").values[mem] {
                Some(Cell::I(v)) => v,
                _ => unreachable!(),
            };
            assert_eq!(i("memory_used_bytes_last", g), last_mem);
        }
        assert!(rollup_rollups(&hourly, Table::GpuMetrics1h).is_err());
    }

    /// `hourly` with the row of `gpu` at `at` reporting reasons (largest bitmask 4) that its
    /// counts (null) do not hold, as a row rolled up before the counts existed.
    fn reported_uncounted(hourly: &RecordBatch, gpu: &str, at: i64) -> RecordBatch {
        let gpus = col(hourly, "gpu_uuid").as_string::<i32>();
        let times = hourly.column(0).as_primitive::<TimestampNanosecondType>();
        let row = (0..hourly.num_rows())
            .find(|&g| gpus.value(g) == gpu && times.value(g) == at)
            .expect("the row");
        let max = hourly
            .schema()
            .index_of("clock_event_reasons_max")
            .expect("max");
        let m = hourly.column(max).as_primitive::<Int64Type>();
        let reported: Int64Array = (0..hourly.num_rows())
            .map(|g| {
                if g == row {
                    Some(4)
                } else {
                    m.is_valid(g).then(|| m.value(g))
                }
            })
            .collect();
        let mut columns = hourly.columns().to_vec();
        columns[max] = Arc::new(reported);
        RecordBatch::try_new(hourly.schema(), columns).expect("batch")
    }

    /// Each clock-event reason bit's samples are counted per bucket and summed per day; a bucket
    /// (or a day) where no sample reported reasons has no counts, not zeros, and so has a day
    /// with an hour that reported reasons without counts.
    #[test]
    fn clock_reasons_are_counted_per_bit_and_summed_per_day() {
        use crate::schema::{CLOCK_REASON_BITS, clock_reason_column};
        let reasons = value_index("gpu.clock.event_reasons").expect("reasons");
        let hour = 3_600_000_000_000i64;
        let t0 = 20_833 * 86_400_000_000_000i64; // a UTC midnight
        let mut rows = Vec::new();
        // GPU-a: hour 0 masks 1, 5, none, 4, 0, 256; hour 1 none at all. GPU-b: never any.
        let a = [
            Some(1),
            Some(5),
            None,
            Some(4),
            Some(0),
            Some(256),
            None,
            None,
        ];
        for (k, mask) in a.into_iter().enumerate() {
            for gpu in ["GPU-a", "GPU-b"] {
                let mut r = GpuRow::new(t0 + (k as i64 / 6) * hour + k as i64 * 1_000_000_000);
                r.labels[0] = Some("h".into());
                r.labels[1] = Some(gpu.into());
                r.values[reasons] = mask.filter(|_| gpu == "GPU-a").map(Cell::I);
                rows.push(r);
            }
        }
        let batch = WriteBatch::from_rows(&rows, &[]).expect("batch").batches[0]
            .1
            .clone();
        let hourly = rollup(&batch, Table::GpuMetrics1h).expect("hourly");
        let daily = rollup_rollups(&hourly, Table::GpuMetrics1d).expect("daily");
        let count = |b: &RecordBatch, gpu: &str, at: i64, bit: i64| {
            let gpus = col(b, "gpu_uuid").as_string::<i32>();
            let times = b.column(0).as_primitive::<TimestampNanosecondType>();
            let g = (0..b.num_rows())
                .find(|&g| gpus.value(g) == gpu && times.value(g) == at)
                .expect("row");
            let c = col(b, &clock_reason_column(bit)).as_primitive::<Int64Type>();
            c.is_valid(g).then(|| c.value(g))
        };
        let want = |bit: i64| match bit {
            1 | 4 => Some(2),
            256 => Some(1),
            _ => Some(0),
        };
        // An hour rolled up before the counts existed (GPU-a's second: reasons reported, none
        // counted): the day has no counts rather than those of its first hour alone.
        let mixed = reported_uncounted(&hourly, "GPU-a", t0 + hour);
        let day = rollup_rollups(&mixed, Table::GpuMetrics1d).expect("daily");
        for bit in CLOCK_REASON_BITS {
            assert_eq!(count(&hourly, "GPU-a", t0, bit), want(bit), "bit {bit}");
            assert_eq!(count(&hourly, "GPU-a", t0 + hour, bit), None, "no reasons");
            assert_eq!(count(&hourly, "GPU-b", t0, bit), None, "no reasons");
            assert_eq!(
                count(&daily, "GPU-a", t0, bit),
                want(bit),
                "bit {bit} a day"
            );
            assert_eq!(count(&daily, "GPU-b", t0, bit), None, "no reasons a day");
            assert_eq!(
                count(&day, "GPU-a", t0, bit),
                None,
                "an hour's reasons uncounted"
            );
        }
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
