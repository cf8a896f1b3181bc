//! Job lists stay bounded on 100,000 jobs: half of them ran two hours ago, half in the last ten
//! minutes, one sample each on GPUs across 100 hosts. `GET /api/v1/jobs` answers at most its
//! `limit` (refusing one above the maximum), most recent first, only jobs of the window asked,
//! and says when more matched; `gpuwatch jobs` prints the same page and the note.

use std::process::Command;

use gpuwatch_e2e::{TestServer, bin_dir};

use crate::{now_ns, post_otlp};

const JOBS: usize = 100_000;
const PER_REQUEST: usize = 5_000;

/// One GPU sample of job `k`, on host `k % 100`, GPU `k / 100 % 8`.
fn point(k: usize, t: i64) -> serde_json::Value {
    let kv = |key: &str, v: String| serde_json::json!({"key": key, "value": {"stringValue": v}});
    serde_json::json!({
        "timeUnixNano": t.to_string(),
        "attributes": [
            kv("host.name", format!("scale-{:03}", k % 100)),
            kv("hw.id", format!("GPU-scale-{}-{}", k % 100, k / 100 % 8)),
            kv("job.id", format!("job-{k:06}")),
            kv("job.user", format!("user-{}", k % 7)),
            kv("job.scheduler", "slurm".into()),
        ],
        "asDouble": 0.5
    })
}

/// Jobs `from..to`, each one sample at `t - k/2` ms (two jobs at each time, the later k the
/// earlier).
async fn send(server: &TestServer, from: usize, to: usize, t: i64) {
    let url = server.otlp_url();
    let mut k = from;
    while k < to {
        let end = (k + PER_REQUEST).min(to);
        let points: Vec<_> = (k..end)
            .map(|j| point(j, t - (j / 2) as i64 * 1_000_000))
            .collect();
        let body = serde_json::json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
            {"name": "hw.gpu.utilization", "gauge": {"dataPoints": points}}
        ]}]}]});
        let (status, text) = post_otlp(
            &url,
            "application/json",
            None,
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        k = end;
    }
}

async fn list(server: &TestServer, query: &str) -> (u16, Option<String>, serde_json::Value) {
    let (status, truncated, _, body) = list_page(server, query).await;
    (status, truncated, body)
}

/// A list's status, `gpuwatch-truncated` and `gpuwatch-next` headers, and body.
async fn list_page(
    server: &TestServer,
    query: &str,
) -> (u16, Option<String>, Option<String>, serde_json::Value) {
    let resp = reqwest::Client::new()
        .get(format!("{}/api/v1/jobs?{query}", server.url()))
        .send()
        .await
        .expect("GET /api/v1/jobs");
    let status = resp.status().as_u16();
    let truncated = resp
        .headers()
        .get("gpuwatch-truncated")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let next = resp
        .headers()
        .get("gpuwatch-next")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = resp.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).expect("json");
    (status, truncated, next, body)
}

/// Following `gpuwatch-next` from the first page lists every job of the window once, in the
/// list's order (the same last-seen instant shared by jobs across a page's end included).
async fn pages_list_every_job_once(server: &TestServer) {
    let mut seen: Vec<String> = Vec::new();
    let mut query = "since=1h&limit=6999".to_string();
    for _ in 0..20 {
        let (status, _, next, body) = list_page(server, &query).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(
            body.as_array()
                .expect("array")
                .iter()
                .filter_map(|j| j["job_id"].as_str().map(str::to_owned)),
        );
        match next {
            Some(n) => query = format!("since=1h&limit=6999&{n}"),
            None => break,
        }
    }
    let want: Vec<String> = (JOBS / 2..JOBS).map(|j| format!("job-{j:06}")).collect();
    assert_eq!(seen.len(), want.len(), "jobs listed over the pages");
    assert_eq!(seen, want, "every job once, most recent first");
    let (status, _, _, body) = list_page(server, "since=1h&until=yesterday").await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn job_lists_stay_bounded_on_a_hundred_thousand_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    let now = now_ns();
    let hour = 3_600_000_000_000;
    // Jobs 0..50,000 two hours ago, 50,000..100,000 within the last ten minutes.
    send(&server, 0, JOBS / 2, now - 2 * hour).await;
    send(&server, JOBS / 2, JOBS, now).await;

    let (status, truncated, body) = list(&server, "since=1h&limit=100").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(truncated.as_deref(), Some("true"));
    let jobs = body.as_array().expect("array");
    assert_eq!(jobs.len(), 100);
    // Most recent first: job 50,000 has the latest sample, then 50,001, …
    let ids: Vec<&str> = jobs.iter().filter_map(|j| j["job_id"].as_str()).collect();
    assert_eq!(ids[0], "job-050000");
    assert_eq!(ids[99], "job-050099");

    // The whole window fits under the maximum only when it is narrow enough.
    let (status, truncated, body) = list(&server, "since=1h&limit=10000").await;
    assert_eq!((status, truncated.as_deref()), (200, Some("true")));
    assert_eq!(body.as_array().map(Vec::len), Some(10_000));
    let (status, truncated, body) = list(&server, "since=1h&limit=10&user=user-3").await;
    assert_eq!((status, truncated.as_deref()), (200, Some("true")));
    assert!(
        body.as_array()
            .expect("array")
            .iter()
            .all(|j| j["user"] == "user-3")
    );
    // A wider window still starts with the most recent job.
    let (status, truncated, body) = list(&server, "since=3h&limit=10000").await;
    assert_eq!((status, truncated.as_deref()), (200, Some("true")));
    assert_eq!(body[0]["job_id"], "job-050000");
    let (status, _, body) = list(&server, "since=1h&limit=20000").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("10000")),
        "{body}"
    );

    cli_lists_a_page_and_names_the_next(&server);
    pages_list_every_job_once(&server).await;
}

/// `gpuwatch jobs --limit 5` lists five jobs and the flags of the next page, which list the
/// next five.
fn cli_lists_a_page_and_names_the_next(server: &TestServer) {
    // `gpuwatch jobs --since 1h --limit 5` with `more` flags: what it printed.
    let jobs = |more: &[String]| {
        let out = Command::new(bin_dir().join("gpuwatch"))
            .args([
                "jobs",
                "--since",
                "1h",
                "--limit",
                "5",
                "--server",
                &server.url(),
            ])
            .args(more)
            .output()
            .expect("gpuwatch jobs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = jobs(&[]);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("job-")).count(),
        5,
        "{text}"
    );
    assert!(
        text.contains("the 5 most recent jobs; more match"),
        "{text}"
    );
    // The note names the next page; asking for it lists the next five.
    let flags: Vec<String> = text
        .split("the next page with ")
        .nth(1)
        .and_then(|rest| rest.strip_suffix(")\n"))
        .expect("the next page's flags")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(flags[0], "--until", "{text}");
    let text = jobs(&flags);
    let ids: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("job-"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        ids,
        [
            "job-050005",
            "job-050006",
            "job-050007",
            "job-050008",
            "job-050009"
        ],
        "{text}"
    );
}
