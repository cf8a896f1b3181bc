//! The job limiter and notes on real GPU traces (tests/fixtures/gpu-traces/, recorded on an
//! H100): each trace is replayed through the real server by `gpuwatch-bench replay` (the agent's
//! own OTLP encoder) as a Slurm job, stretched to six minutes so the rules that need five minutes
//! of GPU time speak, and judged by the real `gpuwatch job ID --format json`: the limiter it must
//! get, the notes that must appear and those that must not. Also: the two mixed pairs as one job
//! in two phases (and, above, as two jobs), the traces read as an agent sampling every 10 s
//! would, a GPU without GPM, and the `jobs` table's `limiter` beside each report.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuwatch_e2e::{TestServer, bin_dir};

use crate::rows;

/// Every note that blames the job or its GPU; the healthy tensor-core job gets none of them.
const BLAME: &[&str] = &[
    "idle_gpus",
    "input_stall",
    "no_tensor_cores",
    "memory_bound",
    "host_transfer_bound",
    "low_utilization",
    "tiny_kernels",
    "low_memory",
    "throttled",
    "xid",
    "ecc",
];

/// What one replayed job must show.
struct Expect {
    job: &'static str,
    limiter: &'static str,
    must: &'static [&'static str],
    must_not: &'static [&'static str],
}

const fn e(
    job: &'static str,
    limiter: &'static str,
    must: &'static [&'static str],
    must_not: &'static [&'static str],
) -> Expect {
    Expect {
        job,
        limiter,
        must,
        must_not,
    }
}

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu-traces")
}

pub(crate) fn bench() -> PathBuf {
    let b = bin_dir().join("gpuwatch-bench");
    assert!(
        b.exists(),
        "{} is missing: build it with `cargo build -p gpuwatch-bench` (bash .ci/run builds the workspace)",
        b.display()
    );
    b
}

