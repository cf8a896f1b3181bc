//! The Grafana dashboards of `dashboards/*.json` and their provisioning files (deploy/grafana/).
//!
//! `every_panel_answers_on_the_demo_fleet` starts the real `gpuwatch demo` (a simulated fleet
//! with three hours of history, rolled up) with nothing added but a config file that sets user
//! budgets, as an SRE would: the simulated fleet itself brings the jobs, their processes, the
//! XID and ECC events, the clock-event reasons and, through the built-in rule pack, the alerts
//! (a job over its budget). It then runs tests/dashboards/grafana_sql.py: every variable query
//! and every panel target of every dashboard, expanded as Grafana's PostgreSQL data source
//! expands it, over the Postgres wire protocol with psycopg 3 (extended protocol, binary
//! results, as Grafana's pgx), over four ranges that take each path of the panels' SQL (raw
//! samples, 1-minute rollups, 1-hour rollups). Every answer must come without error, with the
//! column types its panel needs, and with rows. Then the same with each multi-value variable
//! at one value instead of All, once per variable with that variable's query answering no rows
//! (Grafana's expansion of an empty variable), and over a range with no data at all: every
//! query must still answer. The panels are counted here independently of the script, so a
//! panel the script skipped fails the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuwatch_e2e::{bin_dir, free_addr, http_get};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

pub(crate) fn script() -> PathBuf {
    repo().join("tests/dashboards/grafana_sql.py")
}

