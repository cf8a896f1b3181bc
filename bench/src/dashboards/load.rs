//! The dashboards benchmark's fleet: a day of GPU metrics (remote write, as `query` loads it),
//! the processes and XID/ECC events an agent reports on the same GPUs (OTLP/HTTP, the agent's
//! encoding), prices and budgets (the config's `[cost]`), and alert history written by the
//! server's own rule evaluations.
//!
//! Three server lifetimes on one data directory:
//!
//! 1. **History.** A server without rules takes the day, generated while sent, then the rounds
//!    that fell due meanwhile, and is stopped (SIGTERM: it persists what it buffers). No rules
//!    run here: evaluated against a backfill in progress they would see every host silent.
//! 2. **Live.** A server with the rule packs (`--rules`) takes the fleet in real time, one scrape
//!    round per interval, for `--live`: the rules see a fleet that reports and record what
//!    fires (idle GPUs in jobs, jobs over budget, inefficient jobs) in the `alerts` table. It
//!    is stopped the same way once the live rounds are in.
//! 3. **Timing** (in `dashboards.rs`): a server with the prices and no rules, so that rule
//!    evaluations do not run beside the timed queries.
//!
//! `bench-load.json` in the data directory records what was loaded; a later run with the same
//! flags, prices and rule files reuses the directory and only does step 3.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use super::DashboardsArgs;
use crate::fleet::{Fleet, FleetConfig, JobKind};
use crate::ingest::sql_json;
use crate::peers::{self, Result, Server};
use crate::remote_write::{Body, rounds_request};
use crate::send::{self, SendStats, Transport};
use crate::workload::{HostWorkload, otlp_body};

/// What the marker calls this dataset; a change to the generator changes it, so that an older
/// directory is loaded again.
pub(super) const DATASET: &str =
    "dashboards fleet 2: GPU metrics, processes, XID/ECC events, alerts, a multi-host job";

/// The prices and budgets of the fleet, as the servers' config file (docs/cost.md): the H100 at
/// USD 2.50 per GPU-hour (the demo's example price), electricity at USD 0.12 per kWh with a PUE
/// of 1.3, and a default budget of USD 250 per job, which the day's longest 8-GPU jobs pass.
pub(super) const CONFIG: &str =
    "# gpuwatch-bench dashboards: prices and budgets of the simulated fleet (docs/cost.md)
[cost]
gpu_hour_usd = [{ model = \"*H100*\", usd = 2.50 }]
default_gpu_hour_usd = 1.00
kwh_usd = 0.12
pue = 1.3
default_budget_usd = 250.0
";

/// What a data directory holds (`bench-load.json`).
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug, Clone)]
pub(crate) struct Load {
    /// [`DATASET`].
    pub dataset: String,
    pub hosts: usize,
    pub gpus_per_host: usize,
    pub interval_ms: i64,
    pub seed: u64,
    /// Hosts running the multi-host job ([`crate::fleet::BIG_JOB_ID`]) all day.
    #[serde(default)]
    pub job_hosts: usize,
    /// The agents' `--slow-interval` (per-process SM utilisation).
    pub slow_interval_ms: i64,
    /// `--history` in scrape rounds.
    pub history_rounds: u64,
    /// `--live` as asked, in ms.
    pub live_ms: i64,
    /// The config file's text ([`CONFIG`]).
    pub config: String,
    /// FNV-1a of the rule files' names and contents.
    pub rules_digest: String,
    /// Time of the first round (ms since the epoch).
    pub start_ms: i64,
    /// Rounds sent after the history (the rounds due by the end of the history load, then the
    /// live phase).
    pub live_rounds: u64,
    /// `gpu_metrics` rows sent.
    pub gpu_rows: u64,
    /// Remote-write samples sent.
    pub samples: u64,
    /// `gpu_processes` rows sent.
    pub processes: u64,
    /// OTLP data points of the processes and events.
    pub otlp_points: u64,
    /// `gpu_events` rows sent, XID and ECC.
    pub xid_events: u64,
    pub ecc_events: u64,
    /// Seconds the history load took (generation included), and the live phase.
    pub load_seconds: f64,
    pub live_seconds: f64,
}

impl Load {
    /// Every round sent.
    pub(super) fn rounds(&self) -> u64 {
        self.history_rounds + self.live_rounds
    }

    /// The end of the data: one interval after the last round.
    pub(super) fn end_ms(&self) -> i64 {
        self.start_ms + self.rounds() as i64 * self.interval_ms
    }

