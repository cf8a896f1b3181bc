//! Network faults against the real server: points that cannot be read are rejected alone and
//! reported, in OTLP/JSON and protobuf.

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, metric::Data, number_data_point,
};
use prost::Message;

use gpuwatch_e2e::TestServer;

use crate::{now_ns, post_otlp, rows};

/// The values of `metric` stored, in time order.
async fn stored(server: &TestServer, metric: &str) -> Vec<f64> {
    rows(
        server,
        &format!("SELECT value FROM metrics WHERE metric = '{metric}' ORDER BY time"),
    )
    .await
    .iter()
    .map(|r| r["value"].as_f64().unwrap_or(f64::NAN))
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn unreadable_json_points_are_rejected_alone_and_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now = now_ns();
    let (t1, t2) = (now - 2_000_000_000, now - 1_000_000_000);
    // Each metric holds one point the issue names as unreadable between two good ones.
    let cases = [
        (
            "bad.space",
            format!(r#"{{"timeUnixNano":"{now} ","asDouble":9}}"#),
        ),
        (
            "bad.negative",
            r#"{"timeUnixNano":"-5","asDouble":9}"#.to_string(),
        ),
        (
            "bad.int",
            format!(r#"{{"timeUnixNano":"{now}","asInt":"notanumber"}}"#),
        ),
        (
            "bad.type",
            format!(r#"{{"timeUnixNano":"{now}","asDouble":[1]}}"#),
        ),
    ];
    let metrics: Vec<String> = cases
        .iter()
        .map(|(name, bad)| {
            format!(
                r#"{{"name":"{name}","gauge":{{"dataPoints":[{{"timeUnixNano":"{t1}","asDouble":1}},{bad},
                    {{"timeUnixNano":"{t2}","asInt":"2"}}]}}}}"#
            )
        })
        .chain([format!(
            r#"{{"name":"bad.mono","sum":{{"isMonotonic":"true","dataPoints":[{{"timeUnixNano":"{t1}","asDouble":1}}]}}}}"#
        )])
        .collect();
    let body = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[{}]}}]}}]}}"#,
        metrics.join(",")
    );
    let (status, text) = post_otlp(
        &server.otlp_url(),
        "application/json",
        None,
        body.into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).expect("json answer");
    assert_eq!(answer["partialSuccess"]["rejectedDataPoints"], 5, "{text}");
    let msg = answer["partialSuccess"]["errorMessage"]
        .as_str()
        .unwrap_or("");
    assert!(msg.contains("5 that could not be read"), "{msg}");
    assert!(msg.contains("metric \"bad.space\" point 1"), "{msg}");
    for (name, _) in &cases {
        assert_eq!(
            stored(&server, name).await,
            [1.0, 2.0],
            "{name}: siblings kept"
        );
    }
    assert!(stored(&server, "bad.mono").await.is_empty());
}

