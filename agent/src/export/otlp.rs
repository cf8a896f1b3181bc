//! Samples → one OTLP `ExportMetricsServiceRequest`, following docs/schema.md exactly.
//!
//! One `ResourceMetrics` (the host's attributes), one `ScopeMetrics` (`gpuwatch-agent` and the
//! crate version), one `Metric` per metric name that has at least one value, and one data point
//! per GPU sample. Every point of one sample carries the sample's `time_unix_nano` and the GPU's
//! attributes (`hw.id`, `gpu.index`, `hw.model`, `hw.type`, then `gpu.mig.instance` and `job.*`
//! when known), so the server can pivot them back into one `gpu_metrics` row. A `None` value,
//! or a non-finite one, emits no point.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::collect::{GpuEvent, GpuSample, ProcessSample};

mod direct;
pub use direct::encode_collection_to;

/// Instrumentation scope name on every request.
pub const SCOPE_NAME: &str = "gpuwatch-agent";

/// The OpenTelemetry semantic conventions the names follow (the scope's `schema_url`). The
/// server reads `hw.gpu.memory.utilization` by it: with a schema URL it is used/limit (the
/// conventions' meaning), without one an older agent's memory-controller busy time.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.37.0";

/// When this process started (ns since the epoch): the `start_time_unix_nano` of its
/// cumulative sums.
pub fn start_time_unix_nano() -> u64 {
    static START: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    });
    *START
}

/// A metric value, as the column type of `gpu_metrics` wants it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Double(f64),
    Int(i64),
}

/// Gauge, or monotonic cumulative sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A reading at a point in time.
    Gauge,
    /// A counter that only increases (monotonic, cumulative).
    CumulativeSum,
}

/// One OTLP metric of docs/schema.md and how to read it from a sample.
pub struct MetricDef {
    /// OTLP metric name.
    pub name: &'static str,
    /// UCUM unit on the wire.
    pub unit: &'static str,
    /// Gauge or monotonic cumulative sum.
    pub kind: Kind,
    /// Short description.
    pub description: &'static str,
    /// An attribute its points carry beside the GPU's (`error.type` of `hw.errors`); the
    /// definitions of one name follow each other and make one metric.
    pub attr: Option<(&'static str, &'static str)>,
    get: fn(&GpuSample) -> Option<Num>,
}

impl std::fmt::Debug for MetricDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricDef")
            .field("name", &self.name)
            .field("unit", &self.unit)
            .field("kind", &self.kind)
            .finish()
    }
}

const fn gauge(
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    get: fn(&GpuSample) -> Option<Num>,
) -> MetricDef {
    MetricDef {
        name,
        unit,
        kind: Kind::Gauge,
        description,
        attr: None,
        get,
    }
}

const fn sum(
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    get: fn(&GpuSample) -> Option<Num>,
) -> MetricDef {
    MetricDef {
        name,
        unit,
        kind: Kind::CumulativeSum,
        description,
        attr: None,
        get,
    }
}

/// `hw.errors` of one `error.type`.
const fn errors(
    error_type: &'static str,
    description: &'static str,
    get: fn(&GpuSample) -> Option<Num>,
) -> MetricDef {
    MetricDef {
        name: "hw.errors",
        unit: "{error}",
        kind: Kind::CumulativeSum,
        description,
        attr: Some(("error.type", error_type)),
        get,
    }
}

/// `memory_used_bytes / memory_total_bytes`: the conventions' `hw.gpu.memory.utilization`.
fn memory_used_ratio(s: &GpuSample) -> Option<Num> {
    match (s.memory_used_bytes, s.memory_total_bytes) {
        (Some(u), Some(t)) if t > 0 => Some(Num::Double(u as f64 / t as f64)),
        _ => None,
    }
}

