//! MIG: with `--source fake --fake-mig 2` every simulated GPU shows two MIG instances, each a
//! `gpu_metrics` row of its own (MIG device UUID, parent index, `mig_instance` `<gi>.<ci>`,
//! null where a MIG handle gives nothing), and the job mapping dir's `index.gi` files label the
//! instances, through the real server into SQL.

use std::time::Duration;

use gpuwatch_agent::collect::fake::FakeNvml;
use gpuwatch_e2e::{TestAgent, TestServer};

use crate::{eventually, rows};

const HOST: &str = "mig-e2e";

#[tokio::test(flavor = "multi_thread")]
async fn mig_instances_are_rows_and_take_their_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(jobs.join(".jobs")).expect("jobs dir");
    std::fs::create_dir_all(dir.path().join("dev")).expect("dev dir");
    // Job 4242 holds GPU instance 2 of GPU 1; job 77 holds the whole of GPU 0.
    std::fs::write(jobs.join("1.2"), "4242\n").expect("mapping");
    std::fs::write(jobs.join(".jobs/4242"), "user=alice\nname=mig-train\n").expect("job info");
    std::fs::write(jobs.join("0"), "77\n").expect("mapping");
    let agent = TestAgent::start(&[
        "--source",
        "fake",
        "--synthetic-gpus",
        "2",
        "--fake-mig",
        "2",
        "--fake-dev-dir",
        dir.path().join("dev").to_str().expect("utf-8"),
        "--job-mapping-dir",
        jobs.to_str().expect("utf-8"),
        "--pod-resources-socket",
        dir.path().join("no-kubelet.sock").to_str().expect("utf-8"),
        "--host",
        HOST,
        "--interval",
        "1s",
        "--flush-interval",
        "0s",
        "--endpoint",
        &server.otlp_url(),
        "--metrics-addr",
        "off",
        "--log-level",
        "error",
    ]);
    let query = format!(
        "SELECT gpu_index, gpu_uuid, mig_instance, job_id, job_user, memory_total_bytes, power_watts \
         FROM gpu_metrics WHERE host = '{HOST}' \
         AND time = (SELECT max(time) FROM gpu_metrics WHERE host = '{HOST}') \
         ORDER BY gpu_index, mig_instance NULLS FIRST"
    );
    eventually(Duration::from_secs(30), "a full sample", || async {
        rows(&server, &query).await.len() == 6
    })
    .await;
    let r = rows(&server, &query).await;
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let got: Vec<String> = r
        .iter()
        .map(|x| {
            format!(
                "{} {} {} {} {}",
                s(&x["gpu_index"]),
                s(&x["gpu_uuid"]),
                s(&x["mig_instance"]),
                s(&x["job_id"]),
                s(&x["job_user"])
            )
        })
        .collect();
    let want = vec![
        format!("0 {} - 77 -", FakeNvml::uuid(0)),
        format!("0 {} 1.0 - -", FakeNvml::mig_uuid(0, 1)),
        format!("0 {} 2.0 - -", FakeNvml::mig_uuid(0, 2)),
        format!("1 {} - - -", FakeNvml::uuid(1)),
        format!("1 {} 1.0 - -", FakeNvml::mig_uuid(1, 1)),
        format!("1 {} 2.0 4242 alice", FakeNvml::mig_uuid(1, 2)),
    ];
    assert_eq!(got, want);
    // The instance rows carry their share of memory and no power (a MIG handle has none);
    // the GPU rows carry the power.
    assert_eq!(
        r[1]["memory_total_bytes"].as_f64(),
        Some(40.0 * 1024f64.powi(3))
    );
    assert!(r[1]["power_watts"].is_null(), "{:?}", r[1]);
    assert!(r[0]["power_watts"].as_f64().is_some(), "{:?}", r[0]);
    drop(agent);
}
