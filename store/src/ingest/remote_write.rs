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

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message;

use super::rows::{self, Cell, WriteBatch};
use crate::schema::{LABEL_COLUMNS, Table, VALUE_COLUMNS};
use crate::{Error, Result};

mod wire;

pub use wire::{SampleView, SeriesView, WriteRequestView};

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

use proto::WriteRequest;

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
    d("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active", 1.0),
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
    d("DCGM_FI_DEV_MAX_SM_CLOCK", "sm_clock_max_mhz", 1.0),
    d("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_link_gen", 1.0),
    d("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_link_width", 1.0),
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
    // dcgm-exporter has no chargeback labels: these stay null for remote write.
    ("job_account", &[]),
    ("job_partition", &[]),
    ("job_qos", &[]),
    ("job_array_id", &[]),
    ("job_array_task_id", &[]),
    ("job_time_limit_seconds", &[]),
    ("job_labels", &[]),
];

/// The label columns [`dcgm_label_set`] reads: a reader that wants only dcgm-exporter's labels
/// of a row may leave the others out (as nulls).
pub const DCGM_LABEL_COLUMNS: &[&str] = &[
    "host",
    "gpu_uuid",
    "gpu_index",
    "gpu_model",
    "mig_instance",
    "job_id",
    "k8s_namespace",
    "k8s_pod",
    "k8s_container",
];

/// dcgm-exporter's labels of a `gpu_metrics` row, from its label columns (in [`LABEL_COLUMNS`]
/// order, `gpu_index` as decimal text): `gpu`, `UUID`, `device` (`nvidia<gpu>`), `modelName`,
/// `Hostname`, `GPU_I_ID` (the GPU instance of `mig_instance`), then `namespace`, `pod` and
/// `container` when a pod holds the GPU, else `hpc_job` when a job does. Empty values are left
/// out. This is the label set the agent's `/metrics` writes, so PromQL answers a row sent over
/// OTLP with it; a row written by remote write keeps, in its `series_labels` column, how its series'
/// labels differ from it ([`series_overrides`]).
pub fn dcgm_label_set(cols: &[Option<&str>]) -> Vec<(&'static str, String)> {
    let at = |name: &str| {
        debug_assert!(DCGM_LABEL_COLUMNS.contains(&name), "{name} is not declared");
        LABEL_COLUMNS
            .iter()
            .position(|(c, _)| *c == name)
            .and_then(|i| cols.get(i).copied().flatten())
            .filter(|v| !v.is_empty())
    };
    let mut out: Vec<(&'static str, String)> = Vec::with_capacity(9);
    let mut push = |name: &'static str, v: Option<&str>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push((name, v.to_string()));
        }
    };
    let index = at("gpu_index");
    push("gpu", index);
    push("UUID", at("gpu_uuid"));
    push("device", index.map(|i| format!("nvidia{i}")).as_deref());
    push("modelName", at("gpu_model"));
    push("Hostname", at("host"));
    let gi = at("mig_instance").and_then(|m| m.split('.').next());
    push(
        "GPU_I_ID",
        gi.filter(|g| g.bytes().all(|b| b.is_ascii_digit())),
    );
    if at("k8s_pod").is_some() {
        push("namespace", at("k8s_namespace"));
        push("pod", at("k8s_pod"));
        push("container", at("k8s_container"));
    } else {
        push("hpc_job", at("job_id"));
    }
    out
}

/// How a series' labels (without `__name__`) differ from the [`dcgm_label_set`] of its row's
/// columns, sorted by name: each label the set lacks or holds with another value, and each label
/// of the set the series does not have, with an empty value. [`dcgm_label_set`] with these
/// applied (and empty values dropped) is the series' label set again.
pub fn series_overrides<'a>(
    labels: &[(&'a str, &'a str)],
    cols: &[Option<&str>],
) -> Vec<(&'a str, &'a str)> {
    let synth = dcgm_label_set(cols);
    let mut own: Vec<(&'a str, &'a str)> = labels
        .iter()
        .copied()
        .filter(|(n, v)| *n != "__name__" && !v.is_empty())
        .collect();
    own.sort_by_key(|l| l.0);
    own.dedup_by(|later, first| later.0 == first.0);
    let mut out: Vec<(&'a str, &'a str)> = own
        .iter()
        .copied()
        .filter(|(n, v)| !synth.iter().any(|(sn, sv)| sn == n && sv == v))
        .collect();
    for (name, _) in &synth {
        if !own.iter().any(|(n, _)| n == name) {
            out.push((name, ""));
        }
    }
    out.sort_by_key(|l| l.0);
    out
}

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
    decompress_within(content_encoding, body, max_bytes, &mut super::Unbounded)
}

