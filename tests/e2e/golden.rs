//! Golden SQL tests: every `tests/golden/*.sql` runs against a real server loaded with
//! `tests/golden/fixture.jsonl` (fixed OTLP/JSON exports, all on 2026-01-05) and its CSV answer
//! must equal `<name>.out` byte for byte. `now()` in a query is replaced by the fixture's "now",
//! `TIMESTAMP '2026-01-05T00:59:30Z'`, so that recipes written for live data run unchanged.
//!
//! Regenerate the expected answers after a deliberate change with
//! `GOLDEN_UPDATE=1 cargo test -p gpuwatch-e2e --test e2e golden` and review the diff.

use std::path::{Path, PathBuf};

use gpuwatch_e2e::TestServer;

use crate::{post_otlp, sql};

/// The fixture's "now": half a minute after its last sample.
pub(crate) const GOLDEN_NOW: &str = "TIMESTAMP '2026-01-05T00:59:30Z'";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// The golden queries, sorted by file name: (name, SQL as written).
fn cases() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(golden_dir())
        .expect("tests/golden")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let name = p
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 name")
                .to_string();
            (name, std::fs::read_to_string(&p).expect("read sql"))
        })
        .collect();
    out.sort();
    out
}

/// The query as sent: `now()` pinned to the fixture's time.
pub(crate) fn pinned(sql: &str) -> String {
    sql.replace("now()", GOLDEN_NOW)
}

/// Loads the fixture into `server` over OTLP/HTTP (JSON).
pub(crate) async fn load_fixture(server: &TestServer) {
    let text = std::fs::read_to_string(golden_dir().join("fixture.jsonl")).expect("fixture");
    for (n, line) in text.lines().enumerate() {
        let (status, body) = post_otlp(
            &server.url(),
            "application/json",
            None,
            line.as_bytes().to_vec(),
        )
        .await;
        assert_eq!(status, 200, "fixture line {}: {body}", n + 1);
        assert!(
            !body.contains("rejected"),
            "fixture line {} partly rejected: {body}",
            n + 1
        );
    }
}

/// A server whose retention never drops the fixture's (old) data.
pub(crate) fn golden_server(dir: &Path) -> TestServer {
    let config = dir.join("golden.toml");
    std::fs::write(
        &config,
        "[retention]\ngpu_metrics = \"forever\"\nmetrics = \"forever\"\n\
         gpu_metrics_1m = \"forever\"\ngpu_metrics_1h = \"forever\"\n\
         gpu_processes = \"forever\"\ngpu_events = \"forever\"\n",
    )
    .expect("config");
    TestServer::builder()
        .data_dir(&dir.join("data"))
        .arg("--config")
        .arg(config.to_str().expect("utf-8 path"))
        .start()
}

async fn run_all(server: &TestServer, pass: &str) -> Vec<String> {
    let update = std::env::var("GOLDEN_UPDATE").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for (name, text) in cases() {
        let (status, body) = sql(server, &pinned(&text), "csv").await;
        let got = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, 200, "{name}.sql ({pass}): {got}");
        let out = golden_dir().join(format!("{name}.out"));
        if update {
            std::fs::write(&out, &got).expect("write .out");
            continue;
        }
        let want = std::fs::read_to_string(&out).unwrap_or_else(|_| {
            panic!("{name}.out missing: run with GOLDEN_UPDATE=1 to create it")
        });
        if got != want {
            failures.push(format!(
                "{name} ({pass}):\n--- expected\n{want}--- got\n{got}"
            ));
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread")]
async fn golden_queries_give_their_expected_answers() {
    assert!(cases().len() >= 10, "golden cases: {:?}", cases());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = golden_server(dir.path());
    load_fixture(&server).await;
    let mut failures = run_all(&server, "buffered").await;
    // The same answers once the rows come back from Parquet: a graceful stop persists the
    // buffer.
    server.stop();
    server.restart();
    failures.extend(run_all(&server, "after restart").await);
    assert!(
        failures.is_empty(),
        "{} golden mismatches (GOLDEN_UPDATE=1 rewrites the .out files):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_recipe_in_docs_sql_md_has_a_golden_case() {
    let doc = include_str!("../../docs/sql.md");
    let golden: Vec<String> = cases().into_iter().map(|(_, s)| s).collect();
    let mut block: Option<String> = None;
    let mut recipes = 0;
    for line in doc.lines() {
        if line.trim() == "```sql" {
            block = Some(String::new());
        } else if line.trim() == "```" {
            if let Some(b) = block.take() {
                recipes += 1;
                assert!(
                    golden.iter().any(|g| g.trim() == b.trim()),
                    "docs/sql.md recipe has no tests/golden/*.sql copy:\n{b}"
                );
            }
        } else if let Some(b) = block.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    assert!(recipes >= 6, "{recipes} recipes found");
}
