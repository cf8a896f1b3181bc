//! The disk spool: the server is down for a minute while the agent keeps collecting (and is
//! itself killed with SIGKILL and restarted in the middle); when the server is back, the spool
//! is replayed in order and SQL shows every sample, without a gap.

use std::time::{Duration, Instant};

use gpuwatch_e2e::{TestAgent, TestServer, free_addr, metric};

use crate::{eventually, rows, scalar};

const HOST: &str = "spool-e2e";
const OUTAGE: Duration = Duration::from_secs(60);

fn start_agent(endpoint: &str, spool: &str, metrics: &str) -> TestAgent {
    TestAgent::start(&[
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "2",
        "--seed",
        "11",
        "--host",
        HOST,
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--endpoint",
        endpoint,
        "--buffer-dir",
        spool,
        "--metrics-addr",
        metrics,
        "--log-level",
        "error",
    ])
}

/// The sample times of GPU 0, in seconds, oldest first.
async fn times(server: &TestServer) -> Vec<f64> {
    rows(
        server,
        &format!(
            "SELECT CAST(time AS BIGINT) AS t FROM gpu_metrics \
             WHERE host = '{HOST}' AND gpu_index = 0 ORDER BY time"
        ),
    )
    .await
    .iter()
    .filter_map(|r| r["t"].as_f64())
    .map(|ns| ns / 1e9)
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn endpoint_down_for_a_minute_then_back_leaves_no_gap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spool = dir.path().join("spool");
    let spool = spool.to_str().expect("utf-8 path");
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let endpoint = server.otlp_url();
    let metrics = free_addr();
    let mut agent = start_agent(&endpoint, spool, &metrics.to_string());

    eventually(Duration::from_secs(30), "first samples", || async {
        scalar(
            &server,
            &format!("SELECT count(*) FROM gpu_metrics WHERE host = '{HOST}'"),
        )
        .await
            >= 6.0
    })
    .await;

    // The endpoint goes away.
    server.kill9();
    let down = Instant::now();
    // Half-way, the agent is killed too (SIGKILL: no chance to flush) and started again on the
    // same spool.
    tokio::time::sleep(OUTAGE / 2).await;
    let spooled = metric(metrics, "gpuwatch_agent_spool_requests").unwrap_or(0.0);
    assert!(
        spooled >= 20.0,
        "only {spooled} requests spooled after 30 s down"
    );
    drop(agent);
    agent = start_agent(&endpoint, spool, &metrics.to_string());
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;

    // The endpoint is back on the same address: the spool drains, oldest first.
    server.restart();
    eventually(Duration::from_secs(60), "the spool drained", || async {
        metric(metrics, "gpuwatch_agent_spool_requests") == Some(0.0)
    })
    .await;
    // Let a few live samples follow the replayed ones.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let t = times(&server).await;
    assert!(t.len() >= 60, "only {} samples of gpu 0", t.len());
    let span = t[t.len() - 1] - t[0];
    assert!(
        span >= 60.0,
        "samples span {span:.1} s, less than the outage"
    );
    let gaps: Vec<(f64, f64)> = t
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|(_, g)| *g > 2.5)
        .collect();
    // The only pause allowed is the agent's own restart (a second or two of no collection):
    // everything it collected while the server was down is there.
    assert!(
        gaps.is_empty(),
        "gaps (start, seconds) in the samples: {gaps:?}"
    );
    let dups = t.windows(2).filter(|w| w[1] == w[0]).count();
    assert_eq!(dups, 0, "samples replayed twice");
    assert_eq!(
        metric(metrics, "gpuwatch_agent_spool_dropped_total"),
        Some(0.0),
        "nothing should have been dropped"
    );
    drop(agent);
}
