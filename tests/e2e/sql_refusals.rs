//! The SQL endpoint is read-only: writes, settings and every way of reading the server's files
//! or URLs get 403 with a message, over HTTP.

use gpuwatch_e2e::TestServer;

use crate::sql;

#[tokio::test(flavor = "multi_thread")]
async fn file_reads_writes_and_settings_are_refused_with_403() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let secret = dir.path().join("secret.csv");
    std::fs::write(&secret, "a\n42\n").expect("write");
    let secret = secret.display().to_string();
    for q in [
        format!("SELECT * FROM '{secret}'"),
        format!("SELECT * FROM read_csv('{secret}')"),
        format!("SELECT * FROM parquet_metadata('{secret}')"),
        "SELECT * FROM 'https://example.com/x.parquet'".to_string(),
        format!("COPY (SELECT 1) TO '{secret}'"),
        format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{secret}'"),
        "INSERT INTO metrics VALUES (now(), 'x', 1, NULL)".to_string(),
        "SET datafusion.execution.target_partitions = 1".to_string(),
    ] {
        let (status, body) = sql(&server, &q, "json").await;
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, 403, "{q}: {text}");
        assert!(text.contains("not allowed"), "{q}: {text}");
        assert!(
            !text.contains("42"),
            "{q}: the file's content leaked: {text}"
        );
    }
    let (status, _) = sql(&server, "SELECT count(*) FROM gpu_metrics", "json").await;
    assert_eq!(status, 200, "the server answers after the refusals");
}
