//! The agent over OTLP/gRPC (`--protocol grpc`) to the real server's `--otlp-grpc-addr`: samples
//! land in SQL; the server goes away for a while and comes back, and the disk spool replays
//! what was collected meanwhile, in order, without a gap or a duplicate.

use std::time::Duration;

use gpuwatch_e2e::{TestAgent, TestServer, free_addr, metric};

use crate::{eventually, rows, scalar};

const HOST: &str = "grpc-e2e";
const OUTAGE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread")]
async fn agent_over_grpc_lands_in_sql_and_survives_an_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = dir.path().join("spool");
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let endpoint = format!("http://{}", server.grpc);
    let metrics = free_addr();
    let agent = TestAgent::start(&[
        "--protocol",
        "grpc",
        "--endpoint",
        &endpoint,
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "2",
        "--seed",
        "5",
        "--host",
        HOST,
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--buffer-dir",
        spool.to_str().expect("utf-8 path"),
        "--metrics-addr",
        &metrics.to_string(),
        "--log-level",
        "error",
    ]);

    eventually(Duration::from_secs(30), "first grpc samples", || async {
        scalar(
            &server,
            &format!("SELECT count(*) FROM gpu_metrics WHERE host = '{HOST}'"),
        )
        .await
            >= 6.0
    })
    .await;
    // What came over gRPC is the same shape as over HTTP: labels and values of gpu_metrics.
    let r = rows(
        &server,
        &format!(
            "SELECT gpu_uuid, gpu_index, gpu_model, power_watts, memory_total_bytes \
             FROM gpu_metrics WHERE host = '{HOST}' AND gpu_index = 1 LIMIT 1"
        ),
    )
    .await;
    assert!(
        r[0]["gpu_uuid"]
            .as_str()
            .is_some_and(|u| u.starts_with("GPU-")),
        "{r:?}"
    );
    assert!(
        r[0]["power_watts"].as_f64().is_some_and(|w| w > 0.0),
        "{r:?}"
    );
    assert_eq!(r[0]["memory_total_bytes"].as_f64(), Some(85_520_809_984.0));
    assert!(
        metric(metrics, "gpuwatch_agent_exported_requests_total").is_some_and(|n| n >= 3.0),
        "the agent counts its grpc exports"
    );

    // The endpoint goes away, then comes back on the same address.
    server.kill9();
    tokio::time::sleep(OUTAGE).await;
    let spooled = metric(metrics, "gpuwatch_agent_spool_requests").unwrap_or(0.0);
    assert!(
        spooled >= 10.0,
        "only {spooled} requests spooled while down"
    );
    server.restart();
    // The backoff is at most 30 s (±20 %).
    eventually(Duration::from_secs(60), "the spool drained", || async {
        metric(metrics, "gpuwatch_agent_spool_requests") == Some(0.0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let t: Vec<f64> = rows(
        &server,
        &format!(
            "SELECT CAST(time AS BIGINT) AS t FROM gpu_metrics \
             WHERE host = '{HOST}' AND gpu_index = 0 ORDER BY time"
        ),
    )
    .await
    .iter()
    .filter_map(|r| r["t"].as_f64())
    .map(|ns| ns / 1e9)
    .collect();
    let span = t[t.len() - 1] - t[0];
    assert!(span >= OUTAGE.as_secs_f64(), "samples span {span:.1} s");
    let gaps: Vec<(f64, f64)> = t
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|(_, g)| *g > 2.5)
        .collect();
    assert!(gaps.is_empty(), "gaps (start, seconds): {gaps:?}");
    let dups = t.windows(2).filter(|w| w[1] == w[0]).count();
    assert_eq!(dups, 0, "samples replayed twice");
    assert_eq!(
        metric(metrics, "gpuwatch_agent_spool_dropped_total"),
        Some(0.0)
    );
    assert_eq!(
        metric(metrics, "gpuwatch_agent_export_rejected_total"),
        Some(0.0)
    );
    drop(agent);
}
