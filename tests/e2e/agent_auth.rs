//! The agent's bearer token (`--auth-token-file`) against the real server run with
//! `--auth-tokens`, over OTLP/HTTP and OTLP/gRPC: with a wrong token the server refuses every
//! send, the agent says so and keeps its samples; once the token file is rewritten with the
//! ingest token (as a Kubernetes Secret update does, without restarting the agent) every sample
//! arrives, read back over SQL with a query token, none lost, none twice. A bad token file stops
//! the agent at start with a clear message.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuwatch_e2e::{TestServer, bin_dir, free_addr, metric};

use crate::eventually;

const INGEST: &str = "ingest-token-0123456789";
const QUERY: &str = "query-token-0123456789";
const WRONG: &str = "wrong-token-0123456789";

/// Runs SQL with the query token; the rows as JSON objects.
async fn rows(server: &TestServer, q: &str) -> Vec<serde_json::Value> {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .bearer_auth(QUERY)
        .header("content-type", "application/json")
        .body(serde_json::json!({ "sql": q, "format": "json" }).to_string())
        .send()
        .await
        .expect("sql request");
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{q}: {body}");
    serde_json::from_str(&body).expect("json rows")
}

/// The sample times of `host`'s GPU 0, in seconds, oldest first.
async fn times(server: &TestServer, host: &str) -> Vec<f64> {
    rows(
        server,
        &format!(
            "SELECT CAST(time AS BIGINT) AS t FROM gpu_metrics \
             WHERE host = '{host}' AND gpu_index = 0 ORDER BY time"
        ),
    )
    .await
    .iter()
    .filter_map(|r| r["t"].as_f64())
    .map(|ns| ns / 1e9)
    .collect()
}

/// Writes `token` into `path` the way the kubelet updates a Secret volume: a new file, then a
/// rename over the old one.
fn put_token(path: &Path, token: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, format!("{token}\n")).expect("write token");
    std::fs::rename(&next, path).expect("rename token");
}

