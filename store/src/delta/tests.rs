//! A table created by an earlier release, without the columns added since, gains them when an
//! ingest node opens it: its earlier files read them as null, new rows carry them, and the
//! Delta log's schema lists them for any other reader.

use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int64Type, Schema};
use deltalake_core::kernel::Action;
use deltalake_core::operations::create::CreateBuilder;
use deltalake_core::protocol::SaveMode;
use parquet::arrow::ArrowWriter;

use super::*;
use crate::clock::ManualClock;
use crate::ingest::{Cell, GpuRow, WriteBatch};
use crate::schema::value_index;
use crate::{Store, StoreConfig};

const T0: i64 = 1_800_000_000_000_000_000;
const NEW: [&str; 11] = [
    "sm_clock_max_mhz",
    "pcie_link_gen",
    "pcie_link_width",
    "job_account",
    "job_partition",
    "job_qos",
    "job_array_id",
    "job_array_task_id",
    "job_time_limit_seconds",
    "job_labels",
    "job_shares",
];

fn label_index(name: &str) -> usize {
    crate::schema::LABEL_COLUMNS
        .iter()
        .position(|(c, _)| *c == name)
        .expect("label column")
}

fn row(t: i64, power: f64, link: Option<i64>) -> GpuRow {
    let mut r = GpuRow::new(T0 + t * 1_000_000_000);
    r.labels[0] = Some("h".into());
    r.labels[1] = Some("GPU-0".into());
    r.values[value_index("hw.power").expect("power")] = Some(Cell::F(power));
    if let Some(g) = link {
        r.values[value_index("gpu.pcie.link.generation").expect("gen")] = Some(Cell::I(g));
        r.labels[label_index("job_account")] = Some("physics".into());
        r.labels[label_index("job_time_limit_seconds")] = Some("600".into());
    }
    r
}

/// Writes one file of `gpu_metrics` rows in the file schema of the earlier release (without
/// [`NEW`]) and creates the table with that schema and the file, as that release left it.
fn earlier_release_table(storage: &Storage) {
    let table = Table::GpuMetrics;
    let batch = WriteBatch::from_rows(&[row(0, 100.0, None)], &[])
        .expect("batch")
        .batches
        .remove(0)
        .1;
    let batch = crate::buffer::to_micros(&batch).expect("micros");
    let file = schema::to_file_batch(table, &batch).expect("file batch");
    let keep: Vec<usize> = (0..file.num_columns())
        .filter(|&i| !NEW.contains(&file.schema().field(i).name().as_str()))
        .collect();
    let old = file.project(&keep).expect("project");
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, old.schema(), None).expect("writer");
    w.write(&old).expect("write");
    w.close().expect("close");
    let path_in_table = "date=2027-01-15/h08-old-writer.parquet".to_string();
    let size = buf.len() as u64;
    storage
        .put_new(
            &format!("tables/gpu_metrics/{path_in_table}"),
            bytes::Bytes::from(buf),
        )
        .expect("put");
    let add = files::add(path_in_table, "2027-01-15", size, files::stats(&old), 0, 0);
    let columns: Vec<_> = schema::delta_columns(table)
        .expect("columns")
        .into_iter()
        .filter(|c| !NEW.contains(&c.name().as_str()))
        .collect();
    let veil = new_veil(storage, table).expect("veil");
    let store = log_store(storage, table, &veil).expect("log store");
    storage
        .block(async move {
            CreateBuilder::new()
                .with_log_store(store)
                .with_table_name("gpu_metrics")
                .with_columns(columns)
                .with_partition_columns([schema::PARTITION_COLUMN])
                .with_actions(vec![Action::Add(add)])
                .with_save_mode(SaveMode::ErrorIfExists)
                .await
        })
        .expect("runtime")
        .expect("create the earlier table");
}

fn delta_schema_names(storage: &Storage) -> Vec<String> {
    let veil = new_veil(storage, Table::GpuMetrics).expect("veil");
    let store = log_store(storage, Table::GpuMetrics, &veil).expect("log store");
    let t = storage
        .block(async move {
            let mut t = DeltaTable::new(store);
            t.load().await.map(|_| t)
        })
        .expect("runtime")
        .expect("load");
    t.snapshot()
        .expect("snapshot")
        .schema()
        .fields()
        .map(|f| f.name().clone())
        .collect()
}

#[test]
fn a_table_of_an_earlier_release_gains_the_new_columns_and_keeps_its_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let storage = Storage::local(dir.path(), true).expect("storage");
        earlier_release_table(&storage);
        let names = delta_schema_names(&storage);
        assert!(!names.iter().any(|n| NEW.contains(&n.as_str())));
    }
    let config = || StoreConfig {
        wal_sync: false,
        ..StoreConfig::new(dir.path())
    };
    let store = Store::open(config(), Arc::new(ManualClock::new(T0))).expect("open evolves");
    let names = delta_schema_names(store.storage());
    for n in NEW {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
    }
    store
        .write(&WriteBatch::from_rows(&[row(10, 200.0, Some(5))], &[]).expect("batch"))
        .expect("write");
    store.persist().expect("persist").expect("rows persisted");
    drop(store);

    // Reopened (nothing to add any more): both files read in the current schema.
    let store = Store::open(config(), Arc::new(ManualClock::new(T0))).expect("reopen");
    let files = store.files(Table::GpuMetrics);
    assert_eq!(files.len(), 2, "{files:?}");
    let all: RecordBatch =
        crate::compact::read_files(store.storage(), Table::GpuMetrics, &files).expect("read");
    assert_eq!(
        all.schema().as_ref(),
        Table::GpuMetrics.schema().as_ref() as &Schema
    );
    let power = all
        .column_by_name("power_watts")
        .expect("power")
        .as_primitive::<Float64Type>();
    let link = all
        .column_by_name("pcie_link_gen")
        .expect("gen")
        .as_primitive::<Int64Type>();
    let account = all.column_by_name("job_account").expect("account");
    let account = account.as_string::<i32>();
    let limit = all
        .column_by_name("job_time_limit_seconds")
        .expect("limit")
        .as_primitive::<Int64Type>();
    type Seen = (f64, Option<i64>, Option<String>, Option<i64>);
    let mut seen: Vec<Seen> = (0..all.num_rows())
        .map(|i| {
            (
                power.value(i),
                (!link.is_null(i)).then(|| link.value(i)),
                (!account.is_null(i)).then(|| account.value(i).to_string()),
                (!limit.is_null(i)).then(|| limit.value(i)),
            )
        })
        .collect();
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        seen,
        [
            (100.0, None, None, None),
            (200.0, Some(5), Some("physics".into()), Some(600))
        ]
    );
}
