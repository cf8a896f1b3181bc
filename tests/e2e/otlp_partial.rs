//! OTLP partial success over HTTP: a request with some bad points stores the rest and says how
//! many were rejected, in JSON and in protobuf.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use prost::Message;

use gpuwatch_e2e::TestServer;

use crate::{now_ns, post_otlp, rows};

#[tokio::test(flavor = "multi_thread")]
async fn some_points_rejected_gives_partial_success_and_stores_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now = now_ns();
    let far = now + 3_600_000_000_000;
    let body = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[
        {{"name":"partial.ok","gauge":{{"dataPoints":[{{"timeUnixNano":"{now}","asDouble":1.5}},
            {{"timeUnixNano":"{now}","asDouble":"NaN"}},{{"timeUnixNano":"{far}","asDouble":2}}]}}}},
        {{"name":"partial.lat","histogram":{{"aggregationTemporality":2,"dataPoints":[{{"timeUnixNano":"{now}",
            "count":"3","sum":0.6,"bucketCounts":["1","2"],"explicitBounds":[0.1]}}]}}}}
    ]}}]}}]}}"#
    );
    let (status, text) = post_otlp(
        &server.otlp_url(),
        "application/json",
        None,
        body.clone().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).expect("json answer");
    assert_eq!(answer["partialSuccess"]["rejectedDataPoints"], 2, "{text}");
    let msg = answer["partialSuccess"]["errorMessage"]
        .as_str()
        .unwrap_or("");
    assert!(msg.contains("ahead of the server clock"), "{msg}");

    let r = rows(
        &server,
        "SELECT metric, value, labels['le'] AS le FROM metrics WHERE metric LIKE 'partial%' ORDER BY metric, le",
    )
    .await;
    let got: Vec<_> = r
        .iter()
        .map(|x| {
            format!(
                "{} {} {}",
                x["metric"].as_str().unwrap_or(""),
                x["value"],
                x["le"].as_str().unwrap_or("-")
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            "partial.lat_bucket 3.0 +Inf",
            "partial.lat_bucket 1.0 0.1",
            "partial.lat_count 3.0 -",
            "partial.lat_sum 0.6 -",
            "partial.ok 1.5 -",
        ]
    );

    // The same request in protobuf gets a protobuf partial success.
    let req: opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest =
        serde_json::from_str(&body).expect("otlp json");
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/metrics", server.url()))
        .header("content-type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .expect("otlp request");
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = resp.bytes().await.expect("body");
    let answer = ExportMetricsServiceResponse::decode(bytes.as_ref()).expect("protobuf answer");
    assert_eq!(
        answer.partial_success.map(|p| p.rejected_data_points),
        Some(2)
    );
}
