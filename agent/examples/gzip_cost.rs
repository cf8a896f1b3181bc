//! Cost of turning one collection into a request body: protobuf encoding, then gzip at several
//! levels, for a 1-GPU and an 8-GPU host (synthetic fleet, so it runs anywhere).
//!
//!   cargo run --release -p gpuwatch-agent --example gzip_cost

use std::io::Write;
use std::time::Instant;

use flate2::Compression;
use flate2::write::GzEncoder;
use gpuwatch_agent::collect::Source;
use gpuwatch_agent::{Fleet, export};
use prost::Message;

fn main() {
    for gpus in [1, 8] {
        let mut fleet = Fleet::new(gpus, 7);
        let now = gpuwatch_agent::now_unix_nano();
        let samples = fleet.collect(now).unwrap_or_default();
        let procs = fleet.processes();
        let resource = vec![("host.name".to_string(), "bench-host-017".to_string())];
        let req = export::otlp::encode_collection(&samples, &procs, &[], &resource);
        let raw = req.encode_to_vec();
        let n = 2000;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(req.encode_to_vec());
        }
        let enc = t.elapsed().as_secs_f64() * 1e3 / f64::from(n);
        println!(
            "{gpus} GPU(s), {} processes: protobuf {} B, encode {enc:.3} ms",
            procs.len(),
            raw.len()
        );
        for level in [1, 3, 6] {
            let t = Instant::now();
            let mut size = 0;
            for _ in 0..n {
                let mut gz = GzEncoder::new(
                    Vec::with_capacity(raw.len() / 4 + 64),
                    Compression::new(level),
                );
                gz.write_all(&raw).ok();
                size = gz.finish().map(|v| v.len()).unwrap_or(0);
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(n);
            println!("  gzip level {level}, a new encoder per request: {size:6} B, {ms:.3} ms");
        }
        let mut gz = export::http::Gzip::new();
        let t = Instant::now();
        let mut size = 0;
        for _ in 0..n {
            size = gz.encode(&raw).map(|v| v.len()).unwrap_or(0);
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(n);
        println!("  gzip level 1, the agent's reused encoder:  {size:6} B, {ms:.3} ms");
    }
}
