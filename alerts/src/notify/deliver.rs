//! Delivery: one queue and one worker task per receiver, so a slow or dead receiver delays
//! nobody else, and rule evaluation only ever appends to a queue.
//!
//! Each queued message is a file (`<dir>/<receiver>/<id>.json`, written atomically) removed once
//! delivered, so nothing queued is lost on restart. A worker sends its queue in order, at most
//! `rate_limit_per_second`; a 5xx answer, a timeout or a connection error is retried with
//! exponential backoff (`backoff_initial` doubling up to `backoff_max`); a 429 waits for its
//! `Retry-After` (seconds or an HTTP date) when it has one; another 4xx is a permanent error and
//! the message is dropped and counted. A message older than `max_age` is dropped and counted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};

use super::config::{ReceiverConfig, ReceiverKind};
use super::{Message, format};
use crate::error::{Error, Result};

/// The HMAC-SHA256 signature header of `webhook` receivers: `sha256=<hex>` of the body.
pub const SIGNATURE_HEADER: &str = "X-Gpuwatch-Signature";

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let ih = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(ih);
    outer.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A message waiting for delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Queued {
    /// Order in the queue.
    pub id: u64,
    /// Where.
    pub url: String,
    /// The body (JSON).
    pub body: String,
    /// Extra headers.
    pub headers: BTreeMap<String, String>,
    /// When it was queued (ms since the epoch).
    pub queued_at_ms: u64,
}

/// Counters of one receiver.
#[derive(Debug, Default)]
pub struct ReceiverStats {
    /// Delivered.
    pub sent: AtomicU64,
    /// Attempts that failed and will be retried.
    pub retries: AtomicU64,
    /// Dropped: permanent error or too old.
    pub dropped: AtomicU64,
}

struct Lane {
    config: ReceiverConfig,
    queue: Mutex<VecDeque<Queued>>,
    wake: Notify,
    dir: Option<PathBuf>,
    stats: ReceiverStats,
}

impl Lane {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn file(&self, id: u64) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{id:020}.json")))
    }
}

/// The queues of every receiver.
pub struct Outbox {
    lanes: HashMap<String, Arc<Lane>>,
    next_id: AtomicU64,
    external_url: String,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("receivers", &self.lanes.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn load_dir(dir: &Path) -> Result<VecDeque<Queued>> {
    let io = |what: &'static str| {
        let path = dir.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    std::fs::create_dir_all(dir).map_err(io("cannot create notification queue"))?;
    let mut items = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("cannot read notification queue"))? {
        let path = entry.map_err(io("cannot read notification queue"))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            // Leftover temporary files of an interrupted write: never acknowledged, removed.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|source| Error::Io {
            what: "cannot read queued notification",
            path: path.clone(),
            source,
        })?;
        match serde_json::from_slice::<Queued>(&bytes) {
            Ok(q) => items.push(q),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "unreadable queued notification dropped");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    items.sort_by_key(|q| q.id);
    Ok(items.into())
}

impl Outbox {
    /// Queues for `receivers`; with `dir`, messages queued before a restart are loaded.
    pub fn open(
        receivers: &[ReceiverConfig],
        dir: Option<&Path>,
        external_url: &str,
    ) -> Result<Self> {
        let mut lanes = HashMap::new();
        let mut max_id = 0;
        for r in receivers {
            let lane_dir = dir.map(|d| d.join(sanitize(&r.name)));
            let queue = match &lane_dir {
                Some(d) => load_dir(d)?,
                None => VecDeque::new(),
            };
            max_id = max_id.max(queue.back().map_or(0, |q| q.id));
            lanes.insert(
                r.name.clone(),
                Arc::new(Lane {
                    config: r.clone(),
                    queue: Mutex::new(queue),
                    wake: Notify::new(),
                    dir: lane_dir,
                    stats: ReceiverStats::default(),
                }),
            );
        }
        Ok(Self {
            lanes,
            next_id: AtomicU64::new(max_id + 1),
            external_url: external_url.to_string(),
        })
    }

    /// Renders `message` in the receiver's format and queues it durably.
    pub fn enqueue(&self, receiver: &str, message: &Message) -> Result<()> {
        let Some(lane) = self.lanes.get(receiver) else {
            return Err(Error::Config(format!("no receiver named {receiver:?}")));
        };
        let c = &lane.config;
        let (url, body) = match c.kind {
            ReceiverKind::Slack => (c.url.clone(), format::slack(message)),
            ReceiverKind::Teams => (c.url.clone(), format::teams(message)),
            ReceiverKind::Discord => (c.url.clone(), format::discord(message)),
            ReceiverKind::Webhook => (c.url.clone(), format::webhook(message)),
            ReceiverKind::Alertmanager => (
                format!("{}/api/v2/alerts", c.url.trim_end_matches('/')),
                format::alertmanager(message),
            ),
        };
        let body = body.to_string();
        let mut headers = c.headers.clone();
        if let (ReceiverKind::Webhook, Some(secret)) = (c.kind, &c.hmac_secret) {
            headers.insert(
                SIGNATURE_HEADER.into(),
                format!(
                    "sha256={}",
                    hex(&hmac_sha256(secret.as_bytes(), body.as_bytes()))
                ),
            );
        }
        let q = Queued {
            id: self.next_id.fetch_add(1, Ordering::SeqCst),
            url,
            body,
            headers,
            queued_at_ms: now_ms(),
        };
        if let Some(path) = lane.file(q.id) {
            crate::state::save(&path, &q, "notification")?;
        }
        lane.lock().push_back(q);
        lane.wake.notify_one();
        Ok(())
    }

