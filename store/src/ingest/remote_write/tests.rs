use super::proto::{Label, Sample, TimeSeries, WriteRequest};
use super::*;
use crate::schema::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use proptest::prelude::*;

const NOW_MS: i64 = 1_700_000_000_000;
const NOW: i64 = NOW_MS * 1_000_000;

fn series(labels: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
    TimeSeries {
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect(),
        samples: samples
            .iter()
            .map(|&(timestamp, value)| Sample { value, timestamp })
            .collect(),
    }
}

fn dcgm(
    name: &'static str,
    gpu: &'static str,
    uuid: &'static str,
) -> Vec<(&'static str, &'static str)> {
    vec![
        ("__name__", name),
        ("DCGM_FI_DRIVER_VERSION", "550.54.15"),
        ("Hostname", "node-7"),
        ("UUID", uuid),
        ("device", "nvidia0"),
        ("gpu", gpu),
        ("instance", "10.0.0.7:9400"),
        ("job", "dcgm"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
    ]
}

fn snappy(req: &WriteRequest) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(&req.encode_to_vec())
        .expect("compress")
}

fn table(wb: &WriteBatch, t: Table) -> Option<&RecordBatch> {
    wb.batches.iter().find(|(x, _)| *x == t).map(|(_, b)| b)
}

fn f64_col(b: &RecordBatch, name: &str, row: usize) -> Option<f64> {
    let c = b.column_by_name(name).expect(name);
    (!c.is_null(row)).then(|| c.as_primitive::<Float64Type>().value(row))
}

fn i64_col(b: &RecordBatch, name: &str, row: usize) -> Option<i64> {
    let c = b.column_by_name(name).expect(name);
    (!c.is_null(row)).then(|| c.as_primitive::<Int64Type>().value(row))
}

fn str_col(b: &RecordBatch, name: &str, row: usize) -> Option<String> {
    let c = b.column_by_name(name).expect(name);
    (!c.is_null(row)).then(|| c.as_string::<i32>().value(row).to_string())
}

#[test]
fn every_dcgm_field_names_a_real_column() {
    for f in DCGM_FIELDS {
        assert!(
            column_index(f.column).is_some(),
            "{} → {}",
            f.name,
            f.column
        );
    }
    for (c, _) in DCGM_LABELS {
        assert!(LABEL_COLUMNS.iter().any(|(l, _)| l == c), "{c}");
    }
}

