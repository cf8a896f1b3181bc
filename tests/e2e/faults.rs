//! The fault suite: acknowledged writes, `kill -9` (or a stop where a persist is needed), one
//! damaged file, a restart, then exact expectations — which rows survive (all but the damaged
//! ones, counted), what is quarantined, what clients and the log are told, and the readiness of
//! the intact tables — for the WAL, Delta commits of every table, data files and alerting
//! state, on local disk and on S3 (moto: a damaged newest commit and a damaged data file, with
//! `gpuwatch check` and `gpuwatch repair`), and a server started on a full disk (a tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::{S3Server, TestServer, bin_dir, http_get, metric};

use crate::{eventually, now_ns, otlp_json, post_otlp, scalar};

/// Whole seconds, an hour ago: rows of one hour, away from any hour boundary's edge cases.
fn base_time() -> i64 {
    (now_ns() / 1_000_000_000 - 3600) * 1_000_000_000
}

async fn write_power(server: &TestServer, gpu: &str, range: std::ops::Range<usize>, t0: i64) {
    for i in range {
        let body = otlp_json(
            "hw.power",
            i as f64,
            t0 + i as i64 * 1_000_000,
            &[("hw.id", gpu)],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "write {i} to {gpu}: {text}");
    }
}

/// Points `range` of `gpu` in one request: one write, so one persist holds all of them.
async fn write_power_batch(server: &TestServer, gpu: &str, range: std::ops::Range<usize>, t0: i64) {
    let points: Vec<serde_json::Value> = range
        .map(|i| {
            serde_json::json!({
                "timeUnixNano": (t0 + i as i64 * 1_000_000).to_string(),
                "asDouble": i as f64,
                "attributes": [{"key": "hw.id", "value": {"stringValue": gpu}}],
            })
        })
        .collect();
    let body = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "e2e-host"}}]},
        "scopeMetrics": [{"metrics": [{"name": "hw.power", "gauge": {"dataPoints": points}}]}]
    }]});
    let (status, text) = post_otlp(
        &server.url(),
        "application/json",
        None,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "batch to {gpu}: {text}");
}

async fn write_requests(server: &TestServer, range: std::ops::Range<usize>, t0: i64) {
    for i in range {
        let body = otlp_json(
            "app.requests",
            i as f64,
            t0 + i as i64 * 1_000_000,
            &[("route", "/x")],
        );
        let (status, text) =
            post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(status, 200, "write {i} to metrics: {text}");
    }
}

/// Rows `0..n` of `gpu`, except `lost`, each exactly once.
async fn assert_rows(server: &TestServer, gpu: &str, n: usize, lost: &[usize]) {
    let q = |what: &str| format!("SELECT {what} FROM gpu_metrics WHERE gpu_uuid = '{gpu}'");
    let want = (n - lost.len()) as f64;
    let sum: usize = (0..n).filter(|i| !lost.contains(i)).sum();
    assert_eq!(scalar(server, &q("count(*)")).await, want, "{gpu}");
    assert_eq!(
        scalar(server, &q("count(DISTINCT power_watts)")).await,
        want,
        "{gpu}"
    );
    if want > 0.0 {
        assert_eq!(
            scalar(server, &q("sum(power_watts)")).await,
            sum as f64,
            "{gpu}"
        );
    }
}

/// Runs SQL over HTTP: status, the `Gpuwatch-Warning` headers, the body.
async fn sql_warned(server: &TestServer, sql: &str) -> (u16, Vec<String>, String) {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", server.url()))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "sql": sql }).to_string())
        .send()
        .await
        .expect("sql request");
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("gpuwatch-warning")
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .collect();
    (status, warnings, resp.text().await.unwrap_or_default())
}

/// Waits until `table`'s files hold `rows` rows (the persists landed).
async fn wait_persisted(server: &TestServer, table: &str, rows: usize) {
    let q = format!("SELECT coalesce(sum(rows), 0) FROM table_files WHERE table_name = '{table}'");
    eventually(
        Duration::from_secs(30),
        &format!("{rows} rows of {table} persisted"),
        || {
            let q = q.clone();
            async move { scalar(server, &q).await == rows as f64 }
        },
    )
    .await;
}

