//! Job reports against crafted data sent over OTLP/HTTP: a 4-GPU job with an idle GPU, a
//! power-capped GPU (informational, never blamed), a GPU with tiny kernels and an XID during the job. The report (HTTP and
//! `gpuwatch job`) equals the `jobs` table and a hand computation; unknown and hostile job ids
//! get 404 / exit 1; the routes need a query token when tokens are configured.

use std::process::Command;

use gpuwatch_e2e::{TestServer, bin_dir};

use crate::{now_ns, post_otlp, rows};

const GIB: i64 = 1 << 30;
/// A job id with SQL metacharacters: it must stay a value.
const JOB: &str = "e2e-7'; DROP TABLE jobs; --";

struct Gpu {
    index: usize,
    util: f64,
    sm: f64,
    mem: i64,
    /// Clock event reasons of sample k.
    reasons: fn(usize) -> i64,
    /// Joules per 10 s.
    joules: f64,
}

/// One GPU sample as the agent sends it (OTLP/JSON).
fn sample(t: i64, g: &Gpu, energy: f64, reasons: i64) -> serde_json::Value {
    let attrs = serde_json::json!([
        {"key": "hw.id", "value": {"stringValue": format!("GPU-e2e-{}", g.index)}},
        {"key": "gpu.index", "value": {"intValue": g.index.to_string()}},
        {"key": "hw.model", "value": {"stringValue": "NVIDIA H100 80GB HBM3"}},
        {"key": "job.id", "value": {"stringValue": JOB}},
        {"key": "job.user", "value": {"stringValue": "alice"}},
        {"key": "job.name", "value": {"stringValue": "train"}},
        {"key": "job.scheduler", "value": {"stringValue": "slurm"}},
    ]);
    let gauge = |name: &str, v: serde_json::Value| {
        serde_json::json!({"name": name, "gauge": {"dataPoints": [
            {"timeUnixNano": t.to_string(), "attributes": attrs, "asDouble": v}
        ]}})
    };
    let int = |name: &str, v: i64| {
        serde_json::json!({"name": name, "gauge": {"dataPoints": [
            {"timeUnixNano": t.to_string(), "attributes": attrs, "asInt": v.to_string()}
        ]}})
    };
    serde_json::json!([
        gauge("hw.gpu.utilization", g.util.into()),
        gauge("gpu.sm.active", g.sm.into()),
        gauge("gpu.tensor.active", (g.sm / 2.0).into()),
        gauge("gpu.dram.active", 0.3.into()),
        int("hw.gpu.memory.usage", g.mem),
        int("hw.gpu.memory.limit", 80 * GIB),
        int("gpu.clock.event_reasons", reasons),
        gauge("hw.energy", energy.into()),
    ])
}

fn export(metrics: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "e2e-node"}}]},
        "scopeMetrics": [{"metrics": metrics}]
    }]})
    .to_string()
    .into_bytes()
}

/// Sends the crafted job: samples every 10 s for 600 s, ending `end_ns`. Price config: USD 2.50
/// per H100 GPU-hour, USD 0.12 per kWh, PUE 1.3.
async fn send_job(server: &TestServer, end_ns: i64, token: Option<&str>) {
    let gpus = [
        Gpu {
            index: 0,
            util: 0.9,
            sm: 0.8,
            mem: 60 * GIB,
            reasons: |_| 0,
            joules: 3000.0,
        },
        Gpu {
            index: 1,
            util: 0.9,
            sm: 0.7,
            mem: 70 * GIB,
            reasons: |k| if k % 2 == 0 { 0x4 } else { 0x1 },
            joules: 3000.0,
        },
        Gpu {
            index: 2,
            util: 0.0,
            sm: 0.0,
            mem: GIB / 2,
            reasons: |_| 0x1,
            joules: 600.0,
        },
        Gpu {
            index: 3,
            util: 0.95,
            sm: 0.1,
            mem: 4 * GIB,
            reasons: |_| 0,
            joules: 3000.0,
        },
    ];
    let start = end_ns - 600_000_000_000;
    let client = reqwest::Client::new();
    for k in 0..=60usize {
        let t = start + k as i64 * 10_000_000_000;
        let mut metrics = Vec::new();
        for g in &gpus {
            if let serde_json::Value::Array(m) = sample(t, g, g.joules * k as f64, (g.reasons)(k)) {
                metrics.extend(m);
            }
        }
        if k == 30 {
            metrics.push(serde_json::json!({"name": "gpu.event", "gauge": {"dataPoints": [{
                "timeUnixNano": t.to_string(), "asInt": "79",
                "attributes": [{"key": "hw.id", "value": {"stringValue": "GPU-e2e-0"}},
                               {"key": "gpu.event.kind", "value": {"stringValue": "xid"}},
                               {"key": "gpu.event.detail", "value": {"stringValue": "xid 79"}}]}]}}));
        }
        let mut req = client
            .post(format!("{}/v1/metrics", server.url()))
            .header("content-type", "application/json")
            .body(export(metrics));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("otlp");
        assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    }
}

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("gpuwatch.toml");
    std::fs::write(
        &p,
        "[cost]\ngpu_hour_usd = [{ model = \"*H100*\", usd = 2.5 }]\nkwh_usd = 0.12\npue = 1.3\n",
    )
    .expect("config");
    p
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