/// Every metric of `gpu_metrics`, in schema order (docs/schema.md, "Values").
pub const METRICS: &[MetricDef] = &[
    gauge(
        "hw.gpu.utilization",
        "1",
        "fraction of time a kernel ran",
        |s| s.gpu_utilization.map(Num::Double),
    ),
    gauge(
        "gpu.memory_controller.utilization",
        "1",
        "fraction of time the memory controller was busy",
        |s| s.memory_utilization.map(Num::Double),
    ),
    gauge(
        "hw.gpu.memory.utilization",
        "1",
        "fraction of the GPU memory in use (usage / limit)",
        memory_used_ratio,
    ),
    gauge("gpu.sm.active", "1", "GPM SM activity", |s| {
        s.sm_active.map(Num::Double)
    }),
    gauge("gpu.sm.occupancy", "1", "GPM SM occupancy", |s| {
        s.sm_occupancy.map(Num::Double)
    }),
    gauge("gpu.tensor.active", "1", "GPM tensor pipe activity", |s| {
        s.tensor_active.map(Num::Double)
    }),
    gauge("gpu.dram.active", "1", "GPM DRAM bandwidth activity", |s| {
        s.dram_active.map(Num::Double)
    }),
    gauge("gpu.fp64.active", "1", "GPM FP64 pipe activity", |s| {
        s.fp64_active.map(Num::Double)
    }),
    gauge("gpu.fp32.active", "1", "GPM FP32 pipe activity", |s| {
        s.fp32_active.map(Num::Double)
    }),
    gauge("gpu.fp16.active", "1", "GPM FP16 pipe activity", |s| {
        s.fp16_active.map(Num::Double)
    }),
    gauge(
        "hw.gpu.memory.usage",
        "By",
        "framebuffer memory used",
        |s| s.memory_used_bytes.map(Num::Int),
    ),
    gauge(
        "hw.gpu.memory.limit",
        "By",
        "framebuffer memory installed",
        |s| s.memory_total_bytes.map(Num::Int),
    ),
    gauge("hw.power", "W", "board power draw", |s| {
        s.power_watts.map(Num::Double)
    }),
    sum("hw.energy", "J", "energy since driver load", |s| {
        s.energy_joules.map(Num::Double)
    }),
    gauge("hw.temperature", "Cel", "GPU core temperature", |s| {
        s.temperature_celsius.map(Num::Double)
    }),
    gauge(
        "gpu.graphics.active",
        "1",
        "ratio of time the graphics engine was active (GPM)",
        |s| s.gr_engine_active.map(Num::Double),
    ),
    gauge("gpu.memory.temperature", "Cel", "HBM temperature", |s| {
        s.memory_temperature_celsius.map(Num::Double)
    }),
    gauge("gpu.clock.sm", "MHz", "SM clock", |s| {
        s.sm_clock_mhz.map(Num::Int)
    }),
    gauge("gpu.clock.memory", "MHz", "memory clock", |s| {
        s.memory_clock_mhz.map(Num::Int)
    }),
    gauge(
        "gpu.clock.event_reasons",
        "1",
        "NVML clocks-event-reasons bitmask",
        |s| s.clock_event_reasons.map(Num::Int),
    ),
    gauge(
        "gpu.pcie.transmit.rate",
        "By/s",
        "PCIe bytes sent per second",
        |s| s.pcie_tx_bytes_per_second.map(Num::Double),
    ),
    gauge(
        "gpu.pcie.receive.rate",
        "By/s",
        "PCIe bytes received per second",
        |s| s.pcie_rx_bytes_per_second.map(Num::Double),
    ),
    gauge(
        "gpu.nvlink.transmit.rate",
        "By/s",
        "NVLink bytes sent per second",
        |s| s.nvlink_tx_bytes_per_second.map(Num::Double),
    ),
    gauge(
        "gpu.nvlink.receive.rate",
        "By/s",
        "NVLink bytes received per second",
        |s| s.nvlink_rx_bytes_per_second.map(Num::Double),
    ),
    errors("corrected", "ECC errors since driver load", |s| {
        s.ecc_sbe_volatile_total.map(Num::Int)
    }),
    errors("uncorrected", "ECC errors since driver load", |s| {
        s.ecc_dbe_volatile_total.map(Num::Int)
    }),
    gauge(
        "gpu.remapped_rows.uncorrectable",
        "{row}",
        "rows remapped for uncorrectable errors",
        |s| s.remapped_rows_uncorrectable.map(Num::Int),
    ),
    gauge(
        "gpu.remapped_rows.failure",
        "1",
        "1 when a row remapping failed",
        |s| s.remapped_rows_failure.map(Num::Int),
    ),
    sum(
        "gpu.xid.errors",
        "{error}",
        "XID errors since agent start",
        |s| s.xid_errors_total.map(Num::Int),
    ),
    gauge("gpu.clock.sm.max", "MHz", "maximum SM clock", |s| {
        s.sm_clock_max_mhz.map(Num::Int)
    }),
    gauge(
        "gpu.pcie.link.generation",
        "1",
        "current PCIe link generation",
        |s| s.pcie_link_gen.map(Num::Int),
    ),
    gauge(
        "gpu.pcie.link.width",
        "{lane}",
        "current PCIe link width",
        |s| s.pcie_link_width.map(Num::Int),
    ),
];

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

