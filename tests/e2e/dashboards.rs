//! The Grafana dashboards of `dashboards/*.json` and their provisioning files (deploy/grafana/).
//!
//! `every_panel_answers_on_the_demo_fleet` starts the real `gpuwatch demo` (a simulated fleet
//! with three hours of history, rolled up), adds what the simulation does not produce (XID and
//! ECC events, GPU processes, a faulty GPU, an idle job, a silent agent, a firing alert, user
//! budgets), then runs tests/dashboards/grafana_sql.py: every variable query and every panel
//! target of every dashboard, expanded as Grafana's PostgreSQL data source expands it, over the
//! Postgres wire protocol with psycopg 3 (extended protocol, binary results, as Grafana's pgx),
//! over four ranges that take each path of the panels' SQL (raw samples, 1-minute rollups,
//! 1-hour rollups). Every answer must come without error, with the column types its panel
//! needs, and with rows. The panels are counted here independently of the script, so a panel
//! the script skipped fails the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuwatch_e2e::{bin_dir, free_addr, http_get};

use crate::{now_ns, post_otlp};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

fn script() -> PathBuf {
    repo().join("tests/dashboards/grafana_sql.py")
}

/// The dashboards, parsed.
fn dashboards() -> Vec<(String, serde_json::Value)> {
    let dir = repo().join("dashboards");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).expect("dashboards/") {
        let path = e.expect("entry").path();
        if path.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&path).expect("read dashboard");
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
            out.push((
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
                v,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every panel but rows, rows' nested panels included.
fn panels(d: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] != "row" {
            out.push(p);
        }
        for inner in p["panels"].as_array().into_iter().flatten() {
            out.push(inner);
        }
    }
    out
}

#[test]
fn five_dashboards_with_datasource_variable_units_thresholds_and_descriptions() {
    let ds = dashboards();
    let names: Vec<&str> = ds.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "alerts.json",
            "cost.json",
            "fleet.json",
            "health.json",
            "job.json"
        ],
        "the five dashboards of issue 12"
    );
    let mut uids = std::collections::HashSet::new();
    for (name, d) in &ds {
        assert!(uids.insert(d["uid"].as_str().expect("uid")), "{name}: uid");
        let v = d["schemaVersion"].as_i64().expect("schemaVersion");
        assert!(
            (36..=41).contains(&v),
            "{name}: schemaVersion {v} (Grafana 10/11 line)"
        );
        let vars = d["templating"]["list"].as_array().expect("templating");
        let dsvar = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(dsvar["type"], "datasource", "{name}");
        assert_eq!(dsvar["query"], "grafana-postgresql-datasource", "{name}");
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"]["uid"], "${datasource}",
                "{name}: {}",
                v["name"]
            );
        }
        let ps = panels(d);
        assert!(ps.len() >= 5, "{name}: {} panels", ps.len());
        let mut ids = std::collections::HashSet::new();
        for p in ps {
            let title = p["title"].as_str().unwrap_or("?");
            assert!(
                ids.insert(p["id"].as_i64().expect("id")),
                "{name}: {title}: id"
            );
            assert!(
                p["description"].as_str().is_some_and(|s| s.len() > 20),
                "{name}: {title}: description"
            );
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {title}");
            assert_eq!(
                p["datasource"]["type"], "grafana-postgresql-datasource",
                "{name}: {title}"
            );
            let defaults = &p["fieldConfig"]["defaults"];
            assert!(defaults["unit"].is_string(), "{name}: {title}: unit");
            assert!(
                defaults["thresholds"]["steps"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: {title}: thresholds"
            );
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: {title}: targets");
            for t in targets {
                assert_eq!(t["rawQuery"], true, "{name}: {title}");
                assert!(t["rawSql"].is_string(), "{name}: {title}");
                assert!(
                    t["format"] == "table" || t["format"] == "time_series",
                    "{name}: {title}: format"
                );
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: {title}");
            }
        }
    }
}

#[test]
fn provisioning_files_parse() {
    let dir = repo().join("deploy/grafana");
    let read = |f: &str| -> serde_yaml_ng::Value {
        let text = std::fs::read_to_string(dir.join(f)).expect("provisioning file");
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{f}: {e}"))
    };
    let ds = read("datasource.yaml");
    assert_eq!(ds["apiVersion"].as_i64(), Some(1));
    let d = &ds["datasources"][0];
    assert_eq!(d["type"].as_str(), Some("grafana-postgresql-datasource"));
    assert_eq!(d["url"].as_str(), Some("gpuwatch:5433"));
    assert_eq!(d["jsonData"]["database"].as_str(), Some("gpuwatch"));
    assert!(d["secureJsonData"]["password"].is_string());
    let p = read("dashboards.yaml");
    assert_eq!(p["apiVersion"].as_i64(), Some(1));
    assert_eq!(p["providers"][0]["type"].as_str(), Some("file"));
    assert!(p["providers"][0]["options"]["path"].is_string());
}