/// [`decompress`], asking `budget` for room for the inflated body (its length is in the
/// snappy header) before it is inflated.
pub fn decompress_within(
    content_encoding: Option<&str>,
    body: &[u8],
    max_bytes: usize,
    budget: &mut dyn super::DecodeBudget,
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
    budget.inflated(len)?;
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
    let encoding = super::http::Encoding {
        content_type,
        content_encoding,
        max_decoded_bytes,
    };
    decode_request_within(&encoding, body, now, &mut super::Unbounded)
}

/// [`decode_request`] within a memory budget: room for the inflated body and what decoding
/// it builds is asked for before it is inflated.
pub fn decode_request_within(
    encoding: &super::http::Encoding<'_>,
    body: &[u8],
    now: i64,
    budget: &mut dyn super::DecodeBudget,
) -> Result<(WriteBatch, RemoteWriteStats)> {
    check_content_type(encoding.content_type)?;
    let raw = decompress_within(
        encoding.content_encoding,
        body,
        encoding.max_decoded_bytes,
        budget,
    )?;
    let req = WriteRequestView::decode(&raw)?;
    view_to_write_batch(&req, now)
}

fn column_index(column: &str) -> Option<usize> {
    VALUE_COLUMNS.iter().position(|c| c.column == column)
}

/// The time of a sample in ns, or `None` when it is out of the accepted range.
fn sample_time(ms: i64, now: i64) -> Option<i64> {
    if ms < 0 {
        return None;
    }
    let ns = ms.checked_mul(1_000_000)?;
    (ns <= now.saturating_add(MAX_FUTURE)).then_some(ns)
}

/// Decodes a (decompressed) protobuf `WriteRequest` without copying its strings.
pub fn decode_view(raw: &[u8]) -> Result<WriteRequestView<'_>> {
    WriteRequestView::decode(raw)
}

/// Turns a request into rows. `now` (ns) bounds how far in the future a sample may be.
pub fn to_write_batch(req: &WriteRequest, now: i64) -> Result<(WriteBatch, RemoteWriteStats)> {
    view_to_write_batch(&WriteRequestView::from_request(req), now)
}

const NL: usize = LABEL_COLUMNS.len();
const NV: usize = VALUE_COLUMNS.len();

/// The `gpu_metrics` label values of one series, in [`LABEL_COLUMNS`] order.
type GpuLabels<'a> = [Option<&'a str>; NL];

/// Lookup tables built once: metric name → dcgm field, label name → (label column, rank).
struct Tables {
    fields: HashMap<&'static str, (f64, usize)>,
    labels: Vec<(&'static str, usize, usize)>,
    host: usize,
    uuid: usize,
    mig: usize,
    job: usize,
    pod: usize,
    scheduler: usize,
    memory_used: usize,
    memory_total: usize,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let label_col = |name: &str| {
            LABEL_COLUMNS
                .iter()
                .position(|(c, _)| *c == name)
                .unwrap_or_else(|| panic!("gpu_metrics has no label column {name}"))
        };
        let value_col = |name: &str| {
            column_index(name).unwrap_or_else(|| panic!("gpu_metrics has no column {name}"))
        };
        let mut fields = HashMap::new();
        for f in DCGM_FIELDS {
            fields
                .entry(f.name)
                .or_insert((f.scale, value_col(f.column)));
        }
        let mut labels = Vec::new();
        for (column, names) in DCGM_LABELS {
            let col = label_col(column);
            for (rank, name) in names.iter().enumerate() {
                labels.push((*name, col, rank));
            }
        }
        Tables {
            fields,
            labels,
            host: label_col("host"),
            uuid: label_col("gpu_uuid"),
            mig: label_col("mig_instance"),
            job: label_col("job_id"),
            pod: label_col("k8s_pod"),
            scheduler: label_col("scheduler"),
            memory_used: value_col("memory_used_bytes"),
            memory_total: value_col("memory_total_bytes"),
        }
    })
}

/// What the labels of one series say for `gpu_metrics`.
struct SeriesLabels<'a> {
    name: Option<&'a str>,
    uuid: Option<&'a str>,
    /// The label columns (`host` and `scheduler` filled in too).
    gpu: GpuLabels<'a>,
}

