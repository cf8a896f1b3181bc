//! Builds the history data directory through the store's own writers: the agent's simulated
//! nodes (their jobs, users, accounts, idle holds) stepped an hour at a time over the history,
//! each hour's readings made the rows the server's OTLP decoder makes of them ([`rows`]); their `gpu_metrics_1h` rows and the job ledger's rows written a file a day (as the day
//! merge of maintenance leaves them), and for the last `--minute-days` the `gpu_metrics_1m` rows
//! a file an hour; then the last `--raw-hours` as raw samples every `--raw-interval` through
//! the write-ahead log, persisted and compacted (which rolls their closed hours up). The server
//! folds the raw hours into the ledger itself when it starts, as it would after any restart.
//!
//! One reading per GPU stands for its hour in the rollups and the ledger: each hour is one
//! sample of the model, so a ledger row holds 3,600 GPU-seconds and the hour's energy at the
//! reading's power, and each of the hour's minutes holds that reading (so the hourly row counts
//! the samples of its 60 minutes, as a rollup of the minutes would). The simulation, the
//! days' writing and the minutes' writing run on three threads ([`build`]).

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Int64Array, RecordBatch, TimestampNanosecondArray, UInt32Array};
use arrow::compute::kernels::numeric::mul;
use arrow::compute::{concat_batches, take_record_batch};
use gpuwatch_agent::collect::{GpuSample, Source};
use gpuwatch_agent::{Fleet as Node, NodeOptions};
use gpuwatch_alerts::cost::ledger::table::{UsageRow, hour_rows};
use gpuwatch_store::clock::SystemClock;
use gpuwatch_store::compact::rollup::rollup;
use gpuwatch_store::schema::{CLOCK_REASON_BITS, Table, clock_reason_column};
use gpuwatch_store::{Store, StoreConfig};

use super::{HistoryArgs, Marker, rows};
use crate::peers::Result;

const HOUR_NS: i64 = 3_600_000_000_000;
const MINUTE_NS: i64 = 60_000_000_000;
/// The minutes of an hour: each holds the hour's reading ([`minutes`]).
const MINUTES: i64 = 60;
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

    /// Every host's readings at `t`, as `gpu_metrics` rows ([`rows`]), and the host of each.
    fn round(&mut self, t: i64) -> Result<(Vec<GpuSample>, Vec<usize>, RecordBatch)> {
        let mut all = Vec::new();
        let mut owners = Vec::new();
        for (h, node) in self.nodes.iter_mut().enumerate() {
            let samples = node.collect(t as u64).unwrap_or_default();
            owners.extend(std::iter::repeat_n(h, samples.len()));
            all.extend(samples);
        }
        let batch = rows::gpu_metrics(&all, &owners, &self.names)?;
        Ok((all, owners, batch))
    }
}

/// Each row of `rows` (a minute's rollup of one reading per GPU, in the table's order) as the
/// hour's 60 minutes, in the table's order: the row repeated, its time moved to each minute.
fn minutes(rows: &RecordBatch, hour: i64) -> Result<RecordBatch> {
    let n = rows.num_rows() as u32;
    let indices = UInt32Array::from_iter_values(
        (0..n).flat_map(|i| std::iter::repeat_n(i, MINUTES as usize)),
    );
    let all = take_record_batch(rows, &indices).map_err(|e| e.to_string())?;
    let times = TimestampNanosecondArray::from_iter_values(
        (0..n).flat_map(|_| (0..MINUTES).map(move |m| hour + m * MINUTE_NS)),
    )
    .with_timezone("UTC");
    let mut columns = all.columns().to_vec();
    columns[0] = Arc::new(times);
    RecordBatch::try_new(all.schema(), columns).map_err(|e| e.to_string())
}

/// The hourly rollup of one reading per GPU (`rows`) as the rollup of the hour's 60 minutes that
/// each hold it ([`minutes`]): its sample counts (`samples`, the clock-event reasons' counts)
/// times 60, so the hourly and the 1-minute rows of an hour count the same samples.
fn as_sixty_minutes(rows: RecordBatch) -> Result<RecordBatch> {
    let sixty = Int64Array::new_scalar(MINUTES);
    let counts: Vec<String> = std::iter::once("samples".to_string())
        .chain(
            CLOCK_REASON_BITS
                .iter()
                .map(|&bit| clock_reason_column(bit)),
        )
        .collect();
    let schema = rows.schema();
    let columns = schema
        .fields()
        .iter()
        .zip(rows.columns())
        .map(|(f, c)| {
            if counts.contains(f.name()) {
                mul(c, &sixty)
            } else {
                Ok(c.clone())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    RecordBatch::try_new(schema, columns).map_err(|e| e.to_string())
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
    owners: &[usize],
) -> Result<RecordBatch> {
    let mut usage = Vec::new();
    let mut gpus = Vec::new();
    for (s, &h) in samples.iter().zip(owners) {
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
            ]
            .into_iter()
            .chain(s.sm_active.into_iter().flat_map(|sm| {
                [
                    ("sm_active_sum".into(), sm * 360.0),
                    ("sm_active_n".into(), 360.0),
                ]
            }))
            .collect(),
        });
    }
    hour_rows(hour, &usage, &gpus, samples.len() as u64 * 360)
        .map_err(|e| format!("ledger rows: {e}"))
}

