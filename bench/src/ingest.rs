//! `gpuwatch-bench ingest`: the same remote-write requests sent to gpuwatch, VictoriaMetrics and
//! Prometheus, one server at a time; server CPU per sample and bytes per sample on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use tokio::sync::mpsc;

use crate::fleet::{FIELDS, Fleet, FleetConfig};
use crate::peers::{self, Result, Server, dir_bytes, free_port};
use crate::remote_write::{Body, host_request};
use crate::send::{self, SendStats};
use crate::{FleetArgs, parse_duration};

/// Flags of `ingest`.
#[derive(Args, Debug, Clone)]
pub(crate) struct IngestArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Simulated time span to send (it ends at the last full hour at least 11 minutes ago, so
    /// every hour of it is closed and gpuwatch compacts it).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub duration: Duration,
    /// Servers to run, in order: gpuwatch, victoriametrics, prometheus.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gpuwatch,victoriametrics,prometheus"
    )]
    pub targets: Vec<String>,
    /// The gpuwatch binary.
    #[arg(long, default_value = "target/release/gpuwatch")]
    pub gpuwatch: PathBuf,
    /// Extra argument for `gpuwatch serve` (repeatable), e.g. `--gpuwatch-arg=--wal-sync=interval`.
    #[arg(long = "gpuwatch-arg", allow_hyphen_values = true)]
    pub gpuwatch_args: Vec<String>,
    /// The VictoriaMetrics binary.
    #[arg(long, default_value = "victoria-metrics")]
    pub victoria_metrics: PathBuf,
    /// The Prometheus binary.
    #[arg(long, default_value = "prometheus")]
    pub prometheus: PathBuf,
    /// Where the servers keep their data (a fresh directory per run is made inside).
    #[arg(long, default_value = "/tmp/gpuwatch-bench")]
    pub work_dir: PathBuf,
    /// Longest wait for gpuwatch's compaction or a peer's merge after the last write.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub settle_timeout: Duration,
}

/// One server's figures.
#[derive(Debug, Clone)]
struct Outcome {
    name: String,
    version: String,
    send: SendStats,
    wall: Duration,
    cpu_ingest: f64,
    cpu_total: f64,
    disk_bytes: u64,
    disk_note: String,
    extra: Vec<String>,
}

impl Outcome {
    fn samples_per_core_second(&self) -> f64 {
        self.send.samples as f64 / self.cpu_ingest.max(1e-9)
    }
    fn samples_per_wall_second(&self) -> f64 {
        self.send.samples as f64 / self.wall.as_secs_f64().max(1e-9)
    }
    fn bytes_per_sample(&self) -> f64 {
        self.disk_bytes as f64 / self.send.samples.max(1) as f64
    }
}

const HOUR_MS: i64 = 3_600_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Generates every request body (before any timing starts).
fn generate(args: &FleetArgs, start_ms: i64, rounds: u64) -> Vec<Arc<Body>> {
    let mut fleet = Fleet::new(FleetConfig {
        hosts: args.hosts,
        gpus_per_host: args.gpus_per_host,
        interval_ms: args.interval.as_millis() as i64,
        start_ms,
        seed: args.seed,
        job_hosts: 0,
    });
    let per = args.rounds_per_request.max(1);
    let mut bodies = Vec::new();
    let mut first = 0;
    while first < rounds {
        let n = per.min(rounds - first);
        for h in 0..fleet.hosts() {
            bodies.push(Arc::new(host_request(&mut fleet, h, first, n)));
        }
        first += n;
    }
    bodies
}

