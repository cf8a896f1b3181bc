//! `/metrics` on `--metrics-addr` (default 127.0.0.1:9400): the last collection in the
//! Prometheus text format 0.0.4 under dcgm-exporter's metric and label names and units, so
//! existing dashboards and alerts keep working, followed by the agent's own metrics
//! ([`crate::metrics`]).
//!
//! The per-GPU series are the measured hot path (every GPU, every scrape) and are written by
//! hand with `gpuwatch_common::metrics::TextWriter`, the one exposition writer: a registry would
//! rename dcgm-exporter's counters (`…_total`) and cost more per scrape. The agent's own metrics
//! live in a `prometheus-client` registry, rendered as 0.0.4 by
//! `gpuwatch_common::metrics::encode_text_into`, so the whole body is one format.
//! The agent always serves 0.0.4, whatever the scraper's `Accept` says: OpenMetrics requires
//! counters to end in `_total`, which dcgm-exporter's do not.
//!
//! Labels on every GPU series, as dcgm-exporter writes them: `gpu` (index), `UUID`, `device`
//! (`nvidia<index>`), `modelName`, `Hostname`; `GPU_I_ID` for a MIG instance; `hpc_job` when a
//! job owns the GPU (from the job mapping dir or its processes), or `namespace`, `pod`,
//! `container` when a Kubernetes pod does. A value NVML could not read
//! has no series. dcgm-exporter's `pci_bus_id` and `DCGM_FI_DRIVER_VERSION` are not written.
//!
//! The server is a minimal HTTP/1.1 responder on tokio (one request per connection, `GET
//! /metrics`, `GET /healthz`; anything else 404/405), enough for Prometheus and curl.
//!
//! `promtool check metrics` parses the output; its lint flags two things that are part of
//! dcgm-exporter's naming and kept for compatibility: the camelCase label `modelName`, and
//! counters without `_total` (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, the ECC totals, remapped
//! rows). The agent's own metrics are lint-clean.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuwatch_common::metrics::TextWriter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::collect::GpuSample;

/// Content type of the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = gpuwatch_common::metrics::TEXT_CONTENT_TYPE;

/// Longest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// What `/metrics` shows: the host and the last collection.
#[derive(Debug, Default)]
pub struct Exposition {
    /// `Hostname` label.
    pub host: String,
    /// The samples of the last collection.
    pub samples: Vec<GpuSample>,
    /// The code of the last XID error seen on each GPU (by UUID), since the agent started.
    pub last_xid: std::collections::HashMap<String, i64>,
}

impl Exposition {
    /// Remembers the XID codes of a collection's events (the last one per GPU wins).
    pub fn note_events(&mut self, events: &[crate::collect::GpuEvent]) {
        for e in events.iter().filter(|e| e.kind == "xid") {
            self.last_xid.insert(e.gpu_uuid.clone(), e.code);
        }
    }

    /// dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` of a GPU: the last XID error's code, 0 before
    /// any.
    fn xid(&self, s: &GpuSample) -> f64 {
        self.last_xid.get(&s.gpu_uuid).copied().unwrap_or(0) as f64
    }
}

/// Shared between the collection loop (writer) and the HTTP server (reader).
pub type SharedExposition = Arc<Mutex<Exposition>>;

/// How a sample value becomes a dcgm-exporter value.
struct Field {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: fn(&GpuSample) -> Option<f64>,
}

const fn f(
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: fn(&GpuSample) -> Option<f64>,
) -> Field {
    Field {
        name,
        kind,
        help,
        get,
    }
}

const MIB: f64 = 1_048_576.0;

fn int(v: Option<i64>) -> Option<f64> {
    v.map(|x| x as f64)
}

