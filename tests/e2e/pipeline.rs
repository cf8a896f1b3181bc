//! agent → OTLP/HTTP → WAL → Parquet → SQL, with the real binaries.

use std::time::Duration;

use arrow::array::RecordBatch;
use gpuwatch_e2e::{TestAgent, TestServer};

use crate::{eventually, rows, scalar, sql};

const GPUS: usize = 4;

#[tokio::test(flavor = "multi_thread")]
async fn synthetic_agent_data_answers_sql_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .arg("--persist-interval")
        .arg("2s")
        .start();
    let endpoint = server.otlp_url();
    let _agent = TestAgent::start(&[
        "--source",
        "synthetic",
        "--synthetic-gpus",
        &GPUS.to_string(),
        "--interval",
        "300ms",
        "--flush-interval",
        "1s",
        "--endpoint",
        &endpoint,
        "--host",
        "sim-e2e",
        "--seed",
        "7",
    ]);

    // Enough samples for several per GPU, and at least one persist to Parquet in between.
    eventually(
        Duration::from_secs(60),
        "samples from every GPU and a persisted file",
        || async {
            let n = scalar(&server, "SELECT count(*) FROM gpu_metrics").await;
            n >= (GPUS * 12) as f64 && crate::persisted(&dir.path().join("data"), "gpu_metrics")
        },
    )
    .await;

    assert_eq!(
        scalar(&server, "SELECT count(DISTINCT gpu_uuid) FROM gpu_metrics").await,
        GPUS as f64
    );
    assert_eq!(
        scalar(
            &server,
            "SELECT count(DISTINCT host) FROM gpu_metrics WHERE host = 'sim-e2e'"
        )
        .await,
        1.0
    );
    assert_eq!(
        scalar(&server, "SELECT count(DISTINCT gpu_index) FROM gpu_metrics").await,
        GPUS as f64
    );

    // Job labels: present on GPUs held by a job, with user and name and scheduler alongside.
    eventually(
        Duration::from_secs(30),
        "a sample with job labels",
        || async {
            scalar(
                &server,
                "SELECT count(*) FROM gpu_metrics WHERE job_id IS NOT NULL",
            )
            .await
                > 0.0
        },
    )
    .await;
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM gpu_metrics WHERE job_id IS NOT NULL AND (job_user IS NULL OR job_name IS NULL OR scheduler <> 'slurm')").await,
        0.0
    );

    // Values in their ranges.
    for col in [
        "gpu_utilization",
        "memory_utilization",
        "sm_active",
        "sm_occupancy",
        "tensor_active",
        "dram_active",
    ] {
        let r = rows(
            &server,
            &format!(
                "SELECT min({col}) AS lo, max({col}) AS hi, count({col}) AS n FROM gpu_metrics"
            ),
        )
        .await;
        let lo = r[0]["lo"].as_f64().expect("lo");
        let hi = r[0]["hi"].as_f64().expect("hi");
        assert!(r[0]["n"].as_f64().expect("n") > 0.0, "{col} never filled");
        assert!(
            (0.0..=1.0).contains(&lo) && (0.0..=1.0).contains(&hi),
            "{col} out of 0..1: {lo}..{hi}"
        );
    }
    assert_eq!(
        scalar(
            &server,
            "SELECT count(*) FROM gpu_metrics WHERE power_watts <= 0 OR power_watts > 1500"
        )
        .await,
        0.0
    );
    assert_eq!(scalar(&server, "SELECT count(*) FROM gpu_metrics WHERE memory_used_bytes > memory_total_bytes OR memory_used_bytes < 0").await, 0.0);
    assert_eq!(scalar(&server, "SELECT count(*) FROM gpu_metrics WHERE temperature_celsius < 0 OR temperature_celsius > 120").await, 0.0);

    // energy_joules never decreases per GPU (across the buffer and the Parquet files).
    let decreasing = "SELECT count(*) FROM (SELECT energy_joules - lag(energy_joules) OVER (PARTITION BY gpu_uuid ORDER BY time) AS d FROM gpu_metrics) WHERE d < 0";
    assert_eq!(scalar(&server, decreasing).await, 0.0);
    // And no sample is stored twice.
    assert_eq!(scalar(&server, "SELECT count(*) FROM (SELECT gpu_uuid, time FROM gpu_metrics GROUP BY gpu_uuid, time HAVING count(*) > 1)").await, 0.0);

    // Every output format carries the same answer.
    // A fixed cut-off: the agent keeps sending while the formats are compared.
    let cutoff = rows(
        &server,
        "SELECT CAST(max(time) AS BIGINT) AS t FROM gpu_metrics",
    )
    .await[0]["t"]
        .as_i64()
        .expect("max time");
    let q = &format!(
        "SELECT gpu_uuid, count(*) AS n, max(energy_joules) AS e FROM gpu_metrics \
         WHERE CAST(time AS BIGINT) <= {cutoff} GROUP BY gpu_uuid ORDER BY gpu_uuid"
    );
    let expected: Vec<(String, i64)> = rows(&server, q)
        .await
        .iter()
        .map(|r| {
            (
                r["gpu_uuid"].as_str().expect("uuid").to_string(),
                r["n"].as_i64().expect("n"),
            )
        })
        .collect();
    assert_eq!(expected.len(), GPUS);

    let (status, body) = sql(&server, q, "jsonl").await;
    assert_eq!(status, 200);
    let jsonl: Vec<(String, i64)> = String::from_utf8(body)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
        .map(|r| {
            (
                r["gpu_uuid"].as_str().expect("uuid").to_string(),
                r["n"].as_i64().expect("n"),
            )
        })
        .collect();
    assert_eq!(jsonl, expected);

    let (status, body) = sql(&server, q, "csv").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("utf8");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("gpu_uuid,n,e"));
    let csv: Vec<(String, i64)> = lines
        .map(|l| {
            let mut f = l.split(',');
            (
                f.next().expect("uuid").to_string(),
                f.next().expect("n").parse().expect("int"),
            )
        })
        .collect();
    assert_eq!(csv, expected);

    let (status, body) = sql(&server, q, "arrow").await;
    assert_eq!(status, 200);
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)
        .expect("arrow stream");
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("batches");
    assert_eq!(pairs(&batches), expected);

    let (status, body) = sql(&server, q, "parquet").await;
    assert_eq!(status, 200);
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        bytes::Bytes::from(body),
    )
    .expect("parquet")
    .build()
    .expect("reader");
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("batches");
    assert_eq!(pairs(&batches), expected);

    // The files on disk are Parquet that another reader opens, sorted by host, gpu, time.
    let files = crate::rows(
        &server,
        "SELECT location FROM table_files WHERE table_name = 'gpu_metrics'",
    )
    .await;
    let path = std::path::PathBuf::from(files[0]["location"].as_str().expect("location"));
    assert!(
        path.to_string_lossy().contains("/tables/gpu_metrics/date="),
        "{}",
        path.display()
    );
    let f = std::fs::File::open(&path).expect("parquet file");
    let reader =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).expect("parquet");
    let rg = reader.metadata().row_group(0);
    assert!(matches!(
        rg.column(0).compression(),
        parquet::basic::Compression::ZSTD(_)
    ));
    assert!(reader.metadata().file_metadata().num_rows() > 0);
}

fn pairs(batches: &[RecordBatch]) -> Vec<(String, i64)> {
    use arrow::array::AsArray;
    let mut out = Vec::new();
    for b in batches {
        // Strings come as Utf8View (docs/schema.md); read them through a cast to plain Utf8.
        let u = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)
            .expect("cast to Utf8");
        let u = u.as_string::<i32>();
        let n = b.column(1).as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..b.num_rows() {
            out.push((u.value(i).to_string(), n.value(i)));
        }
    }
    out
}

#[test]
fn nvml_source_without_a_driver_says_to_use_synthetic() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a real GPU host: this case cannot happen here
    }
    for source in ["nvml", "auto"] {
        let out = std::process::Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch-agent"))
            .args(["--source", source, "--endpoint", "http://127.0.0.1:9"])
            .output()
            .expect("run agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--source {source}: {stderr}");
        assert!(
            stderr.contains("--source synthetic"),
            "--source {source}: {stderr}"
        );
        assert!(
            stderr.contains("libnvidia-ml.so.1"),
            "--source {source}: {stderr}"
        );
    }
}
