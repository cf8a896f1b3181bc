//! Several servers on one bucket (moto): two ingest nodes fed by agents and by acknowledged
//! writes of this test, two query nodes (one of them started with `--maintenance on` on purpose,
//! a second maintainer beside the first ingest node), and a `kill -9` of an ingest node while it
//! persists every 300 ms. Every acknowledged sample is present exactly once in every reader:
//! each gpuwatch node and delta-rs, Polars and DuckDB reading the bucket.

use std::time::{Duration, Instant};

use gpuwatch_e2e::{S3Server, TestAgent, TestServer, TestServerBuilder};

use crate::delta::read_with_other_engines;
use crate::{eventually, now_ns, otlp_json, post_otlp, rows, scalar};

const PREFIX: &str = "fleet";

fn node(s3: &S3Server, dir: &std::path::Path, name: &str, args: &[&str]) -> TestServerBuilder {
    let mut b = TestServer::builder()
        .data_dir(&dir.join(name))
        .object_store(s3, PREFIX)
        .arg("--refresh-interval")
        .arg("200ms")
        .arg("--compaction-interval")
        .arg("500ms")
        .arg("--persist-interval")
        .arg("300ms");
    for a in args {
        b = b.arg(a);
    }
    b
}

/// One acknowledged write of the marked series `gpu`, value `i`; true when acknowledged.
async fn mark(server: &TestServer, gpu: &str, i: usize, t0: i64) -> bool {
    let body = otlp_json(
        "hw.power",
        i as f64,
        t0 + i as i64 * 1_000_000,
        &[("hw.id", gpu)],
    );
    let (status, _) = post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
    status == 200
}

fn agent(server: &TestServer, host: &str, seed: &str) -> TestAgent {
    TestAgent::start(&[
        "--endpoint",
        &server.otlp_url(),
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "4",
        "--interval",
        "100ms",
        "--host",
        host,
        "--seed",
        seed,
        "--metrics-addr",
        &gpuwatch_e2e::free_addr().to_string(),
    ])
}

/// Marked values of `gpu` that `server` holds, sorted.
async fn marked(server: &TestServer, gpu: &str) -> Vec<usize> {
    rows(
        server,
        &format!("SELECT power_watts FROM gpu_metrics WHERE gpu_uuid = '{gpu}' ORDER BY 1"),
    )
    .await
    .iter()
    .map(|r| r["power_watts"].as_f64().expect("value") as usize)
    .collect()
}

