//! PromQL against a real Prometheus as the oracle: Prometheus scrapes the agent's `/metrics`
//! (a simulated node with jobs, XIDs and throttling) and itself, and remote-writes the very same
//! samples into gpuwatch. Every expression of `tests/promql/corpus.txt` is then asked of both,
//! as instant queries and as range queries at several steps, and the answers are compared
//! series by series (label sets, timestamps, values to a relative 1e-6). The pass rate is
//! printed and must reach [`MIN_PASS_RATE`] (docs/promql.md). The same setup then serves
//! promtool (`promtool query …`, a client nobody here wrote), the requests Grafana's Prometheus
//! data source sends, and every panel and variable of NVIDIA's dashboard 12239.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuwatch_e2e::{TestServer, bin_dir, free_addr};
use serde_json::Value;

/// The share of comparisons that must agree (docs/promql.md, "Oracle").
const MIN_PASS_RATE: f64 = 1.0;

/// How long the fleet is scraped before the comparison.
const SCRAPE_FOR: Duration = Duration::from_secs(100);

/// The simulated node's host name.
const HOST: &str = "oracle-node";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(metrics: std::net::SocketAddr) -> Proc {
    // The OTLP endpoint is a port nobody listens on: only the exposition is used here.
    let dead = free_addr();
    let child = Command::new(bin_dir().join("gpuwatch-agent"))
        .args([
            "--source",
            "synthetic",
            "--synthetic-gpus",
            "4",
            "--seed",
            "26",
            "--host",
            HOST,
            "--interval",
            "1s",
            "--log-level",
            "error",
            "--metrics-addr",
            &metrics.to_string(),
            "--endpoint",
            &format!("http://{dead}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gpuwatch-agent");
    Proc(child)
}

fn start_prometheus(
    dir: &Path,
    listen: std::net::SocketAddr,
    agent: std::net::SocketAddr,
    write: &str,
) -> Proc {
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1m\n\
         scrape_configs:\n\
         \x20 - job_name: gpuwatch-agent\n    static_configs:\n      - targets: ['{agent}']\n\
         \x20 - job_name: prometheus\n    static_configs:\n      - targets: ['{listen}']\n\
         remote_write:\n  - url: {write}\n    queue_config:\n      batch_send_deadline: 1s\n      min_backoff: 100ms\n      max_backoff: 1s\n"
    );
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, config).expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={listen}"))
        .arg("--storage.remote.flush-deadline=5s")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start prometheus ({e}): install it with `apt-get install -y prometheus`, as .ci/run does")
        });
    Proc(child)
}

/// A GET of `path` with `params`; the JSON answer and status.
async fn get(base: &str, path: &str, params: &[(&str, String)]) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .query(params)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .expect("GET");
    let status = resp.status().as_u16();
    let body = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A form-encoded POST, as Grafana sends queries.
async fn post_form(base: &str, path: &str, params: &[(&str, String)]) -> (u16, Value) {
    let body: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", form_escape(k), form_escape(v)))
        .collect();
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.join("&"))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    let body = resp.bytes().await.expect("body");
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// `application/x-www-form-urlencoded` escaping.
fn form_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// Values agree when equal, both NaN, or within a relative 1e-6 (an absolute 1e-9 near 0).
fn close(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let (Ok(x), Ok(y)) = (parse_value(a), parse_value(b)) else {
        return false;
    };
    if x.is_nan() && y.is_nan() {
        return true;
    }
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    (x - y).abs() <= 1e-6 * x.abs().max(y.abs()) || (x - y).abs() < 1e-9
}

fn parse_value(s: &str) -> Result<f64, std::num::ParseFloatError> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        other => other.parse(),
    }
}

/// An answer reduced to what is compared: the error type, or the result type and, per label
/// set, its points.
#[derive(Debug)]
enum Answer {
    Error(String),
    Points(String, BTreeMap<String, Vec<(String, String)>>),
}

fn point(p: &Value) -> (String, String) {
    (
        p[0].to_string(),
        p[1].as_str().unwrap_or_default().to_string(),
    )
}