    /// Messages waiting, per receiver.
    pub fn pending(&self) -> BTreeMap<String, usize> {
        self.lanes
            .iter()
            .map(|(n, l)| (n.clone(), l.lock().len()))
            .collect()
    }

    /// A receiver's counters.
    pub fn stats(&self, receiver: &str) -> Option<(u64, u64, u64)> {
        self.lanes.get(receiver).map(|l| {
            (
                l.stats.sent.load(Ordering::Relaxed),
                l.stats.retries.load(Ordering::Relaxed),
                l.stats.dropped.load(Ordering::Relaxed),
            )
        })
    }

    /// The external URL messages link to.
    pub fn external_url(&self) -> &str {
        &self.external_url
    }

    /// Starts one worker per receiver; they stop when `stop` turns true.
    pub fn start(&self, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>> {
        self.lanes
            .values()
            .map(|lane| {
                let lane = Arc::clone(lane);
                let stop = stop.clone();
                tokio::spawn(async move { worker(lane, stop).await })
            })
            .collect()
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

enum Outcome {
    Sent,
    Retry(Option<Duration>),
    Permanent(String),
}

/// Parses `Retry-After`: delay-seconds or an HTTP date.
pub fn retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let delta = when.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    Some(Duration::from_millis(delta.max(0) as u64))
}

async fn attempt(client: &reqwest::Client, lane: &Lane, q: &Queued) -> Outcome {
    let mut req = client
        .post(&q.url)
        .timeout(lane.config.timeout())
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("gpuwatch/", env!("CARGO_PKG_VERSION")),
        )
        .body(q.body.clone());
    for (k, v) in &q.headers {
        req = req.header(k, v);
    }
    let span = tracing::info_span!("notification", receiver = %lane.config.name);
    match req.send().instrument(span).await {
        Ok(resp) => {
            let status = resp.status();
            if status.is_success() {
                return Outcome::Sent;
            }
            if status.as_u16() == 429 {
                let after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(retry_after);
                return Outcome::Retry(after);
            }
            if status.is_server_error() || status.as_u16() == 408 {
                return Outcome::Retry(None);
            }
            let text = resp.text().await.unwrap_or_default();
            Outcome::Permanent(format!("{status}: {}", format::truncate(&text, 200)))
        }
        Err(e) => {
            tracing::debug!(error = %e, "notification attempt failed");
            Outcome::Retry(None)
        }
    }
}

async fn worker(lane: Arc<Lane>, mut stop: watch::Receiver<bool>) {
    let client = reqwest::Client::new();
    let name = lane.config.name.clone();
    let min_gap = Duration::from_secs_f64(1.0 / lane.config.rate());
    let mut last_send: Option<Instant> = None;
    let mut backoff = lane.config.backoff_initial();
    loop {
        if *stop.borrow() {
            return;
        }
        let front = lane.lock().front().cloned();
        let Some(q) = front else {
            tokio::select! {
                _ = lane.wake.notified() => {}
                _ = stop.changed() => return,
            }
            continue;
        };
        let age = Duration::from_millis(now_ms().saturating_sub(q.queued_at_ms));
        if age > lane.config.max_age() {
            tracing::error!(receiver = %name, id = q.id, "notification dropped: not delivered within max_age");
            lane.stats.dropped.fetch_add(1, Ordering::Relaxed);
            finish(&lane, q.id);
            continue;
        }
        if let Some(t) = last_send {
            let wait = min_gap.saturating_sub(t.elapsed());
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => return,
                }
            }
        }
        last_send = Some(Instant::now());
        let delay = match attempt(&client, &lane, &q).await {
            Outcome::Sent => {
                lane.stats.sent.fetch_add(1, Ordering::Relaxed);
                finish(&lane, q.id);
                backoff = lane.config.backoff_initial();
                continue;
            }
            Outcome::Permanent(why) => {
                tracing::error!(receiver = %name, id = q.id, error = %why, "notification rejected; dropped: fix the receiver's url or credentials");
                lane.stats.dropped.fetch_add(1, Ordering::Relaxed);
                finish(&lane, q.id);
                continue;
            }
            Outcome::Retry(Some(after)) => after.min(Duration::from_secs(3600)),
            Outcome::Retry(None) => {
                let d = backoff;
                backoff = (backoff * 2).min(lane.config.backoff_max());
                d
            }
        };
        lane.stats.retries.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(receiver = %name, id = q.id, retry_in_ms = delay.as_millis() as u64, "notification not delivered; retrying");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

fn finish(lane: &Lane, id: u64) {
    {
        let mut q = lane.lock();
        if q.front().is_some_and(|f| f.id == id) {
            q.pop_front();
        }
    }
    if let Some(p) = lane.file(id)
        && let Err(e) = std::fs::remove_file(&p)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %p.display(), error = %e, "cannot remove delivered notification");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon"), None);
    }
}
