//! `--object-store s3://bucket/prefix` against a real S3 server (moto): acknowledged writes survive
//! `kill -9` exactly once, and a second server on a copy of the first one's data directory (the
//! same writer id) is stopped loudly while the first goes on. Several servers with their own data
//! directories on one prefix: tests/e2e/scale_out.rs.

use std::time::Duration;

use gpuwatch_e2e::{S3Server, TestServer};

use crate::{eventually, now_ns, otlp_json, post_otlp, scalar};

async fn write_acked(server: &TestServer, gpu: &str, from: usize, to: usize, t0: i64) {
    for i in from..to {
        let body = otlp_json(
            "hw.power",
            i as f64,
            t0 + i as i64 * 1_000_000,
            &[("hw.id", gpu)],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "write {i} to {gpu}: {text}");
    }
}

/// Rows `from..to` of `gpu`, each exactly once.
async fn assert_exactly(server: &TestServer, gpu: &str, from: usize, to: usize) {
    let q = |what: &str| format!("SELECT {what} FROM gpu_metrics WHERE gpu_uuid = '{gpu}'");
    let n = (to - from) as f64;
    assert_eq!(scalar(server, &q("count(*)")).await, n, "{gpu}");
    assert_eq!(
        scalar(server, &q("count(DISTINCT power_watts)")).await,
        n,
        "{gpu}"
    );
    assert_eq!(
        scalar(server, &q("sum(power_watts)")).await,
        (from..to).sum::<usize>() as f64,
        "{gpu}"
    );
}