    /// Whether `other` (an earlier run's marker) holds the dataset these flags ask for.
    fn same_dataset(&self, other: &Load) -> bool {
        self.dataset == other.dataset
            && self.hosts == other.hosts
            && self.gpus_per_host == other.gpus_per_host
            && self.interval_ms == other.interval_ms
            && self.seed == other.seed
            && self.job_hosts == other.job_hosts
            && self.slow_interval_ms == other.slow_interval_ms
            && self.history_rounds == other.history_rounds
            && self.live_ms == other.live_ms
            && self.config == other.config
            && self.rules_digest == other.rules_digest
    }
}

/// The marker file in a data directory.
pub(super) const MARKER: &str = "bench-load.json";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// FNV-1a (64 bits) of each rule file's path and contents, in hex.
pub(super) fn rules_digest(rules: &[PathBuf]) -> Result<String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for r in rules {
        let text = std::fs::read(r).map_err(|e| {
            format!(
                "rules file {}: {e} (run from the repository root or pass --rules)",
                r.display()
            )
        })?;
        feed(r.display().to_string().as_bytes());
        feed(&[0]);
        feed(&text);
        feed(&[0]);
    }
    Ok(format!("{h:016x}"))
}

/// The dataset the flags ask for, before anything is loaded.
pub(super) fn wanted(args: &DashboardsArgs) -> Result<Load> {
    let interval_ms = args.fleet.interval.as_millis() as i64;
    if interval_ms <= 0 {
        return Err("--interval must be positive".into());
    }
    if args.fleet.hosts == 0 || args.fleet.gpus_per_host == 0 {
        return Err("--hosts and --gpus-per-host must be at least 1".into());
    }
    Ok(Load {
        dataset: DATASET.to_string(),
        hosts: args.fleet.hosts,
        gpus_per_host: args.fleet.gpus_per_host,
        interval_ms,
        seed: args.fleet.seed,
        job_hosts: args.job_hosts.min(args.fleet.hosts),
        slow_interval_ms: args.slow_interval.as_millis() as i64,
        history_rounds: (args.history.as_millis() as i64 / interval_ms).max(1) as u64,
        live_ms: args.live.as_millis() as i64,
        config: CONFIG.to_string(),
        rules_digest: rules_digest(&args.rules)?,
        start_ms: 0,
        live_rounds: 0,
        gpu_rows: 0,
        samples: 0,
        processes: 0,
        otlp_points: 0,
        xid_events: 0,
        ecc_events: 0,
        load_seconds: 0.0,
        live_seconds: 0.0,
    })
}

/// The earlier load in `data_dir` when it is `wanted`'s dataset; otherwise the directory is
/// cleared for a new load.
pub(super) fn earlier(data_dir: &Path, wanted: &Load) -> Result<Option<Load>> {
    let existing: Option<Load> = std::fs::read_to_string(data_dir.join(MARKER))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let reusable = existing.filter(|m| wanted.same_dataset(m));
    if reusable.is_none() && data_dir.exists() {
        std::fs::remove_dir_all(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    }
    Ok(reusable)
}

/// A gpuwatch server of the benchmark and its listeners.
pub(crate) struct Started {
    pub server: Server,
    /// Postgres wire port.
    pub pg_port: u16,
    /// `http://…/v1/metrics` of its OTLP/HTTP listener.
    pub otlp_url: String,
}

/// Starts `gpuwatch serve` on `args.data_dir` with `config` and the rule files `rules`.
pub(super) fn start_server(
    args: &DashboardsArgs,
    name: &str,
    log: PathBuf,
    config: &Path,
    rules: &[PathBuf],
) -> Result<Started> {
    let cmd = peers::GpuwatchCmd::new(&args.data_dir)?
        .args(["--config".to_string(), config.display().to_string()])
        .args(peers::FAST_PERSIST)
        .args(
            rules
                .iter()
                .flat_map(|r| ["--rules".to_string(), r.display().to_string()]),
        );
    Ok(Started {
        server: cmd.start(name, &args.gpuwatch, log)?,
        pg_port: cmd.pg,
        otlp_url: format!("http://127.0.0.1:{}/v1/metrics", cmd.otlp_http),
    })
}

/// Counts of what the generator produced.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    gpu_rows: u64,
    processes: u64,
    otlp_points: u64,
    xid: u64,
    ecc: u64,
}

