//! Prometheus remote write 1.0: a snappy-compressed protobuf `WriteRequest` decoded into rows.
//!
//! dcgm-exporter's `DCGM_FI_*` series that carry a GPU `UUID` and map to a `gpu_metrics` column
//! are pivoted into one row per (time, host, GPU, MIG instance) with their units converted
//! (percent → ratio, MiB → bytes, mJ → J); every other series becomes `metrics` rows.
//!
//! Sample policy (docs/http-api.md repeats it):
//! - Prometheus staleness markers (the special NaN) are dropped silently: they only say a series
//!   ended, which a table of samples does not need.
//! - Any other NaN or ±inf is rejected (not stored, counted).
//! - A sample more than [`MAX_FUTURE`] ahead of the server clock, or before 1970, is rejected.
//! - Out-of-order samples are stored: the store is append-only and queries order by `time`.
//! - A duplicate (same series and timestamp) within one request keeps the last value; across
//!   requests both are stored (a sender only resends after a failed, unacknowledged write).
//! - A series without `__name__` is rejected.
//!
//! Rejections do not fail the request: the valid samples are stored and the counts come back
//! in [`RemoteWriteStats`], which the server returns in a header and its own metrics.

use std::collections::{BTreeMap, HashMap};

use prost::Message;

use super::rows::{Cell, GpuRow, MetricRow, WriteBatch};
use crate::schema::{LABEL_COLUMNS, VALUE_COLUMNS};
use crate::{Error, Result};

/// The messages of Prometheus's `prompb/remote.proto` and `types.proto` that remote write 1.0
/// sends. Fields gpuwatch does not read (metadata, exemplars, native histograms) are skipped by
/// the decoder as unknown fields.
pub mod proto {
    /// `prometheus.WriteRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteRequest {
        /// The series, each with its samples.
        #[prost(message, repeated, tag = "1")]
        pub timeseries: Vec<TimeSeries>,
    }

    /// `prometheus.TimeSeries`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        /// Labels, `__name__` among them, sorted by name.
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<Label>,
        /// Samples, oldest first.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
    }

    /// `prometheus.Label`.
    #[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
    pub struct Label {
        /// Label name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Label value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `prometheus.Sample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// The value.
        #[prost(double, tag = "1")]
        pub value: f64,
        /// Milliseconds since the Unix epoch.
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}

use proto::{TimeSeries, WriteRequest};

/// How far ahead of the server clock a sample may be (10 minutes).
pub const MAX_FUTURE: i64 = 10 * 60 * 1_000_000_000;

/// The bit pattern Prometheus uses for a staleness marker.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

const MIB: f64 = 1024.0 * 1024.0;

/// A dcgm-exporter field that fills a `gpu_metrics` column.
#[derive(Debug, Clone, Copy)]
pub struct DcgmField {
    /// The Prometheus metric name dcgm-exporter writes.
    pub name: &'static str,
    /// The `gpu_metrics` column.
    pub column: &'static str,
    /// Factor from dcgm-exporter's unit to the column's.
    pub scale: f64,
}

const fn d(name: &'static str, column: &'static str, scale: f64) -> DcgmField {
    DcgmField {
        name,
        column,
        scale,
    }
}