/// Reads a series' labels in one pass. A label with an empty value counts as absent; of two
/// labels for the same column the one earlier in [`DCGM_LABELS`] wins, then the first sent.
fn series_labels<'a>(t: &Tables, labels: &[(&'a str, &'a str)]) -> SeriesLabels<'a> {
    let mut out = SeriesLabels {
        name: None,
        uuid: None,
        gpu: [None; NL],
    };
    let mut rank = [usize::MAX; NL];
    let mut instance = None;
    for &(n, v) in labels {
        if v.is_empty() {
            continue;
        }
        match n {
            "__name__" => {
                out.name.get_or_insert(v);
                continue;
            }
            "instance" => {
                instance.get_or_insert(v);
                continue;
            }
            _ => {}
        }
        for &(ln, col, r) in &t.labels {
            if ln == n && r < rank[col] {
                rank[col] = r;
                out.gpu[col] = Some(v);
            }
        }
    }
    out.uuid = out.gpu[t.uuid];
    // The host: `Hostname`, else the scrape `instance` without its port, else empty.
    if out.gpu[t.host].is_none() {
        out.gpu[t.host] = Some(instance.map_or("", strip_port));
    }
    out.gpu[t.scheduler] = if out.gpu[t.job].is_some() {
        Some("slurm")
    } else if out.gpu[t.pod].is_some() {
        Some("kubernetes")
    } else {
        None
    };
    out
}

/// `host:port` → `host` (and `[v6]:port` → `v6`); anything else unchanged.
fn strip_port(instance: &str) -> &str {
    match instance.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => {
            host.trim_start_matches('[').trim_end_matches(']')
        }
        _ => instance,
    }
}

/// A GPU seen in the request: its rows in the order they were made.
#[derive(Default)]
struct GpuRows {
    rows: Vec<u32>,
}

/// The `gpu_metrics` rows of one request being filled.
struct GpuTable<'a> {
    /// (host, uuid, MIG instance) → index into `gpus`.
    ids: HashMap<(&'a str, &'a str, Option<&'a str>), u32>,
    gpus: Vec<GpuRows>,
    /// (GPU, time) → position in that GPU's `rows`.
    index: HashMap<(u32, i64), u32>,
    times: Vec<i64>,
    /// Per row, the label set of the series that made it.
    label_of: Vec<u32>,
    label_sets: Vec<GpuLabels<'a>>,
    /// Per label set, its series' labels beside the columns ([`series_overrides`]) as the JSON
    /// text of `series_labels`, `None` when there are none.
    label_extra: Vec<Option<String>>,
    /// `NV` cells per row.
    values: Vec<Option<f64>>,
}

impl<'a> GpuTable<'a> {
    fn new() -> Self {
        Self {
            ids: HashMap::new(),
            gpus: Vec::new(),
            index: HashMap::new(),
            times: Vec::new(),
            label_of: Vec::new(),
            label_sets: Vec::new(),
            label_extra: Vec::new(),
            values: Vec::new(),
        }
    }

    fn gpu(&mut self, t: &Tables, labels: &GpuLabels<'a>) -> u32 {
        let key = (
            labels[t.host].unwrap_or_default(),
            labels[t.uuid].unwrap_or_default(),
            labels[t.mig],
        );
        let next = self.gpus.len() as u32;
        let id = *self.ids.entry(key).or_insert(next);
        if id == next {
            self.gpus.push(GpuRows::default());
        }
        id
    }

    /// The row of `gpu` at `time`, made (with the series' labels) when there is none. `cursor`
    /// is where the series expects its next row in the GPU's rows: the series of one GPU
    /// usually carry the same timestamps, so the lookup mostly needs no hashing.
    fn row(
        &mut self,
        gpu: u32,
        time: i64,
        cursor: &mut usize,
        label_set: &mut Option<u32>,
        labels: &GpuLabels<'a>,
        series: &[(&'a str, &'a str)],
    ) -> usize {
        let rows = &self.gpus[gpu as usize].rows;
        if let Some(&r) = rows.get(*cursor)
            && self.times[r as usize] == time
        {
            *cursor += 1;
            return r as usize;
        }
        let next_pos = rows.len() as u32;
        let pos = *self.index.entry((gpu, time)).or_insert(next_pos);
        *cursor = pos as usize + 1;
        if pos != next_pos {
            return self.gpus[gpu as usize].rows[pos as usize] as usize;
        }
        let row = self.times.len();
        let set = *label_set.get_or_insert_with(|| {
            self.label_sets.push(*labels);
            let extra = series_overrides(series, labels);
            self.label_extra
                .push((!extra.is_empty()).then(|| rows::series_labels_json(extra.iter().copied())));
            (self.label_sets.len() - 1) as u32
        });
        self.times.push(time);
        self.label_of.push(set);
        self.values.extend_from_slice(&[None; NV]);
        self.gpus[gpu as usize].rows.push(row as u32);
        row
    }

