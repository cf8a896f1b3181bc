//! Memory and disk limits: the write buffer's cap persists early, and a full disk answers 503
//! with `Retry-After` (OTLP exporters and Prometheus retry it), loses nothing acknowledged, and
//! takes writes again once space returns.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::TestServer;

use crate::{eventually, now_ns, otlp_json, scalar};

async fn post(server: &TestServer, i: usize, t0: i64, gpu: &str) -> reqwest::Response {
    let body = otlp_json(
        "hw.power",
        i as f64,
        t0 + i as i64 * 1_000_000,
        &[("hw.id", gpu)],
    );
    reqwest::Client::new()
        .post(format!("{}/v1/metrics", server.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("otlp request")
}

async fn assert_exactly(server: &TestServer, gpu: &str, n: usize) {
    let q = |what: &str| format!("SELECT {what} FROM gpu_metrics WHERE gpu_uuid = '{gpu}'");
    assert_eq!(scalar(server, &q("count(*)")).await, n as f64);
    assert_eq!(
        scalar(server, &q("count(DISTINCT power_watts)")).await,
        n as f64
    );
    assert_eq!(
        scalar(server, &q("sum(power_watts)")).await,
        (n * (n - 1) / 2) as f64
    );
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_answers_503_loses_nothing_and_writes_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("small-disk");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        mounted,
        "this test simulates a full disk with a 4 MB tmpfs: run the tests as root (CI does), or with CAP_SYS_ADMIN"
    );
    let _unmount = Unmount(mnt.clone());
    let mut server = TestServer::builder()
        .data_dir(&mnt)
        .arg("--persist-interval")
        .arg("1h")
        .start();
    let gpu = "GPU-disk";
    let t0 = now_ns();
    let mut acked = 0;
    for _ in 0..10 {
        let r = post(&server, acked, t0, gpu).await;
        assert_eq!(r.status().as_u16(), 200);
        acked += 1;
    }
    // Fill the disk, then leave a little room.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let len = f.metadata().expect("len").len();
        f.set_len(len.saturating_sub(96 * 1024)).expect("truncate");
    }
    let mut refused = None;
    for _ in 0..10_000 {
        let r = post(&server, acked, t0, gpu).await;
        if r.status().as_u16() == 200 {
            acked += 1;
            continue;
        }
        refused = Some(r);
        break;
    }
    let r = refused.expect("the disk never filled up");
    assert_eq!(r.status().as_u16(), 503, "a full disk answers 503");
    assert!(r.headers().contains_key("retry-after"));
    let text = r.text().await.unwrap_or_default();
    assert!(text.contains("disk full"), "{text}");
    // Still up, and everything acknowledged is there.
    assert_exactly(&server, gpu, acked).await;
    // Space returns: writes resume.
    std::fs::remove_file(&filler).expect("free space");
    for _ in 0..20 {
        let r = post(&server, acked, t0, gpu).await;
        assert_eq!(r.status().as_u16(), 200, "writes resume once space is back");
        acked += 1;
    }
    server.kill9();
    server.restart();
    assert_exactly(&server, gpu, acked).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_buffer_cap_persists_early_and_sheds_load_with_retry_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("1h")
        .arg("--max-buffer-bytes")
        .arg("200000")
        .start();
    let gpu = "GPU-cap";
    let t0 = now_ns();
    let mut acked = 0;
    let mut shed = 0;
    while acked < 300 {
        let r = post(&server, acked, t0, gpu).await;
        match r.status().as_u16() {
            200 => acked += 1,
            503 => {
                assert!(r.headers().contains_key("retry-after"));
                shed += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            s => panic!("unexpected status {s}"),
        }
    }
    // The persist interval is an hour away: only the cap can have written files.
    eventually(Duration::from_secs(10), "an early persist", || async {
        crate::persisted(&data, "gpu_metrics")
    })
    .await;
    eprintln!("buffer cap: {shed} writes shed with 503 while persisting");
    assert_exactly(&server, gpu, acked).await;
    server.kill9();
    server.restart();
    assert_exactly(&server, gpu, acked).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wal_sync_interval_still_survives_a_process_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--persist-interval")
        .arg("1h")
        .arg("--wal-sync")
        .arg("interval")
        .arg("--wal-sync-interval")
        .arg("50ms")
        .start();
    let gpu = "GPU-interval";
    let t0 = now_ns();
    for i in 0..100 {
        assert_eq!(post(&server, i, t0, gpu).await.status().as_u16(), 200);
    }
    let metrics = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("gpuwatch_wal_fsyncs_total"), "{metrics}");
    // Written to the page cache before the answer: a crash of the process alone loses nothing.
    server.kill9();
    server.restart();
    assert_exactly(&server, gpu, 100).await;
}
