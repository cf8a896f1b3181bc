//! Work done reported by the job itself: two processes of a job send `job.samples` with the real
//! OpenTelemetry Python SDK (the snippet of docs/cost.md), while the job's GPU samples arrive as
//! the agent sends them; `jobs`, the job report over HTTP and `gpuwatch job` say what the job
//! did and what a million samples cost, checked against a hand computation to the cent.

use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::{TestServer, bin_dir};

use crate::{eventually, now_ns, post_otlp, rows};

const JOB: &str = "w-4711";

/// Two processes of the job: the first counts 1,000 samples, exports, counts 500 more and exports
/// again at shutdown; the second counts 300. The job's work is 1,800 samples.
const SCRIPT: &str = r#"
import os, socket, sys
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

endpoint, job = sys.argv[1], sys.argv[2]
for rank, counts in ((0, (1000, 500)), (1, (300,))):
    resource = Resource.create({"job.id": job, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}:{rank}"})
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint + "/v1/metrics"), 3_600_000)
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    samples = provider.get_meter("train").create_counter("job.samples")
    for n in counts:
        samples.add(n)
        provider.force_flush()
    provider.shutdown()
print("sent")
"#;

/// One GPU's sample as the agent sends it, with the job's labels.
fn gpu_sample(t: i64, gpu: usize) -> serde_json::Value {
    let attrs = serde_json::json!([
        {"key": "hw.id", "value": {"stringValue": format!("GPU-work-{gpu}")}},
        {"key": "gpu.index", "value": {"intValue": gpu.to_string()}},
        {"key": "hw.model", "value": {"stringValue": "NVIDIA H100 80GB HBM3"}},
        {"key": "job.id", "value": {"stringValue": JOB}},
        {"key": "job.user", "value": {"stringValue": "alice"}},
        {"key": "job.name", "value": {"stringValue": "train-tinylm"}},
        {"key": "job.scheduler", "value": {"stringValue": "slurm"}},
    ]);
    serde_json::json!({"name": "hw.gpu.utilization", "gauge": {"dataPoints": [
        {"timeUnixNano": t.to_string(), "attributes": attrs, "asDouble": 0.8}
    ]}})
}

/// Two GPUs of the job, a sample every 10 s for 60 s, ending now.
async fn send_gpu_samples(server: &TestServer) {
    let end = now_ns();
    let metrics: Vec<serde_json::Value> = (0..=6)
        .flat_map(|k| {
            let t = end - (6 - k) * 10_000_000_000;
            [gpu_sample(t, 0), gpu_sample(t, 1)]
        })
        .collect();
    let body = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "work-node"}}]},
        "scopeMetrics": [{"metrics": metrics}]
    }]});
    let (status, text) = post_otlp(
        &server.otlp_url(),
        "application/json",
        None,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
}

fn send_work_with_the_python_sdk(server: &TestServer) {
    let out = Command::new("python3")
        .args(["-c", SCRIPT, &server.otlp_url(), JOB])
        .output()
        .expect("python3 must be installed (bash .ci/run installs the OpenTelemetry SDK)");
    assert!(
        out.status.success(),
        "the OpenTelemetry Python SDK failed (pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http, as .ci/run does):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_reporting_its_samples_gets_usd_per_million_samples() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("gpuwatch.toml");
    // USD 3.60 per GPU-hour: a GPU-second costs a tenth of a cent.
    std::fs::write(&cfg, "[cost]\ndefault_gpu_hour_usd = 3.6\n").expect("config");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--config")
        .arg(cfg.to_str().expect("utf-8 path"))
        .start();
    send_gpu_samples(&server).await;
    send_work_with_the_python_sdk(&server);
    let q = format!(
        "SELECT max(work_unit) AS unit, sum(work_done) AS work, sum(gpu_seconds) AS gpu_seconds, \
         sum(cost_usd) AS usd, max(usd_per_million_units) AS usd_per_million FROM jobs WHERE job_id = '{JOB}'"
    );
    eventually(
        Duration::from_secs(10),
        "the job's work in jobs",
        || async { rows(&server, &q).await[0]["work"].as_f64() == Some(1800.0) },
    )
    .await;
    let r = &rows(&server, &q).await[0];
    assert_eq!(r["unit"], "job.samples");
    // 2 GPUs x 60 s = 120 GPU-seconds, USD 0.12; 1,800 samples: USD 66.67 per million.
    assert_eq!(r["gpu_seconds"].as_f64(), Some(120.0));
    let usd = r["usd"].as_f64().expect("usd");
    assert!((usd - 0.12).abs() < 1e-9, "{usd}");
    let per_million = r["usd_per_million"].as_f64().expect("usd per million");
    assert_eq!(format!("{per_million:.2}"), "66.67");

    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", JOB, "--server", &server.url(), "--format", "json"])
        .output()
        .expect("gpuwatch job");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["work"]["unit"], "job.samples");
    assert_eq!(report["work"]["done"].as_f64(), Some(1800.0));
    // 1,800 samples in 120 GPU-seconds: 54,000 per GPU-hour; over the 60 s the job ran: 30/s.
    let close = |k: &str, want: f64| {
        let got = report["work"][k].as_f64().unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-6 * want, "{k}: {got} vs {want}");
    };
    close("per_gpu_hour", 54_000.0);
    close("per_second", 30.0);
    let text = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", JOB, "--server", &server.url()])
        .output()
        .expect("gpuwatch job");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("work done 1800.0 job.samples") && text.contains("USD 66.6667 per million"),
        "{text}"
    );
}

