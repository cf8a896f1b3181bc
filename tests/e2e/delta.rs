//! The persisted tables are Delta Lake tables other engines read: after a persist, delta-rs
//! (`deltalake`), Polars and DuckDB's `delta_scan` see the same rows as gpuwatch's SQL
//! (`tests/delta/read.py`, run with the readers `.ci/run` installs in target/delta-venv).

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuwatch_e2e::TestServer;
use serde_json::Value;

use crate::{eventually, now_ns, otlp_json, post_otlp, rows, scalar};

/// The Python holding the Delta readers.
pub(crate) fn readers_python() -> PathBuf {
    let target = gpuwatch_e2e::bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .expect("target dir");
    let python = target.join("delta-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: bash .ci/run creates it (python3 -m venv target/delta-venv, then the Delta readers)",
        python.display()
    );
    python
}

/// What each reader sees of the tables under `root` (a data directory or `s3://…` with `env`).
pub(crate) fn read_with_other_engines(
    root: &str,
    env: &[(String, String)],
    tables: &[&str],
) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("delta/read.py");
    let out = std::process::Command::new(readers_python())
        .arg(script)
        .arg(root)
        .args(tables)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run tests/delta/read.py");
    assert!(
        out.status.success(),
        "tests/delta/read.py {root}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("read.py prints JSON")
}

/// gpuwatch's own figures of `table`, as read.py computes them.
pub(crate) async fn gpuwatch_figures(server: &TestServer, table: &str) -> Value {
    let key = match table {
        "metrics" => "metric, time, value",
        "gpu_processes" => "host, gpu_uuid, pid, time",
        "gpu_events" => "host, gpu_uuid, kind, code, time",
        "alerts" => "fingerprint, state, time",
        _ => "host, gpu_uuid, time",
    };
    let n = scalar(server, &format!("SELECT count(*) FROM {table}")).await as u64;
    let distinct = scalar(
        server,
        &format!("SELECT count(*) FROM (SELECT DISTINCT {key} FROM {table})"),
    )
    .await as u64;
    let time_us = rows(
        server,
        &format!("SELECT CAST(coalesce(sum(arrow_cast(time, 'Int64') / 1000), 0) AS VARCHAR) AS s FROM {table}"),
    )
    .await[0]["s"]
        .as_str()
        .expect("text")
        .parse::<i64>()
        .expect("sum");
    let mut out = serde_json::json!({"rows": n, "distinct": distinct, "time_us": time_us});
    if table == "gpu_metrics" && n > 0 {
        let watts = scalar(server, "SELECT round(sum(power_watts), 3) FROM gpu_metrics").await;
        out["power_watts"] = serde_json::json!(watts);
        let per_gpu: serde_json::Map<String, Value> = rows(
            server,
            "SELECT gpu_uuid, count(*) AS n FROM gpu_metrics GROUP BY gpu_uuid",
        )
        .await
        .into_iter()
        .map(|r| {
            (
                r["gpu_uuid"].as_str().expect("uuid").to_string(),
                r["n"].clone(),
            )
        })
        .collect();
        out["per_gpu"] = Value::Object(per_gpu);
    }
    out
}

/// Asserts that every reader's figures of `table` equal `want`.
pub(crate) fn assert_readers_agree(seen: &Value, table: &str, want: &Value) {
    for reader in ["deltalake", "polars", "duckdb"] {
        let mut got = seen[reader][table].clone();
        if let Some(o) = got.as_object_mut() {
            o.remove("version");
        }
        assert_eq!(
            &got, want,
            "{reader} reads {table} differently from gpuwatch's SQL"
        );
    }
}

