//! Each rule of the per-sample class at and beside its threshold, through the SQL the `jobs`
//! view and the report run, over rows of a real store.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::ingest::{Cell, GpuRow, WriteBatch};
use gpuwatch_store::schema::value_index;
use gpuwatch_store::{ReadStore, Store, StoreConfig};

use super::*;

const T0: i64 = 1_800_000_000_000_000_000;

/// One sample's readings, by OTLP name.
type Reading = Vec<(&'static str, Cell)>;

fn f(v: f64) -> Cell {
    Cell::F(v)
}

fn row(case: &str, values: &Reading) -> GpuRow {
    let mut r = GpuRow::new(T0);
    r.labels[0] = Some("n1".into());
    r.labels[1] = Some(case.into());
    for (name, c) in values {
        r.values[value_index(name).unwrap_or_else(|| panic!("{name}"))] = Some(c.clone());
    }
    r
}

/// The class of each case, as the SQL decides it with `advice`.
async fn classes(cases: &[(&str, Reading)], advice: &AdviceConfig) -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows: Vec<GpuRow> = cases.iter().map(|(c, v)| row(c, v)).collect();
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(dir.path().to_path_buf())
        },
        Arc::new(ManualClock::new(T0)),
    )
    .expect("store");
    store
        .write(&WriteBatch::from_rows(&rows, &[]).expect("batch"))
        .expect("write");
    let read: Arc<dyn ReadStore> = Arc::new(store);
    let e = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    let sql = format!(
        "SELECT gpu_uuid, {} AS c FROM gpu_metrics",
        sample_class_sql(advice, 0.01)
    );
    let r = e.query(&sql).await.expect("class query");
    let mut out = BTreeMap::new();
    for b in &r.batches {
        let uuid =
            arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).expect("cast");
        let class =
            arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Utf8).expect("cast");
        let (uuid, class) = (
            arrow::array::AsArray::as_string::<i32>(&uuid),
            arrow::array::AsArray::as_string::<i32>(&class),
        );
        for i in 0..b.num_rows() {
            out.insert(uuid.value(i).to_string(), class.value(i).to_string());
        }
    }
    out
}

const U: &str = "hw.gpu.utilization";
const SM: &str = "gpu.sm.active";
const TENSOR: &str = "gpu.tensor.active";
const FP16: &str = "gpu.fp16.active";
const FP32: &str = "gpu.fp32.active";
const FP64: &str = "gpu.fp64.active";
const DRAM: &str = "gpu.dram.active";
const RX: &str = "gpu.pcie.receive.rate";
const GEN: &str = "gpu.pcie.link.generation";
const WIDTH: &str = "gpu.pcie.link.width";

