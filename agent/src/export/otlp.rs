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

/// Instrumentation scope name on every request.
pub const SCOPE_NAME: &str = "gpuwatch-agent";

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
        get,
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
        "hw.gpu.memory.utilization",
        "1",
        "fraction of time the memory controller was busy",
        |s| s.memory_utilization.map(Num::Double),
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
    sum(
        "gpu.ecc.sbe.volatile",
        "{error}",
        "corrected ECC errors since driver load",
        |s| s.ecc_sbe_volatile_total.map(Num::Int),
    ),
    sum(
        "gpu.ecc.dbe.volatile",
        "{error}",
        "uncorrected ECC errors since driver load",
        |s| s.ecc_dbe_volatile_total.map(Num::Int),
    ),
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
    let mut metrics = Vec::with_capacity(METRICS.len());
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
                Some(NumberDataPoint {
                    attributes: attrs.clone(),
                    time_unix_nano: s.time_unix_nano,
                    value: Some(value),
                    ..Default::default()
                })
            })
            .collect();
        if points.is_empty() {
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
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// [`encode_collection`] written straight to protobuf bytes, appended to `out`: the same
/// request, field for field (a test decodes one and compares it with the other), without
/// building the message tree first.
///
/// Building the tree means a few hundred small allocations per GPU and tick (every point owns a
/// copy of its GPU's attributes, every metric its name, unit and description), then walking it
/// to encode and freeing it: a fifth of the agent's own CPU per tick. Here each GPU's
/// attributes are encoded once and copied as bytes into each of its points, and nothing is
/// allocated but `out`'s growth.
pub fn encode_collection_to(
    out: &mut Vec<u8>,
    samples: &[GpuSample],
    procs: &[ProcessSample],
    events: &[GpuEvent],
    resource: &[(String, String)],
) {
    use wire::*;
    // Each GPU's point attributes, as `attributes` fields (7) of a NumberDataPoint.
    let mut gpu_attrs: Vec<u8> = Vec::with_capacity(samples.len() * 160);
    let mut gpu_attr_end = Vec::with_capacity(samples.len());
    for s in samples {
        write_point_attributes(&mut gpu_attrs, s);
        gpu_attr_end.push(gpu_attrs.len());
    }
    let gpu_attr = |i: usize| {
        let start = if i == 0 { 0 } else { gpu_attr_end[i - 1] };
        &gpu_attrs[start..gpu_attr_end[i]]
    };
    // ExportMetricsServiceRequest.resource_metrics (1)
    message(out, 1, |out| {
        // ResourceMetrics.resource (1): Resource.attributes (1)
        message(out, 1, |out| {
            for (k, v) in resource {
                message(out, 1, |out| string_key_value(out, k, v));
            }
        });
        // ResourceMetrics.scope_metrics (2)
        message(out, 2, |out| {
            // ScopeMetrics.scope (1): name (1), version (2)
            message(out, 1, |out| {
                string(out, 1, SCOPE_NAME);
                string(out, 2, env!("CARGO_PKG_VERSION"));
            });
            for def in METRICS {
                let value = |s: &GpuSample| match (def.get)(s)? {
                    Num::Double(x) if x.is_finite() => Some(Num::Double(x)),
                    Num::Double(_) => None,
                    Num::Int(i) => Some(Num::Int(i)),
                };
                if !samples.iter().any(|s| value(s).is_some()) {
                    continue;
                }
                // ScopeMetrics.metrics (2)
                message(out, 2, |out| {
                    metric_header(out, def.name, def.description, def.unit);
                    let data_field = match def.kind {
                        Kind::Gauge => 5,
                        Kind::CumulativeSum => 7,
                    };
                    message(out, data_field, |out| {
                        for (i, s) in samples.iter().enumerate() {
                            if let Some(v) = value(s) {
                                point(out, gpu_attr(i), s.time_unix_nano, v);
                            }
                        }
                        if def.kind == Kind::CumulativeSum {
                            // Sum.aggregation_temporality (2), Sum.is_monotonic (3)
                            varint_field(out, 2, AggregationTemporality::Cumulative as u64);
                            varint_field(out, 3, 1);
                        }
                    });
                });
            }
            write_process_metrics(out, procs);
            write_event_metrics(out, events);
        });
    });
}

/// A GPU's point attributes, as [`point_attributes`] lists them, as NumberDataPoint fields.
fn write_point_attributes(out: &mut Vec<u8>, s: &GpuSample) {
    use wire::*;
    message(out, 7, |out| string_key_value(out, "hw.id", &s.gpu_uuid));
    message(out, 7, |out| {
        int_key_value(out, "gpu.index", i64::from(s.gpu_index))
    });
    message(out, 7, |out| {
        string_key_value(out, "hw.model", &s.gpu_model)
    });
    message(out, 7, |out| string_key_value(out, "hw.type", "gpu"));
    if let Some(mig) = &s.mig_instance {
        message(out, 7, |out| string_key_value(out, "gpu.mig.instance", mig));
    }
    write_job(out, s.job.as_ref());
}

/// [`push_job`] as NumberDataPoint `attributes` fields.
fn write_job(out: &mut Vec<u8>, job: Option<&crate::collect::JobLabels>) {
    use wire::*;
    let Some(job) = job else {
        return;
    };
    let mut attr = |k: &str, v: &str| message(out, 7, |out| string_key_value(out, k, v));
    attr("job.id", &job.id);
    if !job.user.is_empty() {
        attr("job.user", &job.user);
    }
    if !job.name.is_empty() {
        attr("job.name", &job.name);
    }
    attr("job.scheduler", &job.scheduler);
    if let Some(k8s) = &job.k8s {
        attr("k8s.namespace.name", &k8s.namespace);
        attr("k8s.pod.name", &k8s.pod);
        if !k8s.container.is_empty() {
            attr("k8s.container.name", &k8s.container);
        }
    }
}

/// [`process_metrics`] as ScopeMetrics `metrics` fields.
fn write_process_metrics(out: &mut Vec<u8>, procs: &[ProcessSample]) {
    use wire::*;
    let mut attrs = Vec::new();
    let attributes = |attrs: &mut Vec<u8>, p: &ProcessSample| {
        attrs.clear();
        message(attrs, 7, |out| string_key_value(out, "hw.id", &p.gpu_uuid));
        message(attrs, 7, |out| {
            int_key_value(out, "gpu.index", i64::from(p.gpu_index))
        });
        message(attrs, 7, |out| {
            int_key_value(out, "process.pid", i64::from(p.pid))
        });
        if let Some(name) = &p.process_name {
            message(attrs, 7, |out| {
                string_key_value(out, "process.executable.name", name)
            });
        }
        write_job(attrs, p.job.as_ref());
    };
    if procs.iter().any(|p| p.used_memory_bytes.is_some()) {
        message(out, 2, |out| {
            metric_header(
                out,
                PROCESS_MEMORY_METRIC,
                "GPU memory used by the process",
                "By",
            );
            message(out, 5, |out| {
                for p in procs {
                    if let Some(m) = p.used_memory_bytes {
                        attributes(&mut attrs, p);
                        point(out, &attrs, p.time_unix_nano, Num::Int(m));
                    }
                }
            });
        });
    }
    let sm = |p: &ProcessSample| p.sm_utilization.filter(|u| u.is_finite());
    if procs.iter().any(|p| sm(p).is_some()) {
        message(out, 2, |out| {
            metric_header(
                out,
                PROCESS_SM_METRIC,
                "fraction of the GPU's SM time the process used",
                "1",
            );
            message(out, 5, |out| {
                for p in procs {
                    if let Some(u) = sm(p) {
                        attributes(&mut attrs, p);
                        point(out, &attrs, p.time_unix_nano, Num::Double(u));
                    }
                }
            });
        });
    }
}

/// [`event_metrics`] as a ScopeMetrics `metrics` field.
fn write_event_metrics(out: &mut Vec<u8>, events: &[GpuEvent]) {
    use wire::*;
    if events.is_empty() {
        return;
    }
    let mut attrs = Vec::new();
    message(out, 2, |out| {
        metric_header(
            out,
            EVENT_METRIC,
            "a GPU event (XID, ECC); the value is the XID number, 0 for ECC",
            "1",
        );
        message(out, 5, |out| {
            for e in events {
                attrs.clear();
                message(&mut attrs, 7, |o| string_key_value(o, "hw.id", &e.gpu_uuid));
                message(&mut attrs, 7, |o| {
                    int_key_value(o, "gpu.index", i64::from(e.gpu_index))
                });
                message(&mut attrs, 7, |o| {
                    string_key_value(o, "gpu.event.kind", &e.kind)
                });
                message(&mut attrs, 7, |o| {
                    string_key_value(o, "gpu.event.detail", &e.detail)
                });
                point(out, &attrs, e.time_unix_nano, Num::Int(e.code));
            }
        });
    });
}

/// The few protobuf encodings [`encode_collection_to`] needs.
mod wire {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

    use super::Num;

    /// Field `field` holding the message `body` writes. The length goes before the body: one
    /// byte is set aside and, for a body of 128 bytes or more, the body is moved up to make
    /// room for the longer varint.
    pub fn message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
        encode_key(field, WireType::LengthDelimited, out);
        let at = out.len();
        out.push(0);
        body(out);
        let len = out.len() - at - 1;
        let n = encoded_len_varint(len as u64);
        if n == 1 {
            out[at] = len as u8;
            return;
        }
        let mut prefix = [0u8; 10];
        let mut slot = &mut prefix[..];
        encode_varint(len as u64, &mut slot);
        out.splice(at..at + 1, prefix[..n].iter().copied());
    }

    /// A string field.
    pub fn string(out: &mut Vec<u8>, field: u32, value: &str) {
        encode_key(field, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value.as_bytes());
    }

    /// A varint field (enum, bool, uint).
    pub fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
        encode_key(field, WireType::Varint, out);
        encode_varint(value, out);
    }

    /// The body of a KeyValue with a string value: key (1), value (2) = AnyValue.string_value (1).
    pub fn string_key_value(out: &mut Vec<u8>, key: &str, value: &str) {
        string(out, 1, key);
        message(out, 2, |out| string(out, 1, value));
    }

    /// The body of a KeyValue with an int value: AnyValue.int_value (3).
    pub fn int_key_value(out: &mut Vec<u8>, key: &str, value: i64) {
        string(out, 1, key);
        // int64 is a varint of the two's complement.
        message(out, 2, |out| varint_field(out, 3, value as u64));
    }

    /// Metric name (1), description (2), unit (3).
    pub fn metric_header(out: &mut Vec<u8>, name: &str, description: &str, unit: &str) {
        string(out, 1, name);
        string(out, 2, description);
        string(out, 3, unit);
    }

    /// A data_points (1) field of a Gauge or Sum: NumberDataPoint with its attributes (already
    /// encoded as fields 7), time_unix_nano (3, fixed64) and as_double (4) or as_int (6,
    /// sfixed64).
    pub fn point(out: &mut Vec<u8>, attributes: &[u8], time_unix_nano: u64, value: Num) {
        message(out, 1, |out| {
            out.extend_from_slice(attributes);
            encode_key(3, WireType::SixtyFourBit, out);
            out.extend_from_slice(&time_unix_nano.to_le_bytes());
            match value {
                Num::Double(x) => {
                    encode_key(4, WireType::SixtyFourBit, out);
                    out.extend_from_slice(&x.to_le_bytes());
                }
                Num::Int(i) => {
                    encode_key(6, WireType::SixtyFourBit, out);
                    out.extend_from_slice(&i.to_le_bytes());
                }
            }
        });
    }
}

