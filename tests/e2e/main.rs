//! End-to-end tests: the real `gpuwatch` and `gpuwatch-agent` binaries, started on free ports.

mod agent_auth;
mod agent_events;
mod agent_grpc;
mod agent_kubernetes;
mod agent_mig;
mod agent_otel;
mod agent_prometheus;
mod agent_slurm;
mod agent_spool;
mod alerts;
mod auth;
mod bad_input;
mod cli;
mod config;
mod console;
mod cost;
mod crash_stress;
mod dashboards;
mod dashboards_daily;
mod delta;
mod durability;
mod faults;
mod faults_load;
mod faults_net;
mod golden;
mod grpc;
mod hostile;
mod jobs;
mod jobs_scale;
mod ledger;
mod limiter;
mod object_store;
mod otlp_partial;
mod pipeline;
mod postgres;
mod promql_oracle;
mod python_sdk;
mod remote_write;
mod restart_config;
mod scale_out;
mod self_telemetry;
mod sql_recipes;
mod sql_refusals;
mod store_limits;
mod streaming;
mod tls;
mod work;

use std::time::{Duration, Instant};

use gpuwatch_e2e::TestServer;

/// The bearer tokens the auth tests share (`--auth-tokens`): one per scope.
pub const TOKENS: &str = r#"
[[tokens]]
name = "fleet"
token = "ingest-token-0123456789"
scopes = ["ingest"]

[[tokens]]
name = "grafana"
token = "query-token-0123456789"
scopes = ["query"]

[[tokens]]
name = "console"
token = "console-token-0123456789"
scopes = ["admin"]
"#;

/// Writes [`TOKENS`] into `dir` and returns the file's path.
pub fn tokens_file(dir: &std::path::Path) -> String {
    let tokens = dir.join("tokens.toml");
    std::fs::write(&tokens, TOKENS).expect("write tokens");
    tokens.to_str().expect("utf-8 path").to_string()
}

/// A server builder on a data directory in `dir` with [`TOKENS`] as its `--auth-tokens`.
pub fn with_tokens(dir: &std::path::Path) -> gpuwatch_e2e::TestServerBuilder {
    TestServer::builder()
        .data_dir(&dir.join("d"))
        .arg("--auth-tokens")
        .arg(&tokens_file(dir))
}

/// A server builder on a data directory in `dir` with `toml` as its `--config` file.
pub fn with_config(dir: &std::path::Path, toml: &str) -> gpuwatch_e2e::TestServerBuilder {
    let cfg = dir.join("gpuwatch.toml");
    std::fs::write(&cfg, toml).expect("write the config file");
    TestServer::builder()
        .data_dir(&dir.join("d"))
        .arg("--config")
        .arg(cfg.to_str().expect("utf-8 path"))
}

/// Runs SQL over HTTP; returns the status and body.
pub async fn sql(server: &TestServer, sql: &str, format: &str) -> (u16, Vec<u8>) {
    let body = serde_json::json!({ "sql": sql, "format": format }).to_string();
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("sql request");
    let status = resp.status().as_u16();
    (status, resp.bytes().await.expect("sql body").to_vec())
}

/// Runs SQL that must succeed; returns the rows as JSON objects.
pub async fn rows(server: &TestServer, q: &str) -> Vec<serde_json::Value> {
    let (status, body) = sql(server, q, "json").await;
    assert_eq!(status, 200, "{q}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("json array")
}

/// The single number a query answers.
pub async fn scalar(server: &TestServer, q: &str) -> f64 {
    let r = rows(server, q).await;
    assert_eq!(r.len(), 1, "{q}: {r:?}");
    let obj = r[0].as_object().expect("object");
    let v = obj.values().next().expect("one column");
    v.as_f64()
        .unwrap_or_else(|| panic!("{q}: not a number: {v}"))
}

/// Polls `f` until it returns true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out after {limit:?} waiting for: {what}");
}

/// A one-point OTLP/JSON export of metric `name` with `value` at `time_ns`, labels `attrs`.
pub fn otlp_json(name: &str, value: f64, time_ns: i64, attrs: &[(&str, &str)]) -> String {
    let attrs: Vec<serde_json::Value> = attrs
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": {"stringValue": v}}))
        .collect();
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "e2e-host"}}]},
        "scopeMetrics": [{"metrics": [{"name": name, "gauge": {"dataPoints": [{
            "timeUnixNano": time_ns.to_string(), "asDouble": value, "attributes": attrs
        }]}}]}]
    }]})
    .to_string()
}

/// Posts an OTLP/HTTP body; returns the status.
pub async fn post_otlp(
    url: &str,
    content_type: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/v1/metrics"))
        .header("content-type", content_type)
        .body(body);
    if let Some(e) = encoding {
        req = req.header("content-encoding", e);
    }
    let resp = req.send().await.expect("otlp request");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// Now, in ns since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// True when the local Delta table `table` under `data` has a commit that adds a file (a
/// persist landed).
pub fn persisted(data: &std::path::Path, table: &str) -> bool {
    let log = data.join("tables").join(table).join("_delta_log");
    std::fs::read_dir(&log)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .any(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
                .any(|l| l.starts_with("{\"add\""))
        })
}