/// `gpuwatch-bench replay` of `files` (names in the fixtures folder or paths) with `args`.
pub(crate) fn replay(server: &TestServer, host: &str, args: &[&str], files: &[&str]) {
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|f| {
            let p = PathBuf::from(f);
            if p.is_absolute() {
                p
            } else {
                traces().join(format!("{f}.csv.gz"))
            }
        })
        .collect();
    let out = Command::new(bench())
        .arg("replay")
        .args(["--server", &server.url(), "--host", host])
        .args(args)
        .args(&paths)
        .output()
        .expect("gpuwatch-bench replay");
    assert!(
        out.status.success(),
        "replay {files:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The report of `job` from the real command line, as JSON.
fn report(server: &TestServer, job: &str) -> serde_json::Value {
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", job, "--server", &server.url(), "--format", "json"])
        .output()
        .expect("gpuwatch job");
    assert!(
        out.status.success(),
        "gpuwatch job {job}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the report is JSON")
}

fn rules(r: &serde_json::Value) -> Vec<String> {
    r["advice"]
        .as_array()
        .expect("advice")
        .iter()
        .filter_map(|a| a["rule"].as_str().map(str::to_string))
        .collect()
}

/// Checks `x` against its report; returns the report.
fn check(server: &TestServer, x: &Expect) -> serde_json::Value {
    let r = report(server, x.job);
    let got = rules(&r);
    let context = format!(
        "job {}: limiter {} notes {got:?}\n{r:#}",
        x.job, r["limiter"]
    );
    assert_eq!(r["limiter"], x.limiter, "{context}");
    for m in x.must {
        assert!(got.iter().any(|g| g == m), "{m} missing: {context}");
    }
    for m in x.must_not {
        assert!(!got.iter().any(|g| g == m), "{m} present: {context}");
    }
    // Each note carries its figure and threshold; the weights add up to the GPU time.
    for a in r["advice"].as_array().expect("advice") {
        assert!(a["value"].is_number() && a["threshold"].is_number(), "{a}");
    }
    let weighted: f64 = r["limiter_seconds"]
        .as_object()
        .expect("limiter_seconds")
        .values()
        .filter_map(serde_json::Value::as_f64)
        .sum();
    let held = r["gpu_seconds"].as_f64().expect("gpu_seconds");
    assert!(
        (weighted - held).abs() < 1e-6 * held.max(1.0),
        "{weighted} vs {held}"
    );
    r
}

/// The recorded shapes, each as its own job.
const SHAPES: &[&str] = &[
    "tensor_bf16",
    "fp32_no_tf32",
    "fp64_matmul",
    "fp16_pipe",
    "d2d_copy",
    "h2d_pageable",
    "tiny_sync",
    "input_starved",
    "idle_hold",
    "train_workers0",
    "train_workers8",
    "infer_batch1",
    "infer_batch64",
    "h100_phased",
];

const ONE_JOB_EACH: &[Expect] = &[
    e("9201", "tensor", &["power_capped"], BLAME),
    e(
        "9202",
        "fp32",
        &["no_tensor_cores"],
        &[
            "throttled",
            "input_stall",
            "memory_bound",
            "low_utilization",
        ],
    ),
    // FP64 matrix products run on the DFMA tensor cores: nothing to move to them.
    e("9203", "tensor", &["power_capped"], BLAME),
    e(
        "9204",
        "fp16",
        &["no_tensor_cores"],
        &["throttled", "input_stall", "memory_bound"],
    ),
    e(
        "9205",
        "memory",
        &["memory_bound"],
        &[
            "no_tensor_cores",
            "input_stall",
            "throttled",
            "low_utilization",
        ],
    ),
    e(
        "9206",
        "host_transfer",
        &["host_transfer_bound"],
        &[
            "input_stall",
            "low_utilization",
            "throttled",
            "memory_bound",
        ],
    ),
    e(
        "9207",
        "latency",
        &["low_utilization"],
        &[
            "input_stall",
            "host_transfer_bound",
            "throttled",
            "memory_bound",
        ],
    ),
    e(
        "9208",
        "input",
        &["input_stall", "power_capped"],
        &["low_utilization", "memory_bound", "throttled", "low_memory"],
    ),
    e(
        "9209",
        "idle",
        &["idle_gpus"],
        &["input_stall", "low_utilization", "low_memory", "throttled"],
    ),
    e(
        "9210",
        "input",
        &["input_stall"],
        &["memory_bound", "throttled", "low_utilization"],
    ),
    // Eight loader workers: the stall is gone.
    e(
        "9211",
        "memory",
        &[],
        &[
            "input_stall",
            "memory_bound",
            "low_utilization",
            "throttled",
        ],
    ),
    e(
        "9212",
        "latency",
        &["low_utilization"],
        &["input_stall", "throttled", "memory_bound"],
    ),
    e(
        "9213",
        "tensor",
        &["power_capped"],
        &[
            "low_utilization",
            "input_stall",
            "no_tensor_cores",
            "throttled",
            "low_memory",
        ],
    ),
    // The older four-phase trace (shared/data columns only): matmul, copy, small kernels, hold.
    e("h100_phased", "idle", &[], &["throttled", "idle_gpus"]),
];

#[tokio::test(flavor = "multi_thread")]
async fn every_recorded_trace_gets_its_limiter_and_notes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    replay(&server, "replay-a", &["--min-span", "6m"], SHAPES);
    let mut limiters = Vec::new();
    for x in ONE_JOB_EACH {
        let r = check(&server, x);
        limiters.push((x.job, r["limiter"].clone()));
    }

    // The healthy bf16 job: no blame at all, and the power cap named with the clock it cost.
    let r = report(&server, "9201");
    for a in r["advice"].as_array().expect("advice") {
        assert_eq!(a["informational"], true, "{a}");
        assert!(
            a["figure"]
                .as_str()
                .is_some_and(|f| f.contains("of 1980 MHz")),
            "{a}"
        );
    }
    let g = &r["per_gpu"][0];
    assert_eq!(g["throttled_share"], 0.0, "SW power cap is not throttling");
    assert_eq!(g["roofline"]["model"], "H100 SXM5");
    assert_eq!(g["roofline"]["compute_unit"], "tensor");
    // The trace's own rate: 676 TFLOP/s while it ran, 62 of its ~72 s.
    let tensor = &g["roofline"]["units"][0];
    let achieved = tensor["achieved"].as_f64().expect("tensor FLOP/s");
    assert!((450e12..700e12).contains(&achieved), "{tensor}");
    // Four phases, each in its own class.
    let phased = report(&server, "h100_phased");
    for class in ["tensor", "memory", "latency", "idle"] {
        let share = phased["limiter_seconds"][class].as_f64().unwrap_or(0.0)
            / phased["gpu_seconds"].as_f64().expect("held");
        assert!(share > 0.1, "{class} {share}: {phased:#}");
    }
    assert!(
        phased["per_gpu"][0]["missing_counters"]
            .as_array()
            .expect("missing")
            .iter()
            .any(|c| c == "pcie_link"),
        "the shared/data column set has no link columns"
    );

    // The `jobs` table's limiter is the report's, job by job.
    let table = rows(
        &server,
        "SELECT job_id, limiter FROM jobs WHERE host = 'replay-a' ORDER BY job_id",
    )
    .await;
    for (job, limiter) in limiters {
        let row = table
            .iter()
            .find(|r| r["job_id"] == job)
            .unwrap_or_else(|| panic!("job {job} not in jobs: {table:?}"));
        assert_eq!(row["limiter"], limiter, "job {job}");
    }

    // The text report says it in words.
    let out = Command::new(bin_dir().join("gpuwatch"))
        .args(["job", "9208", "--server", &server.url()])
        .output()
        .expect("gpuwatch job");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("limiter input"), "{text}");
    assert!(text.contains("[input_stall] GPU 0 on replay-a"), "{text}");
    assert!(text.contains("[power_capped] (informational)"), "{text}");
    assert!(text.contains("roofline"), "{text}");
}