/// The fleet and its workload, advanced round by round.
struct Generator {
    fleet: Fleet,
    work: Vec<HostWorkload>,
    uuids: Vec<Vec<String>>,
    /// The next round to generate.
    next: u64,
    counts: Counts,
}

impl Generator {
    fn new(load: &Load) -> Self {
        let fleet = Fleet::new(FleetConfig {
            hosts: load.hosts,
            gpus_per_host: load.gpus_per_host,
            interval_ms: load.interval_ms,
            start_ms: load.start_ms,
            seed: load.seed,
            job_hosts: load.job_hosts,
        });
        let work = (0..load.hosts)
            .map(|h| {
                HostWorkload::new(
                    load.seed,
                    h,
                    load.gpus_per_host,
                    load.interval_ms,
                    load.slow_interval_ms,
                )
            })
            .collect();
        let uuids = (0..load.hosts)
            .map(|h| {
                (0..load.gpus_per_host)
                    .map(|i| fleet.gpu_ids(h, i).0.to_string())
                    .collect()
            })
            .collect();
        Self {
            fleet,
            work,
            uuids,
            next: 0,
            counts: Counts::default(),
        }
    }

    /// Host `h`'s bodies for rounds `first..first + n`: remote write, and OTLP when the rounds
    /// have processes or events. Hosts must be asked for each round in order.
    fn host_bodies(&mut self, h: usize, first: u64, n: u64) -> (Body, Option<Body>) {
        let gpus = self.fleet.gpus_per_host();
        let mut per_round = Vec::with_capacity(n as usize);
        let mut procs = Vec::new();
        let mut events = Vec::new();
        let mut points = 0;
        for k in first..first + n {
            let mut buf = Vec::with_capacity(gpus);
            self.fleet.scrape(h, k, &mut buf);
            let kinds: Vec<Option<JobKind>> =
                (0..gpus).map(|i| self.fleet.job_kind(h, i)).collect();
            let added =
                self.work[h].observe(k, &buf, &kinds, &self.uuids[h], &mut procs, &mut events);
            self.counts.processes += added.processes;
            self.counts.xid += added.xid;
            self.counts.ecc += added.ecc;
            points += added.process_points + added.xid + added.ecc;
            self.counts.gpu_rows += buf.len() as u64;
            per_round.push(buf);
        }
        self.counts.otlp_points += points;
        let rw = rounds_request(&self.fleet, h, &per_round);
        let otlp = (!procs.is_empty() || !events.is_empty()).then(|| Body {
            bytes: otlp_body(self.fleet.host_name(h), &procs, &events),
            samples: points,
            host: h,
        });
        (rw, otlp)
    }
}

/// Where a stream goes.
struct Target {
    write_url: String,
    otlp_url: String,
    concurrency: usize,
}

impl Target {
    fn of(s: &Started, concurrency: usize) -> Self {
        Self {
            write_url: format!("{}/api/v1/write", s.server.url),
            otlp_url: s.otlp_url.clone(),
            concurrency,
        }
    }
}

/// What [`stream`] sends: `rounds` rounds from the generator's next one, `per` rounds per request;
/// with `pace` (the fleet's start and interval), each round waits until its samples are in the
/// past (rounds already due go at once).
struct Plan {
    rounds: u64,
    per: u64,
    pace: Option<(i64, i64)>,
}

/// Generates while sending; gives the generator back with both streams' statistics.
async fn stream(
    mut generator: Generator,
    plan: Plan,
    target: Target,
) -> Result<(Generator, SendStats, SendStats)> {
    let lanes = target.concurrency.max(1);
    let (rw_tx, rw_rx) = mpsc::channel(4 * lanes);
    let (otlp_tx, otlp_rx) = mpsc::channel(4 * lanes);
    let thread = std::thread::spawn(move || {
        let hosts = generator.fleet.hosts();
        let end = generator.next + plan.rounds;
        while generator.next < end {
            let first = generator.next;
            let n = plan.per.max(1).min(end - first);
            if let Some((start_ms, interval_ms)) = plan.pace {
                let due = start_ms + (first + n) as i64 * interval_ms;
                let wait = due - now_ms();
                if wait > 0 {
                    std::thread::sleep(Duration::from_millis(wait as u64));
                }
            }
            for h in 0..hosts {
                let (rw, otlp) = generator.host_bodies(h, first, n);
                if rw_tx.blocking_send(Arc::new(rw)).is_err() {
                    return generator;
                }
                if let Some(o) = otlp
                    && otlp_tx.blocking_send(Arc::new(o)).is_err()
                {
                    return generator;
                }
            }
            generator.next = first + n;
        }
        generator
    });
    let client = send::client()?;
    let sent = tokio::try_join!(
        send::send_stream_as(
            Transport::RemoteWrite,
            &client,
            &target.write_url,
            rw_rx,
            lanes
        ),
        send::send_stream_as(Transport::Otlp, &client, &target.otlp_url, otlp_rx, lanes),
    );
    let generator = tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| format!("generator task: {e}"))?
        .map_err(|_| "the generator thread panicked".to_string())?;
    let (rw, otlp) = sent?;
    Ok((generator, rw, otlp))
}

