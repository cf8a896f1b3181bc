//! The agent configured the OpenTelemetry way (`OTEL_EXPORTER_OTLP_*`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `--header`), against receivers that require TLS and a header: a gRPC receiver here that wants
//! mutual TLS and an `x-scope-orgid` header (as Mimir does), and the real server over HTTPS with
//! the metrics-specific endpoint given as a full URL.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuwatch_e2e::{TestServer, bin_dir, free_addr};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::eventually;

/// A CA, a server certificate for 127.0.0.1 and a client certificate it signed, made by the
/// openssl CLI in `dir`: (ca, server cert, server key, client cert, client key).
fn pki(dir: &Path) -> [PathBuf; 5] {
    let p = |n: &str| dir.join(n);
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    ca.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=keyCertSign",
    ]);
    run(&ca);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let mut req = vec!["req"];
        req.extend(ec);
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let subj = format!("/CN={name}");
        req.extend(["-subj", &subj, "-keyout", &key, "-out", &csr]);
        run(&req);
        let extfile = format!("{name}.ext");
        std::fs::write(p(&extfile), ext).expect("ext file");
        let pem = format!("{name}.pem");
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &extfile,
        ]);
    }
    [
        p("ca.pem"),
        p("server.pem"),
        p("server.key"),
        p("client.pem"),
        p("client.key"),
    ]
}

/// What the receiver saw: per request, its `x-scope-orgid` and `api-key` metadata and the
/// resource attributes of its first resource.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>, Vec<(String, String)>)>>>;

struct Receiver {
    seen: Seen,
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let meta = |k: &str| {
            request
                .metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (org, key) = (meta("x-scope-orgid"), meta("api-key"));
        let attrs = request
            .get_ref()
            .resource_metrics
            .first()
            .and_then(|r| r.resource.as_ref())
            .map(|r| {
                r.attributes
                    .iter()
                    .filter_map(|kv| {
                        let v = kv.value.as_ref()?.value.as_ref()?;
                        match v {
                            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                                Some((kv.key.clone(), s.clone()))
                            }
                            _ => None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ok = org.as_deref() == Some("team-a");
        self.seen.lock().expect("lock").push((org, key, attrs));
        if !ok {
            return Err(tonic::Status::unauthenticated("missing x-scope-orgid"));
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent(args: &[&str], env: &[(&str, String)]) -> Agent {
    let mut cmd = Command::new(bin_dir().join("gpuwatch-agent"));
    cmd.args(args)
        .args([
            "--source",
            "synthetic",
            "--synthetic-gpus",
            "2",
            "--interval",
            "1s",
        ])
        .args([
            "--flush-interval",
            "0s",
            "--metrics-addr",
            "off",
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    Agent(cmd.spawn().expect("start gpuwatch-agent"))
}

#[tokio::test(flavor = "multi_thread")]
async fn otel_variables_reach_a_grpc_receiver_that_wants_mutual_tls_and_a_header() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let [ca, cert, key, client_cert, client_key] = pki(dir.path());
    let read = |p: &PathBuf| std::fs::read(p).expect("pem");
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read(&cert), read(&key)))
        .client_ca_root(Certificate::from_pem(read(&ca)));
    let addr = free_addr();
    let seen: Seen = Arc::default();
    let service = MetricsServiceServer::new(Receiver {
        seen: Arc::clone(&seen),
    })
    .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let server = tokio::spawn(
        Server::builder()
            .tls_config(tls)
            .expect("tls config")
            .add_service(service)
            .serve(addr),
    );
    let env = vec![
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("https://{addr}")),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.display().to_string()),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            client_cert.display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            client_key.display().to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "X-Scope-OrgID=team-a,api-key=from-env".to_string(),
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "cluster=prod,deployment.environment=test".to_string(),
        ),
    ];
    let _agent = agent(
        &["--header", "api-key=from-flag", "--host", "otel-node"],
        &env,
    );
    let wait = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = seen.lock().expect("lock").len() >= 2;
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < wait,
            "no export reached the TLS receiver"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = seen.lock().expect("lock").clone();
    let (org, api_key, attrs) = &got[0];
    assert_eq!(org.as_deref(), Some("team-a"));
    // --header wins over OTEL_EXPORTER_OTLP_HEADERS by name.
    assert_eq!(api_key.as_deref(), Some("from-flag"));
    for (k, v) in [
        ("cluster", "prod"),
        ("deployment.environment", "test"),
        ("host.name", "otel-node"),
    ] {
        assert!(
            attrs.iter().any(|(a, b)| a == k && b == v),
            "{k}={v} not in {attrs:?}"
        );
    }
    // Without the client certificate the receiver refuses the connection: nothing more arrives.
    drop(_agent);
    let before = seen.lock().expect("lock").len();
    let mut no_client = env.clone();
    no_client.retain(|(k, _)| !k.contains("CLIENT"));
    let _plain = agent(&["--host", "otel-node"], &no_client);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        seen.lock().expect("lock").len(),
        before,
        "a connection without a client certificate got through"
    );
    server.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_endpoint_is_used_as_given_over_https() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [ca, cert, key, _, _] = pki(dir.path());
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .tls(&cert, &key)
        .start();
    let env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:1".to_string(),
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            format!("{}/v1/metrics", server.otlp_url()),
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.display().to_string()),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none".to_string()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "5000".to_string()),
    ];
    let _agent = agent(&["--host", "https-node"], &env);
    let client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca).expect("ca")).expect("ca pem"),
        )
        .build()
        .expect("client");
    let url = server.url();
    eventually(Duration::from_secs(30), "samples over https", || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let resp = client
                .get(format!("{url}/api/v1/query"))
                .query(&[(
                    "query",
                    "count(DCGM_FI_DEV_GPU_TEMP{Hostname=\"https-node\"})",
                )])
                .send()
                .await;
            let Ok(resp) = resp else { return false };
            let body = resp.bytes().await.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            v["data"]["result"][0]["value"][1] == "2"
        }
    })
    .await;
}
