//! Where one collection's CPU time goes, on a real GPU host: every NVML call the agent makes,
//! one by one through nvml-wrapper, then the agent's own phases (collect, attribute, encode,
//! protobuf + gzip). Times are wall times on one thread (the calls do not sleep: NVML answers
//! from the driver), printed as the median and the maximum over the ticks.
//!
//!   cargo build --release -p gpuwatch-agent --example tick_cost
//!   target/release/examples/tick_cost [TICKS]
//!
//! Used by `tests/gpu/overhead.sh`; the figures are in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gpuwatch_agent::collect::Source;
use gpuwatch_agent::{NvmlSource, attribute, export};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::structs::device::FieldId;

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
    let ticks: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("nvml: {e}");
            std::process::exit(1);
        }
    };
    let mut calls = Costs::default();
    let metrics = gpuwatch_agent::collect::nvml::GPM_METRICS;
    let mut prev = None;
    for _ in 0..ticks {
        let d = calls.time("device_by_index", || nvml.device_by_index(0));
        let Ok(d) = d else {
            eprintln!("no gpu 0");
            std::process::exit(1);
        };
        calls.time("uuid", || d.uuid().ok());
        calls.time("name", || d.name().ok());
        calls.time("utilization_rates", || d.utilization_rates().ok());
        calls.time("memory_info", || d.memory_info().ok());
        calls.time("power_usage", || d.power_usage().ok());
        calls.time("temperature", || d.temperature(TemperatureSensor::Gpu).ok());
        calls.time("clock_info x2", || {
            (d.clock_info(Clock::SM).ok(), d.clock_info(Clock::Memory).ok())
        });
        calls.time("current_throttle_reasons", || d.current_throttle_reasons().ok());
        calls.time("total_ecc_errors x2", || {
            (
                d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile).ok(),
                d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
            )
        });
        calls.time("field_values_for 82,143,145", || {
            d.field_values_for(&[FieldId(82), FieldId(143), FieldId(145)]).ok()
        });
        calls.time("running_compute_processes", || d.running_compute_processes().ok());
        let s = calls.time("gpm_sample", || d.gpm_sample().ok());
        if let (Some(p), Some(s)) = (prev.as_ref(), s.as_ref()) {
            calls.time("gpm_metrics_get (11)", || {
                nvml_wrapper::gpm::gpm_metrics_get(&nvml, p, s, metrics).ok()
            });
        }
        prev = s;
        std::thread::sleep(Duration::from_millis(200));
    }
    calls.print("== nvml-wrapper calls, GPU 0");
    drop(prev);
    drop(nvml);

    let mut source = NvmlSource::with_slow_interval(gpuwatch_agent::collect::nvml::DEFAULT_SLOW_INTERVAL).unwrap_or_else(|e| {
        eprintln!("nvml source: {e}");
        std::process::exit(1);
    });
    let mut attributor =
        attribute::Attributor::new(Path::new("/run/gpuwatch/jobs"), Path::new("/proc"));
    let resource = vec![("host.name".to_string(), "bench".to_string())];
    let mut phases = Costs::default();
    let mut bytes = 0;
    for _ in 0..ticks {
        let now = gpuwatch_agent::now_unix_nano();
        let Ok(mut samples) = phases.time("collect", || source.collect(now)) else {
            continue;
        };
        let mut procs = phases.time("processes", || source.processes());
        phases.time("attribute", || attributor.apply(&mut samples, &mut procs));
        let events = phases.time("events", || source.events());
        let req = phases.time("encode_collection", || {
            export::otlp::encode_collection(&samples, &procs, &events, &resource)
        });
        let body = phases.time("protobuf + gzip", || export::http::encode_body(&req));
        bytes = body.map(|b| b.len()).unwrap_or(0);
        std::thread::sleep(Duration::from_secs(1));
    }
    phases.print(&format!(
        "== the agent's phases ({} GPU(s), slow reads every 30 s, request {bytes} B gzipped)",
        source.collect(gpuwatch_agent::now_unix_nano()).map(|s| s.len()).unwrap_or(0)
    ));
}
