//! Slurm attribution with a real single-node Slurm (tests/setup/slurm.sh): two jobs on fake
//! GPUs 0 and 1, the prolog/epilog of deploy/slurm writing the job mapping dir, and the agent
//! with its simulated NVML (`--source fake`) reading that dir and `/proc`. One job holds its
//! GPU open (a "process" on the GPU), the other holds the allocation only (the idle-GPU case).
//! Checked through SQL on the real server: each GPU carries its job while it runs, the process
//! row carries its pid and job, and the labels go when the jobs end, without an agent restart.
//! The jobs bill two accounts and two partitions, one of them as an array task: their labels
//! reach `gpu_metrics`, `gpuwatch cost` and `gpuwatch job`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpuwatch_e2e::{TestAgent, TestServer};
use serde_json::Value;

use crate::{eventually, rows};

/// The Slurm of tests/setup/slurm.sh: started by [`Slurm::start`], stopped on drop, with the
/// test's jobs cancelled.
struct Slurm {
    conf: String,
    dir: PathBuf,
    jobs: Vec<String>,
}

impl Slurm {
    fn start() -> Slurm {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("setup/slurm.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .expect("run tests/setup/slurm.sh");
        assert!(
            out.status.success(),
            "tests/setup/slurm.sh failed (install Slurm with `apt-get install -y slurm-wlm munge`, as .ci/run does):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let get = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("slurm.sh printed no {key}: {text}"))
                .to_string()
        };
        Slurm {
            conf: get("SLURM_CONF"),
            dir: PathBuf::from(get("GPUWATCH_SLURM_DIR")),
            jobs: Vec::new(),
        }
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf).current_dir(&self.dir);
        c
    }

    /// Submit a one-GPU batch job running `script` with sbatch options `args`; returns its id
    /// (an array job's id for an array).
    fn sbatch(&mut self, name: &str, args: &[&str], script: &str) -> String {
        let out = self
            .cmd("sbatch")
            .args(["--parsable", "--gres=gpu:1", "-J", name, "-o", "/dev/null"])
            .args(args)
            .arg("--wrap")
            .arg(script)
            .output()
            .expect("sbatch");
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        assert!(!id.is_empty(), "sbatch printed no job id");
        self.jobs.push(id.clone());
        id
    }

