//! Delivery against local HTTP receivers that record what they get, and payload limits.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::watch;

use super::deliver::{SIGNATURE_HEADER, hmac_sha256};
use super::*;

/// What a test receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub at: Instant,
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub raw: Bytes,
}

/// How a receiver answers its nth request (0-based): status, Retry-After, delay.
pub(crate) type Script = Arc<dyn Fn(usize) -> (u16, Option<&'static str>, Duration) + Send + Sync>;

/// A local receiver that records every request it answers 200 to.
#[derive(Clone)]
pub(crate) struct Recv {
    pub addr: SocketAddr,
    pub got: Arc<Mutex<Vec<Got>>>,
    pub calls: Arc<Mutex<Vec<Instant>>>,
    script: Script,
}

impl Recv {
    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().expect("lock").clone()
    }
    pub(crate) fn calls(&self) -> Vec<Instant> {
        self.calls.lock().expect("lock").clone()
    }
}

async fn record(
    State(r): State<Recv>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = {
        let mut c = r.calls.lock().expect("lock");
        c.push(Instant::now());
        c.len() - 1
    };
    let (status, retry_after, delay) = (r.script)(n);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if status == 200 {
        r.got.lock().expect("lock").push(Got {
            at: Instant::now(),
            path: uri.path().to_string(),
            headers,
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
            raw: body,
        });
    }
    let mut resp = (StatusCode::from_u16(status).expect("status"), "").into_response();
    if let Some(v) = retry_after {
        resp.headers_mut()
            .insert("retry-after", v.parse().expect("header"));
    }
    resp
}

