//! Hostile queries against a loaded server: every one gets its answer (a refusal, a time-out, or
//! rows), while `/healthz` answers within 1 s throughout, writes keep being acknowledged and are
//! all there at the end, and the server's peak resident memory stays under `--memory-limit`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpuwatch_e2e::{TestServer, http_get};

use crate::{now_ns, otlp_json, post_otlp, scalar, sql};

/// `--memory-limit` of the server under test.
const MEMORY_LIMIT: u64 = 1 << 30;
/// `--max-answer-bytes`.
const MAX_ANSWER: usize = 4 << 20;
/// `--max-value-bytes`.
const MAX_VALUE: usize = 1 << 20;
/// `--max-concurrent-queries`.
const SLOTS: usize = 4;

/// 16 GPUs x 2,000 samples of `gpu_metrics`, one OTLP/JSON request per GPU.
async fn load(server: &TestServer) -> u64 {
    let start = now_ns() - 3_600_000_000_000;
    for gpu in 0..16 {
        let points: Vec<serde_json::Value> = (0..2000)
            .map(|i| {
                serde_json::json!({
                    "timeUnixNano": (start + i * 1_000_000_000).to_string(),
                    "asDouble": (i % 100) as f64 / 100.0,
                    "attributes": [{"key": "hw.id", "value": {"stringValue": format!("GPU-{gpu:04}")}}]
                })
            })
            .collect();
        let body = serde_json::json!({"resourceMetrics": [{
            "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": format!("node{}", gpu / 8)}}]},
            "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "gauge": {"dataPoints": points}}]}]
        }]});
        let (status, text) = post_otlp(
            &server.otlp_url(),
            "application/json",
            None,
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(status, 200, "load: {text}");
    }
    32_000
}

/// What the watchers saw while the hostile queries ran.
#[derive(Debug, Default)]
struct Watch {
    stop: AtomicBool,
    health_worst_ms: AtomicU64,
    health_failures: AtomicU64,
    health_checks: AtomicU64,
    writes_acked: AtomicU64,
    writes_refused: AtomicU64,
    write_worst_ms: AtomicU64,
}