/// dcgm-exporter's fields, units converted back to DCGM's (percent, MiB, mJ).
const FIELDS: &[Field] = &[
    f(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        |s| int(s.sm_clock_mhz),
    ),
    f(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        |s| int(s.memory_clock_mhz),
    ),
    f(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        |s| s.memory_temperature_celsius,
    ),
    f(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        |s| s.temperature_celsius,
    ),
    f(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        |s| s.power_watts,
    ),
    f(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        |s| s.energy_joules.map(|j| (j * 1000.0).round()),
    ),
    f(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        |s| s.gpu_utilization.map(|r| (r * 100.0).round()),
    ),
    f(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        |s| s.memory_utilization.map(|r| (r * 100.0).round()),
    ),
    f(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        |s| s.memory_used_bytes.map(|b| (b as f64 / MIB).round()),
    ),
    f(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB), total minus used.",
        |s| match (s.memory_total_bytes, s.memory_used_bytes) {
            (Some(t), Some(u)) => Some(((t - u).max(0) as f64 / MIB).round()),
            _ => None,
        },
    ),
    f(
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "Framebuffer memory total (in MiB).",
        |s| s.memory_total_bytes.map(|b| (b as f64 / MIB).round()),
    ),
    f(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask).",
        |s| int(s.clock_event_reasons),
    ),
    f(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (bitmask; older name of the clock event reasons).",
        |s| int(s.clock_event_reasons),
    ),
    f(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "gauge",
        "Maximum supported SM clock (in MHz).",
        |s| int(s.sm_clock_max_mhz),
    ),
    f(
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "gauge",
        "PCIe current link generation.",
        |s| int(s.pcie_link_gen),
    ),
    f(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "PCIe current link width (lanes).",
        |s| int(s.pcie_link_width),
    ),
    f(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        |s| int(s.ecc_sbe_volatile_total),
    ),
    f(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        |s| int(s.ecc_dbe_volatile_total),
    ),
    f(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        |s| int(s.remapped_rows_uncorrectable),
    ),
    f(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        |s| int(s.remapped_rows_failure),
    ),
    f(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active (ratio 0..1).",
        |s| s.gr_engine_active,
    ),
    f(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned (ratio 0..1).",
        |s| s.sm_active,
    ),
    f(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM (ratio 0..1).",
        |s| s.sm_occupancy,
    ),
    f(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active (ratio 0..1).",
        |s| s.tensor_active,
    ),
    f(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data (ratio 0..1).",
        |s| s.dram_active,
    ),
    f(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active (ratio 0..1).",
        |s| s.fp64_active,
    ),
    f(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active (ratio 0..1).",
        |s| s.fp32_active,
    ),
    f(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active (ratio 0..1).",
        |s| s.fp16_active,
    ),
    f(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |s| s.pcie_tx_bytes_per_second,
    ),
    f(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        |s| s.pcie_rx_bytes_per_second,
    ),
    f(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        |s| s.nvlink_tx_bytes_per_second,
    ),
    f(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        |s| s.nvlink_rx_bytes_per_second,
    ),
];

/// Escape a label value: backslash, double quote and newline (the one escaper of
/// `gpuwatch_common::metrics`).
pub fn escape_label(v: &str) -> String {
    gpuwatch_common::metrics::escape_label(v)
}

fn labels(host: &str, s: &GpuSample) -> String {
    let mut l = format!(
        "gpu=\"{}\",UUID=\"{}\",device=\"nvidia{}\",modelName=\"{}\",Hostname=\"{}\"",
        s.gpu_index,
        escape_label(&s.gpu_uuid),
        s.gpu_index,
        escape_label(&s.gpu_model),
        escape_label(host)
    );
    // The GPU instance id, when the source knows it (`<gi>.<ci>`).
    if let Some(gi) = s
        .mig_instance
        .as_deref()
        .and_then(|m| m.split('.').next())
        .filter(|gi| !gi.is_empty() && gi.bytes().all(|b| b.is_ascii_digit()))
    {
        let _ = write!(l, ",GPU_I_ID=\"{}\"", escape_label(gi));
    }
    match s.job.as_ref() {
        // dcgm-exporter's Kubernetes labels.
        Some(job) if job.k8s.is_some() => {
            if let Some(k) = &job.k8s {
                let _ = write!(
                    l,
                    ",namespace=\"{}\",pod=\"{}\",container=\"{}\"",
                    escape_label(&k.namespace),
                    escape_label(&k.pod),
                    escape_label(&k.container)
                );
            }
        }
        Some(job) => {
            let _ = write!(l, ",hpc_job=\"{}\"", escape_label(&job.id));
        }
        None => {}
    }
    l
}

/// The whole `/metrics` body.
pub fn render(expo: &Exposition) -> String {
    let mut out = String::with_capacity(4096 + expo.samples.len() * 4096);
    let labels: Vec<String> = expo.samples.iter().map(|s| labels(&expo.host, s)).collect();
    for field in FIELDS {
        let values: Vec<(usize, f64)> = expo
            .samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| (field.get)(s).filter(|v| v.is_finite()).map(|v| (i, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        let mut w = TextWriter::new(&mut out);
        w.family(field.name, field.kind, field.help);
        for (i, v) in values {
            w.sample_with(field.name, &labels[i], v);
        }
    }
    // dcgm-exporter's meaning: the last XID error's code (a gauge), 0 before any.
    if !expo.samples.is_empty() {
        let mut w = TextWriter::new(&mut out);
        w.family(
            "DCGM_FI_DEV_XID_ERRORS",
            "gauge",
            "Value of the last XID error encountered.",
        );
        for (i, s) in expo.samples.iter().enumerate() {
            w.sample_with("DCGM_FI_DEV_XID_ERRORS", &labels[i], expo.xid(s));
        }
    }
    crate::metrics::render(&mut out);
    out
}

/// Bind `addr` and serve `/metrics` until the returned task is aborted.
pub async fn serve(
    addr: SocketAddr,
    expo: SharedExposition,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    info!(addr = %local, "serving /metrics");
    Ok(tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let expo = expo.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, &expo).await {
                    debug!(%peer, error = %e, "metrics request failed");
                }
            });
        }
    }))
}

