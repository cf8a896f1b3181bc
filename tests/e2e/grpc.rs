//! OTLP/gRPC: the OpenTelemetry Python SDK's gRPC exporter sends a gauge, a counter and a
//! histogram to `--otlp-grpc-addr`; they come back through SQL.

use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::TestServer;

use crate::{eventually, rows};

const SCRIPT: &str = r#"
import sys
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation

exporter = OTLPMetricExporter(endpoint=sys.argv[1], insecure=True)
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
provider = MeterProvider(resource=Resource.create({"service.name": "e2e-grpc", "host.name": "grpc-host"}), metric_readers=[reader])
meter = provider.get_meter("e2e")
meter.create_observable_gauge("grpc.queue.depth", callbacks=[lambda _: [Observation(11.5, {"queue": "train"})]])
meter.create_counter("grpc.jobs.submitted").add(4, {"cluster": "b"})
h = meter.create_histogram("grpc.latency", unit="s")
for v in (0.003, 0.2, 7.0):
    h.record(v)
if not reader.force_flush(10000):
    sys.exit("export failed")
provider.shutdown()
print("sent")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn opentelemetry_python_sdk_over_grpc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(format!("http://{}", server.grpc))
        .output()
        .expect("python3 must be installed (bash .ci/run installs the OpenTelemetry SDK)");
    assert!(
        out.status.success(),
        "the OpenTelemetry Python gRPC exporter failed (install it with `pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-grpc`, as .ci/run does):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "the grpc gauge in metrics",
        || async {
            !rows(
                &server,
                "SELECT * FROM metrics WHERE metric = 'grpc.queue.depth'",
            )
            .await
            .is_empty()
        },
    )
    .await;
    let r = rows(
        &server,
        "SELECT value, labels['queue'] AS queue, labels['host.name'] AS host FROM metrics WHERE metric = 'grpc.queue.depth'",
    )
    .await;
    assert_eq!(r[0]["value"].as_f64(), Some(11.5));
    assert_eq!(r[0]["queue"], "train");
    assert_eq!(r[0]["host"], "grpc-host");
    let c = rows(
        &server,
        "SELECT max(value) AS v FROM metrics WHERE metric = 'grpc.jobs.submitted'",
    )
    .await;
    assert_eq!(c[0]["v"].as_f64(), Some(4.0));
    let h = rows(
        &server,
        "SELECT metric, max(value) AS v FROM metrics WHERE metric IN ('grpc.latency_count', 'grpc.latency_sum') GROUP BY metric ORDER BY metric",
    )
    .await;
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h[0]["v"].as_f64(), Some(3.0));
    let sum = h[1]["v"].as_f64().unwrap_or(0.0);
    assert!((sum - 7.203).abs() < 1e-9, "{sum}");
    let inf = rows(
        &server,
        "SELECT max(value) AS v FROM metrics WHERE metric = 'grpc.latency_bucket' AND labels['le'] = '+Inf'",
    )
    .await;
    assert_eq!(inf[0]["v"].as_f64(), Some(3.0));
}