/// dcgm-exporter's fields that have a `gpu_metrics` column. The `DCGM_FI_PROF_*` activity
/// fields are already ratios in 0..1 (despite "%" in some help texts); `DCGM_FI_DEV_*_UTIL` are
/// percent. `DCGM_FI_DEV_XID_ERRORS` is the last XID code, not a count, so it stays in `metrics`.
pub const DCGM_FIELDS: &[DcgmField] = &[
    d("DCGM_FI_DEV_GPU_UTIL", "gpu_utilization", 0.01),
    d("DCGM_FI_DEV_MEM_COPY_UTIL", "memory_utilization", 0.01),
    d("DCGM_FI_PROF_SM_ACTIVE", "sm_active", 1.0),
    d("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", 1.0),
    d("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", 1.0),
    d("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", 1.0),
    d("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active", 1.0),
    d("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active", 1.0),
    d("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active", 1.0),
    d("DCGM_FI_DEV_FB_USED", "memory_used_bytes", MIB),
    d("DCGM_FI_DEV_FB_TOTAL", "memory_total_bytes", MIB),
    d("DCGM_FI_DEV_POWER_USAGE", "power_watts", 1.0),
    d(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_joules",
        0.001,
    ),
    d("DCGM_FI_DEV_GPU_TEMP", "temperature_celsius", 1.0),
    d("DCGM_FI_DEV_MEMORY_TEMP", "memory_temperature_celsius", 1.0),
    d("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0),
    d("DCGM_FI_DEV_MEM_CLOCK", "memory_clock_mhz", 1.0),
    d(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "clock_event_reasons",
        1.0,
    ),
    d(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "clock_event_reasons",
        1.0,
    ),
    d(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "pcie_tx_bytes_per_second",
        1.0,
    ),
    d(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "pcie_rx_bytes_per_second",
        1.0,
    ),
    d(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "nvlink_tx_bytes_per_second",
        1.0,
    ),
    d(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "nvlink_rx_bytes_per_second",
        1.0,
    ),
    d(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "ecc_sbe_volatile_total",
        1.0,
    ),
    d(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "ecc_dbe_volatile_total",
        1.0,
    ),
    d(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        1.0,
    ),
    d(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "remapped_rows_failure",
        1.0,
    ),
];

/// Fields that are kept in `metrics` and also give `memory_total_bytes` (used + free + reserved)
/// when dcgm-exporter does not send `DCGM_FI_DEV_FB_TOTAL`.
const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
const FB_RESERVED: &str = "DCGM_FI_DEV_FB_RESERVED";

/// dcgm-exporter's labels, per `gpu_metrics` label column, first found wins. `exported_*` come
/// first: Prometheus renames the exporter's `pod` to `exported_pod` when its own target labels
/// clash. `hpc_job` is dcgm-exporter's `--hpc-job-mapping-dir` label.
pub const DCGM_LABELS: &[(&str, &[&str])] = &[
    ("host", &["Hostname"]),
    ("gpu_uuid", &["UUID"]),
    ("gpu_index", &["gpu"]),
    ("gpu_model", &["modelName"]),
    ("mig_instance", &["GPU_I_ID"]),
    ("job_id", &["hpc_job"]),
    ("job_user", &[]),
    ("job_name", &[]),
    ("scheduler", &[]),
    (
        "k8s_namespace",
        &["exported_namespace", "namespace", "pod_namespace"],
    ),
    ("k8s_pod", &["exported_pod", "pod", "pod_name"]),
    (
        "k8s_container",
        &["exported_container", "container", "container_name"],
    ),
];

/// What a decode kept and dropped, by reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RemoteWriteStats {
    /// Series in the request.
    pub series: u64,
    /// Samples stored (both tables).
    pub samples: u64,
    /// Of those, samples that became `gpu_metrics` cells.
    pub gpu_samples: u64,
    /// Staleness markers dropped.
    pub stale: u64,
    /// NaN or ±inf samples rejected.
    pub non_finite: u64,
    /// Samples rejected for a time too far ahead of the server clock or before 1970.
    pub out_of_range: u64,
    /// Samples of series without a `__name__` rejected.
    pub unnamed: u64,
    /// Samples replaced by a later one with the same series and timestamp in the request.
    pub duplicates: u64,
}

impl RemoteWriteStats {
    /// Samples rejected for any reason (staleness markers and duplicates are not rejections).
    pub fn rejected(&self) -> u64 {
        self.non_finite + self.out_of_range + self.unnamed
    }

    /// A one-line summary of the rejections, or `None` when there were none.
    pub fn rejection_summary(&self) -> Option<String> {
        if self.rejected() == 0 {
            return None;
        }
        Some(format!(
            "rejected {} samples: {} nan or infinite, {} outside [1970, now + 10m], {} without __name__",
            self.rejected(),
            self.non_finite,
            self.out_of_range,
            self.unnamed
        ))
    }
}

/// Removes the snappy block compression of a remote-write body, refusing to inflate beyond
/// `max_bytes`.
pub fn decompress(
    content_encoding: Option<&str>,
    body: &[u8],
    max_bytes: usize,
) -> Result<Vec<u8>> {
    let encoding = content_encoding
        .unwrap_or("snappy")
        .trim()
        .to_ascii_lowercase();
    if encoding != "snappy" {
        return Err(Error::malformed(
            "remote write request",
            format!(
                "content-encoding {encoding:?}: remote write 1.0 bodies are snappy-compressed, send content-encoding: snappy"
            ),
        ));
    }
    if body.is_empty() {
        return Err(Error::malformed(
            "remote write request",
            "empty body: send a snappy-compressed prometheus.WriteRequest",
        ));
    }
    let len = snap::raw::decompress_len(body)
        .map_err(|e| Error::malformed("remote write snappy body", e))?;
    if len > max_bytes {
        return Err(Error::TooLarge { limit: max_bytes });
    }
    snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| Error::malformed("remote write snappy body", e))
}

