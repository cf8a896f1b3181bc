//! A third-party client: the OpenTelemetry Python SDK sends gauges over OTLP/HTTP; they come back
//! through SQL from `metrics`.

use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::TestServer;

use crate::{eventually, rows};

const SCRIPT: &str = r#"
import sys
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation

endpoint = sys.argv[1]
exporter = OTLPMetricExporter(endpoint=endpoint + "/v1/metrics")
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
provider = MeterProvider(resource=Resource.create({"service.name": "e2e-python", "host.name": "py-host"}), metric_readers=[reader])
meter = provider.get_meter("e2e")
meter.create_observable_gauge("queue.depth", callbacks=[lambda _: [Observation(42.5, {"queue": "train"}), Observation(7, {"queue": "eval"})]])
counter = meter.create_counter("jobs.submitted")
counter.add(3, {"cluster": "a"})
# shutdown collects and exports once
provider.shutdown()
print("sent")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn opentelemetry_python_sdk_gauges_come_back_through_sql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(server.otlp_url())
        .output()
        .expect("python3 must be installed (bash .ci/run installs the OpenTelemetry SDK)");
    assert!(
        out.status.success(),
        "the OpenTelemetry Python SDK failed (install it with `pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http`, as .ci/run does):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "the python gauges in metrics",
        || async {
            !rows(
                &server,
                "SELECT * FROM metrics WHERE metric = 'queue.depth'",
            )
            .await
            .is_empty()
        },
    )
    .await;
    let r = rows(
        &server,
        "SELECT labels['queue'] AS queue, value, labels['service.name'] AS service, labels['host.name'] AS host \
         FROM metrics WHERE metric = 'queue.depth' ORDER BY queue",
    )
    .await;
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(r[0]["queue"], "eval");
    assert_eq!(r[0]["value"].as_f64(), Some(7.0));
    assert_eq!(r[1]["queue"], "train");
    assert_eq!(r[1]["value"].as_f64(), Some(42.5));
    assert_eq!(r[1]["service"], "e2e-python");
    assert_eq!(r[1]["host"], "py-host");
    let c = rows(
        &server,
        "SELECT value FROM metrics WHERE metric = 'jobs.submitted'",
    )
    .await;
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["value"].as_f64(), Some(3.0));
}
