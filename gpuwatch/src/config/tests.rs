//! The server's settings: the declaration, the file, the checks, and the page generated from
//! them.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use clap::CommandFactory;
use gpuwatch_common::settings::{self, Loaded, flags};

use super::*;

fn load(args: &[&str]) -> crate::error::Result<Loaded<ServeSettings>> {
    let cmd = crate::Cli::command();
    let argv = std::iter::once("gpuwatch")
        .chain(std::iter::once("serve"))
        .chain(args.iter().copied());
    let no_env = |_: &str| None;
    let m = settings::parse(&cmd, argv.map(Into::into).collect(), &no_env)?;
    Ok(settings::resolve(&cmd, m, sources(&no_env))?)
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("c.toml");
    std::fs::write(&p, text).expect("write");
    let s = p.display().to_string();
    (dir, s)
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let (_d, f) = file("http_adr = \"x\"\n");
    let e = load(&["--config", &f])
        .expect_err("unknown key")
        .to_string();
    assert!(e.contains("http_adr"), "{e}");
    let (_d, f) = file("http_addr = \"nonsense\"\n");
    let e = load(&["--config", &f]).expect_err("bad addr").to_string();
    assert!(e.contains("line 1"), "{e}");
    assert!(load(&["--config", "/nonexistent/missing.toml"]).is_err());
    // The demo's keys may sit in a file `serve` reads too.
    let (_d, f) = file("synthetic_hosts = 2\npg_addr = \"off\"\n[retention]\nmetrics = \"2d\"\n");
    let l = load(&["--config", &f]).expect("load");
    assert_eq!(l.settings.listeners.pg_addr, OptionalAddr(None));
}

#[test]
fn every_shipped_example_parses() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut seen = 0;
    for entry in std::fs::read_dir(&deploy).expect("deploy/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if name.starts_with("gpuwatch.") && name.ends_with(".example.toml") {
            let l = load(&["--config", &path.display().to_string()])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            sections(&l).unwrap_or_else(|e| panic!("{name}: {e}"));
            seen += 1;
        }
    }
    assert!(seen >= 1, "no deploy/gpuwatch.*.example.toml found");
}

#[test]
fn retention_keys_override_the_defaults() {
    let s = Sections::read(
        None,
        "[retention]\ngpu_metrics = \"7d\"\ngpu_metrics_1h = \"forever\"\ngpu_events = \"2d\"\ngpu_processes_1m = \"90d\"\n",
    )
    .expect("parse");
    let r = s.retention().expect("resolve");
    assert_eq!(r.gpu_metrics, Some(Duration::from_secs(7 * 86400)));
    assert_eq!(r.gpu_events, Some(Duration::from_secs(2 * 86400)));
    assert_eq!(r.gpu_processes, Some(Duration::from_secs(30 * 86400)));
    assert_eq!(r.gpu_processes_1m, Some(Duration::from_secs(90 * 86400)));
    assert_eq!(
        r.gpu_processes_1h,
        Some(Duration::from_secs(5 * 365 * 86400))
    );
    assert_eq!(r.gpu_metrics_1h, None);
    assert_eq!(r.gpu_metrics_1m, Some(Duration::from_secs(365 * 86400)));
    let bad = Sections::read(None, "[retention]\nmetrics = \"soon\"\n").expect("parse");
    let e = bad.retention().expect_err("bad");
    assert!(e.to_string().contains("retention.metrics"), "{e}");
    assert!(Sections::read(None, "[retention]\nraw = \"1d\"\n").is_err());
}

#[test]
fn optional_addresses() {
    assert_eq!("off".parse(), Ok(OptionalAddr(None)));
    assert_eq!("OFF".parse(), Ok(OptionalAddr(None)));
    assert_eq!(
        "127.0.0.1:5433".parse(),
        Ok(OptionalAddr(Some("127.0.0.1:5433".parse().expect("addr"))))
    );
    let e = "localhost".parse::<OptionalAddr>().expect_err("no port");
    assert!(e.contains("off"), "{e}");
}