/// One hour of history, as the simulation gives it to the writer.
struct Hour {
    /// Hours since the epoch.
    index: i64,
    /// `gpu_metrics_1h` rows.
    hourly: RecordBatch,
    /// One `gpu_metrics_1m` row per GPU (the hour's reading), for the hours with minutes.
    minute: Option<RecordBatch>,
    ledger: RecordBatch,
}

/// Seconds spent in each step of the build.
#[derive(Default, Debug)]
struct Spent {
    simulate: f64,
    roll_up: f64,
    ledger: f64,
    write_days: f64,
    write_minutes: f64,
}

fn timed<T>(into: &mut f64, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let began = Instant::now();
    let out = f();
    *into += began.elapsed().as_secs_f64();
    out
}

/// The rows of a UTC day, gathered hour by hour and written a file per table.
#[derive(Default)]
struct Day {
    index: Option<i64>,
    hourly: Vec<RecordBatch>,
    ledger: Vec<RecordBatch>,
}

impl Day {
    fn write(&mut self, store: &Store) -> Result<()> {
        let Some(day) = self.index.take() else {
            return Ok(());
        };
        for (table, hours) in [
            (Table::GpuMetrics1h, &mut self.hourly),
            (Table::JobLedger, &mut self.ledger),
        ] {
            let rows = concat_batches(&table.schema(), hours.iter()).map_err(|e| e.to_string())?;
            hours.clear();
            store
                .replace_days(table, &[(day, rows)])
                .map_err(|e| format!("writing {}: {e}", table.name()))?;
        }
        Ok(())
    }
}

/// The hours of history: from the first, the first with minutes, and the first of raw samples.
#[derive(Clone, Copy)]
struct Span {
    start: i64,
    minute_start: i64,
    raw_start: i64,
}

/// The simulation's side: steps the nodes an hour at a time and sends each hour's rows; returns
/// a job of the first hour.
fn simulate(
    nodes: &mut Nodes,
    span: Span,
    out: std::sync::mpsc::SyncSender<Hour>,
    spent: &mut Spent,
) -> Result<Option<String>> {
    let mut old_job = None;
    let mut hour = span.start;
    while hour < span.raw_start {
        let (samples, owners, raw) =
            timed(&mut spent.simulate, || nodes.round(hour + 30 * MINUTE_NS))?;
        if old_job.is_none() {
            old_job = samples
                .iter()
                .find_map(|s| s.job.as_ref().map(|j| j.id.clone()));
        }
        let (hourly, minute) = timed(&mut spent.roll_up, || {
            let hourly = rollup(&raw, Table::GpuMetrics1h).map_err(|e| e.to_string())?;
            let hourly = as_sixty_minutes(hourly)?;
            let minute = (hour >= span.minute_start)
                .then(|| rollup(&raw, Table::GpuMetrics1m).map_err(|e| e.to_string()))
                .transpose()?;
            Ok((hourly, minute))
        })?;
        let ledger = timed(&mut spent.ledger, || {
            ledger_hour(hour, &nodes.names, &samples, &owners)
        })?;
        let hour_rows = Hour {
            index: hour / HOUR_NS,
            hourly,
            minute,
            ledger,
        };
        if out.send(hour_rows).is_err() {
            break; // the writer stopped: its error is the build's
        }
        hour += HOUR_NS;
    }
    Ok(old_job)
}

/// The writer's side: a file a day of hourly rollups and ledger; the minutes go on to
/// `minutes_out`.
fn write(
    (args, store): (&HistoryArgs, &Store),
    span: Span,
    hours: std::sync::mpsc::Receiver<Hour>,
    minutes_out: std::sync::mpsc::SyncSender<(i64, RecordBatch)>,
    spent: &mut Spent,
) -> Result<()> {
    let mut day = Day::default();
    let began = Instant::now();
    for h in hours {
        let d = h.index.div_euclid(24);
        if day.index.is_some_and(|i| i != d) {
            timed(&mut spent.write_days, || day.write(store))?;
            println!(
                "history: {} of {} days written ({:.0} s)",
                (h.index * HOUR_NS - span.start) / (24 * HOUR_NS),
                args.days,
                began.elapsed().as_secs_f64()
            );
        }
        day.index = Some(d);
        day.hourly.push(h.hourly);
        day.ledger.push(h.ledger);
        if let Some(rows) = h.minute
            && minutes_out.send((h.index, rows)).is_err()
        {
            break; // the minutes' writer stopped: its error is the build's
        }
    }
    drop(minutes_out);
    timed(&mut spent.write_days, || day.write(store))
}