#[tokio::test]
async fn each_rule_decides_at_its_threshold() {
    let gen5x16 = PCIE_LANE_BYTES[4].1 * 16.0;
    let cases: Vec<(&str, Reading)> = vec![
        // The recorded shapes' typical seconds (tests/fixtures/gpu-traces/README.md).
        (
            "bf16",
            vec![
                (U, f(0.97)),
                (SM, f(0.95)),
                (TENSOR, f(0.92)),
                (DRAM, f(0.25)),
            ],
        ),
        (
            "fp32",
            vec![
                (U, f(0.98)),
                (SM, f(0.96)),
                (TENSOR, f(0.0)),
                (FP32, f(0.77)),
                (DRAM, f(0.07)),
            ],
        ),
        (
            "hmma-fp16",
            vec![
                (U, f(0.99)),
                (SM, f(0.98)),
                (TENSOR, f(0.61)),
                (FP16, f(0.61)),
            ],
        ),
        (
            "dfma",
            vec![
                (U, f(0.97)),
                (SM, f(0.96)),
                (TENSOR, f(0.94)),
                (FP64, f(0.0005)),
                (DRAM, f(0.18)),
            ],
        ),
        (
            "fp64-pipe",
            vec![(U, f(0.97)), (SM, f(0.96)), (FP64, f(0.6)), (DRAM, f(0.2))],
        ),
        ("copy", vec![(U, f(0.98)), (SM, f(0.98)), (DRAM, f(0.88))]),
        (
            "pageable",
            vec![
                (U, f(0.16)),
                (SM, f(0.0)),
                (RX, f(8.2e9)),
                (GEN, Cell::I(5)),
                (WIDTH, Cell::I(16)),
            ],
        ),
        (
            "tiny",
            vec![
                (U, f(0.15)),
                (SM, f(0.0002)),
                (RX, f(1e8)),
                (GEN, Cell::I(5)),
                (WIDTH, Cell::I(16)),
            ],
        ),
        (
            "starved",
            vec![
                (U, f(0.59)),
                (SM, f(0.56)),
                (TENSOR, f(0.54)),
                (DRAM, f(0.17)),
            ],
        ),
        ("hold", vec![(U, f(0.0)), (SM, f(0.0)), (DRAM, f(0.0))]),
        // GPM read over the interval, utilisation a point reading that missed the kernels.
        (
            "util-missed",
            vec![
                (U, f(0.0)),
                (SM, f(0.12)),
                (TENSOR, f(0.03)),
                (DRAM, f(0.08)),
            ],
        ),
        // No GPM (an A100 read by NVML alone), busy; and idle.
        ("no-gpm-busy", vec![(U, f(0.9))]),
        ("no-gpm-idle", vec![(U, f(0.0))]),
        ("nothing", vec![]),
        // SM activity but no pipe or DRAM counter.
        ("sm-only", vec![(U, f(0.9)), (SM, f(0.9))]),
        // Thresholds: PCIe at 5% of the link with SMs below 0.5; at 4.9%; with SMs at 0.5.
        (
            "link-5%",
            vec![
                (U, f(0.2)),
                (SM, f(0.1)),
                (RX, f(0.05 * gen5x16)),
                (GEN, Cell::I(5)),
                (WIDTH, Cell::I(16)),
            ],
        ),
        (
            "link-4.9%",
            vec![
                (U, f(0.2)),
                (SM, f(0.1)),
                (RX, f(0.049 * gen5x16)),
                (GEN, Cell::I(5)),
                (WIDTH, Cell::I(16)),
            ],
        ),
        (
            "link-sm",
            vec![
                (U, f(0.9)),
                (SM, f(0.5)),
                (TENSOR, f(0.4)),
                (RX, f(0.5 * gen5x16)),
                (GEN, Cell::I(5)),
                (WIDTH, Cell::I(16)),
            ],
        ),
        // Link unknown: the fixed floor (1 GB/s), even without GPM.
        ("floor", vec![(U, f(0.1)), (RX, f(1e9))]),
        ("below-floor", vec![(U, f(0.1)), (RX, f(0.99e9))]),
        // SM fill exactly 0.5 is not latency; duty exactly 0.7 is not input.
        (
            "fill-0.5",
            vec![(U, f(0.8)), (SM, f(0.4)), (TENSOR, f(0.3))],
        ),
        (
            "fill-0.49",
            vec![(U, f(0.8)), (SM, f(0.392)), (TENSOR, f(0.3))],
        ),
        (
            "duty-0.7",
            vec![(U, f(0.7)), (SM, f(0.65)), (TENSOR, f(0.3))],
        ),
        (
            "duty-0.69",
            vec![(U, f(0.69)), (SM, f(0.65)), (TENSOR, f(0.3))],
        ),
        // Busy all the time, every unit nearly idle.
        (
            "no-roof",
            vec![(U, f(0.95)), (SM, f(0.9)), (FP32, f(0.05)), (DRAM, f(0.09))],
        ),
        ("idle-edge", vec![(U, f(0.0099)), (SM, f(0.0))]),
    ];
    let got = classes(&cases, &AdviceConfig::default()).await;
    let want = [
        ("bf16", "tensor"),
        ("fp32", "fp32"),
        ("hmma-fp16", "fp16"),
        ("dfma", "tensor"),
        ("fp64-pipe", "fp64"),
        ("copy", "memory"),
        ("pageable", "host_transfer"),
        ("tiny", "latency"),
        ("starved", "input"),
        ("hold", "idle"),
        ("util-missed", "input"),
        ("no-gpm-busy", "unknown"),
        ("no-gpm-idle", "idle"),
        ("nothing", "unknown"),
        ("sm-only", "unknown"),
        ("link-5%", "host_transfer"),
        ("link-4.9%", "input"),
        ("link-sm", "tensor"),
        ("floor", "host_transfer"),
        ("below-floor", "unknown"),
        ("fill-0.5", "tensor"),
        ("fill-0.49", "latency"),
        ("duty-0.7", "tensor"),
        ("duty-0.69", "input"),
        ("no-roof", "latency"),
        ("idle-edge", "idle"),
    ];
    for (case, class) in want {
        assert_eq!(got.get(case).map(String::as_str), Some(class), "{case}");
    }
    assert_eq!(got.len(), want.len());

    // A site that wants input stalls reported only below 60% of the time.
    let strict = AdviceConfig {
        input_duty: 0.6,
        ..AdviceConfig::default()
    };
    let got = classes(&cases, &strict).await;
    assert_eq!(got["starved"], "input");
    assert_eq!(got["duty-0.69"], "tensor");
}

#[test]
fn argmax_breaks_ties_in_order_and_ignores_zeros() {
    let m = |v: &[(&str, f64)]| -> BTreeMap<String, f64> {
        v.iter().map(|(k, s)| (k.to_string(), *s)).collect()
    };
    assert_eq!(
        argmax(&m(&[("idle", 10.0), ("input", 12.0)])).as_deref(),
        Some("input")
    );
    assert_eq!(
        argmax(&m(&[("memory", 5.0), ("tensor", 5.0)])).as_deref(),
        Some("tensor")
    );
    assert_eq!(argmax(&m(&[("memory", 0.0)])), None);
    assert_eq!(argmax(&m(&[])), None);
}