#[test]
fn durations() {
    use gpuwatch_common::duration::parse_duration;
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn checks_across_settings() {
    let l = load(&["--wal-sync-interval", "0s"]).expect("load");
    let e = l
        .settings
        .validate(Sections::default(), false)
        .expect_err("zero");
    assert!(e.to_string().contains("--wal-sync-interval"), "{e}");
    let l = load(&["--role", "query", "--rules", "r.yaml"]).expect("load");
    assert!(l.settings.validate(Sections::default(), false).is_err());
    let l = load(&["--tls-cert", "c.pem"]).expect("load");
    let e = l
        .settings
        .validate(Sections::default(), false)
        .expect_err("half tls");
    assert!(e.to_string().contains("--tls-key"), "{e}");
    let l = load(&[]).expect("load");
    let c = l
        .settings
        .validate(Sections::default(), true)
        .expect("demo");
    assert_eq!(c.data_dir, Path::new("./gpuwatch-demo-data"));
    assert_eq!(c.persist_interval, Duration::from_secs(60));
    assert!(c.maintenance);
}

#[test]
fn promql_settings_reach_the_query_api_and_the_rules() {
    let c = load(&[])
        .expect("load")
        .settings
        .validate(Sections::default(), false)
        .expect("defaults");
    assert_eq!(c.promql.lookback, 5 * 60 * 1000);
    assert_eq!(c.promql.subquery_step, 60 * 1000);
    assert_eq!(c.promql.max_samples, 50_000_000);
    let (_d, f) = file("promql_subquery_step = \"30s\"\n");
    let l = load(&[
        "--config",
        &f,
        "--promql-lookback-delta",
        "90s",
        "--promql-max-samples",
        "1000",
    ])
    .expect("load");
    let c = l
        .settings
        .validate(Sections::default(), false)
        .expect("valid");
    assert_eq!(c.promql.lookback, 90_000);
    assert_eq!(c.promql.subquery_step, 30_000);
    assert_eq!(c.promql.max_samples, 1000);
    assert_eq!(c.alerts.promql.lookback, 90_000);
    assert_eq!(c.alerts.promql.max_samples, 1000);
    for (flag, value) in [
        ("--promql-lookback-delta", "0s"),
        ("--promql-subquery-step", "0s"),
        ("--promql-max-samples", "0"),
    ] {
        let e = load(&[flag, value])
            .expect("load")
            .settings
            .validate(Sections::default(), false)
            .expect_err(flag);
        assert!(e.to_string().contains(flag), "{e}");
    }
}

/// The settings each command listed in `--help` before they were declared once (captured from
/// the binaries' `--help`).
const BEFORE: &[(&str, &[&str])] = &[
    (
        "serve",
        &[
            "--config",
            "--http-addr",
            "--otlp-http-addr",
            "--otlp-grpc-addr",
            "--pg-addr",
            "--tls-cert",
            "--tls-key",
            "--data-dir",
            "--object-store",
            "--role",
            "--maintenance",
            "--refresh-interval",
            "--persist-interval",
            "--max-body-bytes",
            "--query-timeout",
            "--query-memory-limit",
            "--max-concurrent-queries",
            "--memory-limit",
            "--max-value-bytes",
            "--max-answer-bytes",
            "--insecure-no-auth",
            "--wal-sync",
            "--wal-sync-interval",
            "--max-buffer-bytes",
            "--compaction-interval",
            "--auth-tokens",
            "--log-level",
            "--self-telemetry-endpoint",
            "--self-telemetry-interval",
            "--rules",
        ],
    ),
    (
        "demo",
        &[
            "--synthetic-hosts",
            "--synthetic-gpus",
            "--interval",
            "--backfill",
        ],
    ),
    ("sql", &["--server", "--format", "--timeout"]),
    ("job", &["--server", "--token", "--format", "--timeout"]),
    (
        "jobs",
        &[
            "--user",
            "--since",
            "--running",
            "--limit",
            "--server",
            "--token",
            "--format",
            "--timeout",
        ],
    ),
    ("check", &[]),
    ("repair", &[]),
    (
        "agent",
        &[
            "--endpoint",
            "--protocol",
            "--interval",
            "--source",
            "--synthetic-gpus",
            "--host",
            "--label",
            "--seed",
            "--once",
            "--job-mapping-dir",
            "--pod-resources-socket",
            "--pod-label",
            "--kubelet-url",
            "--kubelet-token-file",
            "--kubelet-ca-file",
            "--kubelet-insecure-tls",
            "--metrics-addr",
            "--buffer-dir",
            "--buffer-max-bytes",
            "--slow-interval",
            "--flush-interval",
            "--fake-dev-dir",
            "--fake-mig",
            "--auth-token-file",
            "--config",
            "--log-level",
        ],
    ),
];

/// The ones added since: one client surface and one log format for both binaries; the PromQL
/// evaluation settings of the Prometheus query API; the agent's headers; the offline `check` and
/// `repair` commands (docs/operations.md).
const ADDED: &[(&str, &[&str])] = &[
    (
        "serve",
        &[
            "--log-format",
            "--promql-lookback-delta",
            "--promql-max-samples",
            "--promql-subquery-step",
            // Issue 23: the names the HTTP API answers to (DNS rebinding).
            "--allowed-hosts",
            // Issue 23: connections bounded.
            "--header-timeout",
            "--max-connections",
            "--idle-timeout",
        ],
    ),
    ("demo", &[]),
    ("sql", &["--token", "--token-file"]),
    ("job", &["--token-file"]),
    ("jobs", &["--token-file", "--until", "--after"]),
    (
        "check",
        &["--data-dir", "--object-store", "--quick", "--format"],
    ),
    (
        "repair",
        &[
            "--data-dir",
            "--object-store",
            "--quick",
            "--format",
            "--apply",
        ],
    ),
    ("agent", &["--log-format", "--header"]),
];

/// None of the settings of [`BEFORE`] may go missing, and only those of [`ADDED`] are new.
#[test]
fn help_lists_the_same_settings_as_before() {
    let tables = docs::tables();
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
    )
    .expect("docs/configuration.md");
    for ((name, old), (_, new)) in BEFORE.iter().zip(ADDED) {
        let (_, cmd) = tables.iter().find(|(n, _)| n == name).expect("table");
        let mut want: BTreeSet<String> = old.iter().map(|s| s.to_string()).collect();
        want.extend(new.iter().map(|s| s.to_string()));
        assert_eq!(flags(cmd), want, "{name}: the settings changed");
        for flag in &want {
            assert!(
                doc.contains(&format!("`{flag}")),
                "docs/configuration.md lacks {flag}"
            );
        }
    }
    // demo's help lists serve's settings too.
    let demo = crate::Cli::command()
        .find_subcommand("demo")
        .cloned()
        .expect("demo");
    assert!(flags(&demo).is_superset(&flags(&tables[0].1)));
}

#[test]
fn docs_configuration_md_is_generated_from_the_declarations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let doc = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let fresh =
        docs::render(&doc).expect("docs/configuration.md lacks a <!-- BEGIN name --> marker");
    if fresh != doc && std::env::var_os("GPUWATCH_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write docs/configuration.md");
        return;
    }
    assert!(
        fresh == doc,
        "docs/configuration.md is out of date with the settings' declarations: run \
         `GPUWATCH_BLESS=1 cargo test -p gpuwatch docs_configuration_md` and commit it"
    );
}
