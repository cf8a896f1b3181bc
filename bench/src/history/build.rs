//! Builds the history data directory through the store's own writers: the agent's simulated
//! nodes (their jobs, users, accounts, idle holds) stepped an hour at a time over the history,
//! each hour's readings encoded as the agent encodes them and decoded as the server decodes
//! them; their `gpu_metrics_1h` rows (and, for the last `--minute-days`, `gpu_metrics_1m` rows)
//! and the job ledger's rows written a day per commit; then the last `--raw-hours` as raw
//! samples every `--raw-interval` through the write-ahead log, persisted and compacted (which
//! rolls their closed hours up). The server folds the raw hours into the ledger itself when it
//! starts, as it would after any restart.
//!
//! One reading per GPU stands for its hour in the rollups and the ledger: each hour is one
//! sample of the model, so a ledger row holds 3,600 GPU-seconds and the hour's energy at the
//! reading's power.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch, TimestampNanosecondArray};
use arrow::compute::concat_batches;
use arrow::datatypes::TimestampNanosecondType;
use gpuwatch_agent::collect::{GpuSample, Source};
use gpuwatch_agent::{Fleet as Node, NodeOptions};
use gpuwatch_alerts::cost::ledger::table::{UsageRow, hour_rows};
use gpuwatch_store::clock::SystemClock;
use gpuwatch_store::compact::rollup::rollup;
use gpuwatch_store::schema::Table;
use gpuwatch_store::{Store, StoreConfig};

use super::{HistoryArgs, Marker};
use crate::peers::Result;

const HOUR_NS: i64 = 3_600_000_000_000;
const MINUTE_NS: i64 = 60_000_000_000;
/// The bench fleet's job lengths (`fleet.rs`: a production cluster's hours).
const JOB_TIME_SCALE: f64 = 6.0;
/// The prices the ledger's report parts are priced at (the server's `[cost]` of the bench).
pub(super) const GPU_HOUR_USD: f64 = 2.5;
/// Utilisation under which a sample is idle (the server's default).
const IDLE_BELOW: f64 = 0.05;

/// The fleet's nodes, one per host.
struct Nodes {
    names: Vec<String>,
    nodes: Vec<Node>,
}

impl Nodes {
    fn new(args: &HistoryArgs, start_ns: i64) -> Self {
        let (names, nodes) = (0..args.hosts)
            .map(|h| {
                let options = NodeOptions {
                    demo_jobs: false,
                    first_job_id: Some(5_000_000 + h as u64 * 1_000_000),
                    standing_job: None,
                    job_time_scale: JOB_TIME_SCALE,
                    fault_rate_scale: 0.01,
                };
                let mut node =
                    Node::with_options(args.gpus_per_host, args.seed ^ h as u64, options);
                // A day before the start, so that the nodes are in their steady state.
                let _ = node.collect((start_ns - 24 * HOUR_NS).max(0) as u64);
                (format!("gpu-node-{:04}", h + 1), node)
            })
            .unzip();
        Self { names, nodes }
    }

    /// Every host's readings at `t`, decoded by the store into `gpu_metrics` rows.
    fn round(&mut self, t: i64) -> Result<(Vec<GpuSample>, Vec<(usize, usize)>, RecordBatch)> {
        let mut all = Vec::new();
        let mut owners = Vec::new();
        let mut batches = Vec::new();
        for (h, node) in self.nodes.iter_mut().enumerate() {
            let samples = node.collect(t as u64).unwrap_or_default();
            let req = gpuwatch_agent::encode(
                &samples,
                &[("host.name".to_string(), self.names[h].clone())],
            );
            let (wb, _) = gpuwatch_store::ingest::otlp::to_write_batch(&req, t)
                .map_err(|e| format!("decoding the fleet's readings: {e}"))?;
            batches.extend(
                wb.batches
                    .into_iter()
                    .filter(|(table, _)| *table == Table::GpuMetrics)
                    .map(|(_, b)| b),
            );
            owners.extend((0..samples.len()).map(|i| (h, i)));
            all.extend(samples);
        }
        let batch = concat_batches(&Table::GpuMetrics.schema(), &batches)
            .map_err(|e| format!("gpu_metrics rows: {e}"))?;
        Ok((all, owners, batch))
    }
}

