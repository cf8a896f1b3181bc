//! TLS on every listener (`--tls-cert`, `--tls-key`) with a self-signed certificate made by the
//! openssl CLI: curl over HTTPS (health, SQL, OTLP/HTTP), an OTLP/gRPC export over TLS from the
//! OpenTelemetry Python SDK, and psql with `sslmode=verify-full`; plain connections are refused.

use std::path::Path;
use std::process::Command;

use gpuwatch_e2e::TestServer;

use crate::{now_ns, otlp_json};

/// A self-signed certificate for 127.0.0.1 and its key, in `dir`.
fn self_signed(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=gpuwatch-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl CLI");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// curl with the test CA; returns (exit ok, stdout).
fn curl(ca: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(args)
        .output()
        .expect("curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn sql(server: &TestServer, ca: &Path, q: &str) -> serde_json::Value {
    let body = serde_json::json!({ "sql": q }).to_string();
    let (ok, out) = curl(
        ca,
        &[
            "-f",
            "-H",
            "content-type: application/json",
            "--data",
            &body,
            &format!("{}/api/v1/sql", server.url()),
        ],
    );
    assert!(ok, "{q}: {out}");
    serde_json::from_str(&out).expect("json")
}

const GRPC_SCRIPT: &str = r#"
import sys, grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Observation

endpoint, ca = sys.argv[1], sys.argv[2]
creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
exporter = OTLPMetricExporter(endpoint=endpoint, credentials=creds, insecure=False)
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60000)
provider = MeterProvider(resource=Resource.create({"host.name": "tls-host"}), metric_readers=[reader])
meter = provider.get_meter("e2e")
meter.create_observable_gauge("tls.grpc.gauge", callbacks=[lambda _: [Observation(3.25)]])
provider.shutdown()
print("sent")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn every_listener_speaks_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path());
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .tls(&cert, &key)
        .start();

    // HTTPS: health and SQL; plain HTTP gets no answer.
    let (ok, body) = curl(&cert, &["-f", &format!("{}/healthz", server.url())]);
    assert!(ok && body == "ok\n", "{body}");
    assert!(
        gpuwatch_e2e::http_get(server.http, "/healthz")
            .map(|(code, _)| code != 200)
            .unwrap_or(true),
        "plain HTTP must not be served"
    );
    assert_eq!(sql(&server, &cert, "SELECT 1 AS one")[0]["one"], 1);

    // OTLP/HTTP over TLS on its own listener.
    let t = now_ns();
    let (ok, out) = curl(
        &cert,
        &[
            "-f",
            "-H",
            "content-type: application/json",
            "--data",
            &otlp_json("tls.http.gauge", 1.5, t, &[]),
            &format!("{}/v1/metrics", server.otlp_url()),
        ],
    );
    assert!(ok, "{out}");

    // OTLP/gRPC over TLS from the OpenTelemetry Python SDK.
    let out = Command::new("python3")
        .arg("-c")
        .arg(GRPC_SCRIPT)
        .arg(format!("https://{}", server.grpc))
        .arg(&cert)
        .output()
        .expect("python3 (bash .ci/run installs the OpenTelemetry SDK)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = sql(
        &server,
        &cert,
        "SELECT metric, value FROM metrics WHERE metric LIKE 'tls.%' ORDER BY metric",
    );
    assert_eq!(
        got,
        serde_json::json!([
            {"metric": "tls.grpc.gauge", "value": 3.25},
            {"metric": "tls.http.gauge", "value": 1.5},
        ])
    );

    // Postgres: TLS verified against the certificate; plain connections refused.
    let conn = format!("sslrootcert={}", cert.display());
    let out = server.psql(
        None,
        &format!("verify-full {conn}"),
        &["-c", "SELECT 11", "-c", "\\conninfo"],
    );
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.starts_with("11\n"), "{}", out.stdout);
    assert!(out.stdout.contains("SSL connection"), "{}", out.stdout);
    let plain = server.psql(None, "disable", &["-c", "SELECT 12"]);
    assert!(!plain.ok, "a plain Postgres connection must be refused");
    assert!(plain.stderr.contains("requires TLS"), "{}", plain.stderr);
}

#[test]
fn bad_certificate_files_stop_the_server_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = self_signed(dir.path());
    let bin = gpuwatch_e2e::bin_dir().join("gpuwatch");
    let run = |extra: &[&str]| {
        let out = Command::new(&bin)
            .args(["serve", "--pg-addr", "off", "--data-dir"])
            .arg(dir.path().join("d"))
            .args([
                "--http-addr",
                "127.0.0.1:0",
                "--otlp-http-addr",
                "127.0.0.1:0",
            ])
            .args(["--otlp-grpc-addr", "127.0.0.1:0"])
            .args(extra)
            .output()
            .expect("gpuwatch");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let c = cert.to_str().expect("utf-8");
    let k = key.to_str().expect("utf-8");
    let (code, err) = run(&["--tls-cert", "/nonexistent/cert.pem", "--tls-key", k]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cannot read --tls-cert /nonexistent/cert.pem"),
        "{err}"
    );
    let (code, err) = run(&["--tls-cert", k, "--tls-key", k]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no PEM certificate"), "{err}");
    let (code, err) = run(&["--tls-cert", c, "--tls-key", c]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key"), "{err}");
    let (code, err) = run(&["--tls-cert", c]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs --tls-key"), "{err}");
}
