//! The server's own traces and metrics over OTLP (`--self-telemetry-endpoint`): span trees with
//! the documented names and parents reach a receiver that decodes them with the OpenTelemetry
//! Python packages; pointed at itself (`self`), the server stores its own metrics in `metrics`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuwatch_e2e::TestServer;

use crate::{eventually, now_ns, otlp_json, post_otlp, rows, scalar, sql};

/// The receiver's lines of kind `kind`.
fn records(file: &std::path::Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// The spans named `child` whose parent is a span named `parent`.
fn children<'a>(
    spans: &'a [serde_json::Value],
    parent: &str,
    child: &str,
) -> Vec<&'a serde_json::Value> {
    spans
        .iter()
        .filter(|s| s["name"] == child)
        .filter(|s| {
            spans
                .iter()
                .any(|p| p["name"] == parent && p["id"] == s["parent"] && p["trace"] == s["trace"])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_and_metrics_reach_an_otlp_receiver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let received = dir.path().join("received.jsonl");
    let script = gpuwatch_e2e::bin_dir()
        .join("../../tests/otlp_receiver.py")
        .canonicalize()
        .expect("tests/otlp_receiver.py");
    let mut receiver = Command::new("python3")
        .arg(&script)
        .arg(&received)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the OTLP receiver (needs the OpenTelemetry Python packages)");
    let mut port = String::new();
    BufReader::new(receiver.stdout.take().expect("stdout"))
        .read_line(&mut port)
        .expect("port");
    let endpoint = format!("http://127.0.0.1:{}", port.trim());

    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--self-telemetry-endpoint")
        .arg(&endpoint)
        .arg("--self-telemetry-interval")
        .arg("1s")
        .start();
    // Self-telemetry starts once the store is open; give the exporters a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let body = otlp_json("probe", 1.0, now_ns(), &[]);
    let (status, _) = post_otlp(
        &server.otlp_url(),
        "application/json",
        None,
        body.into_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = sql(&server, "SELECT count(*) FROM metrics", "json").await;
    assert_eq!(status, 200);

    eventually(
        Duration::from_secs(30),
        "ingest and query span trees",
        || {
            let spans = records(&received, "span");
            async move {
                ["decode", "wal_commit", "buffer"]
                    .iter()
                    .all(|c| !children(&spans, "ingest", c).is_empty())
                    && ["plan", "execute", "encode"]
                        .iter()
                        .all(|c| !children(&spans, "query", c).is_empty())
            }
        },
    )
    .await;
    let spans = records(&received, "span");
    let query = spans
        .iter()
        .find(|s| s["name"] == "query")
        .expect("a query span");
    assert!(
        query["attributes"]["sql"]
            .as_str()
            .is_some_and(|q| q.contains("count(*)")),
        "{query}"
    );
    let rows_attr = &query["attributes"]["rows"];
    assert!(rows_attr == 1 || rows_attr == "1", "{query}");
    let ingest = spans
        .iter()
        .find(|s| s["name"] == "ingest")
        .expect("an ingest span");
    assert_eq!(ingest["parent"], "", "ingest spans are roots: {ingest}");
    assert_eq!(ingest["attributes"]["protocol"], "otlp_http");

    eventually(Duration::from_secs(30), "the server's own metrics", || {
        let metrics = records(&received, "metric");
        async move {
            [
                "gpuwatch_writes_total",
                "gpuwatch_rows_written_total",
                "gpuwatch_resident_memory_bytes",
            ]
            .iter()
            .all(|n| {
                metrics
                    .iter()
                    .any(|m| m["name"] == *n && m["service"][0] == "gpuwatch")
            })
        }
    })
    .await;
    let _ = receiver.kill();
    let _ = receiver.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn pointed_at_itself_the_server_stores_its_own_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--self-telemetry-endpoint")
        .arg("self")
        .arg("--self-telemetry-interval")
        .arg("1s")
        .start();
    eventually(
        Duration::from_secs(30),
        "gpuwatch_writes_total in metrics",
        || async {
            scalar(
                &server,
                "SELECT count(*) FROM metrics WHERE metric = 'gpuwatch_writes_total'",
            )
            .await
                > 0.0
        },
    )
    .await;
    // Its own exports are writes too: the counter grows.
    let seen = rows(
        &server,
        "SELECT max(value) AS v FROM metrics WHERE metric = 'gpuwatch_writes_total'",
    )
    .await;
    assert!(seen[0]["v"].as_f64().is_some(), "{seen:?}");
}
