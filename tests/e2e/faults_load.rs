//! Overload against the real server: concurrent decode bombs while health checks and queries
//! go on (the memory ceiling holds before anything is inflated, and the server recovers by
//! itself), and a crowd of connections under a small open-file limit.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use gpuwatch_e2e::TestServer;
use opentelemetry_proto::tonic::metrics::v1::{NumberDataPoint, number_data_point};
use prost::Message;

use crate::{now_ns, otlp_json, post_otlp, rows};

/// `--memory-limit` of the bomb test, and the slack resident memory may pass it by (thread
/// stacks and allocator arenas no reservation counts; docs/operations.md).
const LIMIT: usize = 1 << 30;
const SLACK: usize = 64 << 20;

/// A length-delimited protobuf field.
fn field(number: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 12);
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

/// A valid OTLP export of `points` tiny gauge points (about 22 bytes each on the wire, far
/// more once decoded), gzip-compressed.
fn tiny_point_bomb(points: usize) -> Vec<u8> {
    let now = now_ns() as u64;
    let mut gauge = Vec::with_capacity(points * 24);
    for i in 0..points {
        let p = NumberDataPoint {
            time_unix_nano: now - i as u64,
            value: Some(number_data_point::Value::AsDouble(1.0)),
            ..Default::default()
        };
        gauge.extend(field(1, &p.encode_to_vec()));
    }
    let mut metric = field(1, b"bomb.point");
    metric.extend(field(5, &gauge));
    let request = field(1, &field(2, &field(2, &metric)));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&request).expect("gzip");
    gz.finish().expect("gzip")
}

/// About `bytes` of gzip that inflate roughly a thousand times larger: one member of zeros
/// repeated (a gzip body may hold several members, read one after the other).
fn zeros_bomb(bytes: usize) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 16 << 20]).expect("gzip");
    let member = gz.finish().expect("gzip");
    member.repeat(bytes.div_ceil(member.len()))
}