/// Asks `/healthz` every 100 ms and records the slowest answer.
fn watch_health(server: std::net::SocketAddr, watch: Arc<Watch>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !watch.stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let ok = matches!(http_get(server, "/healthz"), Ok((200, _)));
            let ms = t.elapsed().as_millis() as u64;
            watch.health_checks.fetch_add(1, Ordering::Relaxed);
            watch.health_worst_ms.fetch_max(ms, Ordering::Relaxed);
            if !ok {
                watch.health_failures.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Writes one marked sample every 100 ms and counts those acknowledged.
fn keep_writing(otlp: String, watch: Arc<Watch>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut n = 0u64;
        while !watch.stop.load(Ordering::Relaxed) {
            n += 1;
            let body = otlp_json(
                "hostile_probe",
                n as f64,
                now_ns(),
                &[("n", &n.to_string())],
            );
            let t = Instant::now();
            let (status, _) = post_otlp(&otlp, "application/json", None, body.into_bytes()).await;
            watch
                .write_worst_ms
                .fetch_max(t.elapsed().as_millis() as u64, Ordering::Relaxed);
            if status == 200 {
                watch.writes_acked.fetch_add(1, Ordering::Relaxed);
            } else {
                watch.writes_refused.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// A hostile statement and the statuses it may get.
struct Case {
    sql: String,
    format: &'static str,
    statuses: &'static [u16],
    /// Words the answer must hold.
    says: &'static str,
}

fn case(sql: impl Into<String>, statuses: &'static [u16], says: &'static str) -> Case {
    Case {
        sql: sql.into(),
        format: "csv",
        statuses,
        says,
    }
}

fn cases() -> Vec<Case> {
    let deep_parens = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
    let long_chain = format!("SELECT {}", vec!["1"; 50_000].join("+"));
    let in_list = format!(
        "SELECT count(*) FROM gpu_metrics WHERE gpu_index IN ({})",
        (0..100_000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    vec![
        case("SELECT repeat('x', 2000000000)", &[400], "repeat"),
        case("SELECT lpad('x', 2000000000)", &[400], "lpad"),
        case("SELECT rpad('x', 2000000000, 'yz')", &[400], "rpad"),
        case(
            "SELECT array_repeat(1.5, 2000000000)",
            &[400],
            "array_repeat",
        ),
        case(
            "SELECT concat(repeat('x', 600000), repeat('y', 600000))",
            &[400],
            "concat",
        ),
        case("SELECT make_array(range(1, 100000000))", &[400], "range"),
        case(
            "SELECT generate_series(1, 1000000000000, 1)",
            &[400],
            "generate_series",
        ),
        case(
            "SELECT string_agg(repeat('x', 1000), ',') FROM generate_series(1, 1000000)",
            &[400, 503],
            "",
        ),
        case(
            "SELECT array_agg(value) FROM generate_series(1, 100000000)",
            &[400, 503],
            "",
        ),
        case(
            "SELECT regexp_replace(repeat('a', 100000), '', repeat('b', 1000), 'g')",
            &[400],
            "regexp_replace",
        ),
        case(
            "SELECT regexp_like(repeat('a', 1000000), '(a+)+$')",
            &[200],
            "true",
        ),
        case(
            format!("SELECT regexp_like('a', '{}')", "(a|b)".repeat(100_000)),
            &[400],
            "",
        ),
        case(
            "SELECT sum(a.gpu_utilization * b.gpu_utilization * c.gpu_utilization) FROM gpu_metrics a CROSS JOIN gpu_metrics b CROSS JOIN gpu_metrics c",
            &[503, 504],
            "",
        ),
        case(
            "SELECT a.gpu_utilization, b.gpu_utilization FROM gpu_metrics a JOIN gpu_metrics b ON a.host = b.host ORDER BY 1, 2",
            &[503, 504],
            "",
        ),
        case(
            "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
            &[504, 503],
            "",
        ),
        case(deep_parens, &[400], ""),
        case(long_chain, &[400], "operators"),
        // Planning 100,000 values takes seconds in a debug build: an answer or the time limit.
        case(in_list, &[200, 504], ""),
        case(
            "SELECT * FROM generate_series(1, 9223372036854775806) LIMIT 5",
            &[200],
            "5",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_queries_never_take_the_server_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--memory-limit")
        .arg(&MEMORY_LIMIT.to_string())
        .arg("--max-answer-bytes")
        .arg(&MAX_ANSWER.to_string())
        .arg("--max-value-bytes")
        .arg(&MAX_VALUE.to_string())
        .arg("--max-concurrent-queries")
        .arg(&SLOTS.to_string())
        .arg("--query-timeout")
        .arg("5s")
        .arg("--query-memory-limit")
        .arg(&(256u64 << 20).to_string())
        .start();
    let loaded = load(&server).await;
    assert_eq!(
        scalar(&server, "SELECT count(*) FROM gpu_metrics").await as u64,
        loaded
    );
    let watch = Arc::new(Watch::default());
    let health = watch_health(server.http, Arc::clone(&watch));
    let writer = keep_writing(server.otlp_url(), Arc::clone(&watch));

    // One at a time: each gets its own status.
    for c in cases() {
        let t = Instant::now();
        let (status, body) = sql(&server, &c.sql, c.format).await;
        let text = String::from_utf8_lossy(&body[..body.len().min(600)]).to_string();
        let shown = &c.sql[..c.sql.len().min(80)];
        assert!(
            c.statuses.contains(&status),
            "{shown}: status {status}, expected one of {:?}: {text}",
            c.statuses
        );
        assert!(text.contains(c.says), "{shown}: {text}");
        eprintln!("{status} in {:>6} ms  {shown}", t.elapsed().as_millis());
    }

    // 10 MB of SQL text: 413 (curl reads the answer the server sends before the body's end).
    let file = dir.path().join("big.json");
    let big = serde_json::json!({ "sql": format!("SELECT '{}'", "x".repeat(10 << 20)) });
    std::fs::write(&file, big.to_string()).expect("write");
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "content-type: application/json",
            "--data-binary",
        ])
        .arg(format!("@{}", file.display()))
        .arg(format!("{}/api/v1/sql", server.url()))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "413");

    // Answers larger than --max-answer-bytes: cut, with the error at their end.
    let (status, body, cut) = sql_cut(
        &server,
        "SELECT a.time, a.gpu_uuid, b.gpu_uuid FROM gpu_metrics a CROSS JOIN gpu_metrics b",
    )
    .await;
    assert_eq!(status, 200);
    assert!(cut, "the cut answer ends without its last chunk");
    let tail = String::from_utf8_lossy(&body[body.len().saturating_sub(300)..]).to_string();
    assert!(tail.contains("--max-answer-bytes"), "{tail}");
    assert!(body.len() <= MAX_ANSWER + 4096, "{} bytes sent", body.len());
    let (status, body) = sql(
        &server,
        "SELECT repeat('x', 900000 + value % 2) AS a, repeat('y', 900000 + value % 2) AS b FROM generate_series(1, 4)",
        "json",
    )
    .await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));

    flood_and_cancel(&server).await;
    postgres_clients(&server);

    // Everything answers as before.
    let (status, _) = sql(&server, "SELECT count(*) FROM gpu_metrics", "json").await;
    assert_eq!(status, 200);
    watch.stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    health.join().expect("health watcher");

    let acked = watch.writes_acked.load(Ordering::Relaxed);
    let stored = scalar(
        &server,
        "SELECT count(DISTINCT labels['n']) FROM metrics WHERE metric = 'hostile_probe'",
    )
    .await as u64;
    let peak = peak_rss(&server);
    eprintln!(
        "healthz: {} checks, worst {} ms, {} failed; writes: {acked} acknowledged, {} refused, worst {} ms; peak RSS {} MiB of a {} MiB limit",
        watch.health_checks.load(Ordering::Relaxed),
        watch.health_worst_ms.load(Ordering::Relaxed),
        watch.health_failures.load(Ordering::Relaxed),
        watch.writes_refused.load(Ordering::Relaxed),
        watch.write_worst_ms.load(Ordering::Relaxed),
        peak >> 20,
        MEMORY_LIMIT >> 20,
    );
    assert_eq!(stored, acked, "every acknowledged write is stored");
    assert!(acked > 50, "writes kept being acknowledged: {acked}");
    assert_eq!(watch.health_failures.load(Ordering::Relaxed), 0);
    assert!(
        watch.health_worst_ms.load(Ordering::Relaxed) < 1000,
        "/healthz answered within 1 s"
    );
    assert!(peak < MEMORY_LIMIT, "peak RSS {peak} under the ceiling");
}

/// Runs SQL (csv) and reads the answer as far as it goes: the status, the bytes, and whether
/// the body was cut off before its end.
async fn sql_cut(server: &TestServer, q: &str) -> (u16, Vec<u8>, bool) {
    let body = serde_json::json!({ "sql": q, "format": "csv" }).to_string();
    let mut resp = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("sql request");
    let status = resp.status().as_u16();
    let mut bytes = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => bytes.extend_from_slice(&c),
            Ok(None) => return (status, bytes, false),
            Err(_) => return (status, bytes, true),
        }
    }
}

/// More queries than slots at once; clients that go away mid-answer free their slots.
async fn flood_and_cancel(server: &TestServer) {
    let slow = "SELECT count(*) FROM generate_series(1, 100000000000)";
    let mut flood = Vec::new();
    for _ in 0..(SLOTS * 4) {
        let url = server.url();
        flood.push(tokio::spawn(async move {
            let body = serde_json::json!({ "sql": slow, "format": "json" }).to_string();
            let resp = reqwest::Client::new()
                .post(format!("{url}/api/v1/sql"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("flood request");
            resp.status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for f in flood {
        statuses.push(f.await.expect("flood task"));
    }
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(refused >= SLOTS * 2, "429s beyond the slots: {statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 429 || *s == 504),
        "{statuses:?}"
    );

    // Clients that read the start of an endless answer, then hang up.
    for _ in 0..SLOTS {
        let body = serde_json::json!({
            "sql": "SELECT value, repeat('x', 100) FROM generate_series(1, 1000000000000)",
            "format": "csv"
        })
        .to_string();
        let mut resp = reqwest::Client::new()
            .post(format!("{}/api/v1/sql", server.url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("streaming request");
        assert_eq!(resp.status().as_u16(), 200);
        let chunk = resp.chunk().await.expect("a chunk");
        assert!(chunk.is_some());
        drop(resp);
    }
    // Their slots come back at once (not after the time limit).
    let t = Instant::now();
    loop {
        let (status, _) = sql(server, "SELECT 1", "json").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "slots of cancelled clients still held"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Over the Postgres wire: value limits as SQLSTATE 54000, and clients that vanish with an open
/// cursor free their slots.
fn postgres_clients(server: &TestServer) {
    let out = server.psql(None, "disable", &["-c", "SELECT repeat('x', 2000000000)"]);
    assert!(!out.ok);
    assert!(out.stderr.contains("54000"), "{}", out.stderr);
    assert!(out.stderr.contains("repeat"), "{}", out.stderr);

    for _ in 0..SLOTS {
        let conninfo = format!(
            "host={} port={} user=grafana dbname=gpuwatch sslmode=disable",
            server.pg.ip(),
            server.pg.port()
        );
        let mut psql = Command::new("psql")
            .args([&conninfo, "-X", "-At", "-v", "ON_ERROR_STOP=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("psql");
        let mut stdin = psql.stdin.take().expect("stdin");
        writeln!(
            stdin,
            "BEGIN; DECLARE c CURSOR FOR SELECT * FROM generate_series(1, 1000000000000); FETCH 3 FROM c;"
        )
        .expect("send");
        let mut lines = BufReader::new(psql.stdout.take().expect("stdout")).lines();
        let mut got = 0;
        while got < 3 {
            let line = lines.next().expect("a row").expect("read");
            if line.trim().parse::<u64>().is_ok() {
                got += 1;
            }
        }
        // Gone without a word, the cursor still open.
        psql.kill().expect("kill psql");
        let _ = psql.wait();
    }
    let t = Instant::now();
    loop {
        let out = server.psql(None, "disable", &["-c", "SELECT 1"]);
        if out.ok {
            break;
        }
        assert!(out.stderr.contains("53000"), "{}", out.stderr);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "slots of vanished postgres clients still held: {}",
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The server's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(server: &TestServer) -> u64 {
    let pid = server.pid().expect("running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .expect("kB")
        * 1024
}