    fn scancel(&self, id: &str) {
        let _ = self.cmd("scancel").arg(id).status();
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for id in &self.jobs {
            self.scancel(id);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("setup/slurm.sh");
        let _ = Command::new("bash").arg(script).arg("stop").status();
    }
}

/// The newest `gpu_metrics` row of each GPU of host `host`.
async fn latest(server: &TestServer, host: &str) -> Vec<Value> {
    rows(
        server,
        &format!(
            "SELECT gpu_index, job_id, job_user, job_name, scheduler, gpu_utilization \
             FROM gpu_metrics m WHERE host = '{host}' AND time = \
             (SELECT max(time) FROM gpu_metrics WHERE host = '{host}') ORDER BY gpu_index"
        ),
    )
    .await
}

fn field<'a>(row: &'a Value, key: &str) -> &'a Value {
    row.get(key).unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn slurm_jobs_label_their_gpus_and_go_when_they_end() {
    let mut slurm = Slurm::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::builder()
        .data_dir(&dir.path().join("data"))
        .start();
    let host = "slurm-e2e";
    let mapping = slurm.dir.join("jobs");
    let fake = slurm.dir.join("fakegpu");

    // Each job writes the GPU Slurm gave it and its job id, so the test knows where to look
    // (the files of an earlier run go first).
    for name in ["train-a", "idle-b"] {
        let _ = std::fs::remove_file(slurm.dir.join(format!("gpus.{name}")));
    }
    // Two accounts, two partitions, two time limits; the idle job is task 3 of an array job.
    let busy_submit = slurm.sbatch(
        "train-a",
        &["--account=physics", "--partition=debug", "--time=00:05:00"],
        &format!(
            "echo $SLURM_JOB_GPUS $SLURM_JOB_ID > {d}/gpus.train-a; exec 3<{f}/nvidia$SLURM_JOB_GPUS; exec sleep 120",
            d = slurm.dir.display(),
            f = fake.display()
        ),
    );
    let array = slurm.sbatch(
        "idle-b",
        &[
            "--account=chem",
            "--partition=long",
            "--time=00:30:00",
            "--array=3",
        ],
        &format!(
            "echo $SLURM_JOB_GPUS $SLURM_JOB_ID > {d}/gpus.idle-b; exec sleep 120",
            d = slurm.dir.display()
        ),
    );
    let started = |name: &str| -> Option<(u32, String)> {
        let text = std::fs::read_to_string(slurm.dir.join(format!("gpus.{name}"))).ok()?;
        let (gpu, id) = text.trim().split_once(' ')?;
        Some((gpu.parse().ok()?, id.to_string()))
    };
    eventually(Duration::from_secs(30), "both jobs running", || async {
        started("train-a").is_some() && started("idle-b").is_some()
    })
    .await;
    let (busy_gpu, busy) = started("train-a").expect("gpu of the busy job");
    let (idle_gpu, idle) = started("idle-b").expect("gpu of the idle job");
    assert_eq!(busy, busy_submit);
    slurm.jobs.push(idle.clone());
    assert_ne!(busy_gpu, idle_gpu, "two one-GPU jobs share a GPU");

    let endpoint = server.otlp_url();
    let _agent = TestAgent::start(&[
        "--source",
        "fake",
        "--synthetic-gpus",
        "2",
        "--fake-dev-dir",
        fake.to_str().expect("utf-8 path"),
        "--job-mapping-dir",
        mapping.to_str().expect("utf-8 path"),
        "--interval",
        "500ms",
        "--flush-interval",
        "0s",
        "--endpoint",
        &endpoint,
        "--host",
        host,
        "--metrics-addr",
        "off",
    ]);

    let expect_running = |r: &[Value]| -> bool {
        r.len() == 2
            && r.iter().all(|row| {
                let index = field(row, "gpu_index").as_u64();
                let job = field(row, "job_id").as_str();
                if index == Some(u64::from(busy_gpu)) {
                    job == Some(busy.as_str())
                        && field(row, "job_user").as_str() == Some("root")
                        && field(row, "job_name").as_str() == Some("train-a")
                        && field(row, "gpu_utilization").as_f64() == Some(1.0)
                } else {
                    job == Some(idle.as_str())
                        && field(row, "job_user").as_str() == Some("root")
                        && field(row, "gpu_utilization").as_f64() == Some(0.0)
                }
            })
    };
    let mut last = Vec::new();
    for _ in 0..100 {
        last = latest(&server, host).await;
        if expect_running(&last) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        expect_running(&last),
        "gpu {busy_gpu} should carry job {busy} (train-a, with a process) and gpu {idle_gpu} job {idle} (idle, allocation only); newest rows: {last:?}"
    );
    for row in &last {
        assert_eq!(field(row, "scheduler").as_str(), Some("slurm"), "{row}");
    }

    chargeback_reaches_the_statement(&server, host, (&busy, busy_gpu), (&idle, &array)).await;

    // The per-process row: the job's pid on the busy GPU, with its job.
    let procs = rows(
        &server,
        &format!(
            "SELECT CAST(p.pid AS VARCHAR) AS pid, p.job_id AS job, CAST(g.gpu_index AS VARCHAR) AS gpu, \
             p.used_memory_bytes AS value \
             FROM gpu_processes p JOIN gpu_metrics g ON g.host = p.host AND g.gpu_uuid = p.gpu_uuid AND g.time = p.time \
             WHERE p.host = '{host}' ORDER BY p.time DESC LIMIT 1"
        ),
    )
    .await;
    assert_eq!(procs.len(), 1, "no gpu_processes row: {procs:?}");
    assert_eq!(
        field(&procs[0], "job").as_str(),
        Some(busy.as_str()),
        "{procs:?}"
    );
    assert_eq!(
        field(&procs[0], "gpu").as_str(),
        Some(busy_gpu.to_string().as_str()),
        "{procs:?}"
    );
    assert!(
        field(&procs[0], "pid")
            .as_str()
            .is_some_and(|p| !p.is_empty()
                && std::fs::read_to_string(format!("/proc/{p}/environ"))
                    .is_ok_and(|e| e.contains(&format!("SLURM_JOB_ID={busy}")))),
        "process row's pid is not a process of job {busy}: {procs:?}"
    );

    // The jobs end: the epilog empties the mapping dir, the agent drops the labels.
    slurm.scancel(&busy);
    slurm.scancel(&idle);
    eventually(
        Duration::from_secs(30),
        "labels gone after the jobs end",
        || async {
            let r = latest(&server, host).await;
            r.len() == 2 && r.iter().all(|row| field(row, "job_id").is_null())
        },
    )
    .await;
    assert!(
        !mapping.join(busy_gpu.to_string()).exists()
            && !mapping.join(idle_gpu.to_string()).exists(),
        "the epilog left mapping files behind"
    );
}