/// The SQL of the built-in rule `name` (deploy/rules/jobs.yaml), as the server runs it.
fn rule_sql(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rules/jobs.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/rules/jobs.yaml");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
    doc["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .find(|r| r["alert"].as_str() == Some(name))
        .and_then(|r| r["sql"].as_str())
        .unwrap_or_else(|| panic!("no rule {name} with sql in {}", path.display()))
        .to_string()
}

/// Real runs of one small PyTorch training job on an H100 (tests/fixtures/gpu-traces): three
/// earlier runs with 8 DataLoader workers and pinned memory, then a run with the loader in the
/// training process (0 workers), which trains at a quarter of the rate. Each run reports its
/// samples as the job would; JobRegression must fire on work per GPU-second for the slow run,
/// although its SM activity while the GPU is busy stays what it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_starved_data_loader_fires_job_regression_on_work_done() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now = now_ns() as f64 / 1e9;
    let runs = [
        ("train_workers8", "run-1"),
        ("train_workers8", "run-2"),
        ("train_workers8", "run-3"),
        ("train_workers0", "run-4"),
    ];
    // Each run stretched to 12 minutes (the rule judges runs at least 10 minutes in), one after
    // another, the last ending now.
    for (k, (trace, id)) in runs.iter().enumerate() {
        let end = format!("{:.3}", now - (3 - k) as f64 * 13.0 * 60.0);
        crate::limiter::replay(
            &server,
            "train-node",
            &["--job-id", id, "--min-span", "12m", "--end", &end],
            &[trace],
        );
    }
    let fired = rows(&server, &rule_sql("JobRegression")).await;
    assert_eq!(fired.len(), 1, "{fired:?}");
    let a = &fired[0];
    assert_eq!(
        (a["job_id"].as_str(), a["basis"].as_str()),
        (Some("run-4"), Some("work"))
    );
    assert_eq!(a["job_name"], "train-tinylm");
    let drop = a["value"].as_f64().expect("value");
    // The workloads measured 300 and 1,319 samples/s: a drop of about three quarters.
    assert!((0.65..0.85).contains(&drop), "drop {drop}");

    // What SM activity alone says: while the GPU is busy, the SMs are as active as before.
    let busy = rows(
        &server,
        "SELECT job_id, avg(sm_active) / avg(gpu_utilization) AS fill FROM gpu_metrics \
         WHERE gpu_utilization > 0.05 GROUP BY job_id ORDER BY job_id",
    )
    .await;
    let fill = |i: usize| busy[i]["fill"].as_f64().expect("fill");
    assert_eq!(busy.len(), 4, "{busy:?}");
    assert!(
        (fill(3) / fill(0) - 1.0).abs() < 0.15,
        "SM activity while busy: {} before, {} in the slow run",
        fill(0),
        fill(3)
    );
}
