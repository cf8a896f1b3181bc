//! Tests of the configuration: precedence, parsing, errors, the shipped example.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::error::Error;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn no_env(_: &str) -> Option<String> {
    None
}

/// A config file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "gpuwatch-agent-test-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn arg(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load_with(args: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Result<Settings> {
    load(
        std::iter::once("gpuwatch-agent").chain(args.iter().copied()),
        env,
    )
}

#[test]
fn defaults() {
    let s = load_with(&[], &no_env).unwrap();
    let a = &s.agent;
    assert_eq!(a.endpoint, "http://127.0.0.1:4318");
    assert_eq!(a.protocol, Protocol::Http);
    assert_eq!(a.interval, Duration::from_secs(5));
    assert_eq!(a.source, SourceKind::Auto);
    assert_eq!(a.synthetic_gpus, 8);
    assert_eq!(a.host, hostname());
    assert_eq!(a.seed, seed_from_host(&a.host));
    assert!(a.labels.is_empty());
    assert!(!a.once);
    assert_eq!(s.log_level, "info");
}

#[test]
fn synthetic_host_is_labelled_simulated() {
    let s = load_with(&["--source", "synthetic"], &no_env).unwrap();
    assert_eq!(s.agent.host, format!("sim-{}", hostname()));
    let s = load_with(&["--source", "synthetic", "--host", "lab1"], &no_env).unwrap();
    assert_eq!(s.agent.host, "lab1");
}

#[test]
fn flags() {
    let s = load_with(
        &[
            "--endpoint",
            "http://gw:9500",
            "--protocol",
            "http",
            "--interval",
            "250ms",
            "--source",
            "synthetic",
            "--synthetic-gpus",
            "4",
            "--host",
            "n1",
            "--label",
            "cluster=prod",
            "--label",
            "rack = r12",
            "--seed",
            "42",
            "--once",
            "--log-level",
            "debug",
        ],
        &no_env,
    )
    .unwrap();
    let a = &s.agent;
    assert_eq!(a.endpoint, "http://gw:9500");
    assert_eq!(a.interval, Duration::from_millis(250));
    assert_eq!(a.source, SourceKind::Synthetic);
    assert_eq!(a.synthetic_gpus, 4);
    assert_eq!(a.host, "n1");
    assert_eq!(
        a.labels,
        vec![
            ("cluster".to_string(), "prod".to_string()),
            ("rack".to_string(), "r12".to_string())
        ]
    );
    assert_eq!(a.seed, 42);
    assert!(a.once);
    assert_eq!(s.log_level, "debug");
}

#[test]
fn precedence_flag_env_file_default() {
    let file = TempFile::new(
        "precedence",
        r#"
endpoint = "http://file:1"
interval = "30s"
synthetic_gpus = 3
source = "synthetic"
label = ["from=file"]
seed = 7
host = "file-host"
"#,
    );
    let env = env_of(&[
        ("GPUWATCH_CONFIG", &file.arg()),
        ("GPUWATCH_ENDPOINT", "http://env:2"),
        ("GPUWATCH_INTERVAL", "20s"),
        ("GPUWATCH_LABEL", "from=env,second=yes"),
        ("GPUWATCH_HOST", ""),
    ]);
    let s = load_with(&["--endpoint", "http://flag:3"], &env).unwrap();
    let a = &s.agent;
    // flag beats env and file
    assert_eq!(a.endpoint, "http://flag:3");
    // env beats file
    assert_eq!(a.interval, Duration::from_secs(20));
    assert_eq!(a.labels.len(), 2);
    assert_eq!(a.labels[0], ("from".to_string(), "env".to_string()));
    // file beats default (an empty env var counts as unset)
    assert_eq!(a.synthetic_gpus, 3);
    assert_eq!(a.source, SourceKind::Synthetic);
    assert_eq!(a.seed, 7);
    assert_eq!(a.host, "file-host");
    // default where nobody says anything
    assert_eq!(s.log_level, "info");
    assert_eq!(a.protocol, Protocol::Http);

    // A flag typed with the default value still wins over env and file.
    let s = load_with(&["--synthetic-gpus", "8", "--interval", "5s"], &env).unwrap();
    assert_eq!(s.agent.synthetic_gpus, 8);
    assert_eq!(s.agent.interval, Duration::from_secs(5));

    // --config beats GPUWATCH_CONFIG.
    let other = TempFile::new("other", "synthetic_gpus = 5\n");
    let s = load_with(&["--config", &other.arg()], &env).unwrap();
    assert_eq!(s.agent.synthetic_gpus, 5);
    assert_eq!(s.agent.interval, Duration::from_secs(20));
}

