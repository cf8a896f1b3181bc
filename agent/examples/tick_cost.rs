//! Where one collection's CPU time goes, on a real GPU host: every NVML call the agent makes at
//! each collection, one by one, as the agent makes it (kept device handle, GPM sample refilled
//! in place); then the calls it now makes only once per GPU or every `--slow-interval`, timed
//! at every tick all the same to show what they would cost there; then the agent's own phases
//! (collect, attribute, the request written to protobuf, gzip with the state kept as the
//! exporter keeps it, and for comparison the message tree the request used to be built as).
//! Times are wall times on one thread (the calls do not sleep: NVML answers from the driver),
//! printed as the median, the maximum and the mean over the ticks.
//!
//!   cargo build --release -p gpuwatch-agent --example tick_cost
//!   target/release/examples/tick_cost [TICKS]
//!
//! Used by `tests/gpu/overhead.sh`; the figures are in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gpuwatch_agent::collect::Source;
use gpuwatch_agent::collect::gpm::{GpmPair, refill};
use gpuwatch_agent::{NvmlSource, attribute, export};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml};
use prost::Message;

#[derive(Default)]
struct Costs(BTreeMap<&'static str, Vec<f64>>);

impl Costs {
    fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let t0 = std::time::Instant::now();
        let v = f();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        self.0.entry(name).or_default().push(ms);
        v
    }
    fn print(&self, title: &str) {
        println!("{title}");
        for (name, times) in &self.0 {
            let mut t = times.clone();
            t.sort_by(f64::total_cmp);
            let sum: f64 = t.iter().sum();
            println!(
                "  {name:30} median {:7.3} ms  max {:7.3} ms  mean {:7.3} ms ({} calls)",
                t[t.len() / 2],
                t[t.len() - 1],
                sum / t.len() as f64,
                t.len()
            );
        }
    }
}

fn main() {
    let ticks: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let (nvml, d) = open_gpu0();
    nvml_calls(nvml, &d, ticks);
    agent_phases(ticks);
}

/// NVML, kept for the whole run as the agent keeps it, and GPU 0; exits when either is missing.
fn open_gpu0() -> (&'static Nvml, Device<'static>) {
    let nvml: &'static Nvml = match Nvml::init() {
        Ok(n) => Box::leak(Box::new(n)),
        Err(e) => {
            eprintln!("nvml: {e}");
            std::process::exit(1);
        }
    };
    let Ok(d) = nvml.device_by_index(0) else {
        eprintln!("no gpu 0");
        std::process::exit(1);
    };
    (nvml, d)
}

/// Times each NVML call, at every tick: those of every collection, then the others.
fn nvml_calls(nvml: &'static Nvml, d: &Device<'static>, ticks: u32) {
    // The agent's event set: XID (and ECC where supported) of GPU 0, drained without waiting.
    let events = nvml.create_event_set().ok().and_then(|set| {
        let types = d.supported_event_types().ok()?
            & (EventTypes::CRITICAL_XID_ERROR
                | EventTypes::DOUBLE_BIT_ECC_ERROR
                | EventTypes::SINGLE_BIT_ECC_ERROR);
        d.register_events(types, set).ok()
    });
    let mut every = Costs::default();
    let mut once = Costs::default();
    let mut pair = GpmPair::new();
    let mut spare = None;
    for _ in 0..ticks {
        every_collection(&mut every, nvml, d, events.as_ref(), &mut pair);
        no_longer_every_collection(&mut once, nvml, d, &mut spare);
        std::thread::sleep(Duration::from_millis(200));
    }
    every.print("== NVML calls the agent makes at every collection, GPU 0");
    once.print(
        "== NVML calls made once per GPU or every --slow-interval (timed at every tick here)",
    );
}