#[cfg(test)]
mod collection_tests {
    use super::*;
    use crate::collect::JobLabels;

    #[test]
    fn processes_and_events_travel_with_the_gpus() {
        let gpu = GpuSample::empty(7, "GPU-a".into(), 0, "m".into());
        let p = ProcessSample {
            time_unix_nano: 7,
            gpu_uuid: "GPU-a".into(),
            gpu_index: 0,
            pid: 4242,
            process_name: Some("python3".into()),
            job: Some(JobLabels {
                id: "12".into(),
                user: "alice".into(),
                name: String::new(),
                scheduler: "slurm".into(),
                k8s: None,
            }),
            used_memory_bytes: Some(1 << 30),
            sm_utilization: Some(0.5),
        };
        let e = GpuEvent {
            time_unix_nano: 7,
            gpu_uuid: "GPU-a".into(),
            gpu_index: 0,
            kind: "xid".into(),
            code: 79,
            detail: "xid 79".into(),
        };
        let req = encode_collection(&[gpu], &[p], &[e], &[]);
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        let find = |n: &str| {
            metrics
                .iter()
                .find(|m| m.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        let Some(metric::Data::Gauge(g)) = &find(PROCESS_MEMORY_METRIC).data else {
            panic!("gauge")
        };
        let point = &g.data_points[0];
        assert_eq!(point.value, Some(number_data_point::Value::AsInt(1 << 30)));
        let keys: Vec<&str> = point.attributes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "hw.id",
                "gpu.index",
                "process.pid",
                "process.executable.name",
                "job.id",
                "job.user",
                "job.scheduler"
            ]
        );
        let Some(metric::Data::Gauge(g)) = &find(PROCESS_SM_METRIC).data else {
            panic!("gauge")
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsDouble(0.5))
        );
        let Some(metric::Data::Gauge(g)) = &find(EVENT_METRIC).data else {
            panic!("gauge")
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsInt(79))
        );
        assert!(
            g.data_points[0]
                .attributes
                .iter()
                .any(|a| a.key == "gpu.event.kind")
        );
    }
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use crate::collect::{JobLabels, PodLabels, Source, synthetic::Fleet};
    use prost::Message;

    /// The direct writer and the message tree, decoded: the same request.
    fn assert_same(
        samples: &[GpuSample],
        procs: &[ProcessSample],
        events: &[GpuEvent],
        resource: &[(String, String)],
    ) {
        let mut out = vec![0xAA]; // appended to what is there
        encode_collection_to(&mut out, samples, procs, events, resource);
        assert_eq!(out[0], 0xAA);
        let direct = ExportMetricsServiceRequest::decode(&out[1..]).expect("valid protobuf");
        let tree = encode_collection(samples, procs, events, resource);
        assert_eq!(direct, tree);
    }

    fn job(k8s: bool) -> JobLabels {
        JobLabels {
            id: "4242".into(),
            user: if k8s { String::new() } else { "alice".into() },
            name: "train ü".into(),
            scheduler: if k8s { "kubernetes" } else { "slurm" }.into(),
            k8s: k8s.then(|| PodLabels {
                namespace: "ml".into(),
                pod: "trainer-0".into(),
                container: String::new(),
            }),
        }
    }

    #[test]
    fn direct_bytes_decode_to_the_same_request() {
        let resource = vec![
            ("host.name".to_string(), "node1".to_string()),
            ("cluster".to_string(), String::new()),
        ];
        // Nothing at all, and no resource attributes.
        assert_same(&[], &[], &[], &[]);
        // A simulated node over a few ticks: every metric, with their simulated jobs.
        let mut fleet = Fleet::new(8, 3);
        for t in 0..5u64 {
            let samples = fleet
                .collect(1_700_000_000_000_000_000 + t * 1_000_000_000)
                .unwrap();
            let procs = fleet.processes();
            let events = fleet.events();
            assert_same(&samples, &procs, &events, &resource);
        }
        // Edge values: MIG rows, k8s and Slurm jobs, non-finite and negative values, long
        // strings (lengths of two varint bytes and more), time 0, processes and events.
        let mut a = GpuSample::empty(0, "GPU-a".into(), 3, "x".repeat(300));
        a.gpu_utilization = Some(f64::NAN);
        a.memory_utilization = Some(0.0);
        a.power_watts = Some(f64::INFINITY);
        a.memory_used_bytes = Some(-1);
        a.energy_joules = Some(1e300);
        a.ecc_sbe_volatile_total = Some(i64::MAX);
        a.job = Some(job(true));
        let mut b = GpuSample::empty(u64::MAX, "MIG-b".into(), 3, "MIG 1g.10gb".into());
        b.mig_instance = Some("dev0".into());
        b.memory_used_bytes = Some(1 << 33);
        b.xid_errors_total = Some(0);
        b.job = Some(job(false));
        let procs = vec![
            ProcessSample {
                time_unix_nano: 5,
                gpu_uuid: "GPU-a".into(),
                gpu_index: 3,
                pid: 1,
                process_name: Some("p".repeat(200)),
                job: Some(job(true)),
                used_memory_bytes: None,
                sm_utilization: Some(f64::NAN),
            },
            ProcessSample {
                time_unix_nano: 5,
                gpu_uuid: "GPU-a".into(),
                gpu_index: 3,
                pid: u32::MAX,
                process_name: None,
                job: None,
                used_memory_bytes: Some(0),
                sm_utilization: Some(0.25),
            },
        ];
        let events = vec![GpuEvent {
            time_unix_nano: 9,
            gpu_uuid: "GPU-a".into(),
            gpu_index: 3,
            kind: "xid".into(),
            code: -79,
            detail: "d".repeat(130),
        }];
        let gpus = [a, b];
        assert_same(&gpus, &procs, &events, &resource);
        assert_same(&gpus, &procs[..1], &[], &resource);
        assert_same(&[], &procs, &events, &resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::{JobLabels, Source, synthetic::Fleet};
    use std::collections::HashMap;

    fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
        attrs
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    fn str_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
        match attr(attrs, key)? {
            any_value::Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    fn points(m: &Metric) -> &[NumberDataPoint] {
        match m.data.as_ref().unwrap() {
            metric::Data::Gauge(g) => &g.data_points,
            metric::Data::Sum(s) => &s.data_points,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn sample(uuid: &str, index: u32, t: u64) -> GpuSample {
        let mut s = GpuSample::empty(t, uuid.into(), index, "NVIDIA H100 80GB HBM3".into());
        s.gpu_utilization = Some(0.5);
        s.memory_used_bytes = Some(1 << 30);
        s.energy_joules = Some(1234.5);
        s.ecc_dbe_volatile_total = Some(0);
        s
    }

    fn resource() -> Vec<(String, String)> {
        vec![
            ("host.name".into(), "node1".into()),
            ("cluster".into(), "prod".into()),
        ]
    }

    #[test]
    fn names_kinds_units_match_the_schema() {
        // The wire contract, spelled out once more so that a typo in METRICS fails a test.
        let expected: &[(&str, &str, Kind)] = &[
            ("hw.gpu.utilization", "1", Kind::Gauge),
            ("hw.gpu.memory.utilization", "1", Kind::Gauge),
            ("gpu.sm.active", "1", Kind::Gauge),
            ("gpu.sm.occupancy", "1", Kind::Gauge),
            ("gpu.tensor.active", "1", Kind::Gauge),
            ("gpu.dram.active", "1", Kind::Gauge),
            ("gpu.fp64.active", "1", Kind::Gauge),
            ("gpu.fp32.active", "1", Kind::Gauge),
            ("gpu.fp16.active", "1", Kind::Gauge),
            ("hw.gpu.memory.usage", "By", Kind::Gauge),
            ("hw.gpu.memory.limit", "By", Kind::Gauge),
            ("hw.power", "W", Kind::Gauge),
            ("hw.energy", "J", Kind::CumulativeSum),
            ("hw.temperature", "Cel", Kind::Gauge),
            ("gpu.memory.temperature", "Cel", Kind::Gauge),
            ("gpu.clock.sm", "MHz", Kind::Gauge),
            ("gpu.clock.memory", "MHz", Kind::Gauge),
            ("gpu.clock.event_reasons", "1", Kind::Gauge),
            ("gpu.pcie.transmit.rate", "By/s", Kind::Gauge),
            ("gpu.pcie.receive.rate", "By/s", Kind::Gauge),
            ("gpu.nvlink.transmit.rate", "By/s", Kind::Gauge),
            ("gpu.nvlink.receive.rate", "By/s", Kind::Gauge),
            ("gpu.ecc.sbe.volatile", "{error}", Kind::CumulativeSum),
            ("gpu.ecc.dbe.volatile", "{error}", Kind::CumulativeSum),
            ("gpu.remapped_rows.uncorrectable", "{row}", Kind::Gauge),
            ("gpu.remapped_rows.failure", "1", Kind::Gauge),
            ("gpu.xid.errors", "{error}", Kind::CumulativeSum),
        ];
        let got: Vec<(&str, &str, Kind)> =
            METRICS.iter().map(|m| (m.name, m.unit, m.kind)).collect();
        assert_eq!(got, expected);

        // A full synthetic sample emits all of them, with the right OTLP shapes.
        let samples = Fleet::new(2, 1).collect(1_700_000_000_000_000_000).unwrap();
        let req = encode(&samples, &resource());
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics.len(), expected.len());
        for (m, (name, unit, kind)) in metrics.iter().zip(expected) {
            assert_eq!((m.name.as_str(), m.unit.as_str()), (*name, *unit));
            match (m.data.as_ref().unwrap(), kind) {
                (metric::Data::Gauge(g), Kind::Gauge) => assert_eq!(g.data_points.len(), 2),
                (metric::Data::Sum(s), Kind::CumulativeSum) => {
                    assert!(s.is_monotonic);
                    assert_eq!(
                        s.aggregation_temporality,
                        AggregationTemporality::Cumulative as i32
                    );
                    assert_eq!(s.data_points.len(), 2);
                }
                (d, k) => panic!("{name}: {d:?} is not a {k:?}"),
            }
        }
        // Int columns travel as asInt, float columns as asDouble.
        let usage = metrics
            .iter()
            .find(|m| m.name == "hw.gpu.memory.usage")
            .unwrap();
        assert!(matches!(
            points(usage)[0].value,
            Some(number_data_point::Value::AsInt(_))
        ));
        let power = metrics.iter().find(|m| m.name == "hw.power").unwrap();
        assert!(matches!(
            points(power)[0].value,
            Some(number_data_point::Value::AsDouble(_))
        ));
    }

    #[test]
    fn resource_and_scope() {
        let req = encode(&[sample("GPU-a", 0, 5)], &resource());
        assert_eq!(req.resource_metrics.len(), 1);
        let rm = &req.resource_metrics[0];
        let attrs = &rm.resource.as_ref().unwrap().attributes;
        assert_eq!(str_attr(attrs, "host.name"), Some("node1"));
        assert_eq!(str_attr(attrs, "cluster"), Some("prod"));
        assert_eq!(rm.scope_metrics.len(), 1);
        let scope = rm.scope_metrics[0].scope.as_ref().unwrap();
        assert_eq!(scope.name, "gpuwatch-agent");
        assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn point_attributes_and_none_values() {
        let mut a = sample("GPU-a", 0, 100);
        a.job = Some(JobLabels {
            id: "9101".into(),
            user: "alice".into(),
            name: "train-llm".into(),
            scheduler: "slurm".into(),
            k8s: None,
        });
        a.mig_instance = Some("1.0".into());
        let mut b = sample("GPU-b", 1, 200);
        b.gpu_utilization = None;
        b.power_watts = Some(f64::NAN);
        let req = encode(&[a, b], &resource());
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        // Only the metrics with a value are present.
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "hw.gpu.utilization",
                "hw.gpu.memory.usage",
                "hw.energy",
                "gpu.ecc.dbe.volatile"
            ]
        );
        let util = points(&metrics[0]);
        assert_eq!(util.len(), 1, "None emits no point");
        let p = &util[0];
        assert_eq!(p.time_unix_nano, 100);
        assert_eq!(str_attr(&p.attributes, "hw.id"), Some("GPU-a"));
        assert_eq!(
            attr(&p.attributes, "gpu.index"),
            Some(&any_value::Value::IntValue(0))
        );
        assert_eq!(
            str_attr(&p.attributes, "hw.model"),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(str_attr(&p.attributes, "hw.type"), Some("gpu"));
        assert_eq!(str_attr(&p.attributes, "gpu.mig.instance"), Some("1.0"));
        assert_eq!(str_attr(&p.attributes, "job.id"), Some("9101"));
        assert_eq!(str_attr(&p.attributes, "job.user"), Some("alice"));
        assert_eq!(str_attr(&p.attributes, "job.name"), Some("train-llm"));
        assert_eq!(str_attr(&p.attributes, "job.scheduler"), Some("slurm"));
        // GPU b: no job, no MIG attributes; NaN power emitted nothing.
        let usage = points(&metrics[1]);
        assert_eq!(usage.len(), 2);
        let pb = &usage[1];
        assert_eq!(str_attr(&pb.attributes, "hw.id"), Some("GPU-b"));
        assert_eq!(attr(&pb.attributes, "job.id"), None);
        assert_eq!(attr(&pb.attributes, "gpu.mig.instance"), None);
        assert!(!names.contains(&"hw.power"));
    }

    #[test]
    fn every_point_of_a_gpu_has_its_sample_time() {
        let mut fleet = Fleet::new(4, 3);
        let mut samples = fleet.collect(1_000_000_000_000).unwrap();
        // Give each GPU its own time to catch any mix-up.
        for (i, s) in samples.iter_mut().enumerate() {
            s.time_unix_nano += i as u64;
        }
        let req = encode(&samples, &resource());
        let mut times: HashMap<String, Vec<u64>> = HashMap::new();
        for m in &req.resource_metrics[0].scope_metrics[0].metrics {
            for p in points(m) {
                let id = str_attr(&p.attributes, "hw.id").unwrap().to_string();
                times.entry(id).or_default().push(p.time_unix_nano);
            }
        }
        assert_eq!(times.len(), 4);
        for s in &samples {
            let t = &times[&s.gpu_uuid];
            assert_eq!(t.len(), METRICS.len());
            assert!(t.iter().all(|&x| x == s.time_unix_nano));
        }
    }

    #[test]
    fn empty_input_is_a_valid_request() {
        let req = encode(&[], &resource());
        assert!(req.resource_metrics[0].scope_metrics[0].metrics.is_empty());
    }
}