fn answer(v: &Value) -> Answer {
    if v["status"] != "success" {
        return Answer::Error(v["errorType"].as_str().unwrap_or("no JSON").to_string());
    }
    let t = v["data"]["resultType"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = &v["data"]["result"];
    let mut out = BTreeMap::new();
    match t.as_str() {
        "scalar" | "string" => {
            out.insert(String::new(), vec![point(r)]);
        }
        _ => {
            for s in r.as_array().into_iter().flatten() {
                let key = s["metric"].to_string();
                let pts = match s.get("values") {
                    Some(vs) => vs.as_array().into_iter().flatten().map(point).collect(),
                    None => vec![point(&s["value"])],
                };
                out.insert(key, pts);
            }
        }
    }
    Answer::Points(t, out)
}

/// `None` when the answers agree, else what differs.
fn compare(gw: &Answer, prom: &Answer) -> Option<String> {
    match (gw, prom) {
        (Answer::Error(a), Answer::Error(b)) if a == b => None,
        (Answer::Points(ta, a), Answer::Points(tb, b)) => {
            if ta != tb {
                return Some(format!("result type {ta} vs {tb}"));
            }
            for k in a.keys().chain(b.keys()) {
                let (Some(pa), Some(pb)) = (a.get(k), b.get(k)) else {
                    return Some(format!(
                        "series {k} only in {}",
                        if a.contains_key(k) {
                            "gpuwatch"
                        } else {
                            "prometheus"
                        }
                    ));
                };
                if pa.len() != pb.len() {
                    return Some(format!("{k}: {} points vs {}", pa.len(), pb.len()));
                }
                for (x, y) in pa.iter().zip(pb) {
                    if x.0 != y.0 || !close(&x.1, &y.1) {
                        return Some(format!("{k}: {x:?} vs {y:?}"));
                    }
                }
            }
            None
        }
        _ => Some(format!("{gw:?} vs {prom:?}")),
    }
}

/// The corpus, `$HOST` filled in.
fn corpus() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("promql/corpus.txt");
    std::fs::read_to_string(&path)
        .expect("read tests/promql/corpus.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.replace("$HOST", HOST))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn promql_answers_as_prometheus_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("gw"))
        .start();
    let agent_addr = free_addr();
    let prom_addr = free_addr();
    let _agent = start_agent(agent_addr);
    let _prom = start_prometheus(
        dir.path(),
        prom_addr,
        agent_addr,
        &format!("{}/api/v1/write", server.url()),
    );
    let gw = server.url();
    let prom = format!("http://{prom_addr}");
    tokio::time::sleep(SCRAPE_FOR).await;
    let t = (now_s() - 5.0).floor() + 0.25;
    wait_for_remote_write_of(&gw, &prom, t, 2).await;

    let queries = corpus();
    assert!(
        queries.len() >= 150,
        "the corpus has {} expressions",
        queries.len()
    );
    let (mut passed, mut failed) = (0usize, Vec::new());
    for (n, q) in queries.iter().enumerate() {
        let mut checks: Vec<(&str, &str, Vec<(&str, String)>)> = vec![
            (
                "instant",
                "/api/v1/query",
                vec![("query", q.clone()), ("time", format!("{t:.3}"))],
            ),
            (
                "instant-37s",
                "/api/v1/query",
                vec![("query", q.clone()), ("time", format!("{:.3}", t - 37.5))],
            ),
        ];
        for step in ["1", "7s", "30"] {
            checks.push((
                "range",
                "/api/v1/query_range",
                vec![
                    ("query", q.clone()),
                    ("start", format!("{:.3}", t - 90.0)),
                    ("end", format!("{t:.3}")),
                    ("step", step.to_string()),
                ],
            ));
        }
        for (kind, path, params) in checks {
            // Half of the requests to gpuwatch are form POSTs, as Grafana sends them.
            let (_, a) = if n % 2 == 0 {
                get(&gw, path, &params).await
            } else {
                post_form(&gw, path, &params).await
            };
            let (_, b) = get(&prom, path, &params).await;
            match compare(&answer(&a), &answer(&b)) {
                None => passed += 1,
                Some(why) => failed.push(format!("{kind} {q} {:?}: {why}", params.last())),
            }
        }
    }
    let total = passed + failed.len();
    let rate = passed as f64 / total as f64;
    println!(
        "promql oracle: {passed} of {total} comparisons agree ({:.2} %), {} expressions",
        rate * 100.0,
        queries.len()
    );
    for f in &failed {
        println!("  differs: {f}");
    }
    assert!(
        rate >= MIN_PASS_RATE,
        "pass rate {:.2} % is below the documented {:.2} %: {failed:#?}",
        rate * 100.0,
        MIN_PASS_RATE * 100.0
    );

    promtool_reads_gpuwatch(&gw, t);
    grafana_requests(&gw, t).await;
    dashboard_12239(&gw, t).await;
    error_shapes(&gw, t).await;
}

/// `promtool query instant|range|series|labels` against gpuwatch.
fn promtool_reads_gpuwatch(gw: &str, t: f64) {
    let run = |args: &[&str]| -> String {
        let out = Command::new("promtool")
            .args(args)
            .output()
            .expect("run promtool (apt-get install -y prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (time, start) = (format!("{t:.3}"), format!("{:.3}", t - 60.0));
    let instant = run(&[
        "query",
        "instant",
        "--time",
        &time,
        gw,
        "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    ]);
    assert!(
        instant.contains(&format!("Hostname=\"{HOST}\"")),
        "{instant}"
    );
    let range = run(&[
        "query",
        "range",
        "--start",
        &start,
        "--end",
        &time,
        "--step",
        "15s",
        gw,
        "max(DCGM_FI_DEV_GPU_TEMP)",
    ]);
    assert!(range.contains(" @["), "{range}");
    let series = run(&[
        "query",
        "series",
        "--match",
        "DCGM_FI_DEV_FB_FREE",
        "--start",
        &start,
        "--end",
        &time,
        gw,
    ]);
    assert_eq!(series.lines().count(), 4, "{series}");
    assert!(series.contains("UUID="), "{series}");
    let labels = run(&[
        "query", "labels", "--start", &start, "--end", &time, gw, "gpu",
    ]);
    for g in ["0", "1", "2", "3"] {
        assert!(labels.lines().any(|l| l.trim() == g), "{labels}");
    }
}

/// The request forms of Grafana's Prometheus data source.
async fn grafana_requests(gw: &str, t: f64) {
    let (start, end) = (format!("{}", (t - 60.0) as i64), format!("{}", t as i64));
    // A panel: POST form with query, start, end, step and timeout.
    let (status, v) = post_form(
        gw,
        "/api/v1/query_range",
        &[
            ("query", "avg(DCGM_FI_DEV_GPU_TEMP)".into()),
            ("start", start.clone()),
            ("end", end.clone()),
            ("step", "15".into()),
            ("timeout", "30s".into()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["resultType"], "matrix");
    // The data source's health check and feature detection.
    let (status, v) = get(gw, "/api/v1/status/buildinfo", &[]).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["data"]["version"]
            .as_str()
            .is_some_and(|s| s.starts_with("2.")),
        "{v}"
    );
    let (status, v) = get(gw, "/api/v1/metadata", &[]).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["DCGM_FI_DEV_GPU_UTIL"][0]["type"], "gauge", "{v}");
    // Label names and values, with and without match[].
    let (status, v) = get(
        gw,
        "/api/v1/labels",
        &[("start", start.clone()), ("end", end.clone())],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let names: Vec<&str> = v["data"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for n in ["Hostname", "UUID", "__name__", "gpu", "instance", "job"] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    let (status, v) = post_form(
        gw,
        "/api/v1/labels",
        &[
            ("match[]", "DCGM_FI_DEV_FB_FREE".into()),
            ("start", start.clone()),
            ("end", end.clone()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["data"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "modelName")),
        "{v}"
    );
    let (status, v) = get(
        gw,
        "/api/v1/label/__name__/values",
        &[("start", start.clone()), ("end", end.clone())],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["data"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "DCGM_FI_DEV_GPU_UTIL")),
        "{v}"
    );
    // An older Grafana's label_values(): the series of the selector.
    let (status, v) = get(
        gw,
        "/api/v1/series",
        &[
            (
                "match[]",
                format!("DCGM_FI_DEV_FB_FREE{{Hostname=~\"{HOST}\"}}"),
            ),
            ("start", start),
            ("end", end),
        ],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(4), "{v}");
}

/// Every variable and panel of NVIDIA's dashboard 12239, as Grafana sends them with "All" and
/// with a multi-value selection of the variables' own answers.
async fn dashboard_12239(gw: &str, t: f64) {
    let (start, end) = (format!("{}", (t - 300.0) as i64), format!("{}", t as i64));
    // Variable Hostname = label_values(DCGM_FI_DEV_FB_FREE, Hostname).
    let (status, v) = get(
        gw,
        "/api/v1/label/Hostname/values",
        &[
            ("match[]", "DCGM_FI_DEV_FB_FREE".into()),
            ("start", start.clone()),
            ("end", end.clone()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let hosts: Vec<String> = v["data"]
        .as_array()
        .expect("hosts")
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect();
    assert_eq!(hosts, vec![HOST.to_string()]);
    // Variable gpu = label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu).
    for host_re in [".*".to_string(), format!("({})", hosts.join("|"))] {
        let (status, v) = get(
            gw,
            "/api/v1/label/gpu/values",
            &[
                (
                    "match[]",
                    format!("DCGM_FI_DEV_FB_FREE{{Hostname=~\"{host_re}\"}}"),
                ),
                ("start", start.clone()),
                ("end", end.clone()),
            ],
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let gpus: Vec<&str> = v["data"]
            .as_array()
            .expect("gpus")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(gpus, vec!["0", "1", "2", "3"], "{host_re}");
    }
    let panels = [
        (
            "max(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
            true,
        ),
        (
            "avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~\"$Hostname\", gpu=~\"$gpu\"})",
            true,
        ),
        (
            "max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, uuid)",
            true,
        ),
        (
            "sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (gpu))",
            false,
        ),
        (
            "max(DCGM_FI_DEV_SM_CLOCK{Hostname=~\"$Hostname\", gpu=~\"$gpu\"} * 1000000) by (Hostname, UUID, gpu)",
            true,
        ),
        (
            "max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
            true,
        ),
        (
            "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
            true,
        ),
        (
            "max(DCGM_FI_DEV_FB_USED{Hostname=~\"$Hostname\", gpu=~\"$gpu\"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
            true,
        ),
    ];
    for (host, gpu) in [(".*", ".*"), (&*format!("({HOST})"), "(0|2)")] {
        for (expr, range) in panels {
            let q = expr.replace("$Hostname", host).replace("$gpu", gpu);
            let (path, params) = if range {
                (
                    "/api/v1/query_range",
                    vec![
                        ("query", q.clone()),
                        ("start", start.clone()),
                        ("end", end.clone()),
                        ("step", "15".to_string()),
                    ],
                )
            } else {
                (
                    "/api/v1/query",
                    vec![("query", q.clone()), ("time", end.clone())],
                )
            };
            let (status, v) = post_form(gw, path, &params).await;
            assert_eq!(status, 200, "{q}: {v}");
            let n = v["data"]["result"].as_array().map_or(0, Vec::len);
            assert!(n > 0, "panel {q} has no data: {v}");
        }
    }
}

/// Prometheus's error shapes: bad_data 400, execution 422.
async fn error_shapes(gw: &str, t: f64) {
    let time = format!("{t:.3}");
    for (q, kind, status, says) in [
        ("sum(", "bad_data", 400, "invalid parameter \"query\""),
        (
            "histogram_count(DCGM_FI_DEV_GPU_TEMP)",
            "bad_data",
            400,
            "histogram_count",
        ),
        (
            "{gpu=~\".*\"}",
            "bad_data",
            400,
            "at least one non-empty matcher",
        ),
        (
            "DCGM_FI_DEV_GPU_TEMP + on (Hostname) DCGM_FI_DEV_GPU_TEMP",
            "execution",
            422,
            "many-to-many",
        ),
        (
            "rate({__name__=~\"DCGM_FI_DEV_(GPU|MEMORY)_TEMP\"}[1m])",
            "execution",
            422,
            "same labelset",
        ),
    ] {
        let (code, v) = get(
            gw,
            "/api/v1/query",
            &[("query", q.to_string()), ("time", time.clone())],
        )
        .await;
        assert_eq!(code, status, "{q}: {v}");
        assert_eq!(v["status"], "error", "{q}: {v}");
        assert_eq!(v["errorType"], kind, "{q}: {v}");
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(says)),
            "{q}: {v}"
        );
    }
    let (code, v) = get(
        gw,
        "/api/v1/query_range",
        &[
            ("query", "up".into()),
            ("start", time.clone()),
            ("end", format!("{:.3}", t - 1.0)),
            ("step", "1".into()),
        ],
    )
    .await;
    assert_eq!(
        (code, v["errorType"].as_str()),
        (400, Some("bad_data")),
        "{v}"
    );
    let (code, v) = get(
        gw,
        "/api/v1/query_range",
        &[
            ("query", "up".into()),
            ("start", "0".into()),
            ("end", time.clone()),
            ("step", "1".into()),
        ],
    )
    .await;
    assert_eq!(
        (code, v["errorType"].as_str()),
        (400, Some("bad_data")),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("11,000 points")),
        "{v}"
    );
    let (code, v) = get(gw, "/api/v1/series", &[]).await;
    assert_eq!(
        (code, v["errorType"].as_str()),
        (400, Some("bad_data")),
        "{v}"
    );
}

/// Serves a dcgm-exporter exposition whose GPU changes jobs at `switch` (the old series ends)
/// and that fails its scrapes for a while after `fail` (every series of the target ends), from a
/// thread, until the process ends.
fn serve_changing_exposition(switch: Instant, fail: Instant) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind exposition");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let now = Instant::now();
            if now >= fail && now < fail + Duration::from_secs(3) {
                let _ = write!(
                    s,
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                continue;
            }
            let job = if now < switch { "100" } else { "200" };
            let body = format!(
                "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
                 DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"GPU-aaaa\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"stale-node\",hpc_job=\"{job}\"}} {}\n\
                 DCGM_FI_DEV_GPU_UTIL{{gpu=\"1\",UUID=\"GPU-bbbb\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"stale-node\"}} {}\n\
                 # TYPE DCGM_FI_DEV_XID_ERRORS gauge\n\
                 DCGM_FI_DEV_XID_ERRORS{{gpu=\"0\",UUID=\"GPU-aaaa\",device=\"nvidia0\",Hostname=\"stale-node\",hpc_job=\"{job}\"}} 0\n",
                n % 100,
                (n * 7) % 100
            );
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// Series that end (a job change, a failed scrape) end at the same step in both: gpuwatch infers
/// the stale markers Prometheus writes (docs/promql.md, "Staleness").
#[tokio::test(flavor = "multi_thread")]
async fn series_go_stale_when_prometheus_marks_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("gw"))
        .start();
    let start = Instant::now();
    let target = serve_changing_exposition(
        start + Duration::from_secs(12),
        start + Duration::from_secs(22),
    );
    let prom_addr = free_addr();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
         scrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['{target}']\n\
         remote_write:\n  - url: {}/api/v1/write\n    queue_config:\n      batch_send_deadline: 1s\n      min_backoff: 100ms\n      max_backoff: 1s\n",
        server.url()
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let _prom = Proc(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus (apt-get install -y prometheus)"),
    );
    let prom = format!("http://{prom_addr}");
    tokio::time::sleep(Duration::from_secs(35)).await;
    let t = (now_s() - 3.0).floor() + 0.5;
    wait_for_remote_write_of(&server.url(), &prom, t, 1).await;
    let mut agree = 0;
    for q in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "count by (hpc_job) (DCGM_FI_DEV_GPU_UTIL)",
        "up",
    ] {
        let params = vec![
            ("query", q.to_string()),
            ("start", format!("{:.3}", t - 30.0)),
            ("end", format!("{t:.3}")),
            ("step", "0.5".to_string()),
        ];
        let (_, a) = get(&server.url(), "/api/v1/query_range", &params).await;
        let (_, b) = get(&prom, "/api/v1/query_range", &params).await;
        assert_eq!(compare(&answer(&a), &answer(&b)), None, "{q}:\n{a}\n{b}");
        agree += 1;
    }
    assert_eq!(agree, 4);
    // The job change really ended a series within the window (in both).
    let (_, b) = get(
        &prom,
        "/api/v1/query",
        &[
            (
                "query",
                "count(count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"}[30s]))".into(),
            ),
            ("time", format!("{t:.3}")),
        ],
    )
    .await;
    assert_eq!(b["data"]["result"][0]["value"][1], "2", "{b}");
}

/// Waits until gpuwatch holds the last scrape before `t` of `targets` targets.
async fn wait_for_remote_write_of(gw: &str, prom: &str, t: f64, targets: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let q = [
        ("query", "timestamp(up)".to_string()),
        ("time", format!("{t:.3}")),
    ];
    loop {
        let (_, a) = get(gw, "/api/v1/query", &q).await;
        let (_, b) = get(prom, "/api/v1/query", &q).await;
        if compare(&answer(&a), &answer(&b)).is_none()
            && a["data"]["result"]
                .as_array()
                .is_some_and(|r| r.len() == targets)
        {
            tokio::time::sleep(Duration::from_secs(3)).await;
            return;
        }
        assert!(
            Instant::now() < deadline,
            "gpuwatch never caught up with prometheus: {a} vs {b}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