/// The agent, its stderr in a file; killed on drop.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(args: &[&str], log: PathBuf) -> Agent {
        let err = std::fs::File::create(&log).expect("agent log");
        let child = Command::new(bin_dir().join("gpuwatch-agent"))
            .args(args)
            .env_remove("GPUWATCH_AUTH_TOKEN_FILE")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start gpuwatch-agent");
        Agent { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

async fn wrong_then_fixed_token(grpc: bool) {
    let host = if grpc {
        "auth-grpc-e2e"
    } else {
        "auth-http-e2e"
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_tokens(dir.path()).start();
    let token_file = dir.path().join("agent.token");
    put_token(&token_file, WRONG);
    let metrics = free_addr();
    let metrics_arg = metrics.to_string();
    let (protocol, endpoint) = if grpc {
        ("grpc", format!("http://{}", server.grpc))
    } else {
        ("http", server.otlp_url())
    };
    let spool = dir.path().join("spool");
    let mut args = vec![
        "--protocol",
        protocol,
        "--endpoint",
        &endpoint,
        "--auth-token-file",
        token_file.to_str().expect("utf-8 path"),
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "2",
        "--seed",
        "3",
        "--host",
        host,
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--metrics-addr",
        &metrics_arg,
        "--log-level",
        "info",
    ];
    // gRPC keeps the refused samples in the disk spool, HTTP in the in-memory queue.
    if grpc {
        args.extend(["--buffer-dir", spool.to_str().expect("utf-8 path")]);
    }
    let started = now_s();
    let agent = Agent::start(&args, dir.path().join("agent.log"));

    // Wrong token: every send is refused, the agent says so, and keeps the samples.
    eventually(
        Duration::from_secs(30),
        "sends refused, samples queued",
        || async {
            metric(metrics, "gpuwatch_agent_export_auth_refused_total").unwrap_or(0.0) >= 2.0
                && metric(metrics, "gpuwatch_agent_spool_requests").unwrap_or(0.0) >= 4.0
        },
    )
    .await;
    let log = agent.log_text();
    let status = if grpc {
        "grpc Unauthenticated"
    } else {
        "http 401"
    };
    assert!(
        log.contains("endpoint refused the bearer token") && log.contains(status),
        "the agent's log does not report the refusal ({status}):\n{log}"
    );
    assert!(
        log.contains("agent.token"),
        "the refusal names the token file:\n{log}"
    );
    for secret in [WRONG, INGEST] {
        assert!(
            !log.contains(secret),
            "a token is in the agent's log:\n{log}"
        );
    }
    assert_eq!(
        metric(metrics, "gpuwatch_agent_export_rejected_total"),
        Some(0.0),
        "nothing may be dropped as rejected"
    );
    assert!(times(&server, host).await.is_empty(), "nothing stored yet");
    let queued = metric(metrics, "gpuwatch_agent_spool_requests").unwrap_or(0.0);

    // The file is fixed while the agent runs: everything it kept arrives, then live samples.
    put_token(&token_file, INGEST);
    let fixed = Instant::now();
    eventually(Duration::from_secs(30), "the queue drained", || async {
        metric(metrics, "gpuwatch_agent_spool_requests") == Some(0.0)
            && metric(metrics, "gpuwatch_agent_exported_requests_total").unwrap_or(0.0) >= queued
    })
    .await;
    let drained_in = fixed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let t = times(&server, host).await;
    assert!(t.len() >= 6, "only {} samples of gpu 0: {t:?}", t.len());
    // The first sample is the agent's first collection, taken while the token was refused.
    assert!(
        t[0] - started < 3.0,
        "first stored sample {:.1} s after the agent started: the refused ones are lost",
        t[0] - started
    );
    let gaps: Vec<(f64, f64)> = t
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|(_, g)| *g > 2.5)
        .collect();
    assert!(gaps.is_empty(), "gaps (start, seconds): {gaps:?}");
    assert_eq!(
        t.windows(2).filter(|w| w[1] == w[0]).count(),
        0,
        "samples stored twice"
    );
    assert_eq!(
        metric(metrics, "gpuwatch_agent_spool_dropped_total"),
        Some(0.0)
    );
    assert_eq!(
        metric(metrics, "gpuwatch_agent_export_rejected_total"),
        Some(0.0)
    );
    let log = agent.log_text();
    assert!(
        log.contains("bearer token file changed"),
        "the agent's log does not say it read the new token:\n{log}"
    );
    assert!(!log.contains(INGEST), "the token is in the agent's log");
    eprintln!(
        "{protocol}: {} requests refused and kept, delivered {:.1} s after the token file was fixed; {} samples of gpu 0 without a gap",
        queued,
        drained_in.as_secs_f64(),
        t.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http_wrong_token_keeps_samples_until_the_file_is_fixed() {
    wrong_then_fixed_token(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_wrong_token_keeps_samples_until_the_file_is_fixed() {
    wrong_then_fixed_token(true).await;
}

#[test]
fn a_bad_token_file_stops_the_agent_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.token");
    let run = |extra: &[&str]| {
        let out = Command::new(bin_dir().join("gpuwatch-agent"))
            .args([
                "--source",
                "synthetic",
                "--endpoint",
                "http://127.0.0.1:9",
                "--metrics-addr",
                "off",
            ])
            .args(extra)
            .env_remove("GPUWATCH_AUTH_TOKEN_FILE")
            .output()
            .expect("run gpuwatch-agent");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let arg = path.to_str().expect("utf-8 path");
    // Missing, empty, two words, a character no header carries.
    let cases: [(Option<&str>, &str); 4] = [
        (None, "cannot read it"),
        (Some("\n"), "empty"),
        (Some("secret-one secret-two\n"), "one token"),
        (Some("secret-\u{e9}t\u{e9}-0123456789\n"), "visible ASCII"),
    ];
    for (text, says) in cases {
        if let Some(t) = text {
            std::fs::write(&path, t).expect("write token");
        }
        let (code, err) = run(&["--auth-token-file", arg]);
        assert_eq!(code, Some(2), "{text:?}: {err}");
        assert!(
            err.contains("bearer token file") && err.contains(says),
            "{text:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            !err.contains("secret"),
            "the token is in the message: {err}"
        );
    }
    // The same check in --once, and through the environment variable.
    std::fs::write(&path, "").expect("write token");
    let out = Command::new(bin_dir().join("gpuwatch-agent"))
        .args(["--source", "synthetic", "--once"])
        .env("GPUWATCH_AUTH_TOKEN_FILE", arg)
        .output()
        .expect("run gpuwatch-agent");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    // A good file: --once runs.
    std::fs::write(&path, format!("{INGEST}\n")).expect("write token");
    let (code, err) = run(&["--auth-token-file", arg, "--once"]);
    assert_eq!(code, Some(0), "{err}");
}
