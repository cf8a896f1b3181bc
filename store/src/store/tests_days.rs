//! Daily rollups: maintenance rolls each closed UTC day of `gpu_metrics_1h` into
//! `gpu_metrics_1d`, once, and again when the day's hours change.

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int64Type, TimestampNanosecondType};

use super::*;
use crate::clock::ManualClock;
use crate::ingest::{Cell, GpuRow, WriteBatch};
use crate::schema::value_index;

const H: i64 = 3_600_000_000_000;
const DAY: i64 = 24 * H;
/// 20:00 UTC.
const T0: i64 = 20_833 * DAY + 20 * H;

fn sample(t: i64, gpu: &str, power: f64) -> WriteBatch {
    let mut row = GpuRow::new(t);
    row.labels[0] = Some("h".into());
    row.labels[1] = Some(gpu.into());
    row.values[value_index("hw.power").expect("power")] = Some(Cell::F(power));
    WriteBatch::from_rows(&[row], &[]).expect("batch")
}

/// Per daily row: (day start, GPU, samples, max power, mean power), sorted.
fn daily(s: &Store) -> Vec<(i64, String, i64, f64, f64)> {
    let files = s.files(Table::GpuMetrics1d);
    let b = crate::compact::read_files(s.storage(), Table::GpuMetrics1d, &files).expect("read");
    let col = |n: &str| b.column_by_name(n).expect(n);
    let times = col("time").as_primitive::<TimestampNanosecondType>();
    let gpus =
        arrow::compute::cast(col("gpu_uuid"), &arrow::datatypes::DataType::Utf8).expect("text");
    let gpus = gpus.as_string::<i32>();
    let samples = col("samples").as_primitive::<Int64Type>();
    let max = col("power_watts_max").as_primitive::<Float64Type>();
    let avg = col("power_watts_avg").as_primitive::<Float64Type>();
    let mut out: Vec<_> = (0..b.num_rows())
        .map(|i| {
            let g = gpus.value(i).to_string();
            (
                times.value(i),
                g,
                samples.value(i),
                max.value(i),
                avg.value(i),
            )
        })
        .collect();
    out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    out
}

#[test]
fn closed_days_are_rolled_once_and_again_when_an_hour_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let s = Store::open(StoreConfig::new(dir.path()), clock.clone()).expect("open");
    // 40 hours from 20:00, two GPUs, a sample every 10 minutes: 4 hours of the first UTC day,
    // all of the second, 12 hours of the third (not ended).
    let step = 600_000_000_000;
    for k in 0..240 {
        for (gpu, base) in [("GPU-a", 0.0), ("GPU-b", 1000.0)] {
            s.write(&sample(T0 + k * step, gpu, base + (k % 50) as f64))
                .expect("write");
        }
    }
    s.persist().expect("persist");
    clock.advance(40 * H + 20 * 60_000_000_000);
    s.maintain().expect("maintain");
    let day0 = T0 - 20 * H;
    let mean = |ks: std::ops::Range<i64>| {
        ks.clone().map(|k| (k % 50) as f64).sum::<f64>() / (ks.end - ks.start) as f64
    };
    let want = vec![
        (day0, "GPU-a".to_string(), 24, 23.0, mean(0..24)),
        (day0, "GPU-b".to_string(), 24, 1023.0, 1000.0 + mean(0..24)),
        (day0 + DAY, "GPU-a".to_string(), 144, 49.0, mean(24..168)),
        (
            day0 + DAY,
            "GPU-b".to_string(),
            144,
            1049.0,
            1000.0 + mean(24..168),
        ),
    ];
    let got = daily(&s);
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.0, &g.1, g.2, g.3), (w.0, &w.1, w.2, w.3));
        assert!((g.4 - w.4).abs() < 1e-9, "{g:?} vs {w:?}");
    }
    assert_eq!(s.files(Table::GpuMetrics1d).len(), 2, "a file a day");
    // Nothing changed: the next pass rolls nothing.
    assert_eq!(s.maintain().expect("maintain").rollup_files, 0);
    // A late sample at 12:05 on the second day: the hour is compacted again, its rollups
    // rebuilt, and the day rolled again from the changed hours.
    s.write(&sample(
        day0 + DAY + 12 * H + 300_000_000_000,
        "GPU-a",
        5000.0,
    ))
    .expect("late write");
    s.persist().expect("persist");
    for _ in 0..3 {
        clock.advance(60_000_000_000);
        s.maintain().expect("maintain");
    }
    let got = daily(&s);
    assert_eq!((got[2].2, got[2].3), (145, 5000.0), "{got:?}");
    assert_eq!(&got[..2], &want[..2]);
    assert_eq!((got[3].2, got[3].3), (144, 1049.0));
    assert_eq!(
        s.files(Table::GpuMetrics1d).len(),
        2,
        "the day's file replaced"
    );
    // And a restart keeps them.
    drop(s);
    let s = Store::open(StoreConfig::new(dir.path()), clock).expect("reopen");
    assert_eq!(daily(&s), got);
    assert_eq!(s.maintain().expect("maintain").rollup_files, 0);
}