/// One count from the SQL API (column `n`).
pub(super) async fn count(server: &Server, sql: &str) -> Result<u64> {
    let rows = sql_json(&send::client()?, &server.url, sql).await?;
    Ok(rows
        .first()
        .and_then(|r| r.get("n"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0))
}

/// Loads `wanted`'s dataset into `args.data_dir` (steps 1 and 2 of the module docs).
pub(super) async fn load(
    args: &DashboardsArgs,
    wanted: &Load,
    config: &Path,
    logs: &Path,
) -> Result<Load> {
    let mut load = wanted.clone();
    let interval = load.interval_ms;
    let end_ms = now_ms().div_euclid(interval) * interval;
    load.start_ms = end_ms - load.history_rounds as i64 * interval;
    let generator = Generator::new(&load);
    let (generator, history) = load_history(args, &mut load, generator, config, logs).await?;
    let (generator, live) = run_live(args, &mut load, generator, config, logs).await?;

    load.live_rounds = generator.next - load.history_rounds;
    load.gpu_rows = generator.counts.gpu_rows;
    load.samples = history.samples + live.samples;
    load.processes = generator.counts.processes;
    load.otlp_points = generator.counts.otlp_points;
    load.xid_events = generator.counts.xid;
    load.ecc_events = generator.counts.ecc;
    if history.otlp_points + live.otlp_points != load.otlp_points {
        return Err(format!(
            "sent {} OTLP points, generated {}",
            history.otlp_points + live.otlp_points,
            load.otlp_points
        ));
    }
    let text = serde_json::to_string_pretty(&load).map_err(|e| e.to_string())?;
    let marker = args.data_dir.join(MARKER);
    std::fs::write(&marker, text).map_err(|e| format!("{}: {e}", marker.display()))?;
    Ok(load)
}

/// What a phase of the load sent.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// Remote-write samples.
    samples: u64,
    /// OTLP points.
    otlp_points: u64,
}

/// Step 1: the history, then the rounds that fell due meanwhile, without rules.
async fn load_history(
    args: &DashboardsArgs,
    load: &mut Load,
    generator: Generator,
    config: &Path,
    logs: &Path,
) -> Result<(Generator, Sent)> {
    let interval = load.interval_ms;
    let mut history = start_server(
        args,
        "gpuwatch (history load)",
        logs.join("dashboards-load.log"),
        config,
        &[],
    )?;
    println!(
        "loading {} GPUs x {} rounds through remote write, their processes and events through OTLP/HTTP (gpuwatch pid {})...",
        load.hosts * load.gpus_per_host,
        load.history_rounds,
        history.server.pid()
    );
    let t = Instant::now();
    let (generator, rw, otlp) = stream(
        generator,
        Plan {
            rounds: load.history_rounds,
            per: args.fleet.rounds_per_request,
            pace: None,
        },
        Target::of(&history, args.fleet.concurrency),
    )
    .await?;
    let due = ((now_ms() - load.start_ms) / interval) as u64;
    let catch_up = due.saturating_sub(generator.next);
    let (generator, rw2, otlp2) = stream(
        generator,
        Plan {
            rounds: catch_up,
            per: args.fleet.rounds_per_request,
            pace: Some((load.start_ms, interval)),
        },
        Target::of(&history, args.fleet.concurrency),
    )
    .await?;
    load.load_seconds = t.elapsed().as_secs_f64();
    let retries = rw.retries + rw2.retries + otlp.retries + otlp2.retries;
    println!(
        "loaded {} samples and {} OTLP points in {:.1}s ({catch_up} rounds that fell due included; {retries} retries)",
        rw.samples + rw2.samples,
        otlp.samples + otlp2.samples,
        load.load_seconds
    );
    history.server.terminate(Duration::from_secs(300))?;
    let sent = Sent {
        samples: rw.samples + rw2.samples,
        otlp_points: otlp.samples + otlp2.samples,
    };
    Ok((generator, sent))
}