/// The accounting labels of the two jobs: `busy` (account physics, partition debug, 5 minutes,
/// a process on its GPU: its account from the process's environment) and `idle` (task 3 of
/// array job `array`, account chem, partition long, 30 minutes, no process: everything from the
/// prolog's `.jobs/<id>`), in `gpu_metrics`, in `gpuwatch cost` and in `gpuwatch job`.
async fn chargeback_reaches_the_statement(
    server: &TestServer,
    host: &str,
    (busy, busy_gpu): (&str, u32),
    (idle, array): (&str, &str),
) {
    let labels = rows(
        server,
        &format!(
            "SELECT job_id, max(job_account) AS account, max(job_partition) AS partition, \
             max(job_array_id) AS array_id, max(job_array_task_id) AS task, \
             max(job_time_limit_seconds) AS time_limit, max(job_qos) AS qos, min(gpu_index) AS gpu \
             FROM gpu_metrics WHERE host = '{host}' AND job_id IS NOT NULL GROUP BY job_id ORDER BY job_id"
        ),
    )
    .await;
    let of = |id: &str| {
        labels
            .iter()
            .find(|r| field(r, "job_id").as_str() == Some(id))
            .unwrap_or_else(|| panic!("no rows of job {id}: {labels:?}"))
    };
    let (b, i) = (of(busy), of(idle));
    assert_eq!(field(b, "account").as_str(), Some("physics"), "{b}");
    assert_eq!(field(b, "partition").as_str(), Some("debug"), "{b}");
    assert_eq!(field(b, "time_limit").as_i64(), Some(300), "{b}");
    assert_eq!(field(b, "gpu").as_u64(), Some(u64::from(busy_gpu)), "{b}");
    assert!(field(b, "array_id").is_null(), "not an array task: {b}");
    assert_eq!(field(i, "account").as_str(), Some("chem"), "{i}");
    assert_eq!(field(i, "partition").as_str(), Some("long"), "{i}");
    assert_eq!(field(i, "time_limit").as_i64(), Some(1800), "{i}");
    assert_eq!(field(i, "array_id").as_str(), Some(array), "{i}");
    assert_eq!(field(i, "task").as_str(), Some("3"), "{i}");
    // Without slurmdbd a job has no QOS: scontrol prints `(null)`, which the agent drops.
    assert!(field(b, "qos").is_null(), "{b}");

    // `gpuwatch cost` bills this month by account and by partition.
    let cost = |by: &str| -> Vec<Value> {
        let out = Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
            .args([
                "cost",
                "--by",
                by,
                "--format",
                "json",
                "--server",
                &server.url(),
            ])
            .output()
            .expect("gpuwatch cost");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    };
    let groups = |rows: &[Value], key: &str| -> Vec<String> {
        let mut g: Vec<String> = rows
            .iter()
            .filter(|r| field(r, "gpu_hours").as_f64().is_some_and(|h| h > 0.0))
            .filter_map(|r| field(r, key).as_str().map(String::from))
            .collect();
        g.sort();
        g
    };
    // Each job needs two samples on its GPU before it has any GPU time.
    eventually(Duration::from_secs(30), "both accounts billed", || async {
        groups(&cost("account"), "account") == ["chem", "physics"]
    })
    .await;
    assert_eq!(groups(&cost("partition"), "partition"), ["debug", "long"]);

    // The job report names them.
    let out = Command::new(gpuwatch_e2e::bin_dir().join("gpuwatch"))
        .args(["job", busy, "--server", &server.url()])
        .output()
        .expect("gpuwatch job");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("account physics  partition debug") && text.contains("time limit 00:05:00"),
        "{text}"
    );
}