/// What the agent calls at every collection.
fn every_collection(
    every: &mut Costs,
    nvml: &'static Nvml,
    d: &Device<'static>,
    events: Option<&EventSet<'static>>,
    pair: &mut GpmPair,
) {
    if let Some(set) = events {
        every.time("event set wait(0)", || set.wait(0).ok());
    }
    every.time("utilization_rates", || d.utilization_rates().ok());
    every.time("memory_info", || d.memory_info().ok());
    every.time("power_usage", || d.power_usage().ok());
    every.time("temperature", || d.temperature(TemperatureSensor::Gpu).ok());
    every.time("clock_info x2", || {
        (
            d.clock_info(Clock::SM).ok(),
            d.clock_info(Clock::Memory).ok(),
        )
    });
    every.time("current_throttle_reasons", || {
        d.current_throttle_reasons().ok()
    });
    every.time("total_ecc_errors x2", || {
        (
            d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                .ok(),
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
        )
    });
    every.time("field_values_for 82,143,145", || {
        d.field_values_for(&[FieldId(82), FieldId(143), FieldId(145)])
            .ok()
    });
    every.time("running_compute_processes", || {
        d.running_compute_processes().ok()
    });
    // The agent's GPM path: the older of two kept samples refilled (nvmlGpmSampleGet),
    // then the metrics between the two.
    let t0 = std::time::Instant::now();
    let got = pair.sample(d);
    every
        .0
        .entry("gpm sample (kept, refilled)")
        .or_default()
        .push(t0.elapsed().as_secs_f64() * 1e3);
    if let Ok(Some((p, s))) = got {
        let metrics = gpuwatch_agent::collect::nvml::GPM_METRICS;
        every.time("gpm_metrics_get (11)", || {
            nvml_wrapper::gpm::gpm_metrics_get(nvml, p, s, metrics).ok()
        });
    }
}

/// What the agent no longer calls at every collection, for comparison.
fn no_longer_every_collection(
    once: &mut Costs,
    nvml: &'static Nvml,
    d: &Device<'static>,
    spare: &mut Option<GpmSample<'static>>,
) {
    once.time("device_count", || nvml.device_count().ok());
    once.time("device_by_index", || nvml.device_by_index(0).ok());
    once.time("uuid", || d.uuid().ok());
    once.time("name", || d.name().ok());
    once.time("mig_mode", || d.mig_mode().ok());
    // nvml-wrapper's own call: allocates and fills a new sample, freed on drop.
    let fresh = once.time("gpm_sample (allocating)", || d.gpm_sample().ok());
    once.time("gpm_sample drop (free)", || drop(fresh));
    // A third sample refilled on its own, to time nvmlGpmSampleGet alone.
    if spare.is_none() {
        *spare = d.gpm_sample().ok();
    }
    if let Some(sp) = spare.as_ref() {
        once.time("nvmlGpmSampleGet alone", || refill(d, sp).ok());
    }
    // One call instead of three: the ECC volatile totals (fields 3, 4) with the others.
    once.time("field_values_for 3,4,82,143,145", || {
        d.field_values_for(&[
            FieldId(3),
            FieldId(4),
            FieldId(82),
            FieldId(143),
            FieldId(145),
        ])
        .ok()
    });
}

/// Times the agent's own phases over `ticks` collections of every GPU.
fn agent_phases(ticks: u32) {
    let mut source =
        NvmlSource::with_slow_interval(gpuwatch_agent::collect::nvml::DEFAULT_SLOW_INTERVAL)
            .unwrap_or_else(|e| {
                eprintln!("nvml source: {e}");
                std::process::exit(1);
            });
    let mut attributor =
        attribute::Attributor::new(Path::new("/run/gpuwatch/jobs"), Path::new("/proc"));
    let resource = vec![("host.name".to_string(), "bench".to_string())];
    let mut phases = Costs::default();
    let mut gzip = export::http::Gzip::new();
    let mut bytes = 0;
    for _ in 0..ticks {
        let now = gpuwatch_agent::now_unix_nano();
        let Ok(mut samples) = phases.time("collect", || source.collect(now)) else {
            continue;
        };
        let mut procs = phases.time("processes", || source.processes());
        phases.time("attribute", || attributor.apply(&mut samples, &mut procs));
        let events = phases.time("events", || source.events());
        // As the agent does it: the request written straight to protobuf, gzip with one state
        // kept between requests.
        let mut raw = Vec::new();
        phases.time("encode_collection_to (protobuf)", || {
            export::otlp::encode_collection_to(&mut raw, &samples, &procs, &events, &resource)
        });
        let body = phases.time("gzip (kept state)", || gzip.encode(&raw));
        bytes = body.map(|b| b.len()).unwrap_or(0);
        // For comparison: the message tree, then its protobuf encoding.
        phases.time("tree: encode_collection + encode_to_vec", || {
            export::otlp::encode_collection(&samples, &procs, &events, &resource).encode_to_vec()
        });
        std::thread::sleep(Duration::from_secs(1));
    }
    phases.print(&format!(
        "== the agent's phases ({} GPU(s), slow reads every {} s, request {bytes} B gzipped)",
        source
            .collect(gpuwatch_agent::now_unix_nano())
            .map(|s| s.len())
            .unwrap_or(0),
        gpuwatch_agent::collect::nvml::DEFAULT_SLOW_INTERVAL.as_secs()
    ));
}
