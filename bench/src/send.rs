//! Sending remote-write or OTLP/HTTP bodies to a server with a few concurrent connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[cfg(test)]
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsPartialSuccess;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use tokio::sync::mpsc;

use crate::remote_write::Body;

/// What a send run did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SendStats {
    /// Requests acknowledged.
    pub requests: u64,
    /// Samples in those requests.
    pub samples: u64,
    /// Compressed bytes sent.
    pub bytes: u64,
    /// Requests repeated after the server shed load (429 or 503).
    pub retries: u64,
}

/// How a body is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Prometheus remote write 1.0: snappy-compressed `WriteRequest` to `/api/v1/write`.
    RemoteWrite,
    /// OTLP/HTTP: a protobuf `ExportMetricsServiceRequest` to `/v1/metrics`, uncompressed (the
    /// agent gzips; on one machine compression would only cost the sender CPU). An answer with
    /// rejected data points (OTLP partial success) is an error.
    Otlp,
}

/// The rejection an OTLP answer body reports, if any.
fn otlp_rejection(body: &[u8]) -> Result<Option<String>, String> {
    use prost::Message;
    let resp = ExportMetricsServiceResponse::decode(body)
        .map_err(|e| format!("the OTLP answer is not an ExportMetricsServiceResponse: {e}"))?;
    Ok(resp
        .partial_success
        .filter(|p| p.rejected_data_points > 0 || !p.error_message.is_empty())
        .map(|p| {
            format!(
                "{} data points rejected: {}",
                p.rejected_data_points, p.error_message
            )
        }))
}

/// A client for remote-write posts.
pub(crate) fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(64)
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))
}

/// Posts one remote-write body; repeats it while the server answers 429 or 503 (load shedding).
pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    bytes: Vec<u8>,
    retries: &AtomicU64,
) -> Result<(), String> {
    post_as(Transport::RemoteWrite, client, url, bytes, retries).await
}

/// Posts one body by `transport`; repeats it while the server answers 429 or 503.
pub(crate) async fn post_as(
    transport: Transport,
    client: &reqwest::Client,
    url: &str,
    bytes: Vec<u8>,
    retries: &AtomicU64,
) -> Result<(), String> {
    loop {
        let mut req = client
            .post(url)
            .header("Content-Type", "application/x-protobuf");
        if transport == Transport::RemoteWrite {
            req = req
                .header("Content-Encoding", "snappy")
                .header("X-Prometheus-Remote-Write-Version", "0.1.0");
        }
        let resp = req
            .body(bytes.clone())
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = resp.status();
        if status.is_success() {
            if transport == Transport::Otlp {
                let body = resp
                    .bytes()
                    .await
                    .map_err(|e| format!("POST {url}: reading the answer: {e}"))?;
                if let Some(why) = otlp_rejection(&body)? {
                    return Err(format!("POST {url}: {why}"));
                }
            }
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
pub(crate) async fn send_stream(
    client: &reqwest::Client,
    url: &str,
    rx: mpsc::Receiver<Arc<Body>>,
    concurrency: usize,
) -> Result<SendStats, String> {
    send_stream_as(Transport::RemoteWrite, client, url, rx, concurrency).await
}

/// [`send_stream`] for bodies of `transport`.
pub(crate) async fn send_stream_as(
    transport: Transport,
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
                post_as(transport, &client, &url, body.bytes.clone(), &retries).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn otlp_answers_with_rejected_points_are_errors() {
        assert_eq!(otlp_rejection(b""), Ok(None));
        let ok = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess::default()),
        };
        assert_eq!(otlp_rejection(&ok.encode_to_vec()), Ok(None));
        let rejected = ExportMetricsServiceResponse {
            partial_success: Some(ExportMetricsPartialSuccess {
                rejected_data_points: 3,
                error_message: "3 more than 10 minutes ahead".into(),
            }),
        };
        let why = otlp_rejection(&rejected.encode_to_vec())
            .expect("decodes")
            .expect("rejected");
        assert!(why.starts_with("3 data points rejected"), "{why}");
        assert!(otlp_rejection(b"\xff\xff").is_err());
    }
}
