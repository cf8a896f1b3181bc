//! The web console in headless Chromium (Debian `chromium`, driven over the DevTools protocol by
//! tests/console/check.py): every page against a real server fed by the simulated agent, the job
//! page's cost against the `jobs` table, and the token prompt. Any JavaScript error fails the
//! test. Screenshots are kept under target/tmp/console-screenshots/.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::TestAgent;

use crate::{eventually, now_ns, rows, scalar};

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Runs check.py; panics with its output unless it passes.
fn check(url: &str, args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/console/check.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--url", url, "--out"])
        .arg(screenshots())
        .args(args)
        .output()
        .expect("python3 tests/console/check.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "console check {args:?} failed (needs Debian `chromium` and `pip install websockets`; .ci/run installs both):\n{stdout}\n{stderr}"
    );
}

fn agent(endpoint: &str, host: &str, seed: &str) -> TestAgent {
    TestAgent::start(&[
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "6",
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--protocol",
        "http",
        "--endpoint",
        endpoint,
        "--host",
        host,
        "--seed",
        seed,
    ])
}

#[tokio::test(flavor = "multi_thread")]
async fn console_pages_in_headless_chromium() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_config(
        dir.path(),
        "[cost]\ngpu_hour_usd = [{ model = \"*H100*\", usd = 2.5 }]\nkwh_usd = 0.12\npue = 1.3\n",
    )
    .start();
    let agents = vec![
        agent(&server.url(), "console-a", "3"),
        agent(&server.url(), "console-b", "4"),
    ];
    eventually(
        Duration::from_secs(60),
        "12 GPUs with a few samples each and a job",
        || async {
            scalar(
                &server,
                "SELECT count(DISTINCT gpu_uuid) FROM gpu_metrics WHERE time > now() - INTERVAL '1 minute'",
            )
            .await
                == 12.0
                && scalar(&server, "SELECT count(*) FROM gpu_metrics").await >= 60.0
                && scalar(&server, "SELECT count(*) FROM jobs").await >= 1.0
        },
    )
    .await;
    println!("screenshots: {}", screenshots().display());
    check(&server.url(), &["pages"]);

    // Freeze the data, then the job page's cost must be the jobs table's.
    drop(agents);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let top = rows(
        &server,
        "SELECT job_id, sum(cost_usd) AS usd FROM jobs GROUP BY job_id ORDER BY usd DESC, job_id LIMIT 1",
    )
    .await;
    let job = top[0]["job_id"].as_str().expect("job id").to_string();
    let usd = top[0]["usd"].as_f64().expect("cost");
    assert!(usd > 0.0, "{top:?}");
    check(
        &server.url(),
        &["job", "--job", &job, "--expect-cost", &format!("{usd:?}")],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn console_asks_for_a_token_and_shows_nothing_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_tokens(dir.path()).start();
    // Two GPUs sampled just now (the agent has no token option, so the test sends them).
    let client = reqwest::Client::new();
    for gpu in ["GPU-auth-0", "GPU-auth-1"] {
        let body = serde_json::json!({"resourceMetrics": [{
            "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "auth-node"}}]},
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "gauge": {"dataPoints": [{
                "timeUnixNano": now_ns().to_string(), "asDouble": 0.5,
                "attributes": [{"key": "hw.id", "value": {"stringValue": gpu}}]}]}}]}]
        }]});
        let resp = client
            .post(format!("{}/v1/metrics", server.url()))
            .bearer_auth("ingest-token-0123456789")
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("otlp");
        assert_eq!(resp.status().as_u16(), 200);
    }
    check(
        &server.url(),
        &["auth", "--token", "console-token-0123456789"],
    );
}

/// Kills the demo when the test ends, even on failure.
struct Demo(std::process::Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_prints_the_console_address_first_and_serves_it() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().expect("tempdir");
    let http = gpuwatch_e2e::free_addr();
    let mut demo = Demo(
        Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
            .args([
                "demo",
                "--synthetic-hosts",
                "2",
                "--synthetic-gpus",
                "4",
                "--backfill",
                "2m",
                "--interval",
                "2s",
                "--pg-addr",
                "off",
            ])
            .arg("--http-addr")
            .arg(http.to_string())
            .arg("--otlp-http-addr")
            .arg(gpuwatch_e2e::free_addr().to_string())
            .arg("--otlp-grpc-addr")
            .arg(gpuwatch_e2e::free_addr().to_string())
            .arg("--data-dir")
            .arg(dir.path().join("demo"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start gpuwatch demo"),
    );
    let stdout = demo.0.stdout.take().expect("stdout");
    // Keep reading the demo's output to its end (a closed pipe would stop the demo); the first
    // line comes back through the channel.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok).unwrap_or_default());
        for _ in lines {}
    });
    let first = tokio::task::spawn_blocking(move || {
        rx.recv_timeout(Duration::from_secs(120))
            .unwrap_or_default()
    })
    .await
    .expect("read the banner");
    let url = format!("http://{http}");
    assert_eq!(
        first,
        format!("gpuwatch console: {url}/   (open it in a browser: fleet, jobs, alerts, SQL)")
    );
    let page = reqwest::get(format!("{url}/"))
        .await
        .expect("console")
        .text()
        .await
        .expect("html");
    assert!(page.contains("<title>gpuwatch</title>"), "{page}");
    // The pages against the demo's own simulated fleet.
    check(&url, &["pages"]);
}