fn esc(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn get(server: &TestServer, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().get(format!("{}{path}", server.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let body = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn job_report_equals_the_jobs_table_and_a_hand_computation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--config")
        .arg(cfg.to_str().expect("path"))
        .start();
    // Ended 5 minutes ago: more than two 10 s intervals, so the job has ended.
    send_job(&server, now_ns() - 300_000_000_000, None).await;

    let (status, r) = get(&server, &format!("/api/v1/jobs/{}", encode(JOB)), None).await;
    assert_eq!(status, 200, "{r}");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));

    // By hand: 4 GPUs x 600 s, GPU 2 idle all of it; energy 3 x 60 x 3000 J + 60 x 600 J.
    let joules = 3.0 * 180_000.0 + 36_000.0;
    let usd_per_j = 0.12 * 1.3 / 3.6e6;
    assert_eq!(r["job_id"], JOB);
    assert_eq!(r["gpus"], 4);
    assert_eq!(r["state"], "ended");
    assert_eq!(r["user"], "alice");
    assert!(close(f("gpu_hours"), 2400.0 / 3600.0), "{r}");
    assert!(close(f("idle_gpu_hours"), 600.0 / 3600.0));
    assert!(close(f("idle_share"), 0.25));
    assert!(close(f("energy_kwh"), joules / 3.6e6));
    assert!(close(
        f("cost_usd"),
        2400.0 * 2.5 / 3600.0 + joules * usd_per_j
    ));
    assert!(close(
        f("idle_cost_usd"),
        600.0 * 2.5 / 3600.0 + 36_000.0 * usd_per_j
    ));

    // The same numbers as the jobs table.
    let j = rows(
        &server,
        &format!(
            "SELECT sum(gpu_seconds) AS g, sum(idle_gpu_seconds) AS i, sum(energy_joules) AS e, \
             sum(cost_usd) AS c, sum(idle_cost_usd) AS ic FROM jobs WHERE job_id = {}",
            esc(JOB)
        ),
    )
    .await;
    let jf = |k: &str| j[0][k].as_f64().unwrap_or_else(|| panic!("{k}: {j:?}"));
    assert!(close(jf("g"), f("gpu_seconds")));
    assert!(close(jf("i"), f("idle_gpu_seconds")));
    assert!(close(jf("e"), f("energy_joules")));
    assert!(close(jf("c"), f("cost_usd")));
    assert!(close(jf("ic"), f("idle_cost_usd")));

    // Per GPU.
    let g = r["per_gpu"].as_array().expect("per_gpu");
    assert_eq!(g.len(), 4);
    let gf = |i: usize, k: &str| g[i][k].as_f64().unwrap_or_else(|| panic!("{k}: {}", g[i]));
    assert_eq!(g[2]["gpu_index"], 2);
    assert!(close(gf(2, "idle_minutes"), 10.0));
    // The SW power cap (0x4) is no throttling: power_capped_share, and an informational note.
    assert_eq!(gf(1, "throttled_share"), 0.0);
    assert!(close(gf(1, "power_capped_share"), 31.0 / 61.0));
    assert_eq!(g[0]["limiter"], "tensor");
    assert_eq!(g[2]["limiter"], "idle");
    assert_eq!(g[3]["limiter"], "latency");
    assert_eq!(r["limiter"], "tensor");
    assert_eq!(
        gf(2, "throttled_share"),
        0.0,
        "0x1 (GPU idle) is not throttling"
    );
    assert!(close(gf(3, "peak_memory_share"), 0.05));
    assert!(close(gf(0, "mean_sm_active"), 0.8));
    assert_eq!(g[0]["xid_events"], 1);
    assert_eq!(r["events"][0]["code"], 79);
    let rules: Vec<&str> = r["advice"]
        .as_array()
        .expect("advice")
        .iter()
        .filter_map(|a| a["rule"].as_str())
        .collect();
    assert_eq!(
        rules,
        [
            "idle_gpus",
            "power_capped",
            "tiny_kernels",
            "low_memory",
            "xid"
        ],
        "{r}"
    );

    // The command line prints the same report; an unknown or hostile id exits 1.
    let gpuwatch = bin_dir().join("gpuwatch");
    let out = Command::new(&gpuwatch)
        .args(["job", JOB, "--server", &server.url()])
        .output()
        .expect("gpuwatch job");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("cost USD {:.2}", f("cost_usd"))),
        "{text}"
    );
    assert!(text.contains("[idle_gpus] 1 of 4 GPUs idle"), "{text}");
    assert!(text.contains("XID 79"), "{text}");
    let out = Command::new(&gpuwatch)
        .args(["job", JOB, "--server", &server.url(), "--format", "json"])
        .output()
        .expect("gpuwatch job --format json");
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(cli["cost_usd"], r["cost_usd"]);
    for id in ["nope", "' OR '1'='1", "e2e-7"] {
        let out = Command::new(&gpuwatch)
            .args(["job", id, "--server", &server.url()])
            .output()
            .expect("gpuwatch job");
        assert_eq!(out.status.code(), Some(1), "{id}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no such job"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (status, body) = get(&server, &format!("/api/v1/jobs/{}", encode(id)), None).await;
        assert_eq!(status, 404, "{id}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("no such job"))
        );
    }

    // The league table.
    let out = Command::new(&gpuwatch)
        .args([
            "jobs",
            "--user",
            "alice",
            "--since",
            "1h",
            "--server",
            &server.url(),
        ])
        .output()
        .expect("gpuwatch jobs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("e2e-7'; DROP") && text.contains("(1 job)"),
        "{text}"
    );
    let (status, list) = get(&server, "/api/v1/jobs?user=bob&since=1h", None).await;
    assert_eq!(status, 200);
    assert_eq!(list, serde_json::json!([]));
    let (status, list) = get(&server, "/api/v1/jobs?since=1h", None).await;
    assert_eq!(status, 200);
    assert!(close(
        list[0]["cost_usd"].as_f64().expect("cost"),
        f("cost_usd")
    ));
    let (status, _) = get(&server, "/api/v1/jobs?since=soon", None).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn job_routes_need_a_query_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::with_tokens(dir.path()).start();
    send_job(&server, now_ns(), Some("ingest-token-0123456789")).await;
    let path = format!("/api/v1/jobs/{}", encode(JOB));
    assert_eq!(get(&server, &path, None).await.0, 401);
    assert_eq!(get(&server, "/api/v1/jobs", None).await.0, 401);
    assert_eq!(
        get(&server, &path, Some("ingest-token-0123456789")).await.0,
        403
    );
    let (status, r) = get(&server, &path, Some("query-token-0123456789")).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["state"], "running");
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", JOB, "--server", &server.url()])
        .output()
        .expect("gpuwatch job");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", JOB, "--server", &server.url()])
        .env("GPUWATCH_TOKEN", "query-token-0123456789")
        .output()
        .expect("gpuwatch job");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The console's files are served without a token; they hold no data.
    let resp = reqwest::get(format!("{}/", server.url()))
        .await
        .expect("console");
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.text().await.expect("html").contains("/console/app.js"));
    // Writes without a token stay refused.
    let (status, _) = post_otlp(&server.url(), "application/json", None, b"{}".to_vec()).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn slurm_epilog_appends_the_report_only_when_switched_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .arg("--config")
        .arg(cfg.to_str().expect("path"))
        .start();
    send_job(&server, now_ns() - 300_000_000_000, None).await;
    // A stand-in for Slurm's scontrol: the job's output file.
    let out = dir.path().join("slurm-7.out");
    std::fs::write(&out, "training done\n").expect("output");
    let fake = dir.path().join("bin");
    std::fs::create_dir_all(&fake).expect("bin");
    let scontrol = fake.join("scontrol");
    std::fs::write(
        &scontrol,
        format!(
            "#!/bin/sh\necho \"JobId=7 JobName=train UserId=alice StdOut={} StdErr={}\"\n",
            out.display(),
            out.display()
        ),
    )
    .expect("scontrol");
    Command::new("chmod")
        .args(["755", scontrol.to_str().expect("path")])
        .status()
        .expect("chmod");
    let user = String::from_utf8(Command::new("id").arg("-un").output().expect("id").stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let epilog = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/slurm/epilog.sh");
    let run = |switch: Option<&str>| {
        let mut cmd = Command::new("bash");
        cmd.arg(epilog)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    fake.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("SLURM_JOB_ID", JOB)
            .env("SLURM_JOB_USER", &user)
            .env(
                "GPUWATCH_JOB_MAPPING_DIR",
                dir.path().join("no-mapping-dir"),
            )
            .env("GPUWATCH_SLURM_CONF", dir.path().join("no-conf"))
            .env("GPUWATCH_SERVER", server.url())
            .env("GPUWATCH_BIN", bin_dir().join("gpuwatch"));
        if let Some(v) = switch {
            cmd.env("GPUWATCH_JOB_REPORT", v);
        }
        let o = cmd.output().expect("epilog");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(&out).expect("output")
    };
    assert_eq!(run(None), "training done\n", "off by default");
    assert_eq!(run(Some("0")), "training done\n");
    let text = run(Some("1"));
    assert!(
        text.starts_with("training done\n\n==== gpuwatch job report ===="),
        "{text}"
    );
    assert!(
        text.contains("cost USD") && text.contains("[idle_gpus]"),
        "{text}"
    );
}