async fn handle(mut stream: TcpStream, expo: &SharedExposition) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_read = async {
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if buf.len() > MAX_REQUEST {
                return Ok(false);
            }
        }
    };
    let complete = match tokio::time::timeout(Duration::from_secs(10), head_read).await {
        Ok(r) => r?,
        Err(_) => return Ok(()),
    };
    let (status, content_type, body) = if !complete {
        (
            400,
            "text/plain",
            "bad request: send one HTTP/1.1 GET\n".to_string(),
        )
    } else {
        let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        let path = target.split('?').next().unwrap_or_default();
        match (method, path) {
            ("GET" | "HEAD", "/metrics") => {
                let text = {
                    let e = expo.lock().unwrap_or_else(|p| p.into_inner());
                    render(&e)
                };
                (200, CONTENT_TYPE, text)
            }
            ("GET" | "HEAD", "/healthz") => (200, "text/plain", "ok\n".to_string()),
            ("GET" | "HEAD", _) => (
                404,
                "text/plain",
                "not found: the agent serves /metrics and /healthz\n".to_string(),
            ),
            _ => (
                405,
                "text/plain",
                "method not allowed: use GET\n".to_string(),
            ),
        }
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let head_only = buf.starts_with(b"HEAD ");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::JobLabels;

    fn sample() -> GpuSample {
        let mut s = GpuSample::empty(1, "GPU-a\"b".into(), 3, "NVIDIA H100 80GB HBM3".into());
        s.gpu_utilization = Some(0.97);
        s.memory_used_bytes = Some(2 << 30);
        s.memory_total_bytes = Some(80 << 30);
        s.energy_joules = Some(49_850.753);
        s.tensor_active = Some(0.938);
        s.job = Some(JobLabels {
            id: "123".into(),
            user: "alice".into(),
            name: "train".into(),
            scheduler: "slurm".into(),
            k8s: None,
            extra: Default::default(),
        });
        s
    }

    #[test]
    fn pods_and_mig_instances_get_dcgm_exporter_labels() {
        let mut s = sample();
        s.mig_instance = Some("2.0".into());
        s.job = Some(crate::attribute::kubernetes::job_of(
            &crate::collect::PodLabels {
                namespace: "ml".into(),
                pod: "train-0".into(),
                container: "trainer".into(),
            },
        ));
        let l = labels("node-1", &s);
        assert!(
            l.ends_with(",GPU_I_ID=\"2\",namespace=\"ml\",pod=\"train-0\",container=\"trainer\""),
            "{l}"
        );
        assert!(!l.contains("hpc_job"), "{l}");
        // An instance named without its GPU instance id (NVML's `dev<n>`) has no GPU_I_ID.
        s.mig_instance = Some("dev1".into());
        assert!(!labels("node-1", &s).contains("GPU_I_ID"));
    }

    #[test]
    fn dcgm_names_units_and_labels() {
        let mut expo = Exposition {
            host: "node-1".into(),
            samples: vec![sample()],
            ..Default::default()
        };
        let text = render(&expo);
        let l = "gpu=\"3\",UUID=\"GPU-a\\\"b\",device=\"nvidia3\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-1\",hpc_job=\"123\"";
        assert!(
            text.contains(&format!("DCGM_FI_DEV_GPU_UTIL{{{l}}} 97\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("DCGM_FI_DEV_FB_USED{{{l}}} 2048\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("DCGM_FI_DEV_FB_FREE{{{l}}} 79872\n")),
            "{text}"
        );
        assert!(text.contains(&format!(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{l}}} 49850753\n"
        )));
        assert!(text.contains(&format!("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{l}}} 0.938\n")));
        assert!(text.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"));
        // A value that could not be read has no series.
        assert!(!text.contains("DCGM_FI_DEV_POWER_USAGE"));
        assert!(text.contains("gpuwatch_agent_collections_total"));
        // No XID yet: dcgm-exporter writes 0; then the code of the last one.
        assert!(
            text.contains(&format!("DCGM_FI_DEV_XID_ERRORS{{{l}}} 0\n")),
            "{text}"
        );
        let xid = |code| crate::collect::GpuEvent {
            time_unix_nano: 1,
            gpu_uuid: "GPU-a\"b".into(),
            gpu_index: 3,
            kind: "xid".into(),
            code,
            detail: String::new(),
        };
        expo.note_events(&[xid(13), xid(79)]);
        let text = render(&expo);
        assert!(
            text.contains(&format!("DCGM_FI_DEV_XID_ERRORS{{{l}}} 79\n")),
            "{text}"
        );
        assert!(
            text.contains("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"),
            "{text}"
        );
    }
}
