//! SQL answers stream: a large answer arrives in many chunks, without a Content-Length (the
//! server never holds it whole), complete and in order, in every format.

use gpuwatch_e2e::TestServer;

#[tokio::test(flavor = "multi_thread")]
async fn a_large_answer_streams_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    const N: u64 = 1_000_000;
    for format in ["csv", "jsonl", "json", "arrow", "parquet"] {
        let body = serde_json::json!({
            "sql": format!("SELECT value AS n FROM generate_series(1, {N}) AS t(value)"),
            "format": format,
        });
        let mut resp = reqwest::Client::new()
            .post(format!("{}/api/v1/sql", server.url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("sql request");
        assert_eq!(resp.status().as_u16(), 200, "{format}");
        assert!(
            resp.headers().get("content-length").is_none(),
            "{format}: a streamed answer has no content-length"
        );
        let mut chunks = 0usize;
        let mut all = Vec::new();
        while let Some(c) = resp.chunk().await.expect("body chunk") {
            chunks += 1;
            all.extend_from_slice(&c);
        }
        assert!(chunks > 10, "{format}: {chunks} chunks");
        let text = String::from_utf8_lossy(&all);
        match format {
            "csv" => {
                let lines: Vec<&str> = text.lines().collect();
                assert_eq!(lines.len() as u64, N + 1, "header plus rows");
                assert_eq!(lines[0], "n");
                assert_eq!(lines[N as usize], N.to_string());
            }
            "jsonl" => assert_eq!(text.lines().count() as u64, N),
            "json" => {
                let v: serde_json::Value = serde_json::from_slice(&all).expect("one json array");
                assert_eq!(v.as_array().map(Vec::len), Some(N as usize));
            }
            "arrow" => {
                let reader =
                    arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(&all), None)
                        .expect("arrow stream");
                let rows: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
                assert_eq!(rows as u64, N);
            }
            _ => {
                let reader =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                        bytes::Bytes::from(all.clone()),
                    )
                    .expect("parquet file")
                    .build()
                    .expect("reader");
                let rows: usize = reader.map(|b| b.expect("batch").num_rows()).sum();
                assert_eq!(rows as u64, N);
            }
        }
    }
}