/// Runs the benchmark.
pub(crate) async fn run(args: IngestArgs) -> Result<()> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    if interval_ms <= 0 {
        return Err("--interval must be positive".into());
    }
    let rounds = (args.duration.as_millis() as i64 / interval_ms).max(1) as u64;
    let end_ms = (now_ms() - 11 * 60_000).div_euclid(HOUR_MS) * HOUR_MS;
    let start_ms = end_ms - rounds as i64 * interval_ms;
    let gpus = (args.fleet.hosts * args.fleet.gpus_per_host) as u64;
    println!(
        "fleet: {} hosts x {} GPUs = {gpus} GPUs, {} series per GPU, {rounds} samples each ({}s interval), {} .. {} (ms)",
        args.fleet.hosts,
        args.fleet.gpus_per_host,
        FIELDS.len(),
        interval_ms / 1000,
        start_ms,
        end_ms
    );
    let t = Instant::now();
    let bodies = generate(&args.fleet, start_ms, rounds);
    let samples: u64 = bodies.iter().map(|b| b.samples).sum();
    let wire: u64 = bodies.iter().map(|b| b.bytes.len() as u64).sum();
    println!(
        "generated {} requests, {samples} samples, {:.1} MB snappy protobuf ({:.2} bytes/sample on the wire) in {:.1}s",
        bodies.len(),
        wire as f64 / 1e6,
        wire as f64 / samples as f64,
        t.elapsed().as_secs_f64()
    );
    let run_dir = args.work_dir.join(format!("ingest-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir).map_err(|e| format!("{}: {e}", run_dir.display()))?;
    let expected_rows = gpus * rounds;
    let mut outcomes = Vec::new();
    for target in &args.targets {
        let outcome = match target.as_str() {
            "gpuwatch" => run_gpuwatch(&args, &run_dir, &bodies, expected_rows).await?,
            "victoriametrics" | "vm" => run_vm(&args, &run_dir, &bodies).await?,
            "prometheus" => run_prometheus(&args, &run_dir, &bodies).await?,
            other => {
                return Err(format!(
                    "unknown target {other:?}: use gpuwatch, victoriametrics, prometheus"
                ));
            }
        };
        print_outcome(&outcome);
        outcomes.push(outcome);
    }
    print_summary(&outcomes);
    println!("data left in {} (remove it when done)", run_dir.display());
    Ok(())
}

async fn send_all(url: &str, bodies: &[Arc<Body>], concurrency: usize) -> Result<SendStats> {
    let (tx, rx) = mpsc::channel(bodies.len().max(1));
    for b in bodies {
        tx.send(Arc::clone(b))
            .await
            .map_err(|_| "request queue closed".to_string())?;
    }
    drop(tx);
    send::send_stream(&send::client()?, url, rx, concurrency).await
}

/// Sends everything, measuring wall time and the server's CPU time.
async fn timed_send(
    server: &Server,
    path: &str,
    bodies: &[Arc<Body>],
    concurrency: usize,
) -> Result<(SendStats, Duration, f64)> {
    let cpu0 = server.cpu_seconds()?;
    let t = Instant::now();
    let stats = send_all(&format!("{}{path}", server.url), bodies, concurrency).await?;
    let wall = t.elapsed();
    let cpu = server.cpu_seconds()? - cpu0;
    Ok((stats, wall, cpu))
}

/// One data file of the server's tables (`table_files`).
#[derive(serde::Deserialize, Debug, Clone)]
pub(crate) struct TableFile {
    pub(crate) table_name: String,
    pub(crate) location: String,
    pub(crate) rows: u64,
    pub(crate) bytes: u64,
    pub(crate) level: u8,
}

/// The data files of every table, as the server at `url` sees them.
pub(crate) async fn table_files(url: &str) -> Result<Vec<TableFile>> {
    let rows = sql_json(
        &send::client()?,
        url,
        "SELECT table_name, location, rows, bytes, level FROM table_files",
    )
    .await?;
    rows.into_iter()
        .map(|r| serde_json::from_value(r).map_err(|e| format!("table_files row: {e}")))
        .collect()
}

async fn run_gpuwatch(
    args: &IngestArgs,
    run_dir: &Path,
    bodies: &[Arc<Body>],
    expected_rows: u64,
) -> Result<Outcome> {
    let data_dir = run_dir.join("gpuwatch");
    let cmd = peers::GpuwatchCmd::new(&data_dir)?
        .args(peers::FAST_PERSIST)
        .args(&args.gpuwatch_args);
    let mut server = cmd.start("gpuwatch", &args.gpuwatch, run_dir.join("gpuwatch.log"))?;
    let version = peers::version_of(&args.gpuwatch, "--version");
    println!("\n== gpuwatch ({version}), pid {}", server.pid());
    let cpu_start = server.cpu_seconds()?;
    let (send, wall, cpu_ingest) =
        timed_send(&server, "/api/v1/write", bodies, args.fleet.concurrency).await?;
    println!(
        "sent in {:.1}s; waiting for persist and compaction of every hour",
        wall.as_secs_f64()
    );
    let rss = server.rss_bytes();
    let catalog = settled_catalog(args, run_dir, &server.url, expected_rows).await?;
    let cpu_total = server.cpu_seconds()? - cpu_start;
    let check = check_gpu_metrics(&server.url, expected_rows).await?;
    let (raw_bytes, mut extra) = gpuwatch_disk(&catalog, &data_dir, send.samples, &check);
    extra.push(format!(
        "RSS after ingest: {:.0} MB",
        rss.unwrap_or(0) as f64 / 1e6
    ));
    server.stop();
    Ok(Outcome {
        name: "gpuwatch".into(),
        version,
        send,
        wall,
        cpu_ingest,
        cpu_total,
        disk_bytes: raw_bytes,
        disk_note: "gpu_metrics Parquet after persist and compaction (rollups apart)".into(),
        extra,
    })
}

/// The catalog once settled: every row persisted, every gpu_metrics file the single file of
/// its closed hour (within `--settle-timeout`).
async fn settled_catalog(
    args: &IngestArgs,
    run_dir: &Path,
    url: &str,
    expected_rows: u64,
) -> Result<Vec<TableFile>> {
    let deadline = Instant::now() + args.settle_timeout;
    loop {
        if let Ok(c) = table_files(url).await {
            let raw: Vec<&TableFile> = c.iter().filter(|f| f.table_name == "gpu_metrics").collect();
            let rows: u64 = raw.iter().map(|f| f.rows).sum();
            if rows == expected_rows && !raw.is_empty() && raw.iter().all(|f| f.level >= 1) {
                return Ok(c);
            }
            if rows > expected_rows {
                return Err(format!(
                    "gpuwatch holds {rows} gpu_metrics rows where {expected_rows} were sent"
                ));
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "gpuwatch did not persist and compact every hour within {:?}; see {}",
                args.settle_timeout,
                run_dir.join("gpuwatch.log").display()
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The counts of the SQL check of gpu_metrics.
#[derive(Debug)]
struct GpuMetricsCheck {
    rows: u64,
    gpus: u64,
    with_job: u64,
}

/// Checks through SQL that the samples landed as gpu_metrics rows with every column filled.
async fn check_gpu_metrics(url: &str, expected_rows: u64) -> Result<GpuMetricsCheck> {
    let sql = "SELECT count(*) AS n_rows, count(DISTINCT gpu_uuid) AS gpus, count(power_watts) AS power, \
               count(nvlink_rx_bytes_per_second) AS nvlink, count(remapped_rows_failure) AS remap, \
               count(job_id) AS with_job FROM gpu_metrics";
    let check = sql_json(&send::client()?, url, sql).await?;
    let row = check
        .first()
        .ok_or_else(|| "the check query returned no row".to_string())?;
    let get = |k: &str| row.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    if get("n_rows") != expected_rows
        || get("power") != expected_rows
        || get("nvlink") != expected_rows
    {
        return Err(format!("gpu_metrics does not hold what was sent: {row}"));
    }
    Ok(GpuMetricsCheck {
        rows: get("n_rows"),
        gpus: get("gpus"),
        with_job: get("with_job"),
    })
}

/// gpu_metrics' Parquet bytes, and the lines that break the disk down by table and WAL.
fn gpuwatch_disk(
    catalog: &[TableFile],
    data_dir: &Path,
    samples: u64,
    check: &GpuMetricsCheck,
) -> (u64, Vec<String>) {
    let by_table = |t: &str| -> (u64, usize) {
        let f: Vec<&TableFile> = catalog.iter().filter(|f| f.table_name == t).collect();
        (f.iter().map(|f| f.bytes).sum(), f.len())
    };
    let (raw_bytes, raw_files) = by_table("gpu_metrics");
    let (m1_bytes, _) = by_table("gpu_metrics_1m");
    let (h1_bytes, _) = by_table("gpu_metrics_1h");
    let (metrics_bytes, _) = by_table("metrics");
    let wal = dir_bytes(&data_dir.join("wal"), &[]);
    let all_live = raw_bytes + m1_bytes + h1_bytes + metrics_bytes + wal;
    let extra = vec![
        format!(
            "gpu_metrics rows {} ({} GPUs, {} with a job), {raw_files} Parquet file(s) of {raw_bytes} bytes",
            check.rows, check.gpus, check.with_job
        ),
        format!(
            "rollups gpu_metrics_1m {m1_bytes} bytes, gpu_metrics_1h {h1_bytes} bytes; metrics {metrics_bytes}; wal {wal}"
        ),
        format!(
            "with rollups and WAL: {:.3} bytes/sample",
            all_live as f64 / samples.max(1) as f64
        ),
    ];
    (raw_bytes, extra)
}

/// `POST /api/v1/sql` returning the JSON rows.
/// Runs `sql` over `POST /api/v1/sql` with `client` (kept between queries, with its
/// connection, as a dashboard or a script keeps it) and parses the JSON answer.
pub(crate) async fn sql_json(
    client: &reqwest::Client,
    url: &str,
    sql: &str,
) -> Result<Vec<serde_json::Value>> {
    let body = serde_json::json!({ "sql": sql, "format": "json" }).to_string();
    let resp = client
        .post(format!("{url}/api/v1/sql"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("sql: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| format!("sql: {e}"))?;
    if !status.is_success() {
        return Err(format!("sql: {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("sql answer is not a JSON array: {e}"))
}

/// Waits until the size of `dir` (minus `skip`) stays the same for three polls in a row.
async fn wait_stable_size(dir: &Path, skip: &[&str], timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    let mut last = u64::MAX;
    let mut same = 0;
    loop {
        let now = dir_bytes(dir, skip);
        if now == last {
            same += 1;
            if same >= 3 {
                return now;
            }
        } else {
            same = 0;
            last = now;
        }
        if Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn run_vm(args: &IngestArgs, run_dir: &Path, bodies: &[Arc<Body>]) -> Result<Outcome> {
    let data_dir = run_dir.join("victoria-metrics");
    let port = free_port()?;
    let cmd_args = vec![
        format!("-httpListenAddr=127.0.0.1:{port}"),
        format!("-storageDataPath={}", data_dir.display()),
        "-retentionPeriod=1y".into(),
        "-loggerLevel=WARN".into(),
    ];
    let mut server = Server::start(
        "victoria-metrics",
        &args.victoria_metrics,
        &cmd_args,
        format!("http://127.0.0.1:{port}"),
        "/health",
        run_dir.join("victoria-metrics.log"),
    )?;
    let version = peers::version_of(&args.victoria_metrics, "-version");
    println!("\n== VictoriaMetrics ({version}), pid {}", server.pid());
    let cpu_start = server.cpu_seconds()?;
    let (send, wall, cpu_ingest) =
        timed_send(&server, "/api/v1/write", bodies, args.fleet.concurrency).await?;
    println!(
        "sent in {:.1}s; force_flush, force_merge, waiting for a stable size",
        wall.as_secs_f64()
    );
    let rss = server.rss_bytes();
    let url = server.url.clone();
    let flush = tokio::task::spawn_blocking(move || {
        let a = peers::blocking_get(&format!("{url}/internal/force_flush"));
        let b = peers::blocking_get(&format!("{url}/internal/force_merge"));
        (a, b)
    })
    .await
    .map_err(|e| format!("force_flush task: {e}"))?;
    for r in [flush.0, flush.1] {
        match r {
            Ok((s, _)) if s < 300 => {}
            Ok((s, b)) => return Err(format!("victoria-metrics admin call: {s}: {b}")),
            Err(e) => return Err(e),
        }
    }
    let disk = wait_stable_size(&data_dir, &["cache", "snapshots"], args.settle_timeout).await;
    let cpu_total = server.cpu_seconds()? - cpu_start;
    let metrics = peers::blocking_get(&format!("{}/metrics", server.url))
        .map(|(_, b)| b)
        .unwrap_or_default();
    let stored = peers::metric_sum(&metrics, "vm_rows_added_to_storage_total").unwrap_or(-1.0);
    let data = dir_bytes(&data_dir.join("data"), &[]);
    let index = dir_bytes(&data_dir.join("indexdb"), &[]);
    server.stop();
    if stored >= 0.0 && stored as u64 != send.samples {
        println!(
            "warning: VictoriaMetrics reports {stored} rows added, {} were sent",
            send.samples
        );
    }
    Ok(Outcome {
        name: "VictoriaMetrics".into(),
        version,
        send,
        wall,
        cpu_ingest,
        cpu_total,
        disk_bytes: disk,
        disk_note: "storageDataPath (data + indexdb) after force_flush and force_merge".into(),
        extra: vec![
            format!("rows added to storage: {stored}"),
            format!("data/ {data} bytes, indexdb/ {index} bytes"),
            format!("RSS after ingest: {:.0} MB", rss.unwrap_or(0) as f64 / 1e6),
        ],
    })
}

async fn run_prometheus(
    args: &IngestArgs,
    run_dir: &Path,
    bodies: &[Arc<Body>],
) -> Result<Outcome> {
    let data_dir = run_dir.join("prometheus");
    let mut server = start_prometheus(args, run_dir, &data_dir)?;
    let version = peers::version_of(&args.prometheus, "--version");
    println!("\n== Prometheus ({version}), pid {}", server.pid());
    let cpu_start = server.cpu_seconds()?;
    let (send, wall, cpu_ingest) =
        timed_send(&server, "/api/v1/write", bodies, args.fleet.concurrency).await?;
    println!(
        "sent in {:.1}s; snapshot of the head as a persistent block",
        wall.as_secs_f64()
    );
    let rss = server.rss_bytes();
    let disk = snapshot_bytes(&server, &data_dir).await?;
    let cpu_total = server.cpu_seconds()? - cpu_start;
    let metrics = peers::blocking_get(&format!("{}/metrics", server.url))
        .map(|(_, b)| b)
        .unwrap_or_default();
    let appended =
        peers::metric_sum(&metrics, "prometheus_tsdb_head_samples_appended_total").unwrap_or(-1.0);
    let wal = dir_bytes(&data_dir.join("wal"), &[]);
    server.stop();
    if appended >= 0.0 && appended as u64 != send.samples {
        println!(
            "warning: Prometheus reports {appended} samples appended, {} were sent",
            send.samples
        );
    }
    Ok(Outcome {
        name: "Prometheus".into(),
        version,
        send,
        wall,
        cpu_ingest,
        cpu_total,
        disk_bytes: disk,
        disk_note:
            "TSDB block written from the head by the snapshot API (what head compaction writes)"
                .into(),
        extra: vec![
            format!("samples appended: {appended}"),
            format!("WAL before compaction: {wal} bytes"),
            format!("RSS after ingest: {:.0} MB", rss.unwrap_or(0) as f64 / 1e6),
        ],
    })
}

/// Prometheus on a free port with the remote-write receiver and the admin API, no scrapes,
/// its TSDB in `data_dir`.
fn start_prometheus(args: &IngestArgs, run_dir: &Path, data_dir: &Path) -> Result<Server> {
    std::fs::create_dir_all(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let config = run_dir.join("prometheus.yml");
    std::fs::write(
        &config,
        "global:\n  scrape_interval: 1m\nscrape_configs: []\n",
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    let port = free_port()?;
    let cmd_args = vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", data_dir.display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--web.enable-remote-write-receiver".into(),
        "--web.enable-admin-api".into(),
        "--storage.tsdb.retention.time=1y".into(),
        "--log.level=warn".into(),
    ];
    Server::start(
        "prometheus",
        &args.prometheus,
        &cmd_args,
        format!("http://127.0.0.1:{port}"),
        "/-/ready",
        run_dir.join("prometheus.log"),
    )
}

/// Writes the head as a persistent block (the snapshot API) and returns that block's bytes.
async fn snapshot_bytes(server: &Server, data_dir: &Path) -> Result<u64> {
    let url = server.url.clone();
    let (status, body) = tokio::task::spawn_blocking(move || {
        peers::blocking_post(&format!("{url}/api/v1/admin/tsdb/snapshot"))
    })
    .await
    .map_err(|e| format!("snapshot task: {e}"))??;
    if status >= 300 {
        return Err(format!("prometheus snapshot: {status}: {body}"));
    }
    let name = body
        .find('{')
        .and_then(|i| serde_json::from_str::<serde_json::Value>(&body[i..]).ok())
        .and_then(|v| v["data"]["name"].as_str().map(str::to_string))
        .ok_or_else(|| format!("prometheus snapshot: no name in {body}"))?;
    Ok(dir_bytes(&data_dir.join("snapshots").join(&name), &[]))
}

fn print_outcome(o: &Outcome) {
    println!(
        "{}: {} samples in {} requests ({:.1} MB, {} retried), wall {:.1}s = {:.0} samples/s; server CPU {:.1}s while ingesting = {:.0} samples/s per core; CPU until settled {:.1}s",
        o.name,
        o.send.samples,
        o.send.requests,
        o.send.bytes as f64 / 1e6,
        o.send.retries,
        o.wall.as_secs_f64(),
        o.samples_per_wall_second(),
        o.cpu_ingest,
        o.samples_per_core_second(),
        o.cpu_total
    );
    println!(
        "{}: {} bytes on disk = {:.3} bytes/sample ({})",
        o.name,
        o.disk_bytes,
        o.bytes_per_sample(),
        o.disk_note
    );
    for e in &o.extra {
        println!("  {e}");
    }
}

fn print_summary(outcomes: &[Outcome]) {
    println!(
        "\n| server | version | samples/s per core (server CPU) | samples/s (wall) | bytes/sample on disk |"
    );
    println!("| --- | --- | ---: | ---: | ---: |");
    for o in outcomes {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.3} |",
            o.name,
            o.version,
            o.samples_per_core_second(),
            o.samples_per_wall_second(),
            o.bytes_per_sample()
        );
    }
    let Some(gw) = outcomes.iter().find(|o| o.name == "gpuwatch") else {
        return;
    };
    for o in outcomes.iter().filter(|o| o.name != "gpuwatch") {
        println!(
            "gpuwatch/{}: ingest rate per core {:.2}x (target >= 1), bytes per sample {:.2}x (target <= 1)",
            o.name,
            gw.samples_per_core_second() / o.samples_per_core_second().max(1e-9),
            gw.bytes_per_sample() / o.bytes_per_sample().max(1e-9)
        );
    }
}
