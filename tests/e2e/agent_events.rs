//! Events and processes from the agent to SQL. With `--source fake`, an XID written to
//! `<dev-dir>/nvidia<i>.xid` is what an NVML event set would report, and a process holding
//! `<dev-dir>/nvidia<i>` open is a process on GPU `i`. The server stores the `gpu.event` point
//! as a `gpu_events` row, `xid_errors_total` counts it on that GPU only, and the process's
//! `gpu.process.*` points become one `gpu_processes` row per sample (docs/schema.md).

use std::io::Write;
use std::time::Duration;

use gpuwatch_e2e::{TestAgent, TestServer};

use crate::{eventually, rows, scalar};

#[tokio::test(flavor = "multi_thread")]
async fn an_xid_and_a_process_reach_their_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(&dev).expect("dev dir");
    // A process "on GPU 1": it holds the fake device node open, and carries a Slurm job in its
    // environment as srun would set it.
    let node = dev.join("nvidia1");
    std::fs::write(&node, b"").expect("device node");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Kill(
        std::process::Command::new("sleep")
            .arg("300")
            .stdin(std::fs::File::open(&node).expect("open node"))
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_USER", "alice")
            .spawn()
            .expect("spawn sleep"),
    );
    let pid = child.0.id();
    let server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let endpoint = server.otlp_url();
    let _agent = TestAgent::start(&[
        "--source",
        "fake",
        "--synthetic-gpus",
        "2",
        "--fake-dev-dir",
        dev.to_str().expect("utf-8 path"),
        "--job-mapping-dir",
        dir.path().join("no-jobs").to_str().expect("utf-8 path"),
        "--interval",
        "300ms",
        "--flush-interval",
        "0s",
        "--endpoint",
        &endpoint,
        "--host",
        "xid-e2e",
        "--metrics-addr",
        "off",
    ]);
    let count = |gpu: u32| {
        format!(
            "SELECT max(xid_errors_total) FROM gpu_metrics WHERE host = 'xid-e2e' AND gpu_index = {gpu}"
        )
    };
    eventually(
        Duration::from_secs(30),
        "first samples with a zero count",
        || async {
            rows(&server, &count(1))
                .await
                .first()
                .and_then(|r| r.as_object()?.values().next()?.as_f64())
                == Some(0.0)
        },
    )
    .await;

    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dev.join("nvidia1.xid"))
        .expect("xid file");
    writeln!(f, "79").expect("write xid");
    drop(f);

    eventually(
        Duration::from_secs(30),
        "xid_errors_total = 1 on gpu 1",
        || async { scalar(&server, &count(1)).await == 1.0 },
    )
    .await;
    assert_eq!(scalar(&server, &count(0)).await, 0.0, "gpu 0 had no xid");
    let events = rows(
        &server,
        "SELECT kind, code, detail, gpu_uuid FROM gpu_events WHERE host = 'xid-e2e'",
    )
    .await;
    assert_eq!(events.len(), 1, "exactly one gpu_events row: {events:?}");
    let e = &events[0];
    assert_eq!(e["code"].as_i64(), Some(79), "{e}");
    assert_eq!(e["kind"], "xid", "{e}");
    assert_eq!(e["detail"], "xid 79", "{e}");
    assert_eq!(
        e["gpu_uuid"], "GPU-fa4e0000-0000-4000-8000-000000000001",
        "{e}"
    );
    let left_in_metrics = scalar(
        &server,
        "SELECT count(*) FROM metrics WHERE metric LIKE 'gpu.event%' OR metric LIKE 'gpu.process.%'",
    )
    .await;
    assert_eq!(
        left_in_metrics, 0.0,
        "process and event points left in metrics"
    );

    let procs = rows(
        &server,
        "SELECT pid, gpu_uuid, job_id, job_user, used_memory_bytes, sm_utilization \
         FROM gpu_processes WHERE host = 'xid-e2e' ORDER BY time DESC LIMIT 1",
    )
    .await;
    assert_eq!(procs.len(), 1, "no gpu_processes row: {procs:?}");
    let p = &procs[0];
    assert_eq!(p["pid"].as_u64(), Some(u64::from(pid)), "{p}");
    assert_eq!(
        p["gpu_uuid"], "GPU-fa4e0000-0000-4000-8000-000000000001",
        "{p}"
    );
    assert_eq!(p["job_id"], "4242", "{p}");
    assert_eq!(p["job_user"], "alice", "{p}");
    assert_eq!(p["used_memory_bytes"].as_i64(), Some(1 << 30), "{p}");
    assert_eq!(p["sm_utilization"].as_f64(), Some(1.0), "{p}");
    let other_gpus = scalar(
        &server,
        "SELECT count(*) FROM gpu_processes WHERE host = 'xid-e2e' AND gpu_uuid NOT LIKE '%0001'",
    )
    .await;
    assert_eq!(other_gpus, 0.0, "gpu 0 has no process");
}