/// The dashboards, parsed.
pub(crate) fn dashboards() -> Vec<(String, serde_json::Value)> {
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
pub(crate) fn panels(d: &serde_json::Value) -> Vec<&serde_json::Value> {
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
    fn start(dir: &Path, config: &Path) -> Self {
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

    fn dsn(&self) -> String {
        dsn(self.pg)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first column of the first row of `sql`, as psql prints it (empty if none).
fn psql_text(pg: std::net::SocketAddr, sql: &str) -> String {
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
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn psql_count(pg: std::net::SocketAddr, sql: &str) -> i64 {
    psql_text(pg, sql).parse().unwrap_or(-1)
}

/// The DSN of the Postgres listener at `pg`, as Grafana's data source has it.
pub(crate) fn dsn(pg: std::net::SocketAddr) -> String {
    format!(
        "host={} port={} user=grafana dbname=gpuwatch sslmode=disable",
        pg.ip(),
        pg.port()
    )
}

/// Runs `grafana_sql.py SUBCOMMAND --dsn DSN --dashboards dashboards/` with `args`; returns its
/// output, failing on a non-zero exit.
pub(crate) fn grafana_sql(dsn: &str, subcommand: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(script())
        .args([subcommand, "--dsn", dsn])
        .arg("--dashboards")
        .arg(repo().join("dashboards"))
        .args(args)
        .output()
        .expect("python3 (bash .ci/run installs psycopg)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Runs grafana_sql.py check with `args`; returns its output, failing on a non-zero exit.
fn check(demo: &Demo, args: &[&str]) -> String {
    let text = grafana_sql(&demo.dsn(), "check", args);
    assert!(text.contains(" 0 failures"), "{text}");
    text
}

/// Every query variable of `d` and every panel target ran in scenario `tag` (the bracket of
/// the script's output lines); returns the panel targets counted.
fn assert_all_ran(text: &str, name: &str, d: &serde_json::Value, tag: &str, vars: bool) -> usize {
    let mut n = 0;
    if vars {
        for v in d["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .filter(|v| v["type"] == "query")
        {
            let line = format!(
                "ok   {name} [{tag}] variable {}:",
                v["name"].as_str().expect("name")
            );
            assert!(text.contains(&line), "not run: {line}\n{text}");
        }
    }
    for p in panels(d) {
        let title = p["title"].as_str().expect("title");
        for t in p["targets"].as_array().expect("targets") {
            let line = format!(
                "ok   {name} [{tag}] panel '{title}' {}:",
                t["refId"].as_str().expect("refId")
            );
            assert!(text.contains(&line), "not run: {line}\n{text}");
            n += 1;
        }
    }
    n
}

#[test]
fn every_panel_answers_on_the_demo_fleet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpuwatch.toml");
    // Prices as the demo's defaults; budgets low enough that running jobs go over them, so the
    // built-in JobCostOverBudget and SpendOverBudget rules fire for them (Alerts dashboard, the
    // Job dashboard's alerts, the Cost dashboard's spend by account).
    std::fs::write(
        &config,
        "[cost]\n\
         gpu_hour_usd = [{ model = \"*H100*\", usd = 2.50 }]\n\
         kwh_usd = 0.12\n\
         pue = 1.3\n\
         user_budgets_usd = { alice = 0.5 }\n\
         default_budget_usd = 1.0\n\
         account_budgets_usd = { physics = 1.0, chem = 1000.0 }\n",
    )
    .expect("config");
    let demo = Demo::start(dir.path(), &config);
    assert_eq!(
        http_get(demo.http, "/readyz").map(|(s, _)| s).ok(),
        Some(200)
    );

    // The closed hours of the backfill rolled up, and a job's alert firing. Of the three hours
    // of history, the first (partial) hour and the next are rolled up whatever the minute now
    // (an hour is rolled up 10 minutes after it closes): at least 2 hours and 110 minutes.
    let deadline = Instant::now() + Duration::from_secs(300);
    let job = loop {
        let hours = psql_count(demo.pg, "SELECT count(DISTINCT time) FROM gpu_metrics_1h");
        let minutes = psql_count(demo.pg, "SELECT count(DISTINCT time) FROM gpu_metrics_1m");
        let process_hours =
            psql_count(demo.pg, "SELECT count(DISTINCT time) FROM gpu_processes_1h");
        let job = psql_text(
            demo.pg,
            "SELECT labels['job_id'] FROM alerts WHERE state = 'firing' \
             AND labels['job_id'] IS NOT NULL ORDER BY time DESC, labels['job_id'] LIMIT 1",
        );
        if hours >= 2 && minutes >= 110 && process_hours >= 1 && !job.is_empty() {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "rollups ({hours} hours, {minutes} minutes, {process_hours} hours of processes) or a job's alert ({job:?}) missing:\n{}",
            std::fs::read_to_string(&demo.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // What the panels of events and processes read comes from the simulation itself.
    for (what, sql) in [
        (
            "XID events",
            "SELECT count(*) FROM gpu_events WHERE kind = 'xid'",
        ),
        (
            "ECC events",
            "SELECT count(*) FROM gpu_events WHERE kind LIKE 'ecc%'",
        ),
        ("processes", "SELECT count(*) FROM gpu_processes"),
    ] {
        assert!(psql_count(demo.pg, sql) > 0, "no {what} from the demo");
    }
    // The processes' rollups hold every raw row of their hours once, each group's first and last
    // time inside its bucket.
    let rolled = "SELECT max(time) + INTERVAL '1 hour' FROM gpu_processes_1h";
    let raw = psql_count(
        demo.pg,
        &format!("SELECT count(*) FROM gpu_processes WHERE time < ({rolled})"),
    );
    assert!(raw > 0, "no process rows in the rolled-up hours");
    assert_eq!(
        psql_count(demo.pg, "SELECT sum(samples) FROM gpu_processes_1h"),
        raw,
        "process rows in the hourly rollups"
    );
    assert_eq!(
        psql_count(
            demo.pg,
            "SELECT count(*) FROM gpu_processes_1m WHERE first_seen < time \
             OR last_seen >= time + INTERVAL '1 minute' OR first_seen > last_seen"
        ),
        0
    );

    // 1h and 24h read raw samples, 3d the 1-minute rollups, 30d the 1-hour rollups. The job is
    // one with an alert, picked as a user picks it in the job_id picker.
    let ranges = ["1h", "24h", "3d", "30d"];
    let pin = format!("job_id={job}");
    let mut args = vec!["--var", pin.as_str()];
    for r in ranges {
        args.extend(["--range", r]);
    }
    args.extend(["--first-value", "24h", "--empty-each", "24h"]);
    let text = check(&demo, &args);

    // Every panel and variable of every dashboard ran, over every range, and passed; and again
    // with one value per multi-value variable, and with each query variable empty.
    let mut expected = 0;
    for (name, d) in dashboards() {
        for r in ranges {
            expected += assert_all_ran(&text, &name, &d, r, true);
        }
        assert_all_ran(&text, &name, &d, "24h, first values", true);
        for v in d["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .filter(|v| v["type"] == "query")
        {
            let tag = format!("24h, {} empty", v["name"].as_str().expect("name"));
            assert_all_ran(&text, &name, &d, &tag, false);
        }
    }
    assert!(expected >= 4 * 40, "{expected} panel targets");

    // A range with no data at all (a week, two months ago): every variable is empty as Grafana
    // makes it, and every query still answers.
    let past = (SystemTime::now() - Duration::from_secs(60 * 86_400))
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        .to_string();
    let text = check(&demo, &["--to", &past, "--range", "7d", "--no-data"]);
    for (name, d) in dashboards() {
        assert_all_ran(&text, &name, &d, "7d", true);
    }
}