#[test]
fn mixed_phases_slower_agents_and_gpus_without_gpm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("d"))
        .start();
    // One job, two phases: 0 loader workers, then 8; batch 1, then batch 64.
    replay(
        &server,
        "replay-b",
        &["--min-span", "6m", "--job-id", "9310"],
        &["train_workers0", "train_workers8"],
    );
    replay(
        &server,
        "replay-c",
        &["--min-span", "6m", "--job-id", "9312"],
        &["infer_batch1", "infer_batch64"],
    );
    check(
        &server,
        &e(
            "9310",
            "input",
            &["input_stall"],
            &["throttled", "memory_bound"],
        ),
    );
    let r = check(
        &server,
        &e(
            "9312",
            "latency",
            &["low_utilization", "power_capped"],
            &["input_stall", "throttled"],
        ),
    );
    // Both phases hold their share of the job's time.
    let held = r["gpu_seconds"].as_f64().expect("held");
    for class in ["latency", "tensor"] {
        assert!(
            r["limiter_seconds"][class].as_f64().unwrap_or(0.0) / held > 0.3,
            "{class}: {r:#}"
        );
    }

    // An agent reading every 10 s: GPM averaged over the 10 s, the rest a point reading.
    for (shape, limiter, must) in [
        ("tensor_bf16", "tensor", &["power_capped"][..]),
        ("fp32_no_tf32", "fp32", &["no_tensor_cores"]),
        ("d2d_copy", "memory", &["memory_bound"]),
        ("h2d_pageable", "host_transfer", &["host_transfer_bound"]),
        ("tiny_sync", "latency", &["low_utilization"]),
        ("input_starved", "input", &["input_stall"]),
        ("infer_batch1", "latency", &["low_utilization"]),
        ("idle_hold", "idle", &["idle_gpus"]),
    ] {
        let job = format!("every10-{shape}");
        let host = format!("replay-10s-{shape}");
        replay(
            &server,
            &host,
            &["--every", "10", "--stretch", "5.5", "--job-id", &job],
            &[shape],
        );
        let r = report(&server, &job);
        assert_eq!(r["limiter"], limiter, "{job}: {r:#}");
        let got = rules(&r);
        for m in must {
            assert!(
                got.iter().any(|g| g == m),
                "{job}: {m} missing from {got:?}"
            );
        }
        assert!(!got.iter().any(|g| g == "throttled"), "{job}: {got:?}");
    }

    // A GPU without GPM (an A100 read by NVML alone): the bf16 trace with its GPM columns
    // empty. No limiter can be told, the report says which counters are missing, and no note
    // is drawn from counters it does not have.
    let text = read_gz(&traces().join("tensor_bf16.csv.gz"));
    let nogpm = dir.path().join("nogpm.csv");
    std::fs::write(&nogpm, blank_columns(&text, "gpm_")).expect("write");
    std::fs::write(
        dir.path().join("nogpm.json"),
        r#"{"job_id": "9401", "job_user": "trace", "job_name": "no-gpm", "gpu_model": "NVIDIA A100-SXM4-80GB"}"#,
    )
    .expect("write json");
    replay(
        &server,
        "replay-nogpm",
        &["--min-span", "6m"],
        &[nogpm.to_str().expect("path")],
    );
    let r = check(
        &server,
        &e(
            "9401",
            "unknown",
            &[],
            &[
                "input_stall",
                "no_tensor_cores",
                "memory_bound",
                "low_utilization",
                "tiny_kernels",
            ],
        ),
    );
    let missing = &r["per_gpu"][0]["missing_counters"];
    for c in ["sm_active", "tensor_active", "dram_active"] {
        assert!(
            missing.as_array().expect("missing").iter().any(|m| m == c),
            "{c}: {missing}"
        );
    }
}

fn read_gz(path: &Path) -> String {
    use std::io::Read;
    let bytes = std::fs::read(path).expect("trace");
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .read_to_string(&mut text)
        .expect("gzip");
    text
}

/// `text` (CSV) with every column whose name starts with `prefix` emptied.
fn blank_columns(text: &str, prefix: &str) -> String {
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    let blank: Vec<bool> = header.split(',').map(|h| h.starts_with(prefix)).collect();
    let mut out = format!("{header}\n");
    for line in lines {
        let fields: Vec<&str> = line
            .split(',')
            .zip(&blank)
            .map(|(f, b)| if *b { "" } else { f })
            .collect();
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}
