//! The job ledger through the real server: closed hours are folded into the `job_ledger` table
//! (one file per hour, sums equal to a hand computation), and a restarted server reads them
//! back instead of folding them again.

use std::time::{Duration, Instant};

use gpuwatch_e2e::TestServer;

use crate::{now_ns, rows};

const S: i64 = 1_000_000_000;
const HOUR: i64 = 3_600 * S;

/// One sample of job `led-1` on `GPU-l` at `t` with energy counter `joules`.
fn sample(t: i64, joules: f64) -> serde_json::Value {
    let attrs = serde_json::json!([
        {"key": "hw.id", "value": {"stringValue": "GPU-l"}},
        {"key": "hw.model", "value": {"stringValue": "NVIDIA H100 80GB HBM3"}},
        {"key": "job.id", "value": {"stringValue": "led-1"}},
        {"key": "job.user", "value": {"stringValue": "ada"}},
        {"key": "job.account", "value": {"stringValue": "physics"}},
    ]);
    let point = |v: f64| serde_json::json!({"timeUnixNano": t.to_string(), "attributes": attrs, "asDouble": v});
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "ledger-node"}}]},
        "scopeMetrics": [{"metrics": [
            {"name": "hw.gpu.utilization", "gauge": {"dataPoints": [point(0.8)]}},
            {"name": "hw.energy", "gauge": {"dataPoints": [point(joules)]}}
        ]}]
    }]})
}

async fn count(server: &TestServer, sql: &str) -> i64 {
    rows(server, sql).await[0]["n"].as_i64().unwrap_or(-1)
}

/// Polls `sql` (a `count(*) AS n`) until it gives `want`.
async fn wait_for(server: &TestServer, sql: &str, want: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let n = count(server, sql).await;
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {n}, not {want}, after {limit:?}:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_hours_go_to_the_job_ledger_and_a_restart_folds_nothing_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = crate::with_config(
        dir.path(),
        "[cost]\ngpu_hour_usd = [{ model = \"*H100*\", usd = 2.5 }]\nkwh_usd = 0.1\npue = 1.0\n",
    )
    .arg("--persist-interval")
    .arg("1s")
    .arg("--compaction-interval")
    .arg("1s")
    .start();
    // Two closed hours, a sample every 30 s from the first's start to the second's last
    // half-minute, 300 J apart.
    let start = now_ns().div_euclid(HOUR) * HOUR - 3 * HOUR;
    let client = reqwest::Client::new();
    for k in 0..240i64 {
        let body = sample(start + k * 30 * S, 1_000.0 + 300.0 * k as f64);
        let resp = client
            .post(format!("{}/v1/metrics", server.url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("otlp");
        assert_eq!(resp.status().as_u16(), 200);
    }
    // Persisted, rolled up, then folded at the ledger's next tick (30 s).
    let ledger_hours = "SELECT count(DISTINCT time) AS n FROM job_ledger WHERE job_id = 'led-1'";
    wait_for(&server, ledger_hours, 2, Duration::from_secs(150)).await;
    let hour_rows = rows(
        &server,
        &format!(
            "SELECT samples FROM job_ledger WHERE job_id IS NULL AND last_sample_time IS NULL \
             AND time >= to_timestamp_nanos({start}) AND time < to_timestamp_nanos({}) ORDER BY time",
            start + 2 * HOUR
        ),
    )
    .await;
    assert_eq!(
        hour_rows,
        vec![
            serde_json::json!({"samples": 120}),
            serde_json::json!({"samples": 120})
        ]
    );

    // By hand: 239 intervals of 30 s, 239 × 300 J, at 2.50 USD per GPU-hour and 0.10 USD/kWh.
    let (secs, joules) = (239.0 * 30.0, 239.0 * 300.0);
    let usd = secs * 2.5 / 3600.0 + joules * 0.1 / 3.6e6;
    let job_sql =
        "SELECT gpu_seconds, energy_joules, cost_usd, job_account FROM jobs WHERE job_id = 'led-1'";
    let before = rows(&server, job_sql).await;
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    assert!(close(f(&before[0], "gpu_seconds"), secs), "{before:?}");
    assert!(close(f(&before[0], "energy_joules"), joules), "{before:?}");
    assert!(close(f(&before[0], "cost_usd"), usd), "{before:?}");
    assert_eq!(before[0]["job_account"], "physics");
    // A restart reads the table: the job is there at once, and the restarted server folds no
    // hour it had folded (an hour that closes meanwhile is folded on its own).
    let logged = server.log_text().len();
    server.stop();
    server.restart();
    server.wait_until_ready(Duration::from_secs(60));
    wait_for(
        &server,
        "SELECT count(*) AS n FROM jobs WHERE job_id = 'led-1'",
        1,
        Duration::from_secs(30),
    )
    .await;
    // The ledger's first pass has read the table once its watermark is past the two hours.
    let deadline = Instant::now() + Duration::from_secs(30);
    while watermark(&server).await < (start + 2 * HOUR) / S {
        assert!(Instant::now() < deadline, "{}", server.log_text());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = rows(&server, job_sql).await;
    for k in ["gpu_seconds", "energy_joules", "cost_usd"] {
        assert!(close(f(&after[0], k), f(&before[0], k)), "{k}: {after:?}");
    }
    let log = server.log_text();
    let refolds: Vec<&str> = log[logged.min(log.len())..]
        .lines()
        .filter(|l| l.contains("hours folded"))
        .filter(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("hours="))
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n >= 2)
        })
        .collect();
    assert!(refolds.is_empty(), "history folded again: {refolds:?}");
    // The first server did log its folds (the check above can see them).
    assert!(
        log[..logged.min(log.len())].contains("hours folded"),
        "{log}"
    );
}

/// `gpuwatch_jobs_ledger_watermark_seconds` of the server's `/metrics` (0 when absent).
async fn watermark(server: &TestServer) -> i64 {
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("gpuwatch_jobs_ledger_watermark_seconds "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as i64)
}
