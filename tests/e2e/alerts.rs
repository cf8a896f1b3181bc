//! Alerts end to end: `gpuwatch rules check`, a rule firing in the real server, pushed to a real
//! Alertmanager (seen with `amtool alert query`) and to a webhook receiver exactly once across a
//! `kill -9` restart, the `alerts` table, `/api/v1/alerts` and `/api/v1/silences`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use gpuwatch_e2e::{TestServer, bin_dir, free_addr, http_get};

use crate::{eventually, now_ns, otlp_json, post_otlp, rows};

const ALERTMANAGER: &str = "prometheus-alertmanager";

#[test]
fn rules_check_exit_codes_and_line_numbers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let pack: Vec<_> = ["idle", "jobs", "health"]
        .iter()
        .map(|n| root.join(format!("deploy/rules/{n}.yaml")))
        .collect();
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["rules", "check"])
        .args(&pack)
        .output()
        .expect("run rules check");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("idle.yaml: ok (1 groups, 1 rules)"));

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        sql: SELECT 1 AS value\n      - alert: B\n        sql: DROP TABLE gpu_metrics\n",
    )
    .expect("write");
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["rules", "check"])
        .arg(&bad)
        .output()
        .expect("run rules check");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:7:"), "{err}");
    assert!(err.contains("not allowed"), "{err}");
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_alertmanager(dir: &Path) -> (Killed, String) {
    let addr = free_addr();
    let config = dir.join("am.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: devnull\n  group_wait: 1s\nreceivers:\n  - name: devnull\n",
    )
    .expect("am config");
    let child = Command::new(ALERTMANAGER)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {ALERTMANAGER} ({e}): install it with `apt-get install -y prometheus-alertmanager` (.ci/run does)"
            )
        });
    let am = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if http_get(addr, "/-/ready").is_ok_and(|(c, _)| c == 200) {
            return (am, format!("http://{addr}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("alertmanager not ready on {addr}");
}

fn amtool_alerts(url: &str) -> String {
    let out = Command::new("amtool")
        .args([
            "alert",
            "query",
            "--alertmanager.url",
            url,
            "-o",
            "extended",
        ])
        .output()
        .expect("amtool (installed with prometheus-alertmanager)");
    String::from_utf8_lossy(&out.stdout).to_string()
}

type Got = Arc<Mutex<Vec<serde_json::Value>>>;

async fn hook(State(got): State<Got>, body: Bytes) -> &'static str {
    if let Ok(v) = serde_json::from_slice(&body) {
        got.lock().expect("lock").push(v);
    }
    "ok"
}

async fn start_webhook() -> (String, Got) {
    let got: Got = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(Arc::clone(&got));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

fn firing_messages(got: &Got) -> usize {
    got.lock()
        .expect("lock")
        .iter()
        .filter(|v| v["status"] == "firing")
        .count()
}

async fn client_json(
    method: reqwest::Method,
    url: String,
    body: Option<String>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_fires_to_alertmanager_and_webhook_once_across_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_am, am_url) = start_alertmanager(dir.path());
    let (hook_url, got) = start_webhook().await;

    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        r#"groups:
  - name: e2e
    interval: 1s
    rules:
      - alert: E2eHotGpu
        sql: |
          SELECT host, gpu_uuid, max(temperature_celsius) AS value FROM gpu_metrics
          WHERE time > now() - interval '1 hour' GROUP BY host, gpu_uuid HAVING max(temperature_celsius) > 90
        labels: {severity: critical}
        annotations: {summary: "GPU {{ labels.gpu_uuid }} on {{ labels.host }} at {{ value }} C"}
"#,
    )
    .expect("rules");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        format!(
            r#"[alerting]
external_url = "http://gpuwatch.test"
[[alerting.receivers]]
name = "am"
kind = "alertmanager"
url = "{am_url}"
resend_delay = "2s"
[[alerting.receivers]]
name = "hook"
kind = "webhook"
url = "{hook_url}"
[[alerting.routes]]
receiver = "am"
continue = true
[[alerting.routes]]
receiver = "hook"
group_by = ["alertname"]
group_wait = "1s"
group_interval = "2s"
repeat_interval = "1h"
"#
        ),
    )
    .expect("config");
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .arg("--config")
        .arg(config.to_str().expect("utf-8 path"))
        .arg("--rules")
        .arg(rules.to_str().expect("utf-8 path"))
        .start();
    let body = otlp_json("hw.temperature", 95.0, now_ns(), &[("hw.id", "GPU-hot")]);
    let (status, text) =
        post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
    assert_eq!(status, 200, "{text}");

    eventually(
        Duration::from_secs(30),
        "webhook gets the firing alert",
        || {
            let n = firing_messages(&got);
            async move { n >= 1 }
        },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "amtool alert query shows it",
        || {
            let out = amtool_alerts(&am_url);
            async move { out.contains("E2eHotGpu") && out.contains("GPU-hot") }
        },
    )
    .await;
    let first = got.lock().expect("lock")[0].clone();
    assert_eq!(first["version"], "4");
    assert_eq!(first["alerts"][0]["labels"]["severity"], "critical");
    assert_eq!(
        first["alerts"][0]["annotations"]["summary"],
        "GPU GPU-hot on e2e-host at 95 C"
    );

    let (code, v) = client_json(
        reqwest::Method::GET,
        format!("{}/api/v1/alerts", server.url()),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(v["alerts"][0]["state"], "firing", "{v}");
    let r = rows(&server, "SELECT rule, state FROM alerts ORDER BY time").await;
    assert_eq!(r[0]["rule"], "E2eHotGpu");
    assert_eq!(r[0]["state"], "firing");

    let (code, metrics) = http_get(server.http, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("gpuwatch_alerts{state=\"firing\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuwatch_notifications_sent_total{receiver=\"hook\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuwatch_rule_evaluation_failures_total 0"),
        "{metrics}"
    );

    // kill -9 while firing: the restarted server resumes the state and sends nothing again.
    server.restart();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        firing_messages(&got),
        1,
        "a restart re-notified: {:?}",
        got.lock().expect("lock")
    );
    let r = rows(&server, "SELECT count(*) AS n FROM alerts").await;
    assert_eq!(r[0]["n"], 1, "history rows after restart: {r:?}");
    assert!(server.log_text().contains("alerting started"));

    // Silences.
    let url = format!("{}/api/v1/silences", server.url());
    let (code, v) = client_json(
        reqwest::Method::POST,
        url.clone(),
        Some(r#"{"matchers":[{"name":"alertname","value":"E2eHotGpu"}],"duration":"1h","createdBy":"e2e","comment":"maintenance"}"#.into()),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let id = v["silenceID"].as_str().expect("silenceID").to_string();
    let (_, list) = client_json(reqwest::Method::GET, url.clone(), None).await;
    assert_eq!(list[0]["status"], "active", "{list}");
    let (_, v) = client_json(
        reqwest::Method::GET,
        format!("{}/api/v1/alerts", server.url()),
        None,
    )
    .await;
    assert_eq!(v["alerts"][0]["silenced"], true, "{v}");
    let (code, _) = client_json(reqwest::Method::DELETE, format!("{url}/{id}"), None).await;
    assert_eq!(code, 200);
    let (_, list) = client_json(reqwest::Method::GET, url.clone(), None).await;
    assert_eq!(list[0]["status"], "expired", "{list}");
    let (code, v) = client_json(reqwest::Method::DELETE, format!("{url}/nope"), None).await;
    assert_eq!(code, 404, "{v}");
    let (code, v) = client_json(
        reqwest::Method::POST,
        url,
        Some(r#"{"matchers":[]}"#.into()),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
    server.stop();
}
