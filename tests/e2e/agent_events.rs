//! XID events from the agent to SQL: with `--source fake`, an XID written to
//! `<dev-dir>/nvidia<i>.xid` is what an NVML event set would report. The server stores the
//! `gpu.event` point (docs/schema.md) and `xid_errors_total` counts it on that GPU only.

use std::io::Write;
use std::time::Duration;

use gpuwatch_e2e::{TestAgent, TestServer};

use crate::{eventually, rows, scalar};

#[tokio::test(flavor = "multi_thread")]
async fn an_xid_reaches_sql_as_an_event_and_a_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(&dev).expect("dev dir");
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
        "SELECT value, labels['gpu.event.kind'] AS kind, labels['gpu.index'] AS gpu, \
         labels['hw.id'] AS uuid FROM metrics WHERE metric = 'gpu.event' \
         AND labels['host.name'] = 'xid-e2e'",
    )
    .await;
    assert_eq!(events.len(), 1, "exactly one gpu.event point: {events:?}");
    let e = &events[0];
    assert_eq!(e["value"].as_f64(), Some(79.0), "{e}");
    assert_eq!(e["kind"], "xid", "{e}");
    assert_eq!(e["gpu"], "1", "{e}");
    assert_eq!(e["uuid"], "GPU-fa4e0000-0000-4000-8000-000000000001", "{e}");
}
