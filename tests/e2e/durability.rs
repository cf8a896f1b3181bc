//! A 2xx answer means durable: acknowledged writes survive `kill -9`, exactly once.

use std::time::Duration;

use gpuwatch_e2e::TestServer;

use crate::{eventually, now_ns, otlp_json, post_otlp, scalar};

async fn write_acked(server: &TestServer, from: usize, to: usize, t0: i64) {
    for i in from..to {
        let body = otlp_json(
            "hw.power",
            i as f64,
            t0 + i as i64 * 1_000_000,
            &[("hw.id", "GPU-durable")],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "write {i}: {text}");
    }
}

async fn assert_exactly(server: &TestServer, n: usize) {
    assert_eq!(
        scalar(
            server,
            "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-durable'"
        )
        .await,
        n as f64
    );
    assert_eq!(
        scalar(
            server,
            "SELECT count(DISTINCT power_watts) FROM gpu_metrics WHERE gpu_uuid = 'GPU-durable'"
        )
        .await,
        n as f64
    );
    assert_eq!(
        scalar(
            server,
            "SELECT sum(power_watts) FROM gpu_metrics WHERE gpu_uuid = 'GPU-durable'"
        )
        .await,
        (n * (n - 1) / 2) as f64
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A persist interval far away: everything lives in the WAL when the server dies.
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--persist-interval")
        .arg("1h")
        .start();
    let t0 = now_ns();
    write_acked(&server, 0, 200, t0).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, 200).await;
    // And once more, so replay of a replayed WAL does not double anything.
    server.restart();
    assert_exactly(&server, 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9_across_a_parquet_persist() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("500ms")
        .start();
    let t0 = now_ns();
    write_acked(&server, 0, 100, t0).await;
    eventually(Duration::from_secs(20), "a persist to parquet", || async {
        crate::persisted(&data, "gpu_metrics")
    })
    .await;
    write_acked(&server, 100, 150, t0).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, 150).await;
    // Let the restarted server persist the replayed rows, then kill it again.
    eventually(
        Duration::from_secs(20),
        "the replayed rows persisted",
        || async {
            let wal = std::fs::read_dir(data.join("wal"))
                .map(|d| d.count())
                .unwrap_or(0);
            wal <= 2 && scalar(&server, "SELECT count(*) FROM gpu_metrics").await == 150.0
        },
    )
    .await;
    write_acked(&server, 150, 160, t0).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, 160).await;
    // A clean stop persists what is buffered; nothing is lost or doubled either.
    server.stop();
    server.restart();
    assert_exactly(&server, 160).await;
}