/// Step 2: the fleet reports in real time to a server with the rules, which must fire.
async fn run_live(
    args: &DashboardsArgs,
    load: &mut Load,
    generator: Generator,
    config: &Path,
    logs: &Path,
) -> Result<(Generator, Sent)> {
    let interval = load.interval_ms;
    let mut live = start_server(
        args,
        "gpuwatch (live, rules)",
        logs.join("dashboards-live.log"),
        config,
        &args.rules,
    )?;
    let due = ((now_ms() - load.start_ms) / interval) as u64;
    let live_rounds = due.saturating_sub(generator.next) + (load.live_ms / interval) as u64;
    println!(
        "live: the fleet reports in real time for {:.0} s (gpuwatch pid {} with {} rule files)...",
        load.live_ms as f64 / 1000.0,
        live.server.pid(),
        args.rules.len()
    );
    let t = Instant::now();
    let (generator, rw, otlp) = stream(
        generator,
        Plan {
            rounds: live_rounds,
            per: 1,
            pace: Some((load.start_ms, interval)),
        },
        Target::of(&live, args.fleet.concurrency),
    )
    .await?;
    load.live_seconds = t.elapsed().as_secs_f64();
    // The last evaluation's transitions: the states of every rule, one evaluation after the
    // last round.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let firing = count(
        &live.server,
        "SELECT count(*) AS n FROM alerts WHERE state = 'firing'",
    )
    .await?;
    let transitions = count(&live.server, "SELECT count(*) AS n FROM alerts").await?;
    println!(
        "live phase over after {:.0} s: {} more samples; the rules recorded {transitions} alert transitions, {firing} of them to firing",
        load.live_seconds, rw.samples
    );
    live.server.terminate(Duration::from_secs(300))?;
    if firing == 0 {
        return Err(format!(
            "no alert fired during the {:.0} s live phase: lengthen --live or check the rule files ({})",
            load.live_seconds,
            logs.join("dashboards-live.log").display()
        ));
    }
    let sent = Sent {
        samples: rw.samples,
        otlp_points: otlp.samples,
    };
    Ok((generator, sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> Load {
        Load {
            dataset: DATASET.into(),
            hosts: 2,
            gpus_per_host: 8,
            interval_ms: 10_000,
            seed: 1,
            job_hosts: 1,
            slow_interval_ms: 60_000,
            history_rounds: 100,
            live_ms: 60_000,
            config: CONFIG.into(),
            rules_digest: "x".into(),
            start_ms: 1_790_000_000_000,
            live_rounds: 0,
            gpu_rows: 0,
            samples: 0,
            processes: 0,
            otlp_points: 0,
            xid_events: 0,
            ecc_events: 0,
            load_seconds: 0.0,
            live_seconds: 0.0,
        }
    }

    #[test]
    fn a_directory_is_reused_only_for_the_same_dataset() {
        let a = load();
        let mut b = load();
        b.start_ms += 1;
        b.processes = 7;
        assert!(
            a.same_dataset(&b),
            "times and counts are results, not inputs"
        );
        for change in [
            |l: &mut Load| l.seed = 2,
            |l: &mut Load| l.live_ms = 0,
            |l: &mut Load| l.rules_digest = "y".into(),
            |l: &mut Load| l.config.push('#'),
            |l: &mut Load| l.dataset.push('!'),
            |l: &mut Load| l.slow_interval_ms = 30_000,
            |l: &mut Load| l.job_hosts = 0,
        ] {
            let mut c = load();
            change(&mut c);
            assert!(!a.same_dataset(&c));
        }
    }

    #[test]
    fn the_generator_counts_what_it_sends() {
        let mut g = Generator::new(&load());
        let (rw, otlp) = g.host_bodies(0, 0, 30);
        assert_eq!(rw.samples, 8 * 26 * 30);
        assert_eq!(g.counts.gpu_rows, 8 * 30);
        let otlp = otlp.expect("jobs have processes");
        assert_eq!(otlp.samples, g.counts.otlp_points);
        assert!(g.counts.processes > 0);
    }

    #[test]
    fn rules_digest_names_a_missing_file() {
        let err = rules_digest(&[PathBuf::from("/nonexistent/rules.yaml")]).unwrap_err();
        assert!(err.contains("/nonexistent/rules.yaml"), "{err}");
        assert_eq!(rules_digest(&[]).unwrap(), "cbf29ce484222325");
    }
}
