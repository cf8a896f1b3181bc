//! Crash safety under stress: `kill -9` of the server at random moments while writers ingest and
//! the server persists and compacts, 20 times; after each restart every acknowledged sample is
//! there exactly once. Samples are spread over the last hours, so persists write several hour
//! windows, compaction merges and rolls up closed hours, and the kills land in all of it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuwatch_e2e::{S3Server, TestServer};

use crate::{eventually, now_ns, otlp_json, rows, scalar};

const GPU: &str = "GPU-crash";
const KILLS: usize = 20;
const WRITERS: usize = 3;

/// A small xorshift generator: random kill moments without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

async fn present(server: &TestServer) -> (Vec<i64>, usize) {
    let got = rows(
        server,
        &format!("SELECT power_watts AS v FROM gpu_metrics WHERE gpu_uuid = '{GPU}'"),
    )
    .await;
    let values: Vec<i64> = got
        .iter()
        .map(|r| r["v"].as_f64().expect("value") as i64)
        .collect();
    let n = values.len();
    (values, n)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_acknowledged_sample_survives_20_kill_9_exactly_once() {
    crash_stress(None).await
}

/// The same with the files, the catalog, compaction and rollups in S3 (moto).
#[tokio::test(flavor = "multi_thread")]
async fn every_acknowledged_sample_survives_20_kill_9_exactly_once_on_an_object_store() {
    let s3 = S3Server::start();
    crash_stress(Some(&s3)).await
}

async fn crash_stress(s3: Option<&S3Server>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut builder = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--persist-interval")
        .arg("150ms")
        .arg("--compaction-interval")
        .arg("100ms");
    if let Some(s3) = s3 {
        builder = builder.object_store(s3, "crash");
    }
    let mut server = builder.start();
    let mut rng = Rng(now_ns() as u64 | 1);
    // Six hours ago, on an hour boundary; one sample every 2 s after it, wrapping within the six
    // hours so that no sample is in the future (the server rejects far-future points).
    let hour = 3_600_000_000_000i64;
    let base = (now_ns() / hour - 6) * hour;
    let next_id = Arc::new(Mutex::new(0i64));
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    for round in 0..KILLS {
        let url = server.url();
        let mut writers = Vec::new();
        for _ in 0..WRITERS {
            let (url, next_id, acked) = (url.clone(), Arc::clone(&next_id), Arc::clone(&acked));
            writers.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                loop {
                    let id = {
                        let mut n = next_id.lock().expect("ids");
                        *n += 1;
                        *n
                    };
                    let body = otlp_json(
                        "hw.power",
                        id as f64,
                        base + (id * 2_000_000_000) % (6 * hour),
                        &[("hw.id", GPU)],
                    );
                    let sent = client
                        .post(format!("{url}/v1/metrics"))
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status().is_success() => acked.lock().expect("acked").push(id),
                        Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150 + rng.below(600))).await;
        server.kill9();
        for w in writers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
        server.restart();
        let (values, n) = present(&server).await;
        let distinct: HashSet<i64> = values.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            n,
            "round {round}: a sample is present twice"
        );
        let acked = acked.lock().expect("acked").clone();
        let missing: Vec<i64> = acked
            .iter()
            .copied()
            .filter(|id| !distinct.contains(id))
            .collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged samples lost: {missing:?}"
        );
        // Anything else present was sent and not acknowledged (in flight at the kill).
        assert!(
            n - acked.len() <= WRITERS * (round + 1),
            "round {round}: {n} present, {} acknowledged",
            acked.len()
        );
    }
    let acked = acked.lock().expect("acked").len();
    assert!(
        acked > KILLS * 10,
        "only {acked} samples acknowledged over {KILLS} rounds"
    );
    eprintln!("crash stress: {KILLS} kills, {acked} acknowledged samples, all present once");
    // The closed hours were compacted and rolled up: the hourly rollup counts every raw row of
    // those hours.
    let closed_before = (now_ns() / hour - 1) * hour;
    let raw = format!(
        "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = '{GPU}' AND time < to_timestamp_nanos({closed_before})"
    );
    let rolled = format!(
        "SELECT coalesce(sum(samples), 0) FROM gpu_metrics_1h WHERE gpu_uuid = '{GPU}' AND time < to_timestamp_nanos({closed_before})"
    );
    eventually(
        Duration::from_secs(30),
        "rollups of the closed hours",
        || async {
            let r = scalar(&server, &raw).await;
            r > 0.0 && scalar(&server, &rolled).await == r
        },
    )
    .await;
    let m = format!(
        "SELECT coalesce(sum(samples), 0) FROM gpu_metrics_1m WHERE gpu_uuid = '{GPU}' AND time < to_timestamp_nanos({closed_before})"
    );
    assert_eq!(scalar(&server, &m).await, scalar(&server, &raw).await);
}
