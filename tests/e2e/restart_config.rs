//! Replacing a server on its data directory (what an upgrade or a config change does, as
//! docs/deploy.md "Upgrades" describes): a server stopped with SIGTERM, then one killed with
//! SIGKILL, each started again with a different configuration on the same data directory,
//! keeps every acknowledged row exactly once, whether the row was in Parquet or only in the WAL.

use std::path::{Path, PathBuf};

use gpuwatch_e2e::TestServer;

use crate::{now_ns, otlp_json, post_otlp, rows};

const GPU: &str = "GPU-restart-config";

async fn write(server: &TestServer, from: usize, to: usize, t0: i64) {
    for i in from..to {
        let body = otlp_json(
            "hw.power",
            i as f64,
            t0 + i as i64 * 1_000_000,
            &[("hw.id", GPU)],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "write {i}: {text}");
    }
}

/// Every value 0..n once: the count, the distinct count and the sum all agree.
async fn assert_exactly(server: &TestServer, n: usize) {
    let q = format!(
        "SELECT count(*) AS n, count(DISTINCT power_watts) AS d, sum(power_watts) AS s, \
         min(power_watts) AS lo, max(power_watts) AS hi FROM gpu_metrics WHERE gpu_uuid = '{GPU}'"
    );
    let r = rows(server, &q).await;
    let row = &r[0];
    assert_eq!(row["n"].as_f64(), Some(n as f64), "{row}");
    assert_eq!(row["d"].as_f64(), Some(n as f64), "{row}");
    assert_eq!(row["s"].as_f64(), Some((n * (n - 1) / 2) as f64), "{row}");
    assert_eq!(row["lo"].as_f64(), Some(0.0), "{row}");
    assert_eq!(row["hi"].as_f64(), Some((n - 1) as f64), "{row}");
}

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rules")
}

fn config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_with_a_changed_config_keeps_every_row_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let t0 = now_ns();

    // 1. First configuration: long persist interval, 30-day retention, no rules. SIGTERM
    //    persists the buffered rows before the process exits.
    let first = config(
        dir.path(),
        "first.toml",
        "persist_interval = \"1h\"\n[retention]\ngpu_metrics = \"30d\"\n",
    );
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--config")
        .arg(first.to_str().expect("utf-8 path"))
        .start();
    write(&server, 0, 120, t0).await;
    assert_exactly(&server, 120).await;
    server.stop();
    drop(server);
    assert!(
        crate::persisted(&data, "gpu_metrics"),
        "SIGTERM did not persist to the gpu_metrics table"
    );

    // 2. Second configuration: other persist interval, retention, WAL sync mode and the
    //    built-in rules. The rows of run 1 are there once; new rows go to the WAL only and the
    //    process is killed (-9) before any persist.
    let second = config(
        dir.path(),
        "second.toml",
        "persist_interval = \"2h\"\nwal_sync = \"interval\"\nwal_sync_interval = \"50ms\"\n\
         [retention]\ngpu_metrics = \"365d\"\nmetrics = \"7d\"\n",
    );
    let mut builder = TestServer::builder()
        .data_dir(&data)
        .arg("--config")
        .arg(second.to_str().expect("utf-8 path"));
    for rule in ["idle.yaml", "jobs.yaml", "health.yaml"] {
        builder = builder
            .arg("--rules")
            .arg(rules_dir().join(rule).to_str().expect("utf-8 path"));
    }
    let mut server = builder.start();
    assert_exactly(&server, 120).await;
    write(&server, 120, 200, t0).await;
    assert_exactly(&server, 200).await;
    server.kill9();
    drop(server);

    // 3. Third configuration, back to the defaults but a short persist interval: the WAL of run
    //    2 is replayed over the Parquet files of run 1, nothing lost and nothing twice, and the
    //    replayed rows persist without doubling either.
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    assert_exactly(&server, 200).await;
    let wal = data.join("wal");
    crate::eventually(
        std::time::Duration::from_secs(20),
        "the replayed rows persisted (WAL truncated)",
        || {
            let wal = wal.clone();
            async move { std::fs::read_dir(&wal).map(|d| d.count()).unwrap_or(0) <= 2 }
        },
    )
    .await;
    assert_exactly(&server, 200).await;
    server.stop();
    server.restart();
    assert_exactly(&server, 200).await;
}
