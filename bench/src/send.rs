//! Sending remote-write bodies to a server with a few concurrent connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::remote_write::Body;

/// What a send run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct SendStats {
    /// Requests acknowledged.
    pub requests: u64,
    /// Samples in those requests.
    pub samples: u64,
    /// Compressed bytes sent.
    pub bytes: u64,
    /// Requests repeated after the server shed load (429 or 503).
    pub retries: u64,
}

/// A client for remote-write posts.
pub fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(64)
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// Posts one body; repeats it while the server answers 429 or 503 (load shedding).
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    bytes: Vec<u8>,
    retries: &AtomicU64,
) -> Result<(), String> {
    loop {
        let resp = client
            .post(url)
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .body(bytes.clone())
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        if status.as_u16() == 429 || status.as_u16() == 503 {
            retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("POST {url}: {status}: {}", text.trim()));
    }
}

/// Sends every body coming out of `rx` with `concurrency` requests in flight. Bodies of one
/// host always go through the same connection, in order (as Prometheus's remote-write shards
/// keep each series in order), so no server sees a series' samples out of order.
pub async fn send_stream(
    client: &reqwest::Client,
    url: &str,
    mut rx: mpsc::Receiver<Arc<Body>>,
    concurrency: usize,
) -> Result<SendStats, String> {
    let requests = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let lanes = concurrency.max(1);
    let mut senders = Vec::with_capacity(lanes);
    let mut tasks = Vec::new();
    for _ in 0..lanes {
        let (lane_tx, mut lane_rx) = mpsc::channel::<Arc<Body>>(2);
        senders.push(lane_tx);
        let client = client.clone();
        let url = url.to_string();
        let (requests, samples, bytes, retries) = (
            Arc::clone(&requests),
            Arc::clone(&samples),
            Arc::clone(&bytes),
            Arc::clone(&retries),
        );
        tasks.push(tokio::spawn(async move {
            while let Some(body) = lane_rx.recv().await {
                post(&client, &url, body.bytes.clone(), &retries).await?;
                requests.fetch_add(1, Ordering::Relaxed);
                samples.fetch_add(body.samples, Ordering::Relaxed);
                bytes.fetch_add(body.bytes.len() as u64, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }
    while let Some(body) = rx.recv().await {
        let lane = body.host % lanes;
        if senders[lane].send(body).await.is_err() {
            // That lane stopped on an error, reported below.
            break;
        }
    }
    drop(senders);
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(format!("sender task failed: {e}"));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(SendStats {
        requests: requests.load(Ordering::Relaxed),
        samples: samples.load(Ordering::Relaxed),
        bytes: bytes.load(Ordering::Relaxed),
        retries: retries.load(Ordering::Relaxed),
    })
}