/// `batch` with `shift` ns added to its times.
fn shifted(batch: &RecordBatch, shift: i64) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    let t = batch.column(0).as_primitive::<TimestampNanosecondType>();
    columns[0] = Arc::new(
        TimestampNanosecondArray::from(t.values().iter().map(|v| v + shift).collect::<Vec<_>>())
            .with_timezone("UTC"),
    );
    RecordBatch::try_new(batch.schema(), columns).map_err(|e| e.to_string())
}

/// The limiter class a job of this name is mostly in (the agent's job kinds).
fn class_of(name: &str, util: f64) -> &'static str {
    if util < IDLE_BELOW {
        return "idle";
    }
    match name {
        "eval-sweep" => "latency",
        "render-batch" => "fp32",
        "md-sim" => "fp64",
        "notebook" => "input",
        _ => "tensor",
    }
}

/// The ledger rows of the hour starting at `hour` from one reading per GPU.
fn ledger_hour(
    hour: i64,
    names: &[String],
    samples: &[GpuSample],
    owners: &[(usize, usize)],
) -> Result<RecordBatch> {
    let mut usage = Vec::new();
    let mut gpus = Vec::new();
    for (s, &(h, _)) in samples.iter().zip(owners) {
        let host = names[h].clone();
        let t = s.time_unix_nano as i64;
        gpus.push((host.clone(), s.gpu_uuid.clone(), t, s.energy_joules));
        let Some(job) = &s.job else { continue };
        let util = s.gpu_utilization.unwrap_or(0.0);
        let secs = 3_600.0;
        let joules = s.power_watts.unwrap_or(0.0) * secs;
        let idle = util < IDLE_BELOW;
        let mut labels = Vec::new();
        for (column, v) in [
            ("job_account", &job.extra.account),
            ("job_partition", &job.extra.partition),
            ("job_qos", &job.extra.qos),
        ] {
            if !v.is_empty() {
                labels.push((column.to_string(), v.clone()));
            }
        }
        usage.push(UsageRow {
            job_id: job.id.clone(),
            host,
            gpu_uuid: s.gpu_uuid.clone(),
            gpu_model: Some(s.gpu_model.clone()),
            scheduler: Some(job.scheduler.clone()),
            job_user: Some(job.user.clone()),
            job_name: Some(job.name.clone()),
            labels,
            first_seen: hour,
            last_seen: hour + HOUR_NS - 10_000_000_000,
            gpu_seconds: secs,
            idle_gpu_seconds: if idle { secs } else { 0.0 },
            energy_joules: joules,
            idle_energy_joules: if idle { joules } else { 0.0 },
            limiter: Some(class_of(&job.name, util).to_string()),
            samples: 360,
            interval_seconds: 10.0,
            parts: vec![
                ("price_secs".into(), secs * GPU_HOUR_USD),
                (
                    "idle_price_secs".into(),
                    if idle { secs * GPU_HOUR_USD } else { 0.0 },
                ),
                ("utilization_sum".into(), util * 360.0),
                ("utilization_n".into(), 360.0),
                ("max_utilization".into(), util),
            ],
        });
    }
    hour_rows(hour, &usage, &gpus, samples.len() as u64 * 360)
        .map_err(|e| format!("ledger rows: {e}"))
}

/// What one day of history writes: per table, the rows of each hour (hours since the epoch).
#[derive(Default)]
struct Day {
    hourly: Vec<(i64, RecordBatch)>,
    minutes: Vec<(i64, RecordBatch)>,
    ledger: Vec<(i64, RecordBatch)>,
}

impl Day {
    fn write(&mut self, store: &Store) -> Result<()> {
        for (table, hours) in [
            (Table::GpuMetrics1h, &mut self.hourly),
            (Table::GpuMetrics1m, &mut self.minutes),
            (Table::JobLedger, &mut self.ledger),
        ] {
            if !hours.is_empty() {
                store
                    .replace_hours(table, hours)
                    .map_err(|e| format!("writing {}: {e}", table.name()))?;
                hours.clear();
            }
        }
        Ok(())
    }
}