fn int_kv(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// The attributes every point of one GPU sample carries.
fn point_attributes(s: &GpuSample) -> Vec<KeyValue> {
    let mut attrs = vec![
        string_kv("hw.id", &s.gpu_uuid),
        int_kv("gpu.index", i64::from(s.gpu_index)),
        string_kv("hw.model", &s.gpu_model),
        string_kv("hw.type", "gpu"),
    ];
    if let Some(mig) = &s.mig_instance {
        attrs.push(string_kv("gpu.mig.instance", mig));
    }
    push_job(&mut attrs, s.job.as_ref());
    attrs
}

/// `job.*` attributes; an unknown user or name (empty) is left out rather than sent empty.
fn push_job(attrs: &mut Vec<KeyValue>, job: Option<&crate::collect::JobLabels>) {
    let Some(job) = job else {
        return;
    };
    attrs.push(string_kv("job.id", &job.id));
    if !job.user.is_empty() {
        attrs.push(string_kv("job.user", &job.user));
    }
    if !job.name.is_empty() {
        attrs.push(string_kv("job.name", &job.name));
    }
    attrs.push(string_kv("job.scheduler", &job.scheduler));
    if let Some(k8s) = &job.k8s {
        attrs.push(string_kv("k8s.namespace.name", &k8s.namespace));
        attrs.push(string_kv("k8s.pod.name", &k8s.pod));
        if !k8s.container.is_empty() {
            attrs.push(string_kv("k8s.container.name", &k8s.container));
        }
    }
    for (k, v) in job.extra.attributes() {
        attrs.push(match v {
            crate::collect::ExtraValue::Str(v) => string_kv(&k, v),
            crate::collect::ExtraValue::Int(v) => int_kv(&k, v),
        });
    }
}

/// Metric name of a process's GPU memory (`gpu_processes.used_memory_bytes`).
pub const PROCESS_MEMORY_METRIC: &str = "gpu.process.memory.usage";
/// Metric name of a process's SM utilisation (`gpu_processes.sm_utilization`).
pub const PROCESS_SM_METRIC: &str = "gpu.process.sm.utilization";

/// The attributes of one process's points: the GPU (`hw.id`, `gpu.index`), `process.pid`,
/// `process.executable.name`, and the job.
fn process_attributes(p: &ProcessSample) -> Vec<KeyValue> {
    let mut attrs = vec![
        string_kv("hw.id", &p.gpu_uuid),
        int_kv("gpu.index", i64::from(p.gpu_index)),
        int_kv("process.pid", i64::from(p.pid)),
    ];
    if let Some(name) = &p.process_name {
        attrs.push(string_kv("process.executable.name", name));
    }
    push_job(&mut attrs, p.job.as_ref());
    attrs
}

/// `gpu.process.memory.usage` (By, int) and `gpu.process.sm.utilization` (ratio) gauges, one
/// point per process and value known.
pub fn process_metrics(procs: &[ProcessSample]) -> Vec<Metric> {
    let mut memory = Vec::new();
    let mut sm = Vec::new();
    for p in procs {
        let attrs = process_attributes(p);
        if let Some(m) = p.used_memory_bytes {
            memory.push(NumberDataPoint {
                attributes: attrs.clone(),
                time_unix_nano: p.time_unix_nano,
                value: Some(number_data_point::Value::AsInt(m)),
                ..Default::default()
            });
        }
        if let Some(u) = p.sm_utilization.filter(|u| u.is_finite()) {
            sm.push(NumberDataPoint {
                attributes: attrs,
                time_unix_nano: p.time_unix_nano,
                value: Some(number_data_point::Value::AsDouble(u)),
                ..Default::default()
            });
        }
    }
    let mut out = Vec::new();
    for (name, unit, description, points) in [
        (
            PROCESS_MEMORY_METRIC,
            "By",
            "GPU memory used by the process",
            memory,
        ),
        (
            PROCESS_SM_METRIC,
            "1",
            "fraction of the GPU's SM time the process used",
            sm,
        ),
    ] {
        if points.is_empty() {
            continue;
        }
        out.push(Metric {
            name: name.to_string(),
            description: description.to_string(),
            unit: unit.to_string(),
            data: Some(metric::Data::Gauge(Gauge {
                data_points: points,
            })),
            ..Default::default()
        });
    }
    out
}

/// Metric name of a GPU event (`gpu_events`): one point per event, value = the XID (0 for ECC).
pub const EVENT_METRIC: &str = "gpu.event";

/// `gpu.event` gauge points, one per event, with `hw.id`, `gpu.index`, `gpu.event.kind` and
/// `gpu.event.detail`; the value is the event's code.
pub fn event_metrics(events: &[GpuEvent]) -> Vec<Metric> {
    if events.is_empty() {
        return Vec::new();
    }
    let points = events
        .iter()
        .map(|e| NumberDataPoint {
            attributes: vec![
                string_kv("hw.id", &e.gpu_uuid),
                int_kv("gpu.index", i64::from(e.gpu_index)),
                string_kv("gpu.event.kind", &e.kind),
                string_kv("gpu.event.detail", &e.detail),
            ],
            time_unix_nano: e.time_unix_nano,
            value: Some(number_data_point::Value::AsInt(e.code)),
            ..Default::default()
        })
        .collect();
    vec![Metric {
        name: EVENT_METRIC.to_string(),
        description: "a GPU event (XID, ECC); the value is the XID number, 0 for ECC".to_string(),
        unit: "1".to_string(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: points,
        })),
        ..Default::default()
    }]
}