/// Checks the `Content-Type` (absent is accepted; remote write 2.0 is refused).
pub fn check_content_type(content_type: Option<&str>) -> Result<()> {
    let Some(raw) = content_type else {
        return Ok(());
    };
    let mut parts = raw.split(';').map(|p| p.trim().to_ascii_lowercase());
    let essence = parts.next().unwrap_or_default();
    if essence != "application/x-protobuf" && essence != "application/protobuf" {
        return Err(Error::UnsupportedContentType(raw.to_string()));
    }
    for p in parts {
        if let Some(msg) = p.strip_prefix("proto=")
            && msg != "prometheus.writerequest"
        {
            return Err(Error::malformed(
                "remote write request",
                format!(
                    "protobuf message {msg}: only remote write 1.0 (prometheus.WriteRequest) is supported, set protobuf_message: prometheus.WriteRequest in the sender's remote_write config"
                ),
            ));
        }
    }
    Ok(())
}

/// Decodes a (decompressed) protobuf `WriteRequest`.
pub fn decode_protobuf(raw: &[u8]) -> Result<WriteRequest> {
    WriteRequest::decode(raw).map_err(|e| Error::malformed("remote write protobuf", e))
}

/// Decodes a whole remote-write HTTP request into rows.
pub fn decode_request(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decoded_bytes: usize,
    now: i64,
) -> Result<(WriteBatch, RemoteWriteStats)> {
    check_content_type(content_type)?;
    let raw = decompress(content_encoding, body, max_decoded_bytes)?;
    let req = decode_protobuf(&raw)?;
    to_write_batch(&req, now)
}

fn column_index(column: &str) -> Option<usize> {
    VALUE_COLUMNS.iter().position(|c| c.column == column)
}

/// The dcgm field and its column index for a metric name.
fn dcgm_field(name: &str) -> Option<(DcgmField, usize)> {
    let f = DCGM_FIELDS.iter().find(|f| f.name == name)?;
    Some((*f, column_index(f.column)?))
}

fn label<'a>(ts: &'a TimeSeries, name: &str) -> Option<&'a str> {
    ts.labels
        .iter()
        .find(|l| l.name == name && !l.value.is_empty())
        .map(|l| l.value.as_str())
}

fn first_label(ts: &TimeSeries, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| label(ts, n)).map(str::to_string)
}

/// The host of a series: `Hostname`, else the scrape `instance` without its port.
fn host_of(ts: &TimeSeries) -> String {
    if let Some(h) = label(ts, "Hostname") {
        return h.to_string();
    }
    let Some(instance) = label(ts, "instance") else {
        return String::new();
    };
    match instance.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        _ => instance.to_string(),
    }
}

/// The `gpu_metrics` labels of a dcgm-exporter series, in [`LABEL_COLUMNS`] order.
fn dcgm_labels(ts: &TimeSeries) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = vec![None; LABEL_COLUMNS.len()];
    for (i, (column, _)) in LABEL_COLUMNS.iter().enumerate() {
        out[i] = match *column {
            "host" => Some(host_of(ts)),
            _ => DCGM_LABELS
                .iter()
                .find(|(c, _)| c == column)
                .and_then(|(_, names)| first_label(ts, names)),
        };
    }
    let idx = |name: &str| LABEL_COLUMNS.iter().position(|(c, _)| *c == name);
    if let (Some(job), Some(sched), Some(pod)) = (idx("job_id"), idx("scheduler"), idx("k8s_pod")) {
        out[sched] = if out[job].is_some() {
            Some("slurm".to_string())
        } else if out[pod].is_some() {
            Some("kubernetes".to_string())
        } else {
            None
        };
    }
    out
}

/// The time of a sample in ns, or `None` when it is out of the accepted range.
fn sample_time(ms: i64, now: i64) -> Option<i64> {
    if ms < 0 {
        return None;
    }
    let ns = ms.checked_mul(1_000_000)?;
    (ns <= now.saturating_add(MAX_FUTURE)).then_some(ns)
}

type GpuKey = (i64, String, String, Option<String>);