/// The minutes' writer: a file an hour, on a thread of its own (the most rows of the build).
fn write_minutes(
    store: &Store,
    hours: std::sync::mpsc::Receiver<(i64, RecordBatch)>,
    spent: &mut Spent,
) -> Result<()> {
    for (index, rows) in hours {
        timed(&mut spent.write_minutes, || {
            let all = minutes(&rows, index * HOUR_NS)?;
            store
                .replace_hours(Table::GpuMetrics1m, &[(index, all)])
                .map_err(|e| format!("writing gpu_metrics_1m: {e}"))
        })?;
    }
    Ok(())
}

/// Builds the data directory; returns what the timings need. The simulation and the minutes'
/// writer run on threads of their own, the days' writer on this one.
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
    let span = Span {
        start: end_hour_ns - args.days as i64 * 24 * HOUR_NS,
        minute_start: end_hour_ns - args.minute_days as i64 * 24 * HOUR_NS,
        raw_start: end_hour_ns - args.raw_hours as i64 * HOUR_NS,
    };
    let mut nodes = Nodes::new(args, span.start);
    let began = Instant::now();
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let (minutes_tx, minutes_rx) = std::sync::mpsc::sync_channel(2);
    let mut spent = Spent::default();
    let (mut days_spent, mut minutes_spent) = (Spent::default(), Spent::default());
    let (simulated, written, minutes_written) = std::thread::scope(|scope| {
        let sim = scope.spawn(|| simulate(&mut nodes, span, tx, &mut spent));
        let minutes = scope.spawn(|| write_minutes(&store, minutes_rx, &mut minutes_spent));
        let written = write((args, &store), span, rx, minutes_tx, &mut days_spent);
        let panicked = |what: &str| -> Result<()> { Err(format!("the {what} thread panicked")) };
        let simulated = sim.join().unwrap_or_else(|_| {
            panicked("simulation")?;
            Ok(None)
        });
        let minutes_written = minutes.join().unwrap_or_else(|_| panicked("minutes"));
        (simulated, written, minutes_written)
    });
    written?;
    minutes_written?;
    let old_job = simulated?;
    spent.write_days = days_spent.write_days;
    spent.write_minutes = minutes_spent.write_minutes;
    println!(
        "history written in {:.0} s; seconds spent in each step: {spent:?}",
        began.elapsed().as_secs_f64()
    );
    let first_raw_job = raw_hours(args, &store, &mut nodes, span.raw_start)?;
    drop(store);
    daily_rollups(args)?;
    Ok(Marker {
        shape: args.shape(),
        end_hour_ns,
        old_job: old_job.or(first_raw_job).ok_or("the history has no job")?,
        built_s: began.elapsed().as_secs_f64(),
    })
}

/// Brings the daily rollups up to date as the server's maintenance does (a few days a pass):
/// passes until one writes none.
pub(super) fn daily_rollups(args: &HistoryArgs) -> Result<()> {
    gpuwatch_alerts::cost::declare_ledger_table()?;
    let store = Store::open(
        StoreConfig::new(args.data_dir.clone()),
        Arc::new(SystemClock),
    )
    .map_err(|e| format!("opening {}: {e}", args.data_dir.display()))?;
    let began = Instant::now();
    let mut days = 0;
    loop {
        let r = store.maintain().map_err(|e| format!("maintain: {e}"))?;
        if r.rollup_files == 0 {
            break;
        }
        days += r.rollup_files;
    }
    println!(
        "maintenance until idle: {days} rollup files written ({:.0} s)",
        began.elapsed().as_secs_f64()
    );
    Ok(())
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
    let (mut simulate, mut write) = (0.0, 0.0);
    while t < now {
        let (samples, _, raw) = timed(&mut simulate, || nodes.round(t))?;
        if first_job.is_none() {
            first_job = samples
                .iter()
                .find_map(|s| s.job.as_ref().map(|j| j.id.clone()));
        }
        rounds += 1;
        timed(&mut write, || {
            store
                .write(&gpuwatch_store::ingest::WriteBatch {
                    batches: vec![(Table::GpuMetrics, raw)],
                })
                .map_err(|e| format!("writing raw samples: {e}"))?;
            if rounds % 60 == 0 {
                store.persist().map_err(|e| format!("persist: {e}"))?;
            }
            Ok(())
        })?;
        t += step;
    }
    store.persist().map_err(|e| format!("persist: {e}"))?;
    for _ in 0..2 {
        store.maintain().map_err(|e| format!("maintain: {e}"))?;
    }
    println!(
        "raw: {rounds} rounds of every GPU written and compacted ({:.0} s: simulation {simulate:.0} s, \
         writes and persists {write:.0} s)",
        began.elapsed().as_secs_f64()
    );
    Ok(first_job)
}
