use super::proto::{Label, Sample, TimeSeries, WriteRequest};
use super::*;
use crate::schema::Table;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use proptest::prelude::*;

const NOW_MS: i64 = 1_700_000_000_000;
const NOW: i64 = NOW_MS * 1_000_000;

/// A series with `labels` and `(timestamp ms, value)` samples.
pub(super) fn series(labels: &[(&str, &str)], samples: &[(i64, f64)]) -> TimeSeries {
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
fn the_dcgm_label_set_reads_only_its_declared_columns() {
    for c in DCGM_LABEL_COLUMNS {
        assert!(LABEL_COLUMNS.iter().any(|(l, _)| l == c), "{c}");
    }
    // Every column set (a pod's GPU, then a job's): blanking the undeclared ones changes nothing.
    for pod in [true, false] {
        let full: Vec<String> = LABEL_COLUMNS
            .iter()
            .map(|(c, _)| match *c {
                "gpu_index" => "3".to_string(),
                "mig_instance" => "1.0".to_string(),
                c => format!("{c}-value"),
            })
            .collect();
        let cells = |only_declared: bool| -> Vec<Option<&str>> {
            LABEL_COLUMNS
                .iter()
                .zip(&full)
                .map(|((c, _), v)| {
                    let keep = !only_declared || DCGM_LABEL_COLUMNS.contains(c);
                    let keep = keep && (pod || *c != "k8s_pod");
                    keep.then_some(v.as_str())
                })
                .collect()
        };
        let all = dcgm_label_set(&cells(false));
        assert_eq!(all, dcgm_label_set(&cells(true)));
        assert!(
            all.iter()
                .any(|(n, v)| *n == "Hostname" && v == "host-value")
        );
        assert_eq!(all.iter().any(|(n, _)| *n == "pod"), pod);
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
                Table::GpuMetrics1m
                | Table::GpuMetrics1h
                | Table::GpuMetrics1d
                | Table::GpuProcesses1m
                | Table::GpuProcesses1h
                | Table::JobLedger
                | Table::JobLedger1d
                | Table::JobLedgerTotals
                | Table::JobLedgerSpend => {
                    prop_assert!(false, "ingest never writes rollup or ledger tables");
                }
                Table::GpuProcesses | Table::GpuEvents | Table::Alerts => {
                    prop_assert!(false, "remote write has no process, event or alert series");
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

/// Series of a small fleet with every label the pivot reads, repeated and empty labels, several
/// GPUs and MIG instances, jobs changing, duplicate timestamps and non-GPU series.
fn arb_fleet_series() -> impl Strategy<Value = TimeSeries> {
    let name = prop::sample::select(vec![
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_PROF_SM_ACTIVE",
        "node_load1",
        "",
    ]);
    let optional = |values: Vec<&'static str>| prop::option::of(prop::sample::select(values));
    let labels = (
        name,
        optional(vec!["h1", "h2", ""]),
        optional(vec!["10.0.0.1:9400", "[fe80::1]:9400", "h3", "h4:x", ""]),
        optional(vec!["GPU-1", "GPU-2", ""]),
        optional(vec!["0", "1", "x"]),
        optional(vec!["1", "2"]),
        optional(vec!["42", "43", ""]),
        optional(vec!["p", "q"]),
        optional(vec!["ep"]),
        optional(vec!["ns", ""]),
        prop::collection::vec(
            (
                prop::sample::select(vec!["a", "b", "__name__", "UUID"]),
                prop::sample::select(vec!["1", "2", ""]),
            ),
            0..3,
        ),
    );
    let samples = prop::collection::vec(
        (
            prop::sample::select(vec![
                NOW_MS - 30_000,
                NOW_MS - 15_000,
                NOW_MS,
                NOW_MS + 1_000_000,
            ]),
            prop_oneof![4 => 0.0f64..100.0, 1 => Just(f64::NAN), 1 => Just(f64::from_bits(STALE_NAN_BITS))],
        ),
        0..5,
    );
    (labels, samples).prop_map(
        |((name, host, instance, uuid, gpu, mig, job, pod, epod, ns, extra), samples)| {
            let mut l: Vec<(&str, &str)> = vec![("__name__", name)];
            let opt = [
                ("Hostname", host),
                ("instance", instance),
                ("UUID", uuid),
                ("gpu", gpu),
                ("GPU_I_ID", mig),
                ("hpc_job", job),
                ("pod", pod),
                ("exported_pod", epod),
                ("namespace", ns),
            ];
            for (n, v) in opt {
                if let Some(v) = v {
                    l.push((n, v));
                }
            }
            l.extend(extra);
            l.push(("modelName", "H100"));
            series(&l, &samples)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn same_rows_as_the_reference(series in prop::collection::vec(arb_fleet_series(), 0..24)) {
        let req = WriteRequest { timeseries: series };
        let (want, want_stats) = reference::to_write_batch(&req, NOW).expect("reference decodes");
        let (got, got_stats) =
            decode_request(None, Some("snappy"), &snappy(&req), 1 << 24, NOW).expect("decodes");
        prop_assert_eq!(got_stats, want_stats);
        prop_assert_eq!(got.batches.len(), want.batches.len());
        for ((gt, gb), (wt, wb)) in got.batches.iter().zip(&want.batches) {
            prop_assert_eq!(gt, wt);
            prop_assert_eq!(gb, wb);
        }
        // The owned request path goes through the same code.
        let (again, _) = to_write_batch(&req, NOW).expect("decodes");
        prop_assert_eq!(again.batches.len(), got.batches.len());
        for ((_, a), (_, b)) in again.batches.iter().zip(&got.batches) {
            prop_assert_eq!(a, b);
        }
    }
}

#[test]
fn bad_utf8_in_a_label_is_a_clear_error() {
    // Label { name: "job", value: "\xff" } in the only series.
    let label = [0x0a, 3, b'j', b'o', b'b', 0x12, 1, 0xff];
    let mut ts = vec![0x0a, label.len() as u8];
    ts.extend_from_slice(&label);
    let mut raw = vec![0x0a, ts.len() as u8];
    raw.extend_from_slice(&ts);
    let body = snap::raw::Encoder::new()
        .compress_vec(&raw)
        .expect("compress");
    let err = decode_request(None, None, &body, 1 << 20, NOW).expect_err("bad utf-8");
    assert!(err.is_client_error());
    assert_eq!(
        err.to_string(),
        "malformed remote write protobuf: timeseries 0: label value is not valid utf-8 (at byte 0)"
    );
}

/// The implementation before the borrowed decoder: every request is also run through it and
/// the batches compared (`same_rows_as_the_reference`).
mod reference {
    use super::super::proto::TimeSeries;
    use super::*;
    use crate::ingest::{GpuRow, MetricRow};
    use std::collections::{BTreeMap, HashMap};

    /// The dcgm field and its column index for a metric name.
    pub(super) fn dcgm_field(name: &str) -> Option<(DcgmField, usize)> {
        let f = DCGM_FIELDS.iter().find(|f| f.name == name)?;
        Some((*f, column_index(f.column)?))
    }

    fn label<'a>(ts: &'a TimeSeries, name: &str) -> Option<&'a str> {
        ts.labels
            .iter()
            .find(|l| l.name == name && !l.value.is_empty())
            .map(|l| l.value.as_str())
    }

    fn first_label(ts: &TimeSeries, names: &[&str]) -> Option<String> {
        names.iter().find_map(|n| label(ts, n)).map(str::to_string)
    }

    /// The host of a series: `Hostname`, else the scrape `instance` without its port.
    fn host_of(ts: &TimeSeries) -> String {
        if let Some(h) = label(ts, "Hostname") {
            return h.to_string();
        }
        let Some(instance) = label(ts, "instance") else {
            return String::new();
        };
        match instance.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            _ => instance.to_string(),
        }
    }

    /// The `gpu_metrics` labels of a dcgm-exporter series, in [`LABEL_COLUMNS`] order.
    fn dcgm_labels(ts: &TimeSeries) -> Vec<Option<String>> {
        let mut out: Vec<Option<String>> = vec![None; LABEL_COLUMNS.len()];
        for (i, (column, _)) in LABEL_COLUMNS.iter().enumerate() {
            out[i] = match *column {
                "host" => Some(host_of(ts)),
                _ => DCGM_LABELS
                    .iter()
                    .find(|(c, _)| c == column)
                    .and_then(|(_, names)| first_label(ts, names)),
            };
        }
        let idx = |name: &str| LABEL_COLUMNS.iter().position(|(c, _)| *c == name);
        if let (Some(job), Some(sched), Some(pod)) =
            (idx("job_id"), idx("scheduler"), idx("k8s_pod"))
        {
            out[sched] = if out[job].is_some() {
                Some("slurm".to_string())
            } else if out[pod].is_some() {
                Some("kubernetes".to_string())
            } else {
                None
            };
        }
        out
    }

    type GpuKey = (i64, String, String, Option<String>);

    /// Turns a request into rows. `now` (ns) bounds how far in the future a sample may be.
    pub(super) fn to_write_batch(
        req: &WriteRequest,
        now: i64,
    ) -> Result<(WriteBatch, RemoteWriteStats)> {
        let mut stats = RemoteWriteStats::default();
        let mut gpu_rows: Vec<GpuRow> = Vec::new();
        let mut gpu_index: HashMap<GpuKey, usize> = HashMap::new();
        // (row, free MiB, reserved MiB) for the memory total of rows without DCGM_FI_DEV_FB_TOTAL.
        let mut fb_extra: HashMap<usize, (Option<f64>, Option<f64>)> = HashMap::new();
        let mut metric_rows: Vec<MetricRow> = Vec::new();
        let mut metric_index: HashMap<(usize, i64), usize> = HashMap::new();
        let mut series_ids: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
        let uuid_col = LABEL_COLUMNS.iter().position(|(c, _)| *c == "gpu_uuid");
        let mig_col = LABEL_COLUMNS.iter().position(|(c, _)| *c == "mig_instance");

        for ts in &req.timeseries {
            stats.series += 1;
            let Some(name) = label(ts, "__name__") else {
                stats.unnamed += ts.samples.len() as u64;
                continue;
            };
            let uuid = label(ts, "UUID");
            let gpu_target = match (dcgm_field(name), uuid) {
                (Some(field), Some(_)) => Some(field),
                _ => None,
            };
            let fb_side = uuid.is_some() && (name == FB_FREE || name == FB_RESERVED);
            let labels = if gpu_target.is_some() || fb_side {
                Some(dcgm_labels(ts))
            } else {
                None
            };
            let series_id = if gpu_target.is_none() {
                let mut map: BTreeMap<String, String> = BTreeMap::new();
                for l in &ts.labels {
                    if l.name != "__name__" && !l.value.is_empty() {
                        map.insert(l.name.clone(), l.value.clone());
                    }
                }
                let key = (name.to_string(), map.into_iter().collect::<Vec<_>>());
                let next = series_ids.len();
                Some(*series_ids.entry(key).or_insert(next))
            } else {
                None
            };
            for s in &ts.samples {
                if s.value.to_bits() == STALE_NAN_BITS {
                    stats.stale += 1;
                    continue;
                }
                if !s.value.is_finite() {
                    stats.non_finite += 1;
                    continue;
                }
                let Some(time) = sample_time(s.timestamp, now) else {
                    stats.out_of_range += 1;
                    continue;
                };
                stats.samples += 1;
                if let (Some(labels), Some(uc)) = (&labels, uuid_col)
                    && (gpu_target.is_some() || fb_side)
                {
                    let key: GpuKey = (
                        time,
                        labels[0].clone().unwrap_or_default(),
                        labels[uc].clone().unwrap_or_default(),
                        mig_col.and_then(|m| labels[m].clone()),
                    );
                    let row = *gpu_index.entry(key).or_insert_with(|| {
                        let mut row = GpuRow::new(time);
                        row.labels.clone_from(labels);
                        let pairs: Vec<(&str, &str)> = ts
                            .labels
                            .iter()
                            .map(|l| (l.name.as_str(), l.value.as_str()))
                            .collect();
                        let cols: Vec<Option<&str>> = labels.iter().map(|l| l.as_deref()).collect();
                        let extra = series_overrides(&pairs, &cols);
                        row.series_labels = (!extra.is_empty())
                            .then(|| rows::series_labels_json(extra.iter().copied()));
                        gpu_rows.push(row);
                        gpu_rows.len() - 1
                    });
                    if let Some((field, col)) = gpu_target {
                        stats.gpu_samples += 1;
                        let value = s.value * field.scale;
                        let cell = &mut gpu_rows[row].values[col];
                        if cell.is_some() {
                            stats.duplicates += 1;
                            stats.samples -= 1;
                        }
                        *cell = Some(Cell::F(value));
                        continue;
                    }
                    let extra = fb_extra.entry(row).or_default();
                    if name == FB_FREE {
                        extra.0 = Some(s.value);
                    } else {
                        extra.1 = Some(s.value);
                    }
                    // Also kept in `metrics` below.
                }
                let Some(sid) = series_id else {
                    continue;
                };
                let value = s.value;
                match metric_index.get(&(sid, time)) {
                    Some(&i) => {
                        stats.duplicates += 1;
                        stats.samples -= 1;
                        metric_rows[i].value = value;
                    }
                    None => {
                        let mut row_labels: Vec<(String, String)> = Vec::new();
                        for l in &ts.labels {
                            if l.name != "__name__" && !l.value.is_empty() {
                                row_labels.push((l.name.clone(), l.value.clone()));
                            }
                        }
                        row_labels.sort();
                        row_labels.dedup_by(|a, b| a.0 == b.0);
                        metric_index.insert((sid, time), metric_rows.len());
                        metric_rows.push(MetricRow {
                            time,
                            metric: name.to_string(),
                            value,
                            labels: row_labels,
                        });
                    }
                }
            }
        }

        // Rows made only for the memory total (free/reserved without any mapped field) are dropped
        // unless they gain a value.
        let used = column_index("memory_used_bytes");
        let total = column_index("memory_total_bytes");
        if let (Some(used), Some(total)) = (used, total) {
            for (&row, &(free, reserved)) in &fb_extra {
                let r = &mut gpu_rows[row];
                if r.values[total].is_some() {
                    continue;
                }
                if let (Some(Cell::F(used_bytes)), Some(free)) = (r.values[used], free) {
                    let sum = used_bytes + (free + reserved.unwrap_or(0.0)) * MIB;
                    r.values[total] = Some(Cell::F(sum));
                }
            }
        }
        gpu_rows.retain(|r| r.values.iter().any(Option::is_some));
        Ok((WriteBatch::from_rows(&gpu_rows, &metric_rows)?, stats))
    }
}

/// The `series_labels` of `gpu_metrics` row `row`, as sorted pairs (`None` for null).
fn gpu_labels(b: &RecordBatch, row: usize) -> Option<Vec<(String, String)>> {
    let c = b
        .column_by_name("series_labels")
        .expect("series_labels")
        .as_string::<i32>();
    if c.is_null(row) {
        return None;
    }
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_str(c.value(row)).expect("json object");
    Some(map.into_iter().collect())
}

#[test]
fn gpu_rows_keep_the_labels_their_columns_do_not_give() {
    let mut req = WriteRequest::default();
    req.timeseries.push(series(
        &dcgm("DCGM_FI_DEV_GPU_TEMP", "0", "GPU-a"),
        &[(NOW_MS, 40.0)],
    ));
    // Without `Hostname` (the host comes from `instance`) and with a label of its own.
    req.timeseries.push(series(
        &[
            ("__name__", "DCGM_FI_DEV_GPU_TEMP"),
            ("UUID", "GPU-b"),
            ("gpu", "1"),
            ("instance", "node-8:9400"),
            ("pci_bus_id", "00000000:1B:00.0"),
        ],
        &[(NOW_MS, 41.0)],
    ));
    let (wb, _) = to_write_batch(&req, NOW).expect("decode");
    let b = table(&wb, Table::GpuMetrics).expect("gpu rows");
    assert_eq!(
        gpu_labels(b, 0),
        Some(vec![
            ("DCGM_FI_DRIVER_VERSION".into(), "550.54.15".into()),
            ("instance".into(), "10.0.0.7:9400".into()),
            ("job".into(), "dcgm".into()),
        ])
    );
    assert_eq!(
        gpu_labels(b, 1),
        Some(vec![
            ("Hostname".into(), String::new()),
            ("device".into(), String::new()),
            ("instance".into(), "node-8:9400".into()),
            ("pci_bus_id".into(), "00000000:1B:00.0".into()),
        ])
    );
}

proptest! {
    /// The dcgm-exporter labels of a row's columns with the row's overrides applied are the
    /// series' labels again, whatever the series carried.
    #[test]
    fn overrides_give_the_series_labels_back(
        labels in proptest::collection::vec(
            (prop_oneof![
                Just("Hostname"), Just("UUID"), Just("gpu"), Just("device"), Just("modelName"),
                Just("GPU_I_ID"), Just("hpc_job"), Just("pod"), Just("namespace"),
                Just("container"), Just("instance"), Just("job"), Just("exported_pod")
            ], "[a-c0-2]{0,2}"),
            0..10,
        )
    ) {
        let mut pairs: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.as_str())).collect();
        pairs.push(("__name__", "DCGM_FI_DEV_GPU_TEMP"));
        let sl = series_labels(tables(), &pairs);
        let overrides = series_overrides(&pairs, &sl.gpu);
        let mut back: Vec<(String, String)> = dcgm_label_set(&sl.gpu)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .filter(|(n, _)| !overrides.iter().any(|(o, _)| o == n))
            .collect();
        back.extend(overrides.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        back.retain(|(_, v)| !v.is_empty());
        back.sort();
        let mut want: Vec<(String, String)> = Vec::new();
        for (n, v) in &labels {
            if !v.is_empty() && !want.iter().any(|(w, _)| w == n) {
                want.push((n.to_string(), v.clone()));
            }
        }
        want.sort();
        prop_assert_eq!(back, want);
    }
}
