//! Prometheus remote write: a real Prometheus scrapes a dcgm-exporter exposition and the
//! server's own `/metrics`, and remote-writes both to gpuwatch; dcgm's series come back from
//! `gpu_metrics` with units converted, the rest from `metrics`. Bad bodies get 4xx answers.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuwatch_e2e::{TestServer, free_addr};
use gpuwatch_store::ingest::remote_write::proto::{Label, Sample, TimeSeries, WriteRequest};
use prost::Message;

use crate::{eventually, now_ns, rows};

/// What dcgm-exporter 3.x prints for two H100s, one in a Slurm job (its default counters and
/// labels; the values are arbitrary but in range).
const DCGM_EXPOSITION: &str = r#"# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 1980
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-66666666-7777-8888-9999-000000000000",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 345
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-66666666-7777-8888-9999-000000000000",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 40960
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-66666666-7777-8888-9999-000000000000",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 40000
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 9876543210
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 612.25
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned (in %).
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 0.812
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555555",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node-1",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="7001"} 0
"#;

/// Serves `body` on every request, from a thread, until the process ends.
fn serve_exposition(body: &'static str) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind exposition");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_prometheus(dir: &std::path::Path, targets: &str, write_url: &str) -> Prometheus {
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
         scrape_configs:\n{targets}\
         remote_write:\n  - url: {write_url}\n    queue_config:\n      batch_send_deadline: 1s\n      min_backoff: 100ms\n      max_backoff: 1s\n"
    );
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, config).expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={}", free_addr()))
        .arg("--storage.remote.flush-deadline=5s")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start prometheus ({e}): install it with `apt-get install -y prometheus`, as .ci/run does"
            )
        });
    Prometheus(child)
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_remote_writes_dcgm_exporter_series_into_gpu_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let dcgm = serve_exposition(DCGM_EXPOSITION);
    let targets = format!(
        "  - job_name: dcgm\n    static_configs:\n      - targets: ['{dcgm}']\n\
         \x20 - job_name: gpuwatch\n    static_configs:\n      - targets: ['{}']\n",
        server.http
    );
    let _prom = start_prometheus(
        dir.path(),
        &targets,
        &format!("{}/api/v1/write", server.url()),
    );
    eventually(
        Duration::from_secs(60),
        "dcgm-exporter rows in gpu_metrics and gpuwatch_up in metrics",
        || async {
            let gpu = rows(
                &server,
                "SELECT count(*) AS n FROM gpu_metrics WHERE host = 'dcgm-node-1' AND energy_joules IS NOT NULL",
            )
            .await;
            let own = rows(&server, "SELECT count(*) AS n FROM metrics WHERE metric = 'gpuwatch_up'").await;
            gpu[0]["n"].as_i64().unwrap_or(0) > 0 && own[0]["n"].as_i64().unwrap_or(0) > 0
        },
    )
    .await;
    let r = rows(
        &server,
        "SELECT gpu_index, gpu_model, job_id, scheduler, gpu_utilization, sm_active, memory_used_bytes, \
                memory_total_bytes, energy_joules, power_watts, sm_clock_mhz, temperature_celsius \
         FROM gpu_metrics WHERE host = 'dcgm-node-1' AND gpu_uuid = 'GPU-11111111-2222-3333-4444-555555555555' \
         AND gpu_utilization IS NOT NULL ORDER BY time DESC LIMIT 1",
    )
    .await;
    assert_eq!(r.len(), 1, "{r:?}");
    let row = &r[0];
    assert_eq!(row["gpu_index"], 0);
    assert_eq!(row["gpu_model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(row["job_id"], "7001");
    assert_eq!(row["scheduler"], "slurm");
    assert_eq!(
        row["gpu_utilization"].as_f64(),
        Some(0.87),
        "percent → ratio"
    );
    assert_eq!(row["sm_active"].as_f64(), Some(0.812), "already a ratio");
    assert_eq!(
        row["memory_used_bytes"].as_i64(),
        Some(40960 * 1024 * 1024),
        "MiB → bytes"
    );
    assert_eq!(
        row["memory_total_bytes"].as_i64(),
        Some((40960 + 40000) * 1024 * 1024)
    );
    assert_eq!(row["energy_joules"].as_f64(), Some(9_876_543.21), "mJ → J");
    assert_eq!(row["power_watts"].as_f64(), Some(612.25));
    assert_eq!(row["sm_clock_mhz"].as_i64(), Some(1980));
    assert!(
        row["temperature_celsius"].is_null(),
        "not sent: null, not 0"
    );

    let idle = rows(
        &server,
        "SELECT gpu_utilization, job_id FROM gpu_metrics WHERE gpu_uuid = 'GPU-66666666-7777-8888-9999-000000000000' \
         AND gpu_utilization IS NOT NULL LIMIT 1",
    )
    .await;
    assert_eq!(idle[0]["gpu_utilization"].as_f64(), Some(0.0));
    assert!(idle[0]["job_id"].is_null());

    // The XID code is not a count: it stays in metrics, with dcgm's and Prometheus's labels.
    let xid = rows(
        &server,
        "SELECT value, labels['UUID'] AS uuid, labels['job'] AS scrape_job FROM metrics \
         WHERE metric = 'DCGM_FI_DEV_XID_ERRORS' LIMIT 1",
    )
    .await;
    assert_eq!(xid.len(), 1, "{xid:?}");
    assert_eq!(xid[0]["uuid"], "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!(xid[0]["scrape_job"], "dcgm");
    // Prometheus's own `up` series for both scrape jobs.
    let up = rows(
        &server,
        "SELECT DISTINCT labels['job'] AS j FROM metrics WHERE metric = 'up' ORDER BY j",
    )
    .await;
    let jobs: Vec<_> = up
        .iter()
        .map(|r| r["j"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(jobs, vec!["dcgm", "gpuwatch"]);
}

fn snappy(req: &WriteRequest) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(&req.encode_to_vec())
        .expect("compress")
}

async fn post_write(server: &TestServer, body: Vec<u8>, encoding: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/api/v1/write", server.url()))
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", encoding)
        .header("x-prometheus-remote-write-version", "0.1.0")
        .body(body)
        .send()
        .await
        .expect("remote write request")
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_write_policy_and_bad_bodies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now_ms = now_ns() / 1_000_000;
    let label = |n: &str, v: &str| Label {
        name: n.to_string(),
        value: v.to_string(),
    };
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![label("__name__", "rw_policy"), label("case", "a")],
            samples: vec![
                Sample {
                    value: 1.0,
                    timestamp: now_ms,
                },
                Sample {
                    value: 2.0,
                    timestamp: now_ms - 60_000,
                },
                Sample {
                    value: f64::NAN,
                    timestamp: now_ms + 1,
                },
                Sample {
                    value: 3.0,
                    timestamp: now_ms + 24 * 3600 * 1000,
                },
            ],
        }],
    };
    let resp = post_write(&server, snappy(&req), "snappy").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(
        resp.headers()
            .get("x-gpuwatch-rejected-samples")
            .and_then(|v| v.to_str().ok()),
        Some("2")
    );
    let r = rows(
        &server,
        "SELECT value FROM metrics WHERE metric = 'rw_policy' ORDER BY time",
    )
    .await;
    let values: Vec<_> = r
        .iter()
        .map(|x| x["value"].as_f64().unwrap_or(-1.0))
        .collect();
    assert_eq!(
        values,
        vec![2.0, 1.0],
        "out-of-order kept, nan and far-future rejected"
    );

    for (body, encoding, want) in [
        (
            b"not snappy at all".to_vec(),
            "snappy",
            "malformed remote write",
        ),
        (
            snap::raw::Encoder::new()
                .compress_vec(b"\x0a\xff\xff")
                .expect("compress"),
            "snappy",
            "malformed remote write protobuf",
        ),
        (snappy(&req), "gzip", "snappy"),
        (Vec::new(), "snappy", "empty body"),
    ] {
        let resp = post_write(&server, body, encoding).await;
        assert_eq!(resp.status().as_u16(), 400);
        let text = resp.text().await.expect("body");
        let err: serde_json::Value = serde_json::from_str(&text).expect("json error");
        let msg = err["error"].as_str().expect("error message");
        assert!(msg.contains(want), "{msg}");
    }
    // The self metrics count what happened.
    let (_, metrics) = gpuwatch_e2e::http_get(server.http, "/metrics").expect("metrics");
    assert!(
        metrics
            .contains("gpuwatch_remote_write_samples_total{outcome=\"rejected_out_of_range\"} 1"),
        "{metrics}"
    );
}
