//! The agent's `/metrics`: dcgm-exporter names and labels, the agent's own counters, parsed by
//! `promtool check metrics` and scraped by a real Prometheus (`apt-get install -y prometheus`).

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuwatch_e2e::{TestAgent, free_addr, http_get};
use serde_json::Value;

use crate::eventually;

/// A Prometheus process, killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn need(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{program} is missing: install it with `apt-get install -y prometheus` (as .ci/run does)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_pass_promtool_and_a_real_prometheus_scrapes_them() {
    need("promtool");
    need("prometheus");
    let metrics_addr = free_addr();
    // Nothing listens on the endpoint: export failures must show up in the agent's counters.
    let dead_endpoint = format!("http://{}", free_addr());
    let _agent = TestAgent::start(&[
        "--source",
        "synthetic",
        "--synthetic-gpus",
        "2",
        "--seed",
        "3",
        "--host",
        "prom-e2e",
        "--interval",
        "300ms",
        "--flush-interval",
        "0s",
        "--endpoint",
        &dead_endpoint,
        "--metrics-addr",
        &metrics_addr.to_string(),
        "--log-level",
        "error",
    ]);

    let mut text = String::new();
    eventually(Duration::from_secs(30), "/metrics with GPU series", || {
        let got = http_get(metrics_addr, "/metrics");
        if let Ok((200, body)) = &got {
            text = body.clone();
        }
        let ok = text.contains("DCGM_FI_DEV_GPU_UTIL{")
            && text.lines().any(|l| {
                l.starts_with("gpuwatch_agent_export_failures_total ") && !l.ends_with(" 0")
            });
        async move { ok }
    })
    .await;

    // dcgm-exporter's names, units and labels.
    for name in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{gpu=\"0\"")))
            .unwrap_or_else(|| panic!("no {name} series for gpu 0:\n{text}"));
        for label in [
            "UUID=\"GPU-",
            "device=\"nvidia0\"",
            "modelName=\"NVIDIA H100 80GB HBM3\"",
            "Hostname=\"prom-e2e\"",
        ] {
            assert!(line.contains(label), "{line} lacks {label}");
        }
    }
    let util: f64 = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("a GPU_UTIL value");
    assert!(
        (0.0..=100.0).contains(&util),
        "GPU_UTIL is a percentage: {util}"
    );
    assert!(
        text.contains("hpc_job=\""),
        "the simulated node's jobs carry hpc_job:\n{text}"
    );
    for own in [
        "gpuwatch_agent_collections_total",
        "gpuwatch_agent_collection_duration_seconds",
        "gpuwatch_agent_spool_bytes",
        "gpuwatch_agent_spool_dropped_total",
        "gpuwatch_agent_nvml_errors_total",
    ] {
        assert!(text.contains(&format!("# TYPE {own} ")), "no {own}");
    }

    promtool_accepts(&text);

    // A real Prometheus scrapes it.
    let dir = tempfile::tempdir().expect("tempdir");
    let web = free_addr();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpuwatch-agent\n    static_configs:\n      - targets: ['{metrics_addr}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let query = |q: &str| {
        let path = format!("/api/v1/query?query={q}");
        http_get(web, &path)
            .ok()
            .filter(|(code, _)| *code == 200)
            .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    };
    let mut result = Vec::new();
    eventually(Duration::from_secs(60), "prometheus has both GPUs", || {
        result = query("DCGM_FI_DEV_GPU_UTIL");
        let ok = result.len() == 2;
        async move { ok }
    })
    .await;
    for series in &result {
        let m = &series["metric"];
        assert_eq!(m["Hostname"], "prom-e2e", "{series}");
        assert_eq!(m["modelName"], "NVIDIA H100 80GB HBM3", "{series}");
        assert!(
            m["UUID"].as_str().is_some_and(|u| u.starts_with("GPU-")),
            "{series}"
        );
        assert!(matches!(m["gpu"].as_str(), Some("0" | "1")), "{series}");
    }
    let up = query("up");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0]["value"][1], "1", "scrape target is down: {up:?}");
    let failures = query("gpuwatch_agent_export_failures_total");
    assert_eq!(failures.len(), 1, "{failures:?}");
}

/// `promtool check metrics` parses `text`; its only complaints are dcgm-exporter's own naming,
/// kept on purpose.
fn promtool_accepts(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = promtool.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // 0: clean; 3: lint problems only; 1: the text does not parse.
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool could not parse /metrics ({:?}): {report}",
        out.status
    );
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        let known = line.starts_with("DCGM_FI_")
            && (line.ends_with("label names should be written in 'snake_case' not 'camelCase'")
                || line.ends_with("counter metrics should have \"_total\" suffix"));
        assert!(known, "promtool: {line}");
    }
}

/// `/metrics` of the agent on a real H200 (NVML, recorded with `device`: tests/fixtures/agent/)
/// passes promtool, and its maximum SM clock and PCIe link are what `nvidia-smi` read on the
/// same machine at the same time.
#[test]
fn a_real_h200s_metrics_pass_promtool_and_agree_with_nvidia_smi() {
    need("promtool");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agent");
    let text = std::fs::read_to_string(dir.join("h200-nvml-metrics.txt")).expect("capture");
    promtool_accepts(&text);
    let smi = std::fs::read_to_string(dir.join("h200-nvidia-smi.csv")).expect("nvidia-smi");
    let row: Vec<String> = smi
        .lines()
        .nth(1)
        .expect("a GPU row")
        .split(", ")
        .map(|f| f.trim_end_matches(" MHz").to_string())
        .collect();
    let value = |name: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("no {name}"));
        line.rsplit(' ').next().expect("value").to_string()
    };
    assert_eq!(value("DCGM_FI_DEV_MAX_SM_CLOCK"), row[1], "max SM clock");
    assert_eq!(
        value("DCGM_FI_DEV_PCIE_LINK_GEN"),
        row[3],
        "PCIe generation"
    );
    assert_eq!(value("DCGM_FI_DEV_PCIE_LINK_WIDTH"), row[4], "PCIe width");
    assert!(text.contains("modelName=\"NVIDIA H200\""));
}