#[test]
fn grafana_expander_matches_grafanas_own_expansions() {
    let out = Command::new("python3")
        .arg(script())
        .arg("selftest")
        .arg(repo().join("tests/fixtures/grafana_postgres_macros.sql"))
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(", 0 failures"), "{text}");
}

/// `gpuwatch demo` on free ports; killed (by pid) when dropped.
struct Demo {
    child: Child,
    http: std::net::SocketAddr,
    pg: std::net::SocketAddr,
    out: PathBuf,
    log: PathBuf,
}

impl Demo {
    fn start(dir: &Path, config: &Path, rules: &Path) -> Self {
        for _ in 0..5 {
            let (http, pg) = (free_addr(), free_addr());
            let out = dir.join("demo.out");
            let log = dir.join("demo.log");
            let child = Command::new(bin_dir().join("gpuwatch"))
                .arg("demo")
                .args(["--http-addr", &http.to_string()])
                .args(["--otlp-http-addr", &free_addr().to_string()])
                .args(["--otlp-grpc-addr", &free_addr().to_string()])
                .args(["--pg-addr", &pg.to_string()])
                .arg("--data-dir")
                .arg(dir.join("data"))
                .arg("--config")
                .arg(config)
                .arg("--rules")
                .arg(rules)
                .args(["--synthetic-hosts", "3", "--synthetic-gpus", "4"])
                .args(["--backfill", "3h", "--interval", "5s"])
                .args(["--persist-interval", "5s", "--compaction-interval", "2s"])
                .stdout(std::fs::File::create(&out).expect("out"))
                .stderr(std::fs::File::create(&log).expect("log"))
                .spawn()
                .expect("start gpuwatch demo");
            let mut demo = Demo {
                child,
                http,
                pg,
                out,
                log,
            };
            // The banner is printed once the history is written.
            let deadline = Instant::now() + Duration::from_secs(240);
            loop {
                if let Ok(Some(_)) = demo.child.try_wait() {
                    let log = std::fs::read_to_string(&demo.log).unwrap_or_default();
                    if log.contains("Address already in use") {
                        break;
                    }
                    panic!("gpuwatch demo exited:\n{log}");
                }
                let banner = std::fs::read_to_string(&demo.out).unwrap_or_default();
                if banner.contains("SIMULATED fleet") {
                    return demo;
                }
                assert!(
                    Instant::now() < deadline,
                    "gpuwatch demo not ready:\n{}",
                    std::fs::read_to_string(&demo.log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        panic!("gpuwatch demo found no free ports in 5 tries")
    }

    fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    fn dsn(&self) -> String {
        format!(
            "host={} port={} user=grafana dbname=gpuwatch sslmode=disable",
            self.pg.ip(),
            self.pg.port()
        )
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const FAULTY_HOST: &str = "lab-faulty-01";
const SILENT_HOST: &str = "lab-silent-01";
const FAULTY_JOB: &str = "job-faulty";
const IDLE_JOB: &str = "job-idle";
/// XID codes the Health dashboard decodes, each sent once.
const XIDS: [i64; 12] = [13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95];

fn attr(k: &str, v: &str) -> serde_json::Value {
    serde_json::json!({"key": k, "value": {"stringValue": v}})
}

fn gauge(
    name: &str,
    t: i64,
    v: serde_json::Value,
    attrs: &[serde_json::Value],
) -> serde_json::Value {
    let mut point = serde_json::json!({"timeUnixNano": t.to_string(), "attributes": attrs});
    if v.is_i64() {
        point["asInt"] = serde_json::Value::String(v.to_string());
    } else {
        point["asDouble"] = v;
    }
    serde_json::json!({"name": name, "gauge": {"dataPoints": [point]}})
}

fn export(host: &str, metrics: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [attr("host.name", host)]},
        "scopeMetrics": [{"metrics": metrics}]
    }]})
    .to_string()
    .into_bytes()
}

/// One GPU sample of a crafted GPU.
#[allow(clippy::too_many_arguments)]
fn gpu_sample(
    t: i64,
    uuid: &str,
    index: &str,
    job: &str,
    user: &str,
    util: f64,
    faulty: bool,
) -> Vec<serde_json::Value> {
    let a = vec![
        attr("hw.id", uuid),
        attr("gpu.index", index),
        attr("hw.model", "NVIDIA H100 80GB HBM3"),
        attr("job.id", job),
        attr("job.user", user),
        attr("job.name", if faulty { "xid-repro" } else { "notebook" }),
        attr("job.scheduler", "slurm"),
    ];
    let secs = (t / 1_000_000_000) as f64;
    let int = |v: i64| serde_json::Value::from(v);
    let dbl = |v: f64| serde_json::Value::from(v);
    vec![
        gauge("hw.gpu.utilization", t, dbl(util), &a),
        gauge("gpu.sm.active", t, dbl(util * 0.8), &a),
        gauge("gpu.tensor.active", t, dbl(util * 0.3), &a),
        gauge("gpu.dram.active", t, dbl(util * 0.4), &a),
        gauge("gpu.sm.occupancy", t, dbl(util * 0.5), &a),
        gauge(
            "hw.gpu.memory.usage",
            t,
            int(if faulty {
                60_000_000_000
            } else {
                2_000_000_000
            }),
            &a,
        ),
        gauge("hw.gpu.memory.limit", t, int(85_520_809_984), &a),
        gauge("hw.power", t, dbl(if faulty { 650.0 } else { 90.0 }), &a),
        gauge(
            "hw.energy",
            t,
            dbl(secs * if faulty { 650.0 } else { 90.0 }),
            &a,
        ),
        gauge(
            "hw.temperature",
            t,
            dbl(if faulty { 91.0 } else { 40.0 }),
            &a,
        ),
        gauge(
            "gpu.memory.temperature",
            t,
            dbl(if faulty { 96.0 } else { 45.0 }),
            &a,
        ),
        gauge("gpu.clock.sm", t, int(if faulty { 1200 } else { 1980 }), &a),
        // HW thermal slowdown + SW power cap on the faulty GPU.
        gauge(
            "gpu.clock.event_reasons",
            t,
            int(if faulty { 0x44 } else { 0 }),
            &a,
        ),
        gauge(
            "gpu.ecc.sbe.volatile",
            t,
            int(if faulty { 40 } else { 0 }),
            &a,
        ),
        gauge(
            "gpu.ecc.dbe.volatile",
            t,
            int(if faulty { 2 } else { 0 }),
            &a,
        ),
        gauge(
            "gpu.remapped_rows.uncorrectable",
            t,
            int(if faulty { 3 } else { 0 }),
            &a,
        ),
        gauge("gpu.remapped_rows.failure", t, int(i64::from(faulty)), &a),
        gauge("gpu.xid.errors", t, int(if faulty { 12 } else { 0 }), &a),
    ]
}

/// What the simulated fleet lacks, written through OTLP/HTTP: a faulty GPU with XID and ECC
/// events and a process, an idle job's GPU, and a host that stopped reporting 20 minutes ago.
async fn add_crafted_data(url: &str) {
    let now = now_ns();
    let sec = 1_000_000_000i64;
    let mut bodies = Vec::new();
    // 15 minutes of samples every 10 s, up to now.
    for i in 0..90 {
        let t = now - (90 - i) * 10 * sec;
        let mut m = gpu_sample(t, "GPU-faulty-0", "0", FAULTY_JOB, "tester", 0.9, true);
        m.extend(gpu_sample(
            t,
            "GPU-idle-1",
            "1",
            IDLE_JOB,
            "tester",
            0.0,
            false,
        ));
        let p = [
            attr("hw.id", "GPU-faulty-0"),
            attr("process.pid", "4242"),
            attr("process.executable.name", "python3"),
            attr("job.id", FAULTY_JOB),
            attr("job.user", "tester"),
        ];
        m.push(gauge(
            "gpu.process.memory.usage",
            t,
            serde_json::Value::from(59_000_000_000i64),
            &p,
        ));
        m.push(gauge(
            "gpu.process.sm.utilization",
            t,
            serde_json::Value::from(0.7),
            &p,
        ));
        bodies.push(export(FAULTY_HOST, m));
    }
    // The silent host: 20 minutes of samples that ended 20 minutes ago.
    for i in 0..120 {
        let t = now - 40 * 60 * sec + i * 10 * sec;
        bodies.push(export(
            SILENT_HOST,
            gpu_sample(t, "GPU-silent-0", "0", "job-silent", "tester", 0.5, false),
        ));
    }
    // Events in the last 10 minutes: every decoded XID, then ECC events.
    let mut events = Vec::new();
    for (i, code) in XIDS.iter().enumerate() {
        let t = now - (600 - 30 * i as i64) * sec;
        let a = [
            attr("hw.id", "GPU-faulty-0"),
            attr("gpu.event.kind", "xid"),
            attr("gpu.event.detail", &format!("xid {code}")),
        ];
        events.push(gauge("gpu.event", t, serde_json::Value::from(*code), &a));
    }
    for (i, kind) in ["ecc_sbe", "ecc_dbe"].iter().enumerate() {
        let a = [attr("hw.id", "GPU-faulty-0"), attr("gpu.event.kind", kind)];
        events.push(gauge(
            "gpu.event",
            now - (100 + i as i64) * sec,
            serde_json::Value::from(0),
            &a,
        ));
    }
    bodies.push(export(FAULTY_HOST, events));
    for body in bodies {
        let (status, text) = post_otlp(url, "application/json", None, body).await;
        assert_eq!(status, 200, "{text}");
        assert!(!text.contains("rejected"), "{text}");
    }
}

fn psql_count(pg: std::net::SocketAddr, sql: &str) -> i64 {
    let out = Command::new("psql")
        .args([
            "-h",
            &pg.ip().to_string(),
            "-p",
            &pg.port().to_string(),
            "-d",
            "gpuwatch",
            "-U",
            "grafana",
            "-At",
            "-c",
            sql,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_panel_answers_on_the_demo_fleet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpuwatch.toml");
    std::fs::write(
        &config,
        "[cost]\n\
         gpu_hour_usd = [{ model = \"*H100*\", usd = 2.50 }]\n\
         kwh_usd = 0.12\n\
         pue = 1.3\n\
         user_budgets_usd = { tester = 5.0 }\n\
         default_budget_usd = 100.0\n",
    )
    .expect("config");
    let rules = dir.path().join("rules.yaml");
    // Fires at once for the faulty GPU, with the job's labels (Alerts and Job dashboards).
    std::fs::write(
        &rules,
        format!(
            "groups:\n  - name: dashboards-test\n    interval: 1s\n    rules:\n      - alert: DashboardsTestHotGpu\n        sql: |\n          SELECT host, gpu_uuid, CAST(gpu_index AS VARCHAR) AS gpu_index, job_id, job_user, max(temperature_celsius) AS value\n          FROM gpu_metrics WHERE time > now() - interval '5 minutes' AND host = '{FAULTY_HOST}'\n          GROUP BY host, gpu_uuid, gpu_index, job_id, job_user HAVING max(temperature_celsius) > 85\n        labels: {{severity: critical}}\n"
        ),
    )
    .expect("rules");
    let demo = Demo::start(dir.path(), &config, &rules);
    assert_eq!(
        http_get(demo.http, "/readyz").map(|(s, _)| s).ok(),
        Some(200)
    );
    add_crafted_data(&demo.url()).await;

    // The closed hours of the backfill rolled up, and the test alert firing. Of the three hours
    // of history, the first (partial) hour and the next are rolled up whatever the minute now
    // (an hour is rolled up 10 minutes after it closes): at least 2 hours and 110 minutes.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let hours = psql_count(demo.pg, "SELECT count(DISTINCT time) FROM gpu_metrics_1h");
        let minutes = psql_count(demo.pg, "SELECT count(DISTINCT time) FROM gpu_metrics_1m");
        let firing = psql_count(
            demo.pg,
            "SELECT count(*) FROM alerts WHERE rule = 'DashboardsTestHotGpu' AND state = 'firing'",
        );
        if hours >= 2 && minutes >= 110 && firing >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rollups ({hours} hours, {minutes} minutes) or the alert ({firing}) missing:\n{}",
            std::fs::read_to_string(&demo.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 1h and 24h read raw samples, 3d the 1-minute rollups, 30d the 1-hour rollups.
    let ranges = ["1h", "24h", "3d", "30d"];
    let mut cmd = Command::new("python3");
    cmd.arg(script())
        .arg("check")
        .arg("--dsn")
        .arg(demo.dsn())
        .arg("--dashboards")
        .arg(repo().join("dashboards"))
        .args(["--var", &format!("job_id={FAULTY_JOB}")]);
    for r in ranges {
        cmd.args(["--range", r]);
    }
    let out = cmd
        .output()
        .expect("python3 (bash .ci/run installs psycopg)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every panel and variable of every dashboard ran, over every range, and passed.
    let mut expected = 0;
    for (name, d) in dashboards() {
        for r in ranges {
            for v in d["templating"]["list"]
                .as_array()
                .expect("templating")
                .iter()
                .filter(|v| v["type"] == "query")
            {
                let line = format!(
                    "ok   {name} [{r}] variable {}:",
                    v["name"].as_str().expect("name")
                );
                assert!(text.contains(&line), "not run: {line}\n{text}");
            }
            for p in panels(&d) {
                let title = p["title"].as_str().expect("title");
                for t in p["targets"].as_array().expect("targets") {
                    let line = format!(
                        "ok   {name} [{r}] panel '{title}' {}:",
                        t["refId"].as_str().expect("refId")
                    );
                    assert!(text.contains(&line), "not run: {line}\n{text}");
                    expected += 1;
                }
            }
        }
    }
    assert!(expected >= 4 * 40, "{expected} panel targets");
    assert!(text.contains(" 0 failures"), "{text}");
}