/// Starts a receiver on `addr` (use port 0 for a free one).
pub(crate) async fn start_receiver(
    addr: &str,
    script: impl Fn(usize) -> (u16, Option<&'static str>, Duration) + Send + Sync + 'static,
) -> (Recv, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let r = Recv {
        addr: listener.local_addr().expect("addr"),
        got: Arc::default(),
        calls: Arc::default(),
        script: Arc::new(script),
    };
    let app = Router::new()
        .route("/hook", post(record))
        .route("/api/v2/alerts", post(record))
        .with_state(r.clone());
    let h = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (r, h)
}

fn ok(_: usize) -> (u16, Option<&'static str>, Duration) {
    (200, None, Duration::ZERO)
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

fn receiver_config(name: &str, kind: &str, url: &str, extra: &str) -> ReceiverConfig {
    toml::from_str(&format!(
        "name = \"{name}\"\nkind = \"{kind}\"\nurl = \"{url}\"\nbackoff_initial = \"50ms\"\nbackoff_max = \"200ms\"\nrate_limit_per_second = 100\n{extra}"
    ))
    .expect("receiver config")
}

fn alert(host: &str, status: &str) -> NAlert {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".to_string(), "GpuIdleInJob".to_string());
    labels.insert("host".to_string(), host.to_string());
    let mut annotations = BTreeMap::new();
    annotations.insert("summary".to_string(), format!("GPU idle on {host}"));
    NAlert {
        fingerprint: crate::engine::fingerprint(&labels),
        labels,
        annotations,
        status: status.into(),
        starts_at: 1_700_000_000_000_000_000,
        ends_at: (status == "resolved").then_some(1_700_000_600_000_000_000),
        value: 0.0,
    }
}

fn message(n: usize) -> Message {
    let alerts = (0..n)
        .map(|i| alert(&format!("node-{i:03}"), "firing"))
        .collect();
    let mut gl = BTreeMap::new();
    gl.insert("alertname".to_string(), "GpuIdleInJob".to_string());
    Message::new("r", "0:{}", &gl, alerts, "http://127.0.0.1:9500")
}

async fn wait_for(limit: Duration, what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn retry_after_on_429_is_honoured() {
    let (r, _h) = start_receiver("127.0.0.1:0", |n| {
        if n == 0 {
            (429, Some("1"), Duration::ZERO)
        } else {
            ok(n)
        }
    })
    .await;
    let outbox =
        Outbox::open(&[receiver_config("w", "webhook", &r.url(), "")], None, "").expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    outbox.enqueue("w", &message(1)).expect("enqueue");
    // The receiver holds the message before the sender has read the answer and counted it.
    wait_for(
        Duration::from_secs(5),
        "delivery after 429, counted",
        || r.got().len() == 1 && outbox.stats("w").is_some_and(|(sent, _, _)| sent == 1),
    )
    .await;
    let calls = r.calls();
    assert_eq!(calls.len(), 2);
    let gap = calls[1] - calls[0];
    // The backoff is 50 ms: only Retry-After explains a wait of a second.
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    assert_eq!(outbox.stats("w"), Some((1, 1, 0)));
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_receiver_down_for_a_while_gets_everything_in_order() {
    let addr = free_addr();
    let url = format!("http://{addr}/hook");
    let outbox =
        Outbox::open(&[receiver_config("w", "webhook", &url, "")], None, "").expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    for i in 1..=5 {
        outbox.enqueue("w", &message(i)).expect("enqueue");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(outbox.pending()["w"], 5);
    // Up, but failing with 503 three times first.
    let (r, _h) = start_receiver(&addr, |n| {
        if n < 3 {
            (503, None, Duration::ZERO)
        } else {
            ok(n)
        }
    })
    .await;
    // The receiver holds the last message before the sender has read the answer and dequeued
    // it: wait for both.
    wait_for(
        Duration::from_secs(5),
        "all five delivered and dequeued",
        || r.got().len() == 5 && outbox.pending()["w"] == 0,
    )
    .await;
    let sizes: Vec<usize> = r
        .got()
        .iter()
        .map(|g| g.body["alerts"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, [1, 2, 3, 4, 5], "in order, none lost or doubled");
    assert_eq!(outbox.pending()["w"], 0);
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_slow_receiver_delays_nobody_else() {
    let (slow, _h1) = start_receiver("127.0.0.1:0", |_| (200, None, Duration::from_secs(3))).await;
    let (fast, _h2) = start_receiver("127.0.0.1:0", ok).await;
    let outbox = Outbox::open(
        &[
            receiver_config("slow", "webhook", &slow.url(), ""),
            receiver_config("fast", "webhook", &fast.url(), ""),
        ],
        None,
        "",
    )
    .expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    let t0 = Instant::now();
    outbox.enqueue("slow", &message(1)).expect("enqueue");
    outbox.enqueue("slow", &message(2)).expect("enqueue");
    outbox.enqueue("fast", &message(1)).expect("enqueue");
    wait_for(Duration::from_secs(2), "fast receiver", || {
        fast.got().len() == 1
    })
    .await;
    assert!(slow.got().is_empty());
    assert!(t0.elapsed() < Duration::from_secs(2));
    let _ = stop.send(true);
}

#[tokio::test]
async fn queued_messages_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = free_addr();
    let url = format!("http://{addr}/hook");
    let cfg = [receiver_config("w", "webhook", &url, "")];
    {
        let outbox = Outbox::open(&cfg, Some(dir.path()), "").expect("outbox");
        let (stop, rx) = watch::channel(false);
        let tasks = outbox.start(rx);
        outbox.enqueue("w", &message(1)).expect("enqueue");
        outbox.enqueue("w", &message(2)).expect("enqueue");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = stop.send(true);
        for t in tasks {
            let _ = t.await;
        }
    }
    let (r, _h) = start_receiver(&addr, ok).await;
    let outbox = Outbox::open(&cfg, Some(dir.path()), "").expect("reopen");
    assert_eq!(outbox.pending()["w"], 2);
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    wait_for(Duration::from_secs(5), "delivery after restart", || {
        r.got().len() == 2
    })
    .await;
    wait_for(Duration::from_secs(2), "queue files removed", || {
        std::fs::read_dir(dir.path().join("w")).map_or(0, |d| d.count()) == 0
    })
    .await;
    let _ = stop.send(true);
    // A third open finds nothing left to send.
    let outbox = Outbox::open(&cfg, Some(dir.path()), "").expect("reopen");
    assert_eq!(outbox.pending()["w"], 0);
}

#[tokio::test]
async fn rate_limit_spaces_messages() {
    let (r, _h) = start_receiver("127.0.0.1:0", ok).await;
    let mut c = receiver_config("s", "slack", &r.url(), "");
    c.rate_limit_per_second = None; // Slack's default: 1 per second
    let outbox = Outbox::open(&[c], None, "").expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    for _ in 0..3 {
        outbox.enqueue("s", &message(1)).expect("enqueue");
    }
    wait_for(Duration::from_secs(5), "three messages", || {
        r.got().len() == 3
    })
    .await;
    let got = r.got();
    for w in got.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(gap >= Duration::from_millis(900), "gap {gap:?}");
    }
    let _ = stop.send(true);
}

#[tokio::test]
async fn webhook_is_signed_and_permanent_errors_drop() {
    let (r, _h) = start_receiver("127.0.0.1:0", ok).await;
    let outbox = Outbox::open(
        &[receiver_config(
            "w",
            "webhook",
            &r.url(),
            "hmac_secret = \"s3cret\"",
        )],
        None,
        "",
    )
    .expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    outbox.enqueue("w", &message(2)).expect("enqueue");
    wait_for(Duration::from_secs(5), "delivery", || r.got().len() == 1).await;
    let g = &r.got()[0];
    let sig = g.headers[SIGNATURE_HEADER].to_str().expect("ascii");
    let want: String = hmac_sha256(b"s3cret", &g.raw)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(sig, format!("sha256={want}"));
    let _ = stop.send(true);

    let (bad, _h) = start_receiver("127.0.0.1:0", |_| (404, None, Duration::ZERO)).await;
    let outbox =
        Outbox::open(&[receiver_config("b", "webhook", &bad.url(), "")], None, "").expect("outbox");
    let (stop, rx) = watch::channel(false);
    let _tasks = outbox.start(rx);
    outbox.enqueue("b", &message(1)).expect("enqueue");
    wait_for(Duration::from_secs(5), "dropped", || {
        outbox.pending()["b"] == 0
    })
    .await;
    assert_eq!(outbox.stats("b"), Some((0, 0, 1)));
    assert_eq!(bad.calls().len(), 1, "a 404 is not retried");
    let _ = stop.send(true);
}

#[test]
fn webhook_payload_is_alertmanager_v4() {
    let mut m = message(2);
    m.alerts[1] = alert("node-001", "resolved");
    let v = format::webhook(&m);
    assert_eq!(v["version"], "4");
    assert_eq!(v["status"], "firing");
    for key in [
        "groupKey",
        "truncatedAlerts",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let a = &v["alerts"][1];
    assert_eq!(a["status"], "resolved");
    assert_eq!(a["startsAt"], "2023-11-14T22:13:20.000Z");
    assert_eq!(a["endsAt"], "2023-11-14T22:23:20.000Z");
    assert_eq!(v["alerts"][0]["endsAt"], "0001-01-01T00:00:00Z");
    assert_eq!(v["commonLabels"]["alertname"], "GpuIdleInJob");
    assert!(v["commonLabels"].get("host").is_none());
    assert!(a["fingerprint"].as_str().is_some_and(|f| f.len() == 16));
}

#[test]
fn slack_stays_within_block_kit_limits() {
    let mut m = message(120);
    m.alerts[0]
        .annotations
        .insert("description".into(), "x".repeat(5000));
    m.group_labels.insert("host".into(), "h".repeat(300));
    let v = format::slack(&m);
    let blocks = v["blocks"].as_array().expect("blocks");
    assert!(blocks.len() <= format::SLACK_MAX_BLOCKS, "{}", blocks.len());
    assert_eq!(blocks[0]["type"], "header");
    assert_eq!(blocks[0]["text"]["type"], "plain_text");
    assert!(
        blocks[0]["text"]["text"]
            .as_str()
            .expect("t")
            .chars()
            .count()
            <= 150
    );
    for b in blocks.iter().filter(|b| b["type"] == "section") {
        assert_eq!(b["text"]["type"], "mrkdwn");
        assert!(b["text"]["text"].as_str().expect("t").chars().count() <= 3000);
    }
    assert!(v["text"].as_str().expect("fallback").chars().count() <= 3000);
    let last = blocks.iter().rev().nth(1).expect("more");
    assert!(
        last["elements"][0]["text"]
            .as_str()
            .expect("t")
            .contains("73 more")
    );
}

#[test]
fn discord_stays_within_embed_limits() {
    let mut m = message(200);
    for a in &mut m.alerts {
        a.labels.insert("long".into(), "y".repeat(2000));
    }
    m.common_labels = m.alerts[0].labels.clone();
    let v = format::discord(&m);
    let embeds = v["embeds"].as_array().expect("embeds");
    assert_eq!(embeds.len(), 1);
    let e = &embeds[0];
    let count = |x: &serde_json::Value| x.as_str().map_or(0, |s| s.chars().count());
    assert!(count(&e["title"]) <= 256);
    assert!(count(&e["description"]) <= 4096);
    let fields = e["fields"].as_array().expect("fields");
    assert!(fields.len() <= 25);
    let mut total = count(&e["title"]) + count(&e["description"]) + count(&e["footer"]["text"]);
    for f in fields {
        assert!(count(&f["name"]) <= 256);
        assert!(count(&f["value"]) <= 1024);
        total += count(&f["name"]) + count(&f["value"]);
    }
    assert!(total <= 6000, "{total}");
    assert!(e["color"].as_u64().is_some());
}

#[test]
fn teams_is_an_adaptive_card_under_28k() {
    let v = format::teams(&message(500));
    assert!(v.to_string().len() <= format::TEAMS_MAX_BYTES);
    assert_eq!(v["type"], "message");
    let att = &v["attachments"][0];
    assert_eq!(
        att["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(att["content"]["type"], "AdaptiveCard");
    assert_eq!(att["content"]["version"], "1.4");
    let body = att["content"]["body"].as_array().expect("body");
    assert_eq!(body[0]["type"], "TextBlock");
    assert!(body.iter().any(|b| b["type"] == "FactSet"));
    assert!(
        body.last().expect("last")["text"]
            .as_str()
            .expect("t")
            .contains("more alerts")
    );
}