/// `VmRSS` and `VmHWM` of process `pid`, in bytes.
fn resident(pid: u32) -> (usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| {
                l[name.len()..]
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
            .map_or(0, |k: usize| k * 1024)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// Health checks and a SQL query, over and over until `done`; counts what was not answered 200.
async fn probe(url: String, done: Arc<AtomicBool>, answered: Arc<AtomicUsize>) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut failures = Vec::new();
    while !done.load(Ordering::Acquire) {
        let health = client.get(format!("{url}/healthz")).send().await;
        let query = client
            .post(format!("{url}/api/v1/sql"))
            .header("content-type", "application/json")
            .body(r#"{"sql": "SELECT count(*) AS n FROM metrics"}"#)
            .send()
            .await;
        for (what, r) in [("healthz", health), ("sql", query)] {
            match r {
                Ok(r) if r.status() == 200 => {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                Ok(r) => failures.push(format!("{what}: {}", r.status())),
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    failures
}

/// Awaits `work` while `probe` runs, then checks every probe was answered.
async fn while_probed<T>(server: &TestServer, work: impl std::future::Future<Output = T>) -> T {
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let prober = tokio::spawn(probe(
        server.url(),
        Arc::clone(&done),
        Arc::clone(&answered),
    ));
    let out = work.await;
    done.store(true, Ordering::Release);
    let failures = prober.await.expect("probe task");
    assert!(
        failures.is_empty(),
        "not answered during the bombs: {failures:?}"
    );
    assert!(answered.load(Ordering::Relaxed) >= 2, "the probe ran");
    out
}

/// The server's `/metrics` once the bombs are over, checked to hold nothing reserved, and its
/// count of writes refused for decode memory.
async fn after_bombs(server: &TestServer) -> (String, f64) {
    let metrics = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("gpuwatch_decode_memory_reserved_bytes 0"),
        "{metrics}"
    );
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpuwatch_writes_refused_decode_memory_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("refusal counter");
    (metrics, refused)
}

/// Sends `bombs` at once while `probe` runs; returns each bomb's status, whether it carried
/// `Retry-After`, and its message.
async fn round(server: &TestServer, bombs: &[Arc<Vec<u8>>]) -> Vec<(u16, bool, String)> {
    let mut sent = Vec::new();
    for body in bombs {
        let (url, body) = (server.url(), Arc::clone(body));
        sent.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/v1/metrics"))
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", "gzip")
                .body(body.to_vec())
                .send()
                .await
                .expect("bomb sent");
            let retry = r.headers().contains_key("retry-after");
            (
                r.status().as_u16(),
                retry,
                r.text().await.unwrap_or_default(),
            )
        }));
    }
    while_probed(server, async {
        let mut out = Vec::new();
        for s in sent {
            out.push(s.await.expect("bomb task"));
        }
        out
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn decode_bombs_are_refused_before_they_are_inflated_and_the_server_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--memory-limit")
        .arg(&LIMIT.to_string())
        .arg("--max-body-bytes")
        .arg(&(96usize << 20).to_string())
        .start();
    let pid = server.pid().expect("pid");
    // A valid export of 3 M tiny points (66 MB inflated, within --max-body-bytes: without
    // the reservation it would be decoded, about 20x its size), and 8.7 MB of gzip that
    // inflates to about 9 GB.
    let points = Arc::new(tiny_point_bomb(3_000_000));
    let zeros = Arc::new(zeros_bomb(8_700_000));
    assert!(zeros.len() >= 8_700_000);
    for n in [4, 8] {
        let bombs: Vec<_> = (0..n)
            .map(|i| Arc::clone(if i % 2 == 0 { &zeros } else { &points }))
            .collect();
        let answers = round(&server, &bombs).await;
        let codes: Vec<u16> = answers.iter().map(|a| a.0).collect();
        for (code, retry, text) in answers {
            match code {
                413 => assert!(text.contains("split the batch"), "{text}"),
                503 => assert!(retry && text.contains("Retry-After"), "{text}"),
                other => panic!("a bomb was answered {other}: {text}"),
            }
        }
        let (rss, hwm) = resident(pid);
        eprintln!("{n} bombs: answers {codes:?}, VmRSS {rss}, VmHWM {hwm}");
        assert!(
            hwm < LIMIT + SLACK,
            "{n} bombs: peak resident memory {hwm} over the limit {LIMIT} + {SLACK} (now {rss})"
        );
    }
    // Idle again: an ordinary write and a query are served, and nothing is held.
    let now = now_ns();
    let body = otlp_json("after.bombs", 5.0, now, &[]).into_bytes();
    let (code, text) = post_otlp(&server.url(), "application/json", None, body).await;
    assert_eq!(code, 200, "{text}");
    let got = rows(
        &server,
        "SELECT value FROM metrics WHERE metric = 'after.bombs'",
    )
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let (_, refused) = after_bombs(&server).await;
    assert_eq!(refused, 12.0, "every bomb counted");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crowd_past_the_file_limit_leaves_health_writes_queries_and_the_store_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .nofile(1024)
        .start();
    let pid = server.pid().expect("pid");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open-file limit");
    assert!(files.split_whitespace().nth(3) == Some("1024"), "{files}");
    // 1,100 connections to the HTTP port, more than the process may hold files; half of them
    // with half a request.
    let mut crowd = Vec::new();
    for i in 0..1100 {
        let mut s = std::net::TcpStream::connect(server.http).expect("connect");
        if i % 2 == 0 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .expect("half a request");
        }
        crowd.push(s);
    }
    let (code, body) = tokio::task::block_in_place(|| {
        gpuwatch_e2e::http_get(server.http, "/healthz").expect("healthz")
    });
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let now = now_ns();
    let body = otlp_json("crowd.write", 7.0, now, &[]).into_bytes();
    let (code, text) = post_otlp(&server.url(), "application/json", None, body).await;
    assert_eq!(code, 200, "{text}");
    let got = rows(
        &server,
        "SELECT value FROM metrics WHERE metric = 'crowd.write'",
    )
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    let pg = tokio::task::block_in_place(|| server.psql(None, "disable", &["-c", "SELECT 1"]));
    assert!(pg.ok, "psql: {}", pg.stderr);
    let (code, _) = tokio::task::block_in_place(|| {
        gpuwatch_e2e::http_get(server.http, "/readyz").expect("readyz")
    });
    assert_eq!(code, 200);
    drop(crowd);
    let log = server.log_text();
    assert!(
        log.contains("connections_per_listener=192"),
        "the cap derived from the file limit is logged:\n{log}"
    );
    for sign in ["Too many open files", "os error 24", "EMFILE"] {
        assert!(!log.contains(sign), "the store ran out of files:\n{log}");
    }
}

/// Sends `message` as-is (not necessarily protobuf) as one OTLP/gRPC export, gzip-compressed by
/// the client; the status tonic gets.
async fn grpc_raw_export(addr: std::net::SocketAddr, message: bytes::Bytes) -> tonic::Status {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
    #[derive(Clone, Default)]
    struct Raw;
    struct RawEncoder;
    impl tonic::codec::Encoder for RawEncoder {
        type Item = bytes::Bytes;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: bytes::Bytes,
            dst: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            bytes::BufMut::put_slice(dst, &item);
            Ok(())
        }
    }
    impl tonic::codec::Codec for Raw {
        type Encode = bytes::Bytes;
        type Decode = ExportMetricsServiceResponse;
        type Encoder = RawEncoder;
        type Decoder = tonic_prost::ProstDecoder<ExportMetricsServiceResponse>;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> Self::Decoder {
            tonic_prost::ProstDecoder::default()
        }
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("grpc connect");
    let mut client = tonic::client::Grpc::new(channel)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_encoding_message_size(usize::MAX);
    client.ready().await.expect("grpc ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    );
    match client.unary(tonic::Request::new(message), path, Raw).await {
        Ok(_) => tonic::Status::ok("exported"),
        Err(s) => s,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_decode_bombs_are_refused_before_tonic_inflates_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--memory-limit")
        .arg(&LIMIT.to_string())
        .arg("--max-body-bytes")
        .arg(&(96usize << 20).to_string())
        .start();
    let pid = server.pid().expect("pid");
    // 90 MiB of zeros (about 90 KiB once gzipped): within --max-body-bytes, but decoding it
    // would need 24x its size, more than the whole decode share; and 200 MiB, above the limit.
    let within = bytes::Bytes::from(vec![0u8; 90 << 20]);
    let above = bytes::Bytes::from(vec![0u8; 200 << 20]);
    let mut sent = Vec::new();
    for i in 0..8 {
        let message = if i % 2 == 0 { &within } else { &above }.clone();
        sent.push(tokio::spawn(grpc_raw_export(server.grpc, message)));
    }
    while_probed(&server, async {
        for s in sent {
            let status = s.await.expect("bomb task");
            assert!(
                matches!(
                    status.code(),
                    tonic::Code::ResourceExhausted | tonic::Code::Unavailable
                ),
                "a gRPC bomb was answered {status:?}"
            );
        }
    })
    .await;
    let (rss, hwm) = resident(pid);
    eprintln!("8 gRPC bombs: VmRSS {rss}, VmHWM {hwm}");
    assert!(
        hwm < LIMIT + SLACK,
        "peak resident memory {hwm} over the limit {LIMIT} + {SLACK} (now {rss})"
    );
    let (metrics, refused) = after_bombs(&server).await;
    assert!(
        refused >= 4.0,
        "the bombs within the limit were refused for memory: {refused}"
    );
    let exports = metrics
        .lines()
        .filter(|l| l.starts_with("gpuwatch_ingest_requests_total") && l.contains("otlp_grpc"))
        .collect::<Vec<_>>();
    assert!(
        exports.iter().any(|l| l.contains("outcome=\"memory\"")),
        "refusals counted by protocol: {exports:?}"
    );
}