/// The commits of the `gpu_metrics` Delta table under `prefix`.
fn commits(s3: &S3Server, prefix: &str) -> Vec<String> {
    s3.keys(&format!("{prefix}/tables/gpu_metrics/_delta_log/"))
        .into_iter()
        .filter(|k| k.ends_with(".json"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_with_an_object_store_keeps_every_acknowledged_sample_once() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .object_store(&s3, "fleet/a")
        .arg("--persist-interval")
        .arg("500ms")
        .start();
    // Whole microseconds: times are kept to the microsecond, and the filter below counts rows
    // on either side of one.
    let t0 = now_ns() / 1000 * 1000;
    write_acked(&server, "GPU-s3", 0, 100, t0).await;
    eventually(
        Duration::from_secs(20),
        "a persist to the bucket",
        || async {
            commits(&s3, "fleet/a").len() > 1
                && s3
                    .keys("fleet/a/tables/gpu_metrics/")
                    .iter()
                    .any(|k| k.ends_with(".parquet"))
        },
    )
    .await;
    write_acked(&server, "GPU-s3", 100, 150, t0).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, "GPU-s3", 0, 150).await;
    // Let the restarted server persist the replayed rows, then kill it again.
    eventually(
        Duration::from_secs(20),
        "the replayed rows persisted",
        || async {
            let wal = std::fs::read_dir(data.join("wal"))
                .map(|d| d.count())
                .unwrap_or(0);
            wal <= 2
        },
    )
    .await;
    write_acked(&server, "GPU-s3", 150, 160, t0).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, "GPU-s3", 0, 160).await;
    server.stop();
    server.restart();
    assert_exactly(&server, "GPU-s3", 0, 160).await;
    // Time filters are answered from the table's files in the bucket.
    let before = format!(
        "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-s3' AND time < to_timestamp_nanos({})",
        t0 + 50 * 1_000_000
    );
    assert_eq!(scalar(&server, &before).await, 50.0);
    // Postgres clients read the same files from the bucket.
    let out = server.psql(None, "disable", &["-c", &before]);
    assert!(out.ok, "psql: {}", out.stderr);
    assert_eq!(out.stdout.trim(), "50");
    // The tables live in the bucket; the data directory keeps only the WAL and the writer id.
    assert!(!data.join("tables").exists());
    assert!(data.join("wal").exists());
    assert!(data.join("writer-id").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_on_a_copied_data_directory_is_stopped_loudly_and_the_first_goes_on() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = "shared";
    let mut a = TestServer::builder()
        .data_dir(&dir.path().join("a"))
        .object_store(&s3, prefix)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    let t0 = now_ns();
    write_acked(&a, "GPU-a", 0, 20, t0).await;
    eventually(Duration::from_secs(20), "a's first persist", || async {
        commits(&s3, prefix).len() > 1
    })
    .await;
    // B runs on a copy of A's data directory: the same writer id (and WAL sequence numbers).
    std::fs::create_dir_all(dir.path().join("b")).expect("mkdir");
    std::fs::copy(
        dir.path().join("a/writer-id"),
        dir.path().join("b/writer-id"),
    )
    .expect("copy the writer id");
    let mut b = TestServer::builder()
        .data_dir(&dir.path().join("b"))
        .object_store(&s3, prefix)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    let persisted = commits(&s3, prefix).len();
    write_acked(&a, "GPU-a", 20, 40, t0).await;
    eventually(Duration::from_secs(20), "a persists again", || async {
        commits(&s3, prefix).len() > persisted
    })
    .await;
    // B acknowledges writes (its WAL holds them) until its persist finds A's commits under its
    // own writer id: from then on it refuses them.
    let mut b_acked = 0;
    for i in 0..10 {
        let body = otlp_json(
            "hw.power",
            i as f64,
            t0 + i * 1_000_000,
            &[("hw.id", "GPU-b")],
        );
        let (status, text) = post_otlp(&b.url(), "application/json", None, body.into_bytes()).await;
        if status != 200 {
            assert_eq!(status, 503, "{text}");
            assert!(text.contains("persistence stopped"), "{text}");
            break;
        }
        b_acked += 1;
    }
    assert!(b_acked >= 1, "b acknowledged its first write");
    eventually(
        Duration::from_secs(20),
        "b reports the shared writer id",
        || async {
            let (code, body) =
                gpuwatch_e2e::http_get(b.http, "/readyz").unwrap_or((0, String::new()));
            code == 503 && body.contains("writer id")
        },
    )
    .await;
    let (_, ready) = gpuwatch_e2e::http_get(b.http, "/readyz").expect("readyz");
    assert!(ready.contains(&s3.url(prefix)), "names the prefix: {ready}");
    assert!(
        ready.contains("writer-id"),
        "says which file to delete: {ready}"
    );
    let log = b.log_text();
    assert!(
        log.contains("ERROR") && log.contains("persistence stopped"),
        "{log}"
    );
    let body = otlp_json("hw.power", 1.0, t0, &[("hw.id", "GPU-b")]);
    let (status, text) = post_otlp(&b.url(), "application/json", None, body.into_bytes()).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("persistence stopped"), "{text}");
    // A is untouched: it still takes writes and persists them.
    let persisted = commits(&s3, prefix).len();
    write_acked(&a, "GPU-a", 40, 60, t0).await;
    eventually(Duration::from_secs(20), "a persists again", || async {
        commits(&s3, prefix).len() > persisted
    })
    .await;
    let (code, _) = gpuwatch_e2e::http_get(a.http, "/readyz").expect("readyz");
    assert_eq!(code, 200);
    assert_exactly(&a, "GPU-a", 0, 60).await;
    assert_eq!(
        scalar(
            &a,
            "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-b'"
        )
        .await,
        0.0
    );
    b.stop();
    a.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn object_store_is_read_from_the_config_file_and_a_bad_url_is_refused() {
    let s3 = S3Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!("object_store = \"{}\"\n", s3.url("from-toml")),
    )
    .expect("config");
    let mut builder = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--config")
        .arg(config.to_str().expect("utf8 path"))
        .arg("--persist-interval")
        .arg("300ms");
    for (k, v) in s3.env() {
        builder = builder.env(&k, &v);
    }
    let server = builder.start();
    write_acked(&server, "GPU-toml", 0, 5, now_ns()).await;
    eventually(
        Duration::from_secs(20),
        "a persist to the bucket",
        || async { commits(&s3, "from-toml").len() > 1 },
    )
    .await;
    assert_exactly(&server, "GPU-toml", 0, 5).await;
    drop(server);

    let out = std::process::Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("e"))
        .env("GPUWATCH_OBJECT_STORE", "gs://bucket/prefix")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--object-store") && err.contains("s3://bucket/prefix"),
        "{err}"
    );
}