#[test]
fn dcgm_series_are_pivoted_with_units_converted() {
    let t = NOW_MS - 15_000;
    let mut labels = dcgm("DCGM_FI_DEV_GPU_UTIL", "0", "GPU-aaa");
    labels.push(("hpc_job", "4242"));
    let req = WriteRequest {
        timeseries: vec![
            series(&labels, &[(t, 87.0)]),
            series(&dcgm("DCGM_FI_DEV_FB_USED", "0", "GPU-aaa"), &[(t, 1024.0)]),
            series(
                &dcgm("DCGM_FI_DEV_FB_FREE", "0", "GPU-aaa"),
                &[(t, 80_000.0)],
            ),
            series(
                &dcgm("DCGM_FI_DEV_FB_RESERVED", "0", "GPU-aaa"),
                &[(t, 500.0)],
            ),
            series(
                &dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", "GPU-aaa"),
                &[(t, 123_456_789.0)],
            ),
            series(
                &dcgm("DCGM_FI_PROF_SM_ACTIVE", "0", "GPU-aaa"),
                &[(t, 0.42)],
            ),
            series(
                &dcgm("DCGM_FI_DEV_SM_CLOCK", "0", "GPU-aaa"),
                &[(t, 1980.0)],
            ),
            series(&dcgm("DCGM_FI_DEV_GPU_UTIL", "1", "GPU-bbb"), &[(t, 5.0)]),
            series(
                &dcgm("DCGM_FI_DEV_XID_ERRORS", "1", "GPU-bbb"),
                &[(t, 79.0)],
            ),
        ],
    };
    let (wb, stats) = to_write_batch(&req, NOW).expect("decodes");
    assert_eq!(stats.samples, 9);
    assert_eq!(stats.gpu_samples, 6);
    assert_eq!(stats.rejected(), 0);
    let g = table(&wb, Table::GpuMetrics).expect("gpu rows");
    assert_eq!(g.num_rows(), 2);
    let a = (0..2)
        .find(|&i| str_col(g, "gpu_uuid", i).as_deref() == Some("GPU-aaa"))
        .expect("GPU-aaa row");
    let b = 1 - a;
    assert_eq!(f64_col(g, "gpu_utilization", a), Some(0.87));
    assert_eq!(i64_col(g, "memory_used_bytes", a), Some(1024 * 1024 * 1024));
    assert_eq!(
        i64_col(g, "memory_total_bytes", a),
        Some((1024 + 80_000 + 500) * 1024 * 1024)
    );
    assert_eq!(f64_col(g, "energy_joules", a), Some(123_456.789));
    assert_eq!(f64_col(g, "sm_active", a), Some(0.42));
    assert_eq!(i64_col(g, "sm_clock_mhz", a), Some(1980));
    assert_eq!(f64_col(g, "power_watts", a), None, "absent stays null");
    assert_eq!(str_col(g, "host", a).as_deref(), Some("node-7"));
    assert_eq!(
        str_col(g, "gpu_model", a).as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(str_col(g, "job_id", a).as_deref(), Some("4242"));
    assert_eq!(str_col(g, "scheduler", a).as_deref(), Some("slurm"));
    assert_eq!(str_col(g, "job_id", b), None);
    assert_eq!(str_col(g, "scheduler", b), None);
    let idx = g.column_by_name("gpu_index").expect("gpu_index");
    assert_eq!(idx.as_primitive::<Int32Type>().value(b), 1);
    assert_eq!(f64_col(g, "gpu_utilization", b), Some(0.05));
    assert_eq!(i64_col(g, "memory_total_bytes", b), None);
    let time = g
        .column(0)
        .as_primitive::<arrow::datatypes::TimestampNanosecondType>();
    assert_eq!(time.value(a), t * 1_000_000);

    // FB_FREE, FB_RESERVED and XID_ERRORS (a code, not a count) stay in `metrics` too.
    let m = table(&wb, Table::Metrics).expect("metric rows");
    let names: Vec<_> = (0..m.num_rows())
        .map(|i| str_col(m, "metric", i).unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        vec![
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_FB_RESERVED",
            "DCGM_FI_DEV_XID_ERRORS"
        ]
    );
}

#[test]
fn kubernetes_labels_prefer_the_exported_ones() {
    let mut labels = dcgm("DCGM_FI_DEV_POWER_USAGE", "0", "GPU-k");
    labels.extend([
        ("exported_pod", "trainer-0"),
        ("exported_namespace", "ml"),
        ("exported_container", "main"),
        ("pod", "dcgm-exporter-x"),
        ("namespace", "gpu-operator"),
    ]);
    let req = WriteRequest {
        timeseries: vec![series(&labels, &[(NOW_MS, 300.5)])],
    };
    let (wb, _) = to_write_batch(&req, NOW).expect("decodes");
    let g = table(&wb, Table::GpuMetrics).expect("gpu rows");
    assert_eq!(str_col(g, "k8s_pod", 0).as_deref(), Some("trainer-0"));
    assert_eq!(str_col(g, "k8s_namespace", 0).as_deref(), Some("ml"));
    assert_eq!(str_col(g, "k8s_container", 0).as_deref(), Some("main"));
    assert_eq!(str_col(g, "scheduler", 0).as_deref(), Some("kubernetes"));
    assert_eq!(f64_col(g, "power_watts", 0), Some(300.5));
}

#[test]
fn host_falls_back_to_the_instance_without_port() {
    let req = WriteRequest {
        timeseries: vec![series(
            &[
                ("__name__", "DCGM_FI_DEV_GPU_TEMP"),
                ("UUID", "GPU-h"),
                ("instance", "gpu-node-3:9400"),
            ],
            &[(NOW_MS, 61.0)],
        )],
    };
    let (wb, _) = to_write_batch(&req, NOW).expect("decodes");
    let g = table(&wb, Table::GpuMetrics).expect("gpu rows");
    assert_eq!(str_col(g, "host", 0).as_deref(), Some("gpu-node-3"));
}

#[test]
fn other_series_land_in_metrics_with_their_labels() {
    let req = WriteRequest {
        timeseries: vec![
            series(
                &[
                    ("__name__", "node_load1"),
                    ("instance", "a:9100"),
                    ("job", "node"),
                    ("empty", ""),
                ],
                &[(NOW_MS - 2000, 1.5), (NOW_MS - 1000, 2.5)],
            ),
            // A DCGM field without a UUID cannot be placed on a GPU.
            series(
                &[("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0")],
                &[(NOW_MS, 50.0)],
            ),
        ],
    };
    let (wb, stats) = to_write_batch(&req, NOW).expect("decodes");
    assert_eq!(stats.samples, 3);
    assert!(table(&wb, Table::GpuMetrics).is_none());
    let m = table(&wb, Table::Metrics).expect("metrics");
    assert_eq!(m.num_rows(), 3);
    assert_eq!(f64_col(m, "value", 1), Some(2.5));
    assert_eq!(
        f64_col(m, "value", 2),
        Some(50.0),
        "not converted outside gpu_metrics"
    );
    let labels = m.column(3).as_map();
    let first = labels.value(0);
    let keys = first.column(0).as_string::<i32>();
    let got: Vec<_> = (0..keys.len()).map(|i| keys.value(i)).collect();
    assert_eq!(got, vec!["instance", "job"], "empty labels are absent");
}

#[test]
fn sample_policy() {
    let stale = f64::from_bits(STALE_NAN_BITS);
    let far = NOW_MS + MAX_FUTURE / 1_000_000 + 1;
    let req = WriteRequest {
        timeseries: vec![
            series(
                &[("__name__", "x")],
                &[
                    (NOW_MS, 1.0),
                    (NOW_MS - 60_000, 2.0), // out of order: kept
                    (NOW_MS, 3.0),          // duplicate: last wins
                    (NOW_MS + 1000, stale), // staleness marker: dropped
                    (NOW_MS + 2000, f64::NAN),
                    (NOW_MS + 3000, f64::INFINITY),
                    (NOW_MS + 4000, f64::NEG_INFINITY),
                    (far, 4.0),
                    (-1, 5.0),
                    (i64::MAX, 6.0),
                ],
            ),
            series(&[("job", "no-name")], &[(NOW_MS, 1.0)]),
            series(
                &dcgm("DCGM_FI_DEV_GPU_UTIL", "0", "GPU-d"),
                &[(NOW_MS, 10.0), (NOW_MS, 20.0)],
            ),
        ],
    };
    let (wb, stats) = to_write_batch(&req, NOW).expect("decodes");
    assert_eq!(
        stats,
        RemoteWriteStats {
            series: 3,
            samples: 3,
            gpu_samples: 2,
            stale: 1,
            non_finite: 3,
            out_of_range: 3,
            unnamed: 1,
            duplicates: 2,
        }
    );
    assert!(
        stats
            .rejection_summary()
            .expect("summary")
            .contains("rejected 7 samples")
    );
    let m = table(&wb, Table::Metrics).expect("metrics");
    assert_eq!(m.num_rows(), 2);
    assert_eq!(f64_col(m, "value", 0), Some(3.0));
    assert_eq!(f64_col(m, "value", 1), Some(2.0));
    let g = table(&wb, Table::GpuMetrics).expect("gpu");
    assert_eq!(f64_col(g, "gpu_utilization", 0), Some(0.2));
}

#[test]
fn http_level_decoding() {
    let req = WriteRequest {
        timeseries: vec![series(&[("__name__", "up")], &[(NOW_MS, 1.0)])],
    };
    let body = snappy(&req);
    let (wb, _) = decode_request(
        Some("application/x-protobuf"),
        Some("snappy"),
        &body,
        1 << 20,
        NOW,
    )
    .expect("valid");
    assert_eq!(wb.rows(), 1);
    assert!(
        decode_request(None, None, &body, 1 << 20, NOW).is_ok(),
        "headers may be absent"
    );

    let err = decode_request(None, Some("gzip"), &body, 1 << 20, NOW).expect_err("gzip");
    assert!(err.to_string().contains("snappy"), "{err}");
    let err = decode_request(Some("text/plain"), None, &body, 1 << 20, NOW).expect_err("type");
    assert!(err.is_client_error());
    let err = decode_request(
        Some("application/x-protobuf;proto=io.prometheus.write.v2.Request"),
        None,
        &body,
        1 << 20,
        NOW,
    )
    .expect_err("v2");
    assert!(err.to_string().contains("remote write 1.0"), "{err}");
    let err = decode_request(None, None, &body, 4, NOW).expect_err("too large");
    assert!(matches!(err, Error::TooLarge { .. }));
    let err = decode_request(None, None, b"", 100, NOW).expect_err("empty");
    assert!(err.to_string().contains("empty body"), "{err}");
    let err = decode_request(None, None, b"\xff\xff\xff\xff\xff", 100, NOW).expect_err("garbage");
    assert!(
        err.to_string().starts_with("malformed remote write"),
        "{err}"
    );
    // Valid snappy around invalid protobuf.
    let bad = snap::raw::Encoder::new()
        .compress_vec(b"\x0a\xff\xff")
        .expect("compress");
    let err = decode_request(None, None, &bad, 100, NOW).expect_err("bad protobuf");
    assert!(
        err.to_string()
            .starts_with("malformed remote write protobuf"),
        "{err}"
    );
}

fn arb_series() -> impl Strategy<Value = TimeSeries> {
    let names = prop::sample::select(vec![
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "node_load1",
        "up",
        "",
    ]);
    let value = prop_oneof![
        4 => -1e12f64..1e12,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::from_bits(STALE_NAN_BITS)),
    ];
    let ts = prop_oneof![
        8 => (NOW_MS - 100_000)..(NOW_MS + 100_000),
        1 => any::<i64>(),
    ];
    (
        names,
        prop::option::of(prop::sample::select(vec!["GPU-1", "GPU-2"])),
        prop::collection::vec((ts, value), 0..6),
    )
        .prop_map(|(name, uuid, samples)| {
            let mut labels = vec![("__name__", name), ("Hostname", "h")];
            if let Some(u) = uuid {
                labels.push(("UUID", u));
            }
            series(&labels, &samples)
        })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_request(None, None, &body, 1 << 20, NOW);
        let compressed = snap::raw::Encoder::new().compress_vec(&body).expect("compress");
        let _ = decode_request(None, None, &compressed, 1 << 20, NOW);
    }

    #[test]
    fn every_sample_is_accounted_for(series in prop::collection::vec(arb_series(), 0..8)) {
        let req = WriteRequest { timeseries: series };
        let body = snappy(&req);
        let (wb, stats) = decode_request(None, Some("snappy"), &body, 1 << 24, NOW).expect("valid request");
        let total: u64 = req.timeseries.iter().map(|s| s.samples.len() as u64).sum();
        prop_assert_eq!(stats.series, req.timeseries.len() as u64);
        prop_assert_eq!(
            stats.samples + stats.duplicates + stats.stale + stats.rejected(),
            total
        );
        // Every stored sample is one cell: a metrics row or a gpu_metrics value.
        let mut cells = 0u64;
        for (t, b) in &wb.batches {
            match t {
                Table::Metrics => cells += b.num_rows() as u64,
                Table::GpuMetrics => {
                    for c in VALUE_COLUMNS {
                        let col = b.column_by_name(c.column).expect("column");
                        cells += (col.len() - col.null_count()) as u64;
                    }
                }
                Table::GpuMetrics1m | Table::GpuMetrics1h => {
                    prop_assert!(false, "ingest never writes rollup tables");
                }
                Table::GpuProcesses | Table::GpuEvents => {
                    prop_assert!(false, "remote write has no process or event series");
                }
            }
        }
        let derived_totals = wb.batches.iter().find(|(t, _)| *t == Table::GpuMetrics).map_or(0, |(_, b)| {
            let c = b.column_by_name("memory_total_bytes").expect("total");
            (c.len() - c.null_count()) as u64
        });
        prop_assert_eq!(cells, stats.samples + derived_totals);
        for (_, b) in &wb.batches {
            let time = b.column(0).as_primitive::<arrow::datatypes::TimestampNanosecondType>();
            for i in 0..time.len() {
                prop_assert!(time.value(i) >= 0 && time.value(i) <= NOW + MAX_FUTURE);
            }
        }
    }
}