/// Turns a request into rows. `now` (ns) bounds how far in the future a sample may be.
pub fn to_write_batch(req: &WriteRequest, now: i64) -> Result<(WriteBatch, RemoteWriteStats)> {
    let mut stats = RemoteWriteStats::default();
    let mut gpu_rows: Vec<GpuRow> = Vec::new();
    let mut gpu_index: HashMap<GpuKey, usize> = HashMap::new();
    // (row, free MiB, reserved MiB) for the memory total of rows without DCGM_FI_DEV_FB_TOTAL.
    let mut fb_extra: HashMap<usize, (Option<f64>, Option<f64>)> = HashMap::new();
    let mut metric_rows: Vec<MetricRow> = Vec::new();
    let mut metric_index: HashMap<(usize, i64), usize> = HashMap::new();
    let mut series_ids: HashMap<(String, Vec<(String, String)>), usize> = HashMap::new();
    let uuid_col = LABEL_COLUMNS.iter().position(|(c, _)| *c == "gpu_uuid");
    let mig_col = LABEL_COLUMNS.iter().position(|(c, _)| *c == "mig_instance");

    for ts in &req.timeseries {
        stats.series += 1;
        let Some(name) = label(ts, "__name__") else {
            stats.unnamed += ts.samples.len() as u64;
            continue;
        };
        let uuid = label(ts, "UUID");
        let gpu_target = match (dcgm_field(name), uuid) {
            (Some(field), Some(_)) => Some(field),
            _ => None,
        };
        let fb_side = uuid.is_some() && (name == FB_FREE || name == FB_RESERVED);
        let labels = if gpu_target.is_some() || fb_side {
            Some(dcgm_labels(ts))
        } else {
            None
        };
        let series_id = if gpu_target.is_none() {
            let mut map: BTreeMap<String, String> = BTreeMap::new();
            for l in &ts.labels {
                if l.name != "__name__" && !l.value.is_empty() {
                    map.insert(l.name.clone(), l.value.clone());
                }
            }
            let key = (name.to_string(), map.into_iter().collect::<Vec<_>>());
            let next = series_ids.len();
            Some(*series_ids.entry(key).or_insert(next))
        } else {
            None
        };
        for s in &ts.samples {
            if s.value.to_bits() == STALE_NAN_BITS {
                stats.stale += 1;
                continue;
            }
            if !s.value.is_finite() {
                stats.non_finite += 1;
                continue;
            }
            let Some(time) = sample_time(s.timestamp, now) else {
                stats.out_of_range += 1;
                continue;
            };
            stats.samples += 1;
            if let (Some(labels), Some(uc)) = (&labels, uuid_col)
                && (gpu_target.is_some() || fb_side)
            {
                let key: GpuKey = (
                    time,
                    labels[0].clone().unwrap_or_default(),
                    labels[uc].clone().unwrap_or_default(),
                    mig_col.and_then(|m| labels[m].clone()),
                );
                let row = *gpu_index.entry(key).or_insert_with(|| {
                    let mut row = GpuRow::new(time);
                    row.labels.clone_from(labels);
                    gpu_rows.push(row);
                    gpu_rows.len() - 1
                });
                if let Some((field, col)) = gpu_target {
                    stats.gpu_samples += 1;
                    let value = s.value * field.scale;
                    let cell = &mut gpu_rows[row].values[col];
                    if cell.is_some() {
                        stats.duplicates += 1;
                        stats.samples -= 1;
                    }
                    *cell = Some(Cell::F(value));
                    continue;
                }
                let extra = fb_extra.entry(row).or_default();
                if name == FB_FREE {
                    extra.0 = Some(s.value);
                } else {
                    extra.1 = Some(s.value);
                }
                // Also kept in `metrics` below.
            }
            let Some(sid) = series_id else {
                continue;
            };
            let value = s.value;
            match metric_index.get(&(sid, time)) {
                Some(&i) => {
                    stats.duplicates += 1;
                    stats.samples -= 1;
                    metric_rows[i].value = value;
                }
                None => {
                    let mut row_labels: Vec<(String, String)> = Vec::new();
                    for l in &ts.labels {
                        if l.name != "__name__" && !l.value.is_empty() {
                            row_labels.push((l.name.clone(), l.value.clone()));
                        }
                    }
                    row_labels.sort();
                    row_labels.dedup_by(|a, b| a.0 == b.0);
                    metric_index.insert((sid, time), metric_rows.len());
                    metric_rows.push(MetricRow {
                        time,
                        metric: name.to_string(),
                        value,
                        labels: row_labels,
                    });
                }
            }
        }
    }

    // Rows made only for the memory total (free/reserved without any mapped field) are dropped
    // unless they gain a value.
    let used = column_index("memory_used_bytes");
    let total = column_index("memory_total_bytes");
    if let (Some(used), Some(total)) = (used, total) {
        for (&row, &(free, reserved)) in &fb_extra {
            let r = &mut gpu_rows[row];
            if r.values[total].is_some() {
                continue;
            }
            if let (Some(Cell::F(used_bytes)), Some(free)) = (r.values[used], free) {
                let sum = used_bytes + (free + reserved.unwrap_or(0.0)) * MIB;
                r.values[total] = Some(Cell::F(sum));
            }
        }
    }
    gpu_rows.retain(|r| r.values.iter().any(Option::is_some));
    Ok((WriteBatch::from_rows(&gpu_rows, &metric_rows)?, stats))
}

#[cfg(test)]
mod tests;