    fn cell(&mut self, row: usize, col: usize) -> &mut Option<f64> {
        &mut self.values[row * NV + col]
    }
}

/// The `metrics` facts of one series, worked out at its first stored sample.
struct MetricSeries<'a> {
    name: &'a str,
    /// Labels without `__name__` and empty values, sorted, one per name.
    labels: Vec<(&'a str, &'a str)>,
    id: u32,
}

/// Turns a decoded request into rows. `now` (ns) bounds how far in the future a sample may be.
pub fn view_to_write_batch(
    req: &WriteRequestView<'_>,
    now: i64,
) -> Result<(WriteBatch, RemoteWriteStats)> {
    let t = tables();
    let mut stats = RemoteWriteStats::default();
    let mut gpu = GpuTable::new();
    // (row, free MiB, reserved MiB) for the memory total of rows without DCGM_FI_DEV_FB_TOTAL.
    let mut fb_extra: HashMap<usize, (Option<f64>, Option<f64>)> = HashMap::new();
    let mut metrics = MetricTable::default();

    for ts in req.series() {
        stats.series += 1;
        let sl = series_labels(t, ts.labels);
        let Some(name) = sl.name else {
            stats.unnamed += ts.samples.len() as u64;
            continue;
        };
        let gpu_target = match sl.uuid {
            Some(_) => t.fields.get(name).copied(),
            None => None,
        };
        let fb_side = sl.uuid.is_some() && (name == FB_FREE || name == FB_RESERVED);
        let gpu_id = (gpu_target.is_some() || fb_side).then(|| gpu.gpu(t, &sl.gpu));
        let mut cursor = 0usize;
        let mut label_set: Option<u32> = None;
        // Index into `metrics.series`, made at the first sample that needs it.
        let mut metric: Option<u32> = None;
        for s in ts.samples {
            let Some(time) = kept_sample_time(s.value, s.timestamp, now, &mut stats) else {
                continue;
            };
            if let Some(g) = gpu_id {
                let row = gpu.row(g, time, &mut cursor, &mut label_set, &sl.gpu, ts.labels);
                if let Some((scale, col)) = gpu_target {
                    stats.gpu_samples += 1;
                    let cell = gpu.cell(row, col);
                    if cell.is_some() {
                        stats.duplicates += 1;
                        stats.samples -= 1;
                    }
                    *cell = Some(s.value * scale);
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
            let m = *metric.get_or_insert_with(|| metrics.series_of(name, ts.labels));
            metrics.push(m, time, s.value, &mut stats);
        }
    }
    fill_memory_totals(&mut gpu, t, &fb_extra);
    Ok((finish(&gpu, &metrics)?, stats))
}

/// The time of a sample that is kept, or `None` (counted in `stats`) for a stale marker, a
/// value that is not finite or a time out of range.
#[inline]
fn kept_sample_time(
    value: f64,
    timestamp: i64,
    now: i64,
    stats: &mut RemoteWriteStats,
) -> Option<i64> {
    if value.to_bits() == STALE_NAN_BITS {
        stats.stale += 1;
        return None;
    }
    if !value.is_finite() {
        stats.non_finite += 1;
        return None;
    }
    let Some(time) = sample_time(timestamp, now) else {
        stats.out_of_range += 1;
        return None;
    };
    stats.samples += 1;
    Some(time)
}

/// The `metrics` rows of a request: (time, series, value), and the series they came from.
#[derive(Default)]
struct MetricTable<'a> {
    rows: Vec<(i64, u32, f64)>,
    series: Vec<MetricSeries<'a>>,
    /// (series id, time) → index into `rows`.
    index: HashMap<(u32, i64), usize>,
    ids: HashMap<(&'a str, Vec<(&'a str, &'a str)>), u32>,
}

impl<'a> MetricTable<'a> {
    /// A new entry of `series` for the series `name` with `labels`; its index.
    fn series_of(&mut self, name: &'a str, labels: &[(&'a str, &'a str)]) -> u32 {
        let ms = metric_series_of(name, labels, &mut self.ids);
        self.series.push(ms);
        (self.series.len() - 1) as u32
    }

    /// A sample of series `m`; a second one at the same time replaces the first (a duplicate).
    #[inline]
    fn push(&mut self, m: u32, time: i64, value: f64, stats: &mut RemoteWriteStats) {
        let sid = self.series[m as usize].id;
        match self.index.get(&(sid, time)) {
            Some(&i) => {
                stats.duplicates += 1;
                stats.samples -= 1;
                self.rows[i].2 = value;
            }
            None => {
                self.index.insert((sid, time), self.rows.len());
                self.rows.push((time, m, value));
            }
        }
    }
}

/// The memory total of rows without `DCGM_FI_DEV_FB_TOTAL`: used + free + reserved. Rows made
/// only for it (free/reserved without any mapped field) are dropped later unless they gain a
/// value.
fn fill_memory_totals(
    gpu: &mut GpuTable<'_>,
    t: &Tables,
    fb_extra: &HashMap<usize, (Option<f64>, Option<f64>)>,
) {
    for (&row, &(free, reserved)) in fb_extra {
        if gpu.cell(row, t.memory_total).is_some() {
            continue;
        }
        if let (Some(used_bytes), Some(free)) = (*gpu.cell(row, t.memory_used), free) {
            let sum = used_bytes + (free + reserved.unwrap_or(0.0)) * MIB;
            *gpu.cell(row, t.memory_total) = Some(sum);
        }
    }
}

/// The record batches: `gpu_metrics` rows with a value, then `metrics` rows.
fn finish(gpu: &GpuTable<'_>, metrics: &MetricTable<'_>) -> Result<WriteBatch> {
    let kept: Vec<usize> = (0..gpu.times.len())
        .filter(|&r| gpu.values[r * NV..(r + 1) * NV].iter().any(Option::is_some))
        .collect();
    let mut batches = Vec::new();
    if !kept.is_empty() {
        let rb = rows::gpu_batch_with(
            kept.len(),
            |i| gpu.times[kept[i]],
            |i, c| gpu.label_sets[gpu.label_of[kept[i]] as usize][c],
            |i, c| gpu.values[kept[i] * NV + c].map(Cell::F),
            |i| gpu.label_extra[gpu.label_of[kept[i]] as usize].as_deref(),
            |_| None,
        )?;
        batches.push((Table::GpuMetrics, rb));
    }
    if !metrics.rows.is_empty() {
        let mut b = rows::MetricsBatchBuilder::with_capacity(metrics.rows.len());
        for &(time, m, value) in &metrics.rows {
            let ms = &metrics.series[m as usize];
            b.append(time, ms.name, value, ms.labels.iter().copied())?;
        }
        batches.push((Table::Metrics, b.finish()?));
    }
    Ok(WriteBatch { batches })
}

/// The identity and row labels of a series bound for `metrics`. Series with the same name and
/// labels (the last value of a repeated label name counting) share an id, so that a repeated
/// timestamp across them is a duplicate; the row keeps, of a repeated name, the smallest value.
fn metric_series_of<'a>(
    name: &'a str,
    labels: &[(&'a str, &'a str)],
    ids: &mut HashMap<(&'a str, Vec<(&'a str, &'a str)>), u32>,
) -> MetricSeries<'a> {
    let kept = labels
        .iter()
        .copied()
        .filter(|(n, v)| *n != "__name__" && !v.is_empty());
    // Identity: sorted by name (stable), the last of a repeated name.
    let mut key: Vec<(&str, &str)> = kept.clone().collect();
    key.sort_by_key(|l| l.0);
    let mut identity: Vec<(&str, &str)> = Vec::with_capacity(key.len());
    for l in &key {
        match identity.last_mut() {
            Some(last) if last.0 == l.0 => *last = *l,
            _ => identity.push(*l),
        }
    }
    let mut row: Vec<(&str, &str)> = kept.collect();
    row.sort_unstable();
    row.dedup_by(|a, b| a.0 == b.0);
    let next = ids.len() as u32;
    let id = *ids.entry((name, identity)).or_insert(next);
    MetricSeries {
        name,
        labels: row,
        id,
    }
}

#[cfg(test)]
mod tests;
