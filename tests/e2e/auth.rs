//! Bearer tokens: 401 without or with a wrong token, 403 with a token of another scope, and the
//! right token works, on SQL, OTLP/HTTP and remote write.

use gpuwatch_e2e::TestServer;

use crate::{now_ns, otlp_json};

async fn sql(server: &TestServer, token: Option<&str>) -> (u16, serde_json::Value, bool) {
    let body = serde_json::json!({
        "sql": "SELECT count(*) AS n FROM metrics WHERE metric = 'auth.check'"
    });
    let mut req = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("sql request");
    let status = resp.status().as_u16();
    let challenge = resp.headers().get("www-authenticate").is_some();
    let text = resp.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    (status, body, challenge)
}

async fn otlp(server: &TestServer, token: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/metrics", server.otlp_url()))
        .header("content-type", "application/json")
        .body(otlp_json("auth.check", 1.0, now_ns(), &[]));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("otlp request").status().as_u16()
}

#[tokio::test(flavor = "multi_thread")]
async fn bearer_tokens_and_scopes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_tokens(dir.path()).start();

    let (status, body, challenge) = sql(&server, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(challenge, "401 carries WWW-Authenticate");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("bearer token"),
        "{body}"
    );
    assert_eq!(sql(&server, Some("wrong-token-0123456789")).await.0, 401);
    let (status, body, _) = sql(&server, Some("ingest-token-0123456789")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("query scope"),
        "{body}"
    );

    assert_eq!(otlp(&server, None).await, 401);
    assert_eq!(otlp(&server, Some("query-token-0123456789")).await, 403);
    assert_eq!(otlp(&server, Some("ingest-token-0123456789")).await, 200);

    let rw = |token: Option<&'static str>| {
        let url = format!("{}/api/v1/write", server.url());
        async move {
            let mut req = reqwest::Client::new()
                .post(url)
                .header("content-encoding", "snappy")
                .body(b"x".to_vec());
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.expect("write").status().as_u16()
        }
    };
    assert_eq!(rw(None).await, 401);
    assert_eq!(rw(Some("query-token-0123456789")).await, 403);
    assert_eq!(
        rw(Some("ingest-token-0123456789")).await,
        400,
        "authorised, then decoded"
    );

    let (status, body, _) = sql(&server, Some("query-token-0123456789")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["n"], 1);
    // A cost statement is a query: the query scope, like SQL.
    let cost = |token: Option<&'static str>| {
        let url = format!("{}/api/v1/cost?by=account", server.url());
        async move {
            let mut req = reqwest::Client::new().get(url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.expect("cost").status().as_u16()
        }
    };
    assert_eq!(cost(None).await, 401);
    assert_eq!(cost(Some("ingest-token-0123456789")).await, 403);
    assert_eq!(cost(Some("query-token-0123456789")).await, 200);
    // Health and self metrics stay open.
    assert_eq!(
        gpuwatch_e2e::http_get(server.http, "/healthz")
            .expect("healthz")
            .0,
        200
    );
    assert_eq!(
        gpuwatch_e2e::http_get(server.http, "/metrics")
            .expect("metrics")
            .0,
        200
    );
}

#[test]
fn a_bad_token_file_stops_the_server_with_a_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\nname='x'\ntoken='short'\nscopes=['query']\n",
    )
    .expect("write");
    let out = std::process::Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("d"))
        .arg("--auth-tokens")
        .arg(&tokens)
        .output()
        .expect("run gpuwatch");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 16 characters"), "{err}");
}