/// [`encode`] plus the processes' metrics ([`process_metrics`]) and the events
/// ([`event_metrics`]) in the same request.
pub fn encode_collection(
    samples: &[GpuSample],
    procs: &[ProcessSample],
    events: &[GpuEvent],
    resource: &[(String, String)],
) -> ExportMetricsServiceRequest {
    let mut req = encode(samples, resource);
    let mut extra = process_metrics(procs);
    extra.extend(event_metrics(events));
    if let Some(scope) = req
        .resource_metrics
        .first_mut()
        .and_then(|r| r.scope_metrics.first_mut())
    {
        scope.metrics.extend(extra);
    }
    req
}

/// Encode `samples` as one OTLP request with `resource` as the resource attributes (at least
/// `host.name`; see [`crate::resource_attributes`]).
pub fn encode(samples: &[GpuSample], resource: &[(String, String)]) -> ExportMetricsServiceRequest {
    let attributes: Vec<Vec<KeyValue>> = samples.iter().map(point_attributes).collect();
    let mut metrics: Vec<Metric> = Vec::with_capacity(METRICS.len());
    let start = start_time_unix_nano();
    for def in METRICS {
        let points: Vec<NumberDataPoint> = samples
            .iter()
            .zip(&attributes)
            .filter_map(|(s, attrs)| {
                let value = match (def.get)(s)? {
                    Num::Double(x) if x.is_finite() => number_data_point::Value::AsDouble(x),
                    Num::Double(_) => return None,
                    Num::Int(i) => number_data_point::Value::AsInt(i),
                };
                let mut attributes = attrs.clone();
                if let Some((k, v)) = def.attr {
                    attributes.push(string_kv(k, v));
                }
                Some(NumberDataPoint {
                    attributes,
                    start_time_unix_nano: if def.kind == Kind::CumulativeSum {
                        start
                    } else {
                        0
                    },
                    time_unix_nano: s.time_unix_nano,
                    value: Some(value),
                    ..Default::default()
                })
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        // A second definition of the same name (another `error.type`) adds to its metric.
        if let Some(last) = metrics.last_mut().filter(|m| m.name == def.name)
            && let Some(metric::Data::Sum(sum)) = last.data.as_mut()
        {
            sum.data_points.extend(points);
            continue;
        }
        let data = match def.kind {
            Kind::Gauge => metric::Data::Gauge(Gauge {
                data_points: points,
            }),
            Kind::CumulativeSum => metric::Data::Sum(Sum {
                data_points: points,
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            }),
        };
        metrics.push(Metric {
            name: def.name.to_string(),
            description: def.description.to_string(),
            unit: def.unit.to_string(),
            data: Some(data),
            ..Default::default()
        });
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| string_kv(k, v)).collect(),
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                metrics,
                schema_url: SCHEMA_URL.to_string(),
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests;
