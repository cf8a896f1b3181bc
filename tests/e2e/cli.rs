//! `gpuwatch demo` and `gpuwatch sql` as a user runs them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuwatch_e2e::{TestServer, bin_dir, free_addr, http_get};

use crate::{now_ns, otlp_json, post_otlp};

/// Kills the process if the test ends early, so a failed run leaves no demo holding its ports.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn demo_serves_simulated_data_prints_examples_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (http, otlp) = (free_addr(), free_addr());
    let mut demo = KillOnDrop(
        Command::new(bin_dir().join("gpuwatch"))
            .args([
                "demo",
                "--synthetic-hosts",
                "2",
                "--synthetic-gpus",
                "2",
                "--interval",
                "1s",
                "--backfill",
                "2m",
            ])
            .arg("--http-addr")
            .arg(http.to_string())
            .arg("--otlp-http-addr")
            .arg(otlp.to_string())
            .arg("--otlp-grpc-addr")
            .arg(free_addr().to_string())
            .arg("--pg-addr")
            .arg(free_addr().to_string())
            .arg("--data-dir")
            .arg(dir.path().join("demo"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start demo"),
    );
    let child = &mut demo.0;
    let stdout = child.stdout.take().expect("stdout");
    let mut banner = String::new();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        banner.push_str(&line);
        banner.push('\n');
        if line.starts_with("Ctrl-C") {
            break;
        }
    }
    assert!(banner.contains("SIMULATED"), "{banner}");
    assert!(banner.contains(&http.to_string()), "{banner}");
    for example in [
        "round(avg(gpu_utilization), 2)",
        "HAVING max(gpu_utilization) < 0.01",
        "curl -sG",
    ] {
        assert!(
            banner.contains(example),
            "example {example:?} missing: {banner}"
        );
    }

    // The backfilled history is there: 2 hosts x 2 GPUs, about 2 minutes at 10 s.
    let (code, body) = http_get(
        http,
        "/api/v1/sql?q=SELECT%20count(DISTINCT%20gpu_uuid)%20AS%20g,%20count(*)%20AS%20n,%20min(host)%20AS%20h%20FROM%20gpu_metrics",
    )
    .expect("query");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v[0]["g"], 4, "{body}");
    assert!(v[0]["n"].as_i64().expect("n") >= 4 * 12, "{body}");
    assert_eq!(v[0]["h"], "sim-node-01");

    // Ctrl-C (SIGINT) stops it cleanly.
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            assert!(s.success(), "demo exited with {s}");
            break;
        }
        assert!(Instant::now() < deadline, "demo did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(100));
    }
    // It persisted what it had buffered.
    assert!(
        crate::persisted(&dir.path().join("demo"), "gpu_metrics"),
        "the demo persisted its buffer when stopped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_command_prints_a_table_and_each_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    for (i, gpu) in ["GPU-x", "GPU-y"].iter().enumerate() {
        let body = otlp_json("hw.power", 100.0 + i as f64, now_ns(), &[("hw.id", gpu)]);
        let (s, b) = post_otlp(&server.url(), "application/json", None, body.into_bytes()).await;
        assert_eq!(s, 200, "{b}");
    }
    let run = |args: &[&str]| {
        let out = Command::new(bin_dir().join("gpuwatch"))
            .arg("sql")
            .arg("--server")
            .arg(server.url())
            .args(args)
            .output()
            .expect("run gpuwatch sql");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let q = "SELECT gpu_uuid, power_watts FROM gpu_metrics ORDER BY gpu_uuid";
    let (code, out, _) = run(&[q]);
    assert_eq!(code, Some(0));
    assert!(out.contains("| gpu_uuid | power_watts |"), "{out}");
    assert!(out.contains("| GPU-x    | 100.0       |"), "{out}");
    assert!(out.contains("(2 rows)"), "{out}");
    let (_, out, _) = run(&["--format", "csv", q]);
    assert_eq!(out, "gpu_uuid,power_watts\nGPU-x,100.0\nGPU-y,101.0\n");
    let (_, out, _) = run(&["--format", "jsonl", q]);
    assert_eq!(
        out,
        "{\"gpu_uuid\":\"GPU-x\",\"power_watts\":100.0}\n{\"gpu_uuid\":\"GPU-y\",\"power_watts\":101.0}\n"
    );
    let (_, out, _) = run(&["--format", "json", q]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[1]["power_watts"], 101.0);
    // Errors: the server's message and a non-zero exit code.
    let (code, _, err) = run(&["SELECT nope FROM gpu_metrics"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nope") && err.contains("400"), "{err}");
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["sql", "--server", "http://127.0.0.1:9", "SELECT 1"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach gpuwatch"));
}