fn files_of(data: &Path, table: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![data.join("tables").join(table)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_rs_polars_and_duckdb_read_the_same_rows_as_gpuwatch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    let t0 = now_ns();
    // GPU samples with sub-microsecond times (kept to whole microseconds), other metrics with
    // labels (a map column), processes and events.
    for i in 0..40i64 {
        let body = otlp_json(
            "hw.power",
            100.0 + i as f64,
            t0 + i * 1_000_000_123,
            &[("hw.id", &format!("GPU-delta-{}", i % 4)), ("job.id", "77")],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "{text}");
        let body = otlp_json(
            "node.load",
            i as f64 / 10.0,
            t0 + i * 1_000_000_000,
            &[("instance", &format!("n{}", i % 3))],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "{text}");
    }
    // Processes and events (what an agent sends beside the GPU samples).
    for i in 0..10i64 {
        let t = t0 + i * 1_000_000_000;
        let body = format!(
            r#"{{"resourceMetrics":[{{"resource":{{"attributes":[{{"key":"host.name","value":{{"stringValue":"e2e-host"}}}}]}},
              "scopeMetrics":[{{"metrics":[
                {{"name":"gpu.process.memory.usage","unit":"By","gauge":{{"dataPoints":[
                  {{"timeUnixNano":"{t}","asInt":"{mem}","attributes":[
                    {{"key":"hw.id","value":{{"stringValue":"GPU-delta-0"}}}},{{"key":"process.pid","value":{{"intValue":"{pid}"}}}},
                    {{"key":"process.executable.name","value":{{"stringValue":"python3"}}}},
                    {{"key":"job.id","value":{{"stringValue":"77"}}}}]}}]}}}},
                {{"name":"gpu.event","unit":"1","gauge":{{"dataPoints":[
                  {{"timeUnixNano":"{t}","asInt":"79","attributes":[
                    {{"key":"hw.id","value":{{"stringValue":"GPU-delta-1"}}}},{{"key":"gpu.event.kind","value":{{"stringValue":"xid"}}}},
                    {{"key":"gpu.event.detail","value":{{"stringValue":"xid 79"}}}}]}}]}}}}
              ]}}]}}]}}"#,
            mem = 1000 + i,
            pid = 4000 + i,
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM gpu_events").await,
        10.0
    );
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM gpu_processes").await,
        10.0
    );
    // Every row persisted: the buffer empty.
    eventually(Duration::from_secs(30), "everything persisted", || async {
        gpuwatch_e2e::metric(server.http, "gpuwatch_buffer_rows") == Some(0.0)
    })
    .await;
    assert!(!files_of(&data, "gpu_metrics").is_empty());
    let tables = ["gpu_metrics", "metrics", "gpu_processes", "gpu_events"];
    let seen = read_with_other_engines(data.to_str().expect("utf-8"), &[], &tables);
    for t in tables {
        let want = gpuwatch_figures(&server, t).await;
        assert!(want["rows"].as_u64().unwrap_or(0) > 0, "{t} has rows");
        assert_readers_agree(&seen, t, &want);
    }
    // The times other engines see are gpuwatch's, to the microsecond.
    let first = rows(
        &server,
        "SELECT arrow_cast(min(time), 'Int64') AS t FROM gpu_metrics WHERE gpu_uuid = 'GPU-delta-1'",
    )
    .await[0]["t"]
        .as_i64()
        .expect("t");
    assert_eq!(first, (t0 + 1_000_000_123) / 1000 * 1000);
    // `table_files` lists the Delta layout: date partitions, microsecond files.
    let files = rows(
        &server,
        "SELECT path, rows FROM table_files WHERE table_name = 'gpu_metrics'",
    )
    .await;
    assert!(!files.is_empty());
    assert!(
        files
            .iter()
            .all(|f| f["path"].as_str().is_some_and(|p| p.contains("/date="))),
        "{files:?}"
    );
}

/// Copies `from` into `to`, recursively.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// The figures the earlier release answered for a fixture (`expected.jsonl`).
fn expected(which: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("fixtures/pre-delta/{which}/expected.jsonl"));
    std::fs::read_to_string(&path)
        .expect("expected.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// Asks `server` what the earlier release answered and compares.
async fn assert_same_as_before(server: &TestServer, which: &str) {
    for want in expected(which) {
        let t = want["t"].as_str().expect("table");
        let mut q = format!(
            "SELECT '{t}' AS t, count(*) AS n, sum(arrow_cast(time, 'Int64') / 1000) AS time_us"
        );
        if t == "gpu_metrics" {
            q.push_str(", round(sum(power_watts), 3) AS watts");
        }
        q.push_str(&format!(" FROM {t}"));
        let got = rows(server, &q).await;
        assert_eq!(got[0], want, "{which}: {t} after the upgrade");
    }
}

/// A server on a converted data directory, its maintenance held off so that nothing changes
/// what the earlier release answered (no hour is compacted or rolled up during the test).
fn upgraded(data: &Path) -> gpuwatch_e2e::TestServerBuilder {
    TestServer::builder()
        .data_dir(data)
        .arg("--compaction-interval")
        .arg("1h")
        .arg("--persist-interval")
        .arg("1h")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_directory_of_the_earlier_release_is_converted_and_answers_the_same() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pre-delta/local/data"),
        &data,
    );
    let mut server = upgraded(&data).start();
    assert_same_as_before(&server, "local").await;
    assert!(!data.join("catalog.json").exists(), "the old catalog goes");
    assert!(data.join("tables/gpu_metrics/_delta_log").exists());
    assert!(data.join("alerts/history.jsonl.imported").exists());
    // Converted once: a restart (kill -9, then a clean stop) changes nothing.
    server.kill9();
    server.restart();
    assert_same_as_before(&server, "local").await;
    server.stop();
    server.restart();
    assert_same_as_before(&server, "local").await;
    // Other engines read the converted tables.
    server.stop();
    let seen = read_with_other_engines(data.to_str().expect("utf-8"), &[], &["gpu_metrics"]);
    let want = expected("local")
        .into_iter()
        .find(|v| v["t"] == "gpu_metrics")
        .expect("gpu_metrics");
    for reader in ["deltalake", "polars", "duckdb"] {
        assert_eq!(seen[reader]["gpu_metrics"]["rows"], want["n"], "{reader}");
        assert_eq!(
            seen[reader]["gpu_metrics"]["time_us"], want["time_us"],
            "{reader}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_store_prefix_of_the_earlier_release_is_converted_and_answers_the_same() {
    let s3 = gpuwatch_e2e::S3Server::start();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pre-delta/s3");
    // The earlier release's objects, under a prefix of this bucket.
    let bucket = fixture.join("bucket/gpuwatch");
    let mut stack = vec![bucket.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p
                .strip_prefix(&bucket)
                .expect("rel")
                .to_string_lossy()
                .into_owned();
            s3.put(&format!("old/{rel}"), &std::fs::read(&p).expect("read"));
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    copy_dir(&fixture.join("data"), &data);
    let mut server = upgraded(&data).object_store(&s3, "old").start();
    assert_same_as_before(&server, "s3").await;
    assert!(
        s3.keys("old/catalog/").is_empty(),
        "the old catalog versions go"
    );
    assert!(!s3.keys("old/tables/gpu_metrics/_delta_log/").is_empty());
    server.kill9();
    server.restart();
    assert_same_as_before(&server, "s3").await;
    server.stop();
}