/// The frames of a WAL segment: `(start, end)` of each record.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    assert_eq!(&bytes[..8], b"GPUWAL02");
    let mut out = Vec::new();
    let mut at = 8;
    while at + 12 <= bytes.len() {
        let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let end = at + 12 + len as usize;
        out.push((at, end));
        at = end;
    }
    out
}

fn only_segment(data: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data.join("wal"))
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 8))
        .collect();
    segs.sort();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.remove(0)
}

/// Files under `<data>/quarantine/` (the notes apart).
fn quarantined(data: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![data.join("quarantine")];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if !p.to_string_lossy().ends_with(".note.json") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn note_of(file: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(format!("{}.note.json", file.display())).expect("note");
    serde_json::from_str(&text).expect("note json")
}

/// The commits of a local table, oldest first.
fn commits(data: &Path, table: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        std::fs::read_dir(data.join("tables").join(table).join("_delta_log"))
            .expect("log")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
    out.sort();
    out
}

/// The data files of a local table.
fn data_files(data: &Path, table: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(data.join("tables").join(table))
        .expect("table")
        .flatten()
    {
        if !d.file_name().to_string_lossy().starts_with("date=") {
            continue;
        }
        for f in std::fs::read_dir(d.path()).expect("date dir").flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.ends_with(".parquet") && !name.starts_with('.') {
                out.push(f.path());
            }
        }
    }
    out.sort();
    out
}