fn point(t: i64, value: Option<f64>, attr: &str) -> NumberDataPoint {
    NumberDataPoint {
        time_unix_nano: t as u64,
        value: value.map(number_data_point::Value::AsDouble),
        attributes: vec![KeyValue {
            key: "k".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(attr.into())),
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unreadable_protobuf_points_are_rejected_alone_and_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now = now_ns();
    let points = vec![
        point(now - 3_000_000_000, Some(1.0), "a"),
        // Made not UTF-8 below: this point alone cannot be decoded.
        point(now - 2_000_000_000, Some(7.0), "QQQQ"),
        point(now - 1_000_000_000, Some(f64::NAN), "b"),
        point(now - 1_000_000_000, None, "c"),
        point(now, Some(2.0), "d"),
    ];
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "pb.mixed".into(),
                    data: Some(Data::Gauge(Gauge {
                        data_points: points,
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let mut bytes = req.encode_to_vec();
    let at = bytes.windows(4).position(|w| w == b"QQQQ").expect("marker");
    bytes[at] = 0xff;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/metrics", server.url()))
        .header("content-type", "application/x-protobuf")
        .body(bytes)
        .send()
        .await
        .expect("otlp request");
    assert_eq!(resp.status().as_u16(), 200);
    let answer = ExportMetricsServiceResponse::decode(resp.bytes().await.expect("body").as_ref())
        .expect("protobuf answer");
    let partial = answer.partial_success.expect("partial success");
    assert_eq!(partial.rejected_data_points, 3, "{}", partial.error_message);
    assert!(
        partial
            .error_message
            .contains("metric \"pb.mixed\" point 1"),
        "{}",
        partial.error_message
    );
    assert!(
        partial
            .error_message
            .contains("2 with a nan, infinite or absent value")
    );
    assert_eq!(stored(&server, "pb.mixed").await, [1.0, 2.0]);
}

/// One raw HTTP/1.1 request to `server`'s main listener: `headers` as sent (the `Host` among
/// them), then `body`. Returns the status and the body text.
fn raw(
    server: &TestServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("write");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let text = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, text)
}

#[test]
fn no_browser_page_can_drive_a_default_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--allowed-hosts")
        .arg("gpuwatch.test")
        .start();
    let own = server.url().trim_start_matches("http://").to_string();
    let host = ("Host", own.as_str());
    let silence = r#"{"matchers":[{"name":"alertname","value":".*","isRegex":true}],"duration":"1000h","createdBy":"page","comment":"x"}"#;
    let sql = r#"{"sql":"SELECT 1 AS one"}"#;
    let json = ("Content-Type", "application/json");

    // A "simple request" any page can send: text/plain bodies are refused before they are read.
    let (code, text) = raw(
        &server,
        "POST",
        "/api/v1/silences",
        &[host, ("Content-Type", "text/plain")],
        silence,
    );
    assert_eq!(code, 415, "{text}");
    assert!(text.contains("application/json"), "{text}");
    let (code, text) = raw(
        &server,
        "POST",
        "/api/v1/sql",
        &[host, ("Content-Type", "text/plain")],
        sql,
    );
    assert_eq!(code, 415, "{text}");
    let (code, _) = raw(
        &server,
        "POST",
        "/api/v1/sql",
        &[host, ("Content-Type", "application/x-www-form-urlencoded")],
        sql,
    );
    assert_eq!(code, 415);
    let (code, _) = raw(
        &server,
        "POST",
        "/v1/metrics",
        &[host, ("Content-Type", "text/plain")],
        "{}",
    );
    assert_eq!(
        code, 400,
        "OTLP keeps the interface's 400 for a content type it does not speak"
    );
    // Cross-origin, however it is told.
    let evil = ("Origin", "http://evil.example");
    let (code, text) = raw(
        &server,
        "POST",
        "/api/v1/silences",
        &[host, json, evil],
        silence,
    );
    assert_eq!(code, 403, "{text}");
    let cross = ("Sec-Fetch-Site", "cross-site");
    let (code, _) = raw(&server, "POST", "/api/v1/sql", &[host, json, cross], sql);
    assert_eq!(code, 403);
    let (code, _) = raw(
        &server,
        "GET",
        "/api/v1/sql?q=SELECT%201",
        &[host, cross],
        "",
    );
    assert_eq!(code, 403);
    let (code, _) = raw(&server, "POST", "/v1/metrics", &[host, json, evil], "{}");
    assert_eq!(code, 403, "ingest refuses a page too");
    // DNS rebinding: the page's origin and the Host agree, the name is not the server's.
    let rebound = ("Host", "rebound.example:9500");
    let (code, text) = raw(
        &server,
        "POST",
        "/api/v1/sql",
        &[rebound, json, ("Origin", "http://rebound.example:9500")],
        sql,
    );
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("--allowed-hosts"), "{text}");
    let (code, _) = raw(&server, "GET", "/api/v1/jobs?since=1h", &[rebound], "");
    assert_eq!(code, 403);
    let (code, _) = raw(&server, "GET", "/healthz", &[rebound], "");
    assert_eq!(code, 200, "health answers under any name");
    // Nothing above created a silence.
    let (code, list) = raw(&server, "GET", "/api/v1/silences", &[host], "");
    assert_eq!((code, list.trim()), (200, "[]"));

    // What must keep working: the console (same origin), scripts (no Origin), a name given in
    // --allowed-hosts, Grafana's form POSTs to the Prometheus API.
    let console = [
        host,
        json,
        ("Origin", &*format!("http://{own}")),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let (code, text) = raw(&server, "POST", "/api/v1/sql", &console, sql);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"one\":1"), "{text}");
    let port = own.rsplit(':').next().unwrap_or("");
    let named = format!("gpuwatch.test:{port}");
    let (code, text) = raw(
        &server,
        "POST",
        "/api/v1/sql",
        &[("Host", &named), json],
        sql,
    );
    assert_eq!(code, 200, "{text}");
    let (code, text) = raw(&server, "POST", "/api/v1/silences", &[host, json], silence);
    assert_eq!(code, 200, "{text}");
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let (code, text) = raw(&server, "POST", "/api/v1/query", &[host, form], "query=1");
    assert_eq!(code, 200, "{text}");
}

/// One OTLP/gRPC export of `req`; the answer or the status.
async fn grpc_export(
    addr: std::net::SocketAddr,
    req: ExportMetricsServiceRequest,
) -> Result<ExportMetricsServiceResponse, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("grpc connect");
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.expect("grpc ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    );
    let codec = tonic_prost::ProstCodec::<ExportMetricsServiceRequest, ExportMetricsServiceResponse>::default();
    client
        .unary(tonic::Request::new(req), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversize_grpc_message_is_resource_exhausted_which_exporters_do_not_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--max-body-bytes")
        .arg("65536")
        .start();
    let now = now_ns();
    let request = |n: usize| ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "grpc.size".into(),
                    data: Some(Data::Gauge(Gauge {
                        data_points: (0..n)
                            .map(|i| point(now - i as i64, Some(1.0), "x"))
                            .collect(),
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let big = request(5_000);
    assert!(big.encoded_len() > 65536);
    let status = grpc_export(server.grpc, big).await.expect_err("too large");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // A message within the limit is taken, on the same server.
    grpc_export(server.grpc, request(10))
        .await
        .expect("small export");
    assert_eq!(stored(&server, "grpc.size").await.len(), 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_cannot_keep_health_checks_writes_or_queries_out() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--max-connections")
        .arg("16")
        .arg("--header-timeout")
        .arg("60s")
        .start();
    // Far more idle connections than the cap, half of them with half-sent headers.
    let mut idle = Vec::new();
    for i in 0..100 {
        let mut s = std::net::TcpStream::connect(server.http).expect("connect");
        if i % 2 == 0 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .expect("half a request");
        }
        idle.push(s);
    }
    let own = server.url().trim_start_matches("http://").to_string();
    let (code, text) = raw(&server, "GET", "/healthz", &[("Host", &own)], "");
    assert_eq!((code, text.as_str()), (200, "ok\n"));
    let now = now_ns();
    let (code, text) = post_otlp(
        &server.url(),
        "application/json",
        None,
        crate::otlp_json("conn.cap", 3.0, now, &[]).into_bytes(),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(stored(&server, "conn.cap").await, [3.0]);
    // The server closed the idle connections it had to (those with half a request after a
    // 1 s grace), long before --header-timeout: at most the cap stays open.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let mut open = 0;
    for s in &mut idle {
        s.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .expect("timeout");
        let mut buf = [0u8; 256];
        if let Err(e) = s.read(&mut buf) {
            assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{e}"
            );
            open += 1;
        }
    }
    assert!(open <= 16, "{open} idle connections still open, cap 16");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_sends_no_headers_in_time_is_closed() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--header-timeout")
        .arg("1s")
        .start();
    // Half a request, nothing at all, and a keep-alive connection idle after its answer.
    let mut slow = std::net::TcpStream::connect(server.http).expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\n")
        .expect("half a request");
    let quiet = std::net::TcpStream::connect(server.http).expect("connect");
    let mut kept = std::net::TcpStream::connect(server.http).expect("connect");
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("request");
    for (what, mut s, answered) in [
        ("half", slow, false),
        ("quiet", quiet, false),
        ("kept", kept, true),
    ] {
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .expect("timeout");
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let waited = started.elapsed();
        assert!(
            waited < std::time::Duration::from_secs(10),
            "{what}: closed by the server, not by the read timeout: {waited:?}"
        );
        let text = String::from_utf8_lossy(&buf);
        assert_eq!(text.contains("200 OK"), answered, "{what}: {text}");
    }
}

/// True when the server has closed `s` (end of stream or reset) within `wait`.
fn closed_within(s: &mut std::net::TcpStream, wait: std::time::Duration) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(wait)).expect("timeout");
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_and_postgres_listeners_bound_and_time_out_idle_connections() {
    use std::io::Write;
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--max-connections")
        .arg("16")
        .arg("--header-timeout")
        .arg("3s")
        .arg("--idle-timeout")
        .arg("4s")
        .start();
    // Far more silent connections than the cap on both ports.
    let mut idle: Vec<std::net::TcpStream> = Vec::new();
    for addr in [server.pg, server.grpc] {
        for _ in 0..60 {
            idle.push(std::net::TcpStream::connect(addr).expect("connect"));
        }
    }
    // A real psql and a real OTLP/gRPC client are still served.
    let pg = tokio::task::block_in_place(|| server.psql(None, "disable", &["-c", "SELECT 41 + 1"]));
    assert!(pg.ok, "psql: {}", pg.stderr);
    assert_eq!(pg.stdout.trim(), "42");
    let now = now_ns();
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "grpc.crowd".into(),
                    data: Some(Data::Gauge(Gauge {
                        data_points: vec![point(now, Some(2.0), "x")],
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    grpc_export(server.grpc, req)
        .await
        .expect("grpc export past the crowd");
    assert_eq!(stored(&server, "grpc.crowd").await, [2.0]);
    // At the cap the silent ones were closed to make room: at most the cap stays open per port.
    let open = tokio::task::block_in_place(|| {
        idle.iter_mut()
            .map(|s| closed_within(s, Duration::from_millis(20)))
            .filter(|closed| !closed)
            .count()
    });
    assert!(
        open <= 32,
        "{open} silent connections still open, cap 16 per listener"
    );
    // A connection that spoke (a Postgres SSL request, answered) and then went silent is closed
    // after --idle-timeout; every silent one after --header-timeout.
    let mut spoke = std::net::TcpStream::connect(server.pg).expect("connect");
    spoke
        .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .expect("ssl request");
    let started = std::time::Instant::now();
    tokio::task::block_in_place(|| {
        assert!(
            closed_within(&mut spoke, Duration::from_secs(15)),
            "closed when idle"
        );
        for s in &mut idle {
            assert!(
                closed_within(s, Duration::from_secs(10)),
                "silent connection closed"
            );
        }
    });
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3),
        "closed by the idle timeout, not at once: {waited:?}"
    );
}
