//! Every recipe of docs/sql.md runs against a server loaded with fixed data, and the answers are
//! the ones the data implies.

use gpuwatch_e2e::TestServer;

use crate::{now_ns, post_otlp, rows};

/// The ```sql blocks of docs/sql.md, with the heading above each.
fn recipes() -> Vec<(String, String)> {
    let doc = include_str!("../../docs/sql.md");
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            heading = h.to_string();
        } else if line.trim() == "```sql" {
            block = Some(String::new());
        } else if line.trim() == "```" {
            if let Some(b) = block.take() {
                out.push((heading.clone(), b));
            }
        } else if let Some(b) = block.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    out
}

/// One GPU sample as an OTLP/JSON export.
fn sample(t: i64, gpu: &str, job: &str, user: &str, util: f64, sm: f64, energy: f64) -> String {
    let attrs = serde_json::json!([
        {"key": "hw.id", "value": {"stringValue": gpu}},
        {"key": "job.id", "value": {"stringValue": job}},
        {"key": "job.user", "value": {"stringValue": user}},
    ]);
    let gauge = |name: &str, v: f64| {
        serde_json::json!({"name": name, "gauge": {"dataPoints": [
            {"timeUnixNano": t.to_string(), "asDouble": v, "attributes": attrs}
        ]}})
    };
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-1"}}]},
        "scopeMetrics": [{"metrics": [
            gauge("hw.gpu.utilization", util),
            gauge("gpu.sm.active", sm),
            gauge("hw.energy", energy),
        ]}]
    }]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_recipe_in_docs_sql_md_runs_and_gives_the_expected_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let minute = 60_000_000_000i64;
    let start = now_ns() - 5 * minute;
    // GPU-a busy in job j1 with a driver reload (energy reset) between samples 3 and 4; GPU-b
    // allocated to j2 and idle.
    let energy_a = [1000.0, 2000.0, 3000.0, 50.0, 1050.0];
    let energy_b = [10.0, 20.0, 30.0, 40.0, 50.0];
    for i in 0..5 {
        let t = start + i as i64 * minute;
        for body in [
            sample(t, "GPU-a", "j1", "alice", 0.9, 0.8, energy_a[i]),
            sample(t, "GPU-b", "j2", "bob", 0.0, 0.01, energy_b[i]),
        ] {
            let (status, text) =
                post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
            assert_eq!(status, 200, "{text}");
        }
    }
    // An XID on GPU-a and a process on GPU-b, as the agent sends them.
    let t = start + 4 * minute;
    let t_process = now_ns() - 5_000_000_000;
    let extra = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-1"}}]},
        "scopeMetrics": [{"metrics": [
            {"name": "gpu.event", "gauge": {"dataPoints": [{"timeUnixNano": t.to_string(), "asInt": "79",
                "attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-a"}},
                               {"key": "gpu.event.kind", "value": {"stringValue": "xid"}},
                               {"key": "gpu.event.detail", "value": {"stringValue": "xid 79"}}]}]}},
            {"name": "gpu.process.memory.usage", "gauge": {"dataPoints": [{"timeUnixNano": t_process.to_string(),
                "asInt": "1073741824",
                "attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-b"}},
                               {"key": "process.pid", "value": {"intValue": "321"}},
                               {"key": "job.id", "value": {"stringValue": "j2"}}]}]}}
        ]}]
    }]});
    let (status, text) = post_otlp(
        &server.url(),
        "application/json",
        None,
        extra.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let all = recipes();
    assert_eq!(
        all.len(),
        8,
        "recipes found: {:?}",
        all.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    for (name, sql) in &all {
        let r = rows(&server, sql).await;
        match name.as_str() {
            "Idle allocated GPUs now" => {
                assert_eq!(r.len(), 1, "{name}: {r:?}");
                assert_eq!(r[0]["gpu_uuid"], "GPU-b");
                assert_eq!(r[0]["job_id"], "j2");
            }
            "GPU-hours per user this week" => {
                // Both GPUs ran 4 minutes (unless the week began inside the window).
                for row in &r {
                    let h = row["gpu_hours"].as_f64().unwrap_or(-1.0);
                    assert!(h > 0.0 && h <= 0.067, "{name}: {row}");
                }
            }
            "Jobs below 25% SM activity" => {
                assert_eq!(r.len(), 1, "{name}: {r:?}");
                assert_eq!(r[0]["job_id"], "j2");
                assert_eq!(r[0]["avg_sm_active"].as_f64(), Some(0.01));
            }
            "XID errors per host" => {
                assert_eq!(r.len(), 1, "{name}: {r:?}");
                assert_eq!(r[0]["host"], "node-1");
                assert_eq!(r[0]["xid_events"].as_i64(), Some(1));
                assert_eq!(r[0]["codes"], "79");
            }
            "Memory per process now" => {
                assert_eq!(r.len(), 1, "{name}: {r:?}");
                assert_eq!(r[0]["pid"].as_i64(), Some(321), "{name}: {r:?}");
                assert_eq!(r[0]["job_id"], "j2", "{name}: {r:?}");
                assert_eq!(r[0]["used_memory_bytes"].as_i64(), Some(1 << 30));
            }
            "Power from the energy counter, with empty buckets filled" => {
                // 6 buckets for each of the 2 GPUs, whether or not they hold samples.
                assert_eq!(r.len(), 12, "{name}: {r:?}");
                let gpu_b: Vec<f64> = r
                    .iter()
                    .filter(|x| x["gpu_uuid"] == "GPU-b")
                    .filter_map(|x| x["watts"].as_f64())
                    .collect();
                // GPU-b's counter grows 10 J a minute: 1/6 W wherever a bucket has 2+ samples.
                assert!(!gpu_b.is_empty(), "{name}: {r:?}");
                assert!(gpu_b.iter().all(|w| *w == 0.2), "{name}: {gpu_b:?}");
            }
            "Energy per job" => {
                assert_eq!(r.len(), 2, "{name}: {r:?}");
                assert_eq!(r[0]["job_id"], "j1");
                assert_eq!(r[0]["joules"].as_f64(), Some(3050.0), "reset counted once");
                assert_eq!(r[1]["joules"].as_f64(), Some(40.0));
            }
            _ => {
                assert!(!r.is_empty(), "{name}: no rows");
                let times: Vec<String> = r.iter().map(|x| x["time"].to_string()).collect();
                let mut sorted = times.clone();
                sorted.sort();
                assert_eq!(times, sorted, "{name}: sorted by time");
            }
        }
    }
}