/// Runs `gpuwatch <args>`: exit code, stdout, stderr.
fn gpuwatch(args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run gpuwatch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Replaces an object of the bucket (a signed delete and put: the server's objects are not
/// anonymous-writable).
fn s3_replace(s3: &S3Server, key: &str, bytes: &[u8]) {
    let options: Vec<(String, String)> = [
        ("aws_endpoint", format!("http://{}", s3.addr)),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "test".into()),
        ("aws_secret_access_key", "test".into()),
        ("aws_region", "us-east-1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let scratch = tempfile::tempdir().expect("tempdir");
    let st = gpuwatch_store::persist::Storage::object_store(
        &format!("s3://{}", s3.bucket),
        &options,
        scratch.path(),
        false,
    )
    .expect("s3 client");
    st.delete(key).expect("delete");
    st.put_new(key, bytes::Bytes::copy_from_slice(bytes))
        .expect("put");
}

fn readyz(server: &TestServer, query: &str) -> (u16, String) {
    http_get(server.http, &format!("/readyz{query}")).expect("readyz")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_wal_byte_costs_exactly_one_acknowledged_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("1h")
        .start();
    let t0 = base_time();
    write_power(&server, "GPU-wal", 0..200, t0).await;
    server.kill9();
    let segment = only_segment(&data);
    let mut bytes = std::fs::read(&segment).expect("segment");
    let (start, end) = frames(&bytes)[100];
    bytes[start + 12 + 20] ^= 0x01;
    std::fs::write(&segment, &bytes).expect("flip");
    server.restart();
    assert_rows(&server, "GPU-wal", 200, &[100]).await;
    assert_eq!(
        metric(server.http, "gpuwatch_wal_damaged_segments_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(server.http, "gpuwatch_wal_skipped_bytes_total"),
        Some((end - start) as f64)
    );
    let log = server.log_text();
    assert!(
        log.contains("write-ahead log segment damaged")
            && log.contains(&segment.display().to_string())
            && log.contains(&format!("{start}..{end}")),
        "the log names the segment and the offsets:\n{log}"
    );
    assert!(segment.exists(), "kept until its records are committed");
    // A stop persists: the segment's records are committed, and it moves to quarantine.
    server.stop();
    assert!(!segment.exists());
    let q = quarantined(&data);
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(std::fs::read(&q[0]).expect("kept whole"), bytes);
    let note = note_of(&q[0]);
    assert_eq!(note["details"]["records_replayed"], 199);
    assert_eq!(
        note["details"]["skipped_ranges"],
        serde_json::json!([[start, end]])
    );
    server.restart();
    assert_rows(&server, "GPU-wal", 200, &[100]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zero_filled_4k_hole_in_the_wal_costs_only_the_writes_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("1h")
        .start();
    let t0 = base_time();
    write_power(&server, "GPU-hole", 0..300, t0).await;
    server.kill9();
    let segment = only_segment(&data);
    let before = std::fs::read(&segment).expect("segment");
    let boundary = frames(&before)[150].1;
    let mut bytes = before.clone();
    bytes[boundary - 2048..boundary + 2048].fill(0);
    std::fs::write(&segment, &bytes).expect("hole");
    let lost: Vec<usize> = frames(&before)
        .iter()
        .enumerate()
        .filter(|(_, (a, b))| before[*a..*b] != bytes[*a..*b])
        .map(|(i, _)| i)
        .collect();
    assert!(lost.len() >= 2, "{lost:?}");
    server.restart();
    assert_rows(&server, "GPU-hole", 300, &lost).await;
}

/// Empties the newest commit of `gpu_metrics` (locally or in the bucket); returns its name.
fn empty_newest_commit(data: &Path, s3: Option<(&S3Server, &str)>) -> String {
    let newest = match s3 {
        Some((s3, prefix)) => {
            let mut keys: Vec<String> = s3
                .keys(&format!("{prefix}/tables/gpu_metrics/_delta_log/"))
                .into_iter()
                .filter(|k| k.ends_with(".json"))
                .collect();
            keys.sort();
            let key = keys.pop().expect("a commit");
            s3_replace(s3, &key, b"");
            key
        }
        None => {
            let path = commits(data, "gpu_metrics").pop().expect("a commit");
            std::fs::write(&path, b"").expect("zero bytes");
            path.display().to_string()
        }
    };
    newest.rsplit('/').next().expect("name").to_string()
}

/// While `name` is damaged: exactly the rows before it, every answer says so, the other tables
/// are ready, and writes are taken.
async fn assert_contained(server: &TestServer, name: &str, t0: i64) {
    assert_rows(server, "GPU-a", 50, &[]).await;
    let (status, warnings, _) = sql_warned(
        server,
        "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-a'",
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        warnings.len() == 1 && warnings[0].contains(name) && warnings[0].contains("are not read"),
        "{warnings:?}"
    );
    let (code, body) = readyz(server, "");
    assert!(
        code == 200 && body.contains("degraded: table gpu_metrics"),
        "{body}"
    );
    let (code, body) = readyz(server, "?table=gpu_metrics");
    assert!(
        code == 503 && body.contains("is empty (0 bytes)") && body.contains("gpuwatch repair"),
        "{body}"
    );
    assert_eq!(readyz(server, "?table=metrics").0, 200);
    assert_eq!(
        metric(server.http, "gpuwatch_damaged_table_logs"),
        Some(1.0)
    );
    assert!(
        server.log_text().contains("delta log damaged"),
        "{}",
        server.log_text()
    );
    let out = server.psql(None, "disable", &["-c", "SELECT count(*) FROM gpu_metrics"]);
    assert!(
        out.ok && out.stderr.contains("WARNING") && out.stderr.contains(name),
        "{out:?}"
    );
    // Writes are kept (the damaged table's in the WAL), the other tables persist.
    write_power(server, "GPU-a", 100..110, t0).await;
    write_requests(server, 0..5, t0).await;
    wait_persisted(server, "metrics", 5).await;
}

/// `gpuwatch check` names `name`, a dry run changes nothing, `repair --apply` fixes it.
fn check_and_repair(data: &Path, s3: Option<(&S3Server, &str)>, name: &str) {
    let mut args = vec!["--data-dir".to_string(), data.display().to_string()];
    let mut env = Vec::new();
    if let Some((s3, prefix)) = s3 {
        args.extend(["--object-store".to_string(), s3.url(prefix)]);
        env = s3.env();
    }
    let with = |cmd: &str, more: &[&str]| {
        let mut a: Vec<&str> = vec![cmd];
        a.extend(args.iter().map(String::as_str));
        a.extend(more);
        gpuwatch(&a, &env)
    };
    let (code, out, _) = with("check", &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(name) && out.contains("is empty (0 bytes)"),
        "{out}"
    );
    let (code, out, err) = with("repair", &[]);
    assert!(code == 0 && err.contains("dry run"), "{out}{err}");
    assert_eq!(with("check", &[]).0, 1, "a dry run changes nothing");
    let (code, out, err) = with("repair", &["--apply"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = with("check", &["--format", "json"]);
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json report");
    assert!(
        report["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x["kind"] == "quarantined"))
    );
}

/// A zero-byte newest `gpu_metrics` commit (as a full disk or a crashed copy leaves it) on local
/// disk or S3: an error, never an empty commit. The table is read at the version before it
/// (exactly its rows), the answer says so, the other tables serve and ingest, writes are kept;
/// `gpuwatch check` names it, `gpuwatch repair --apply` brings every row back.
async fn zero_byte_newest_commit(s3: Option<&S3Server>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let bucket = s3.map(|s| (s, "faults/newest"));
    let mut builder = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms");
    if let Some((s3, prefix)) = bucket {
        builder = builder.object_store(s3, prefix);
    }
    let mut server = builder.start();
    let t0 = base_time();
    write_power_batch(&server, "GPU-a", 0..50, t0).await;
    wait_persisted(&server, "gpu_metrics", 50).await;
    write_power_batch(&server, "GPU-a", 50..100, t0).await;
    wait_persisted(&server, "gpu_metrics", 100).await;
    server.kill9();
    let name = empty_newest_commit(&data, bucket);
    server.restart();
    assert_contained(&server, &name, t0).await;
    server.kill9();
    check_and_repair(&data, bucket, &name);
    server.restart();
    assert_rows(&server, "GPU-a", 110, &[]).await;
    let (_, warnings, _) = sql_warned(&server, "SELECT count(*) FROM gpu_metrics").await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(readyz(&server, "?table=gpu_metrics").0, 200);
    assert_eq!(
        scalar(
            &server,
            "SELECT count(*) FROM metrics WHERE metric = 'app.requests'"
        )
        .await,
        5.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zero_byte_newest_commit_is_named_and_repair_brings_its_rows_back() {
    zero_byte_newest_commit(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zero_byte_newest_commit_on_s3_is_named_and_repair_brings_its_rows_back() {
    let s3 = S3Server::start();
    zero_byte_newest_commit(Some(&s3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_garbage_older_commit_hides_the_versions_after_it_until_repaired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    let t0 = base_time();
    for round in 0..3 {
        write_power_batch(&server, "GPU-old", round * 10..round * 10 + 10, t0).await;
        wait_persisted(&server, "gpu_metrics", round * 10 + 10).await;
    }
    server.kill9();
    let log = commits(&data, "gpu_metrics");
    // The first commit adding rows (after the table's creation), then two more.
    let older = &log[log.len() - 3];
    let mut text = std::fs::read(older).expect("commit");
    let cut = text.len() / 2;
    text.truncate(cut);
    text.extend_from_slice(b"\x00\x13garbage");
    std::fs::write(older, &text).expect("garbage");
    server.restart();
    assert_rows(&server, "GPU-old", 0, &[]).await;
    assert_eq!(readyz(&server, "?table=gpu_metrics").0, 503);
    assert_eq!(readyz(&server, "?table=gpu_processes").0, 200);
    server.kill9();
    let dd = data.display().to_string();
    let (code, out, _) = gpuwatch(&["repair", "--apply", "--data-dir", &dd], &[]);
    assert_eq!(code, 0, "{out}");
    server.restart();
    assert_rows(&server, "GPU-old", 30, &[]).await;
}

/// Every table's first commit emptied at once: the server is ready, every table says why it
/// is not, writes are kept in the WAL, and repair makes every table whole again.
#[tokio::test(flavor = "multi_thread")]
async fn a_zero_byte_first_commit_of_each_table_never_takes_the_server_down() {
    const TABLES: [&str; 7] = [
        "gpu_metrics",
        "metrics",
        "gpu_metrics_1m",
        "gpu_metrics_1h",
        "gpu_processes",
        "gpu_events",
        "alerts",
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms")
        .start();
    let t0 = base_time();
    write_requests(&server, 0..10, t0).await;
    wait_persisted(&server, "metrics", 10).await;
    server.kill9();
    for t in TABLES {
        std::fs::write(commits(&data, t)[0].clone(), b"").expect("zero bytes");
    }
    server.restart();
    for t in TABLES {
        let (code, body) = readyz(&server, &format!("?table={t}"));
        assert!(
            code == 503 && body.contains("no version is readable"),
            "{t}: {body}"
        );
        let (status, warnings, _) = sql_warned(&server, &format!("SELECT count(*) FROM {t}")).await;
        assert!(status == 200 && warnings.len() == 1, "{t}: {warnings:?}");
    }
    assert_eq!(readyz(&server, "").0, 200);
    write_power(&server, "GPU-first", 0..7, t0).await;
    write_requests(&server, 10..12, t0).await;
    assert_rows(&server, "GPU-first", 7, &[]).await;
    server.kill9();
    let dd = data.display().to_string();
    let (code, out, _) = gpuwatch(&["check", "--data-dir", &dd], &[]);
    assert!(code == 1 && TABLES.iter().all(|t| out.contains(t)), "{out}");
    assert_eq!(
        gpuwatch(&["repair", "--apply", "--data-dir", &dd], &[]).0,
        0
    );
    server.restart();
    for t in TABLES {
        assert_eq!(readyz(&server, &format!("?table={t}")).0, 200, "{t}");
    }
    assert_rows(&server, "GPU-first", 7, &[]).await;
    assert_eq!(
        scalar(
            &server,
            "SELECT count(*) FROM metrics WHERE metric = 'app.requests'"
        )
        .await,
        12.0,
        "the persisted rows are committed again, the WAL's replayed"
    );
}

/// Three hours in three files; one garbled (same size), one emptied: the answer holds exactly
/// the intact file's rows and names the two others with their rows, over HTTP and Postgres.
async fn damaged_data_files(s3: Option<&S3Server>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let prefix = "faults/files";
    let mut builder = TestServer::builder()
        .data_dir(&data)
        .arg("--persist-interval")
        .arg("300ms");
    if let Some(s3) = s3 {
        builder = builder.object_store(s3, prefix);
    }
    let mut server = builder.start();
    let t0 = base_time() - 2 * 3_600_000_000_000;
    let hour = 3_600_000_000_000i64;
    for h in 0..3i64 {
        write_power_batch(&server, "GPU-files", 0..10, t0 + h * hour).await;
    }
    wait_persisted(&server, "gpu_metrics", 30).await;
    server.kill9();
    let names: Vec<String> = match s3 {
        Some(s3) => {
            let mut keys: Vec<String> = s3
                .keys(&format!("{prefix}/tables/gpu_metrics/"))
                .into_iter()
                .filter(|k| k.ends_with(".parquet"))
                .collect();
            keys.sort();
            assert_eq!(keys.len(), 3, "{keys:?}");
            s3_replace(s3, &keys[0], &vec![0x42; 2048]);
            s3_replace(s3, &keys[1], b"");
            keys
        }
        None => {
            let files = data_files(&data, "gpu_metrics");
            assert_eq!(files.len(), 3, "{files:?}");
            let size = std::fs::metadata(&files[0]).expect("size").len() as usize;
            std::fs::write(&files[0], vec![0x42; size]).expect("garble");
            std::fs::write(&files[1], b"").expect("empty");
            files.iter().map(|f| f.display().to_string()).collect()
        }
    };
    let short = |i: usize| names[i].rsplit('/').next().expect("name").to_string();
    server.restart();
    let q = "SELECT count(*) FROM gpu_metrics WHERE gpu_uuid = 'GPU-files'";
    assert_eq!(
        scalar(&server, q).await,
        10.0,
        "exactly the intact file's rows"
    );
    let (_, warnings, _) = sql_warned(&server, q).await;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    for i in 0..2 {
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(&short(i)) && w.contains("(10 rows)")),
            "{warnings:?}"
        );
    }
    let out = server.psql(None, "disable", &["-c", q]);
    assert!(out.ok && out.stdout.trim() == "10", "{out:?}");
    assert_eq!(out.stderr.matches("WARNING").count(), 2, "{out:?}");
    // The Prometheus API says so in its `warnings`, as Prometheus does for a partial answer.
    let at = (t0 + 3 * hour) as f64 / 1e9;
    let resp = reqwest::Client::new()
        .get(format!("{}/api/v1/query", server.url()))
        .query(&[
            (
                "query",
                "sum(count_over_time(DCGM_FI_DEV_POWER_USAGE{UUID=\"GPU-files\"}[4h]))".to_string(),
            ),
            ("time", format!("{at}")),
        ])
        .send()
        .await
        .expect("promql request");
    let body = resp.bytes().await.expect("promql body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("promql json");
    assert_eq!(v["data"]["result"][0]["value"][1], "10", "{v}");
    let warned = v["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warned.len(), 2, "{v}");
    assert!(
        warned
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(&short(0)))),
        "{v}"
    );
    assert_eq!(metric(server.http, "gpuwatch_damaged_files"), Some(2.0));
    let log = server.log_text();
    assert!(log.contains(&short(0)) && log.contains(&short(1)), "{log}");
    assert_eq!(
        readyz(&server, "?table=gpu_metrics").0,
        200,
        "a damaged file does not stop its table"
    );
    // An answer that could not have read them says nothing.
    let (_, warnings, _) = sql_warned(
        &server,
        &format!(
            "SELECT count(*) FROM gpu_metrics WHERE time >= to_timestamp_nanos({})",
            t0 + 2 * hour
        ),
    )
    .await;
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_data_file_costs_exactly_its_rows_and_every_answer_says_so() {
    damaged_data_files(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_data_file_on_s3_costs_exactly_its_rows_and_every_answer_says_so() {
    let s3 = S3Server::start();
    damaged_data_files(Some(&s3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn damaged_alerting_state_is_set_aside_and_ingest_and_sql_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let mut server = TestServer::builder().data_dir(&data).start();
    server.stop();
    std::fs::write(
        data.join("alerts/state.json"),
        b"{\"alerts\": {\"Idle\": [tru",
    )
    .expect("state");
    std::fs::write(data.join("alerts/silences.json"), b"").expect("silences");
    server.restart();
    let q = quarantined(&data);
    assert_eq!(q.len(), 2, "{q:?}");
    assert!(q.iter().any(|p| p.ends_with("alerts/state.json")), "{q:?}");
    assert_eq!(
        metric(server.http, "gpuwatch_alerting_state_files_quarantined"),
        Some(2.0)
    );
    assert!(
        server.log_text().contains("alerting state damaged"),
        "{}",
        server.log_text()
    );
    let t0 = base_time();
    write_power(&server, "GPU-alerts", 0..3, t0).await;
    assert_rows(&server, "GPU-alerts", 3, &[]).await;
    let (code, body) = http_get(server.http, "/api/v1/silences").expect("silences");
    assert_eq!((code, body.trim()), (200, "[]"));
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A server started on a full disk is not ready and says why; once space is freed it opens
/// by itself, and what it then acknowledges survives `kill -9`.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_started_on_a_full_disk_becomes_ready_by_itself_once_space_is_freed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("small-disk");
    std::fs::create_dir_all(&mnt).expect("mount point");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!(
            "SKIPPED: mounting a 4 MB tmpfs was refused (run as root, as CI does, to simulate a full disk)"
        );
        return;
    }
    let _unmount = Unmount(mnt.clone());
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[0u8; 512]).is_ok() {}
    }
    // The data directory is the tmpfs (the server's log is written beside it, off the tmpfs).
    let mut server = TestServer::builder()
        .data_dir(&mnt)
        .arg("--persist-interval")
        .arg("1h")
        .spawn();
    let t0 = base_time();
    eventually(
        Duration::from_secs(20),
        "an honest not-ready answer",
        || async {
            http_get(server.http, "/readyz").is_ok_and(|(code, body)| {
                code == 503 && body.contains("cannot open the store") && body.contains("free space")
            })
        },
    )
    .await;
    let body = otlp_json("hw.power", 1.0, t0, &[("hw.id", "GPU-full")]);
    let (status, text) =
        post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
    assert!(
        status == 503 && text.contains("cannot open the store"),
        "{status}: {text}"
    );
    std::fs::remove_file(&filler).expect("free space");
    server.wait_until_ready(Duration::from_secs(60));
    write_power(&server, "GPU-full", 0..20, t0).await;
    server.kill9();
    server.restart();
    assert_rows(&server, "GPU-full", 20, &[]).await;
}