#[test]
fn env_values_are_parsed() {
    let env = env_of(&[
        ("GPUWATCH_SOURCE", "Synthetic"),
        ("GPUWATCH_SYNTHETIC_GPUS", "2"),
        ("GPUWATCH_ONCE", "true"),
        ("GPUWATCH_SEED", "9"),
        ("GPUWATCH_LOG_LEVEL", "warn"),
    ]);
    let s = load_with(&[], &env).unwrap();
    assert_eq!(s.agent.source, SourceKind::Synthetic);
    assert_eq!(s.agent.synthetic_gpus, 2);
    assert!(s.agent.once);
    assert_eq!(s.agent.seed, 9);
    assert_eq!(s.log_level, "warn");
}

#[test]
fn bad_label_is_a_usage_error() {
    let e = load_with(&["--label", "novalue"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("key=value"), "{e}");
    let e = load_with(&["--label", "=x"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);

    let e = load_with(&[], &env_of(&[("GPUWATCH_LABEL", "a=b,broken")])).unwrap_err();
    assert!(matches!(e, Error::BadEnv { .. }), "{e}");
    assert!(e.to_string().contains("GPUWATCH_LABEL"), "{e}");
    assert_eq!(e.exit_code(), 2);

    let file = TempFile::new("badlabel", "label = [\"oops\"]\n");
    let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
    assert!(matches!(e, Error::ConfigParse { .. }), "{e}");
    assert!(e.to_string().contains("oops"), "{e}");

    let e = load_with(&["--label", "host.name=x"], &no_env).unwrap_err();
    assert!(matches!(e, Error::ReservedLabel { .. }), "{e}");
}

#[test]
fn unknown_config_key() {
    let file = TempFile::new("unknown", "endpoint = \"http://x:1\"\nsynthetic_gpu = 4\n");
    let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let msg = e.to_string();
    assert!(msg.contains("synthetic_gpu"), "{msg}");
    assert!(msg.contains(&file.arg()), "{msg}");
}

#[test]
fn bad_values() {
    // Bad duration: on the command line, in env, in the file.
    let e = load_with(&["--interval", "5 parsecs"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = load_with(&[], &env_of(&[("GPUWATCH_INTERVAL", "soon")])).unwrap_err();
    assert!(e.to_string().contains("GPUWATCH_INTERVAL"), "{e}");
    assert_eq!(e.exit_code(), 2);
    let file = TempFile::new("baddur", "interval = \"5x\"\n");
    let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
    assert!(e.to_string().contains("interval"), "{e}");
    assert_eq!(e.exit_code(), 2);
    // A type error in the file.
    let file = TempFile::new("badtype", "synthetic_gpus = \"four\"\n");
    let e = load_with(&["--config", &file.arg()], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    // Missing file.
    let e = load_with(&["--config", "/nonexistent/gpuwatch.toml"], &no_env).unwrap_err();
    assert!(matches!(e, Error::ConfigRead { .. }), "{e}");
    assert_eq!(e.exit_code(), 2);
    // Protocols.
    let e = load_with(&["--protocol", "udp"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = load_with(&[], &env_of(&[("GPUWATCH_PROTOCOL", "udp")])).unwrap_err();
    assert!(e.to_string().contains("expected one of: http, grpc"), "{e}");
    // MIG instances of the fake source.
    let e = load_with(&["--source", "fake", "--fake-mig", "8"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("fake_mig"), "{e}");
    let a = load_with(
        &["--source", "fake"],
        &env_of(&[("GPUWATCH_FAKE_MIG", "3")]),
    )
    .unwrap()
    .agent;
    assert_eq!(a.fake_mig, 3);
    // A grpc endpoint has no path.
    for bad in ["http://gw:4317/v1/metrics", "ftp://gw:4317"] {
        let e = load_with(&["--protocol", "grpc", "--endpoint", bad], &no_env).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{bad}");
    }
    // Out of range.
    let e = load_with(&["--interval", "1ms"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = load_with(&["--source", "synthetic", "--synthetic-gpus", "0"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = load_with(&["--endpoint", "127.0.0.1:4318"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    // Unknown flag.
    let e = load_with(&["--frobnicate"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn grpc_protocol_and_its_default_endpoint() {
    // Nothing says where: the grpc port.
    let a = load_with(&["--protocol", "grpc"], &no_env).unwrap().agent;
    assert_eq!(a.protocol, Protocol::Grpc);
    assert_eq!(a.endpoint, "http://127.0.0.1:4317");
    let a = load_with(&[], &env_of(&[("GPUWATCH_PROTOCOL", "grpc")]))
        .unwrap()
        .agent;
    assert_eq!(a.endpoint, "http://127.0.0.1:4317");
    // An endpoint given anywhere wins.
    let a = load_with(
        &["--protocol", "grpc"],
        &env_of(&[("GPUWATCH_ENDPOINT", "http://gw:14317")]),
    )
    .unwrap()
    .agent;
    assert_eq!(a.endpoint, "http://gw:14317");
    let file = TempFile::new(
        "grpc",
        "protocol = \"grpc\"\nendpoint = \"http://gw:4317\"\n",
    );
    let a = load_with(&["--config", &file.arg()], &no_env)
        .unwrap()
        .agent;
    assert_eq!(a.protocol, Protocol::Grpc);
    assert_eq!(a.endpoint, "http://gw:4317");
    // The flag beats the file.
    let a = load_with(&["--config", &file.arg(), "--protocol", "http"], &no_env)
        .unwrap()
        .agent;
    assert_eq!(a.protocol, Protocol::Http);
}

#[test]
fn auth_token_file_flag_env_file() {
    assert_eq!(load_with(&[], &no_env).unwrap().agent.auth_token_file, None);
    let file = TempFile::new("token", "auth_token_file = \"/from/file\"\n");
    let a = load_with(&["--config", &file.arg()], &no_env)
        .unwrap()
        .agent;
    assert_eq!(a.auth_token_file, Some(PathBuf::from("/from/file")));
    let env = env_of(&[
        ("GPUWATCH_CONFIG", &file.arg()),
        ("GPUWATCH_AUTH_TOKEN_FILE", "/from/env"),
    ]);
    let a = load_with(&[], &env).unwrap().agent;
    assert_eq!(a.auth_token_file, Some(PathBuf::from("/from/env")));
    let a = load_with(&["--auth-token-file", "/from/flag"], &env)
        .unwrap()
        .agent;
    assert_eq!(a.auth_token_file, Some(PathBuf::from("/from/flag")));
    // An empty variable counts as unset; an empty path given on purpose is an error.
    let env = env_of(&[("GPUWATCH_AUTH_TOKEN_FILE", " ")]);
    assert_eq!(load_with(&[], &env).unwrap().agent.auth_token_file, None);
    let e = load_with(&["--auth-token-file", ""], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let empty = TempFile::new("emptytoken", "auth_token_file = \"\"\n");
    let e = load_with(&["--config", &empty.arg()], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("auth_token_file"), "{e}");
    // The token itself is never an option: no --auth-token flag.
    let e = load_with(&["--auth-token", "x"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
}

#[test]
fn help_and_version_exit_zero() {
    let e = load_with(&["--help"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 0);
    let help = e.to_string();
    for flag in [
        "--endpoint",
        "--protocol",
        "--interval",
        "--source",
        "--synthetic-gpus",
        "--host",
        "--label",
        "--seed",
        "--once",
        "--config",
        "--log-level",
        "--auth-token-file",
        "GPUWATCH_AUTH_TOKEN_FILE",
        "GPUWATCH_SYNTHETIC_GPUS",
        "grpc",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    let e = load_with(&["--version"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 0);
}

#[test]
fn clap_definition_is_valid() {
    Cli::command().debug_assert();
}

#[test]
fn example_file_parses() {
    let text = "endpoint = \"http://gw:4318\"\nprotocol = \"http\"\ninterval = \"10s\"\n\
                source = \"nvml\"\nsynthetic_gpus = 4\nhost = \"n1\"\nlabel = [\"a=b\"]\n\
                seed = 1\nonce = false\nlog_level = \"info\"\n";
    let layer = parse_file(Path::new("x.toml"), text).unwrap();
    assert_eq!(layer.source, SourceKind::Nvml);
    assert_eq!(layer.interval.get(), Duration::from_secs(10));
}

mod example_tests {
    use super::*;

    #[test]
    fn the_shipped_example_parses() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpuwatch-agent.example.toml");
        let text = std::fs::read_to_string(&path).expect("deploy/gpuwatch-agent.example.toml");
        parse_file(&path, &text).expect("the example parses");
    }
}

#[test]
fn otel_variables_fill_in_below_the_agents_own_settings() {
    // Only OTEL variables: the generic endpoint is a base URL, the metrics one is exact.
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "X-Scope-OrgID=tenant-a,api-key=k1",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "cluster=prod,host.name=node-9,rack=r1",
        ),
    ]);
    let a = load_with(&["--label", "rack=r2"], &env).unwrap().agent;
    assert_eq!(a.endpoint, "https://collector:4318");
    assert!(!a.export.exact_url);
    assert_eq!(a.export.timeout, std::time::Duration::from_millis(2500));
    assert_eq!(a.host, "node-9");
    assert_eq!(
        a.labels,
        vec![
            ("rack".to_string(), "r2".to_string()),
            ("cluster".to_string(), "prod".to_string())
        ]
    );
    // --header overrides by name; the agent's own endpoint and host win.
    let a = load_with(
        &[
            "--endpoint",
            "http://gw:4318",
            "--header",
            "api-key=k2",
            "--host",
            "h",
        ],
        &env,
    )
    .unwrap()
    .agent;
    assert_eq!(a.endpoint, "http://gw:4318");
    assert_eq!(a.host, "h");
    assert_eq!(
        a.export.headers,
        vec![
            ("X-Scope-OrgID".to_string(), "tenant-a".to_string()),
            ("api-key".to_string(), "k2".to_string())
        ]
    );
    // The metrics-specific endpoint is used as given; its protocol too.
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://collector:4318/custom/path",
        ),
    ]);
    let a = load_with(&[], &env).unwrap().agent;
    assert_eq!(a.endpoint, "http://collector:4318/custom/path");
    assert!(a.export.exact_url);
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
    ]);
    let a = load_with(&[], &env).unwrap().agent;
    assert_eq!(a.protocol, Protocol::Grpc);
    assert_eq!(a.endpoint, "https://collector:4317");
    // GPUWATCH_PROTOCOL wins over OTEL_EXPORTER_OTLP_PROTOCOL.
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("GPUWATCH_PROTOCOL", "http"),
    ]);
    let a = load_with(&[], &env).unwrap().agent;
    assert_eq!(a.protocol, Protocol::Http);
    // Bad OTEL values are configuration errors that name the variable.
    let env = env_of(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "lz4")]);
    let e = load_with(&[], &env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string().contains("OTEL_EXPORTER_OTLP_COMPRESSION"),
        "{e}"
    );
    let e = load_with(&["--header", "bad header=x"], &no_env).unwrap_err();
    assert_eq!(e.exit_code(), 2);
}