async fn duplicates(server: &TestServer) -> f64 {
    scalar(
        server,
        "SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT host, gpu_uuid, time FROM gpu_metrics)) FROM gpu_metrics",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn ingest_and_query_nodes_on_one_bucket_keep_every_acknowledged_sample_once() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = node(
        &s3,
        dir.path(),
        "a",
        &["--role", "ingest", "--maintenance", "on"],
    )
    .start();
    let mut b = node(&s3, dir.path(), "b", &["--role", "ingest"]).start();
    let q1 = node(&s3, dir.path(), "q1", &["--role", "query"]).start();
    let q2 = node(
        &s3,
        dir.path(),
        "q2",
        &["--role", "query", "--maintenance", "on"],
    )
    .start();

    // A query node takes no writes, and says where they go.
    let body = otlp_json("hw.power", 1.0, now_ns(), &[("hw.id", "GPU-x")]);
    let (status, text) = post_otlp(&q1.url(), "application/json", None, body.into_bytes()).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("--role query"), "{text}");

    let agent_a = agent(&a, "node-a", "11");
    let agent_b = agent(&b, "node-b", "22");
    let t0 = now_ns();
    let mut acked_a = Vec::new();
    let mut acked_b = Vec::new();
    for i in 0..120 {
        if i == 60 {
            // A dies mid-persist (it persists every 300 ms under the agents' load) and comes back.
            a.kill9();
            a.restart();
        }
        if mark(&a, "GPU-mark-a", i, t0).await {
            acked_a.push(i);
        }
        if mark(&b, "GPU-mark-b", i, t0).await {
            acked_b.push(i);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    drop(agent_a);
    drop(agent_b);
    assert!(
        acked_a.len() >= 100,
        "a acknowledged {} writes",
        acked_a.len()
    );
    assert_eq!(acked_b.len(), 120);

    // Everything persisted on both ingest nodes, then seen by both query nodes.
    for n in [&a, &b] {
        eventually(Duration::from_secs(60), "the buffer persisted", || async {
            gpuwatch_e2e::metric(n.http, "gpuwatch_buffer_rows") == Some(0.0)
        })
        .await;
    }
    // Every commit is in the log now; each node sees it after its next refresh. The rows are
    // those all four nodes agree on twice, a second apart (a node between refreshes may answer
    // from the snapshot before the last commits).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut agreed_before = None;
    let want_rows = loop {
        let mut counts = Vec::new();
        for n in [&a, &b, &q1, &q2] {
            counts.push(scalar(n, "SELECT count(*) FROM gpu_metrics").await);
        }
        let agreed = counts.iter().all(|c| *c == counts[0]).then_some(counts[0]);
        if agreed.is_some() && agreed == agreed_before {
            break counts[0];
        }
        agreed_before = agreed;
        assert!(
            Instant::now() < deadline,
            "the nodes do not agree on the rows (a, b, q1, q2): {counts:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for (name, n) in [("a", &a), ("b", &b), ("q1", &q1), ("q2", &q2)] {
        assert_eq!(
            marked(n, "GPU-mark-a").await,
            acked_a,
            "node {name}: a's writes"
        );
        assert_eq!(
            marked(n, "GPU-mark-b").await,
            acked_b,
            "node {name}: b's writes"
        );
        assert_eq!(duplicates(n).await, 0.0, "node {name}: a row seen twice");
        let hosts = rows(
            n,
            "SELECT DISTINCT host FROM gpu_metrics WHERE host LIKE 'node-%' ORDER BY 1",
        )
        .await;
        assert_eq!(hosts.len(), 2, "node {name}: both agents' rows: {hosts:?}");
    }
    // Two maintainers ran: files were merged, and a pass that met the other's commit wrote
    // nothing (counted in gpuwatch_delta_conflicts_total).
    let merged = gpuwatch_e2e::metric(a.http, "gpuwatch_compactions_total").unwrap_or(0.0)
        + gpuwatch_e2e::metric(q2.http, "gpuwatch_compactions_total").unwrap_or(0.0);
    assert!(merged > 0.0, "no compaction ran");
    let conflicts = gpuwatch_e2e::metric(a.http, "gpuwatch_delta_conflicts_total").unwrap_or(0.0)
        + gpuwatch_e2e::metric(q2.http, "gpuwatch_delta_conflicts_total").unwrap_or(0.0);
    eprintln!(
        "two maintainers: {merged} windows compacted, {conflicts} conflicting commits refused"
    );

    // Other engines reading the bucket see the same rows.
    let seen = read_with_other_engines(&s3.url(PREFIX), &s3.env(), &["gpu_metrics"]);
    for reader in ["deltalake", "polars", "duckdb"] {
        let t = &seen[reader]["gpu_metrics"];
        assert_eq!(t["rows"].as_f64(), Some(want_rows), "{reader}");
        assert_eq!(t["distinct"], t["rows"], "{reader}: a row seen twice");
        assert_eq!(
            t["per_gpu"]["GPU-mark-a"].as_u64(),
            Some(acked_a.len() as u64),
            "{reader}"
        );
        assert_eq!(
            t["per_gpu"]["GPU-mark-b"].as_u64(),
            Some(acked_b.len() as u64),
            "{reader}"
        );
    }
    b.stop();
    a.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_node_refuses_alert_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        sql: SELECT 1 AS value\n",
    )
    .expect("rules");
    let out = std::process::Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
        .args(["serve", "--role", "query", "--data-dir"])
        .arg(dir.path().join("d"))
        .arg("--rules")
        .arg(&rules)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rules needs --role all or ingest"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_role_comes_from_the_flag_the_environment_or_the_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "role = \"query\"\nmaintenance = \"off\"\nrefresh_interval = \"1s\"\n",
    )
    .expect("config");
    let write = |server: &TestServer| {
        let body = otlp_json("hw.power", 1.0, now_ns(), &[("hw.id", "GPU-role")]);
        let url = server.url();
        async move {
            post_otlp(&url, "application/json", None, body.into_bytes())
                .await
                .0
        }
    };
    let from_file = TestServer::builder()
        .data_dir(&dir.path().join("a"))
        .arg("--config")
        .arg(config.to_str().expect("utf-8"))
        .start();
    assert_eq!(write(&from_file).await, 403, "role from the file");
    assert_eq!(
        gpuwatch_e2e::metric(from_file.http, "gpuwatch_ingest"),
        Some(0.0)
    );
    drop(from_file);
    let flag_wins = TestServer::builder()
        .data_dir(&dir.path().join("b"))
        .arg("--config")
        .arg(config.to_str().expect("utf-8"))
        .arg("--role")
        .arg("all")
        .start();
    assert_eq!(write(&flag_wins).await, 200, "the flag beats the file");
    drop(flag_wins);
    let from_env = TestServer::builder()
        .data_dir(&dir.path().join("c"))
        .env("GPUWATCH_ROLE", "query")
        .start();
    assert_eq!(write(&from_env).await, 403, "role from the environment");
}
