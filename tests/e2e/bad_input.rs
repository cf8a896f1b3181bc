//! Bad input gets its INTERFACE.md status and a readable JSON error, and the server stays up.

use std::io::Write;

use gpuwatch_e2e::TestServer;

use crate::{otlp_json, post_otlp, sql};

fn error_of(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not a json error: {body}"));
    let msg = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field: {body}"))
        .to_string();
    assert!(!msg.is_empty());
    assert!(
        msg.chars().next().is_some_and(|c| !c.is_uppercase()),
        "message starts uppercase: {msg}"
    );
    msg
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_clear_errors_and_the_server_stays_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--max-body-bytes")
        .arg("8388608")
        .start();
    let url = server.url();

    let (s, b) = post_otlp(
        &url,
        "application/x-protobuf",
        None,
        vec![0xff, 0xff, 0xff, 0x0f, 0x01],
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(error_of(&b).contains("protobuf"), "{b}");

    let (s, b) = post_otlp(
        &url,
        "application/json",
        None,
        b"{\"resourceMetrics\": [".to_vec(),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(error_of(&b).contains("json"), "{b}");

    for ct in ["application/x-protobuf", "application/json"] {
        let (s, b) = post_otlp(&url, ct, None, Vec::new()).await;
        assert_eq!(s, 400, "{ct}: {b}");
        assert!(error_of(&b).contains("empty body"), "{b}");
    }

    let (s, b) = post_otlp(&url, "text/plain", None, b"hello".to_vec()).await;
    assert_eq!(s, 400, "{b}");
    assert!(error_of(&b).contains("content type"), "{b}");

    let (s, b) = post_otlp(
        &url,
        "application/json",
        Some("gzip"),
        b"not gzip at all".to_vec(),
    )
    .await;
    assert_eq!(s, 400, "{b}");

    // 100 MB body: refused as too large, without the server falling over.
    let (s, b) = post_otlp(
        &url,
        "application/x-protobuf",
        None,
        vec![0u8; 100 * 1024 * 1024],
    )
    .await;
    assert_eq!(s, 413, "{b}");
    assert!(error_of(&b).contains("larger than"), "{b}");

    // A small gzip body that inflates past the limit is refused the same way.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![b' '; 20 * 1024 * 1024]).expect("gzip");
    let bomb = gz.finish().expect("gzip");
    assert!(bomb.len() < 1024 * 1024);
    let (s, b) = post_otlp(&url, "application/json", Some("gzip"), bomb).await;
    assert_eq!(s, 413, "{b}");

    // Bad SQL and refused statements.
    let (s, b) = sql(&server, "SELEC 1", "json").await;
    assert_eq!(s, 400);
    error_of(&String::from_utf8_lossy(&b));
    let (s, b) = sql(&server, "SELECT nope FROM gpu_metrics", "json").await;
    assert_eq!(s, 400);
    assert!(error_of(&String::from_utf8_lossy(&b)).contains("nope"));
    let (s, b) = sql(&server, "SELECT 1", "xml").await;
    assert_eq!(s, 400);
    assert!(error_of(&String::from_utf8_lossy(&b)).contains("format"));
    for stmt in [
        "COPY (SELECT 1) TO '/tmp/gpuwatch-e2e-copy.csv'",
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
        "INSERT INTO metrics VALUES (now(), 'x', 1, NULL)",
        "SET datafusion.execution.batch_size = 1",
    ] {
        let (s, b) = sql(&server, stmt, "json").await;
        assert_eq!(s, 403, "{stmt}: {}", String::from_utf8_lossy(&b));
        assert!(error_of(&String::from_utf8_lossy(&b)).contains("not allowed"));
    }
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{url}/api/v1/sql"))
        .header("content-type", "application/json")
        .body("{\"query\": 1}")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 400);
    let resp = client
        .get(format!("{url}/api/v1/sql"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 400);
    let resp = client
        .get(format!("{url}/api/v1/sql?q=SELECT%201%20AS%20one"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.text().await.expect("body"), "[{\"one\":1}]");

    // Still up, still accepting good writes.
    assert!(server.alive());
    let good = otlp_json("hw.power", 1.0, crate::now_ns(), &[("hw.id", "GPU-ok")]);
    let (s, b) = post_otlp(&url, "application/json", None, good.into_bytes()).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        crate::scalar(&server, "SELECT count(*) FROM gpu_metrics").await,
        1.0
    );

    // gzip JSON on the main listener and gzip protobuf on the OTLP listener are accepted too.
    let good = otlp_json("hw.power", 2.0, crate::now_ns(), &[("hw.id", "GPU-gz")]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(good.as_bytes()).expect("gzip");
    let (s, b) = post_otlp(
        &url,
        "application/json",
        Some("gzip"),
        gz.finish().expect("gzip"),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b, "{}");
    let req: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest =
        serde_json::from_str(&otlp_json(
            "hw.power",
            3.0,
            crate::now_ns(),
            &[("hw.id", "GPU-pb")],
        ))
        .expect("otlp json");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&prost::Message::encode_to_vec(&req))
        .expect("gzip");
    let (s, _) = post_otlp(
        &server.otlp_url(),
        "application/x-protobuf",
        Some("gzip"),
        gz.finish().expect("gzip"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        crate::scalar(&server, "SELECT count(DISTINCT gpu_uuid) FROM gpu_metrics").await,
        3.0
    );
}