/// Builds the data directory; returns what the timings need.
pub(super) fn build(args: &HistoryArgs, end_hour_ns: i64) -> Result<Marker> {
    gpuwatch_alerts::cost::declare_ledger_table()?;
    let store = Store::open(
        StoreConfig {
            wal_sync: false,
            ..StoreConfig::new(args.data_dir.clone())
        },
        Arc::new(SystemClock),
    )
    .map_err(|e| format!("opening {}: {e}", args.data_dir.display()))?;
    let start = end_hour_ns - args.days as i64 * 24 * HOUR_NS;
    let raw_start = end_hour_ns - args.raw_hours as i64 * HOUR_NS;
    let minute_start = end_hour_ns - args.minute_days as i64 * 24 * HOUR_NS;
    let mut nodes = Nodes::new(args, start);
    let mut day = Day::default();
    let mut old_job = None;
    let began = Instant::now();
    let mut hour = start;
    while hour < raw_start {
        let (samples, owners, raw) = nodes.round(hour + 30 * MINUTE_NS)?;
        if old_job.is_none() {
            old_job = samples
                .iter()
                .find_map(|s| s.job.as_ref().map(|j| j.id.clone()));
        }
        let index = hour / HOUR_NS;
        day.hourly.push((
            index,
            rollup(&raw, Table::GpuMetrics1h).map_err(|e| e.to_string())?,
        ));
        if hour >= minute_start {
            let copies = (0..60)
                .map(|m| shifted(&raw, (m - 30) * MINUTE_NS))
                .collect::<Result<Vec<_>>>()?;
            let all = concat_batches(&raw.schema(), &copies).map_err(|e| e.to_string())?;
            day.minutes.push((
                index,
                rollup(&all, Table::GpuMetrics1m).map_err(|e| e.to_string())?,
            ));
        }
        day.ledger
            .push((index, ledger_hour(hour, &nodes.names, &samples, &owners)?));
        hour += HOUR_NS;
        if day.ledger.len() == 24 || hour >= raw_start {
            day.write(&store)?;
            println!(
                "history: {} of {} days written ({:.0} s)",
                (hour - start) / (24 * HOUR_NS),
                args.days,
                began.elapsed().as_secs_f64()
            );
        }
    }
    let first_raw_job = raw_hours(args, &store, &mut nodes, raw_start)?;
    Ok(Marker {
        shape: args.shape(),
        end_hour_ns,
        old_job: old_job.or(first_raw_job).ok_or("the history has no job")?,
        built_s: began.elapsed().as_secs_f64(),
    })
}

/// The raw samples from `from` to now, through the write-ahead log; persisted and compacted.
/// Returns the first job seen.
fn raw_hours(
    args: &HistoryArgs,
    store: &Store,
    nodes: &mut Nodes,
    from: i64,
) -> Result<Option<String>> {
    let step = args.raw_interval.as_nanos() as i64;
    let now = gpuwatch_store::clock::Clock::now_nanos(&SystemClock);
    let began = Instant::now();
    let mut t = from;
    let mut rounds = 0u64;
    let mut first_job = None;
    while t < now {
        let (samples, _, raw) = nodes.round(t)?;
        if first_job.is_none() {
            first_job = samples
                .iter()
                .find_map(|s| s.job.as_ref().map(|j| j.id.clone()));
        }
        store
            .write(&gpuwatch_store::ingest::WriteBatch {
                batches: vec![(Table::GpuMetrics, raw)],
            })
            .map_err(|e| format!("writing raw samples: {e}"))?;
        rounds += 1;
        if rounds % 60 == 0 {
            store.persist().map_err(|e| format!("persist: {e}"))?;
        }
        t += step;
    }
    store.persist().map_err(|e| format!("persist: {e}"))?;
    for _ in 0..2 {
        store.maintain().map_err(|e| format!("maintain: {e}"))?;
    }
    println!(
        "raw: {rounds} rounds of every GPU written and compacted ({:.0} s)",
        began.elapsed().as_secs_f64()
    );
    Ok(first_job)
}
