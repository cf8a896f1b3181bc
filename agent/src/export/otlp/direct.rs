//! [`encode_collection_to`]: the request [`super::encode_collection`] builds as a message tree,
//! written straight to protobuf bytes.

use opentelemetry_proto::tonic::metrics::v1::AggregationTemporality;

use super::{
    EVENT_METRIC, Kind, METRICS, MetricDef, Num, PROCESS_MEMORY_METRIC, PROCESS_SM_METRIC,
    SCHEMA_URL, SCOPE_NAME, start_time_unix_nano,
};
use crate::collect::{GpuEvent, GpuSample, ProcessSample};

/// [`super::encode_collection`] written straight to protobuf bytes, appended to `out`: the same
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
    let attrs = GpuAttributes::of(samples);
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
            write_gpu_metrics(out, samples, &attrs);
            write_process_metrics(out, procs);
            write_event_metrics(out, events);
            // ScopeMetrics.schema_url (3)
            string(out, 3, SCHEMA_URL);
        });
    });
}

/// Each GPU's point attributes, encoded once as `attributes` fields (7) of a NumberDataPoint.
struct GpuAttributes {
    bytes: Vec<u8>,
    /// Where each GPU's attributes end in `bytes`.
    ends: Vec<usize>,
}

impl GpuAttributes {
    /// The attributes of every sample's GPU.
    fn of(samples: &[GpuSample]) -> Self {
        let mut bytes: Vec<u8> = Vec::with_capacity(samples.len() * 160);
        let mut ends = Vec::with_capacity(samples.len());
        for s in samples {
            write_point_attributes(&mut bytes, s);
            ends.push(bytes.len());
        }
        Self { bytes, ends }
    }

    /// The attributes of the `i`th sample's GPU.
    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

/// The value `d` reads from `s`, when it has one (non-finite doubles are left out).
fn gpu_value(d: &MetricDef, s: &GpuSample) -> Option<Num> {
    match (d.get)(s)? {
        Num::Double(x) if x.is_finite() => Some(Num::Double(x)),
        Num::Double(_) => None,
        Num::Int(i) => Some(Num::Int(i)),
    }
}

/// The GPU metrics of [`METRICS`] that some sample has a value of, as ScopeMetrics `metrics`
/// fields. Definitions of one name (`hw.errors` of each `error.type`) make one metric.
fn write_gpu_metrics(out: &mut Vec<u8>, samples: &[GpuSample], attrs: &GpuAttributes) {
    let start = start_time_unix_nano();
    let mut rest: &[MetricDef] = METRICS;
    while let Some(def) = rest.first() {
        let n = rest.iter().take_while(|d| d.name == def.name).count();
        let (group, tail) = rest.split_at(n);
        rest = tail;
        if group
            .iter()
            .any(|d| samples.iter().any(|s| gpu_value(d, s).is_some()))
        {
            write_gpu_metric(out, group, samples, attrs, start);
        }
    }
}

/// One GPU metric (the definitions in `group`, of one name) as a ScopeMetrics `metrics` field
/// (2): a Gauge, or a cumulative monotonic Sum whose points start at `start`.
fn write_gpu_metric(
    out: &mut Vec<u8>,
    group: &[MetricDef],
    samples: &[GpuSample],
    attrs: &GpuAttributes,
    start: u64,
) {
    use wire::*;
    let def = &group[0];
    message(out, 2, |out| {
        metric_header(out, def.name, def.description, def.unit);
        let data_field = match def.kind {
            Kind::Gauge => 5,
            Kind::CumulativeSum => 7,
        };
        let start = if def.kind == Kind::CumulativeSum {
            start
        } else {
            0
        };
        message(out, data_field, |out| {
            for d in group {
                for (i, s) in samples.iter().enumerate() {
                    if let Some(v) = gpu_value(d, s) {
                        point(out, attrs.get(i), d.attr, start, s.time_unix_nano, v);
                    }
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
    use crate::collect::ExtraValue;
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
    for (k, v) in job.extra.attributes() {
        match v {
            ExtraValue::Str(v) => message(out, 7, |out| string_key_value(out, &k, v)),
            ExtraValue::Int(v) => message(out, 7, |out| int_key_value(out, &k, v)),
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
                        point(out, &attrs, None, 0, p.time_unix_nano, Num::Int(m));
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
                        point(out, &attrs, None, 0, p.time_unix_nano, Num::Double(u));
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
                point(out, &attrs, None, 0, e.time_unix_nano, Num::Int(e.code));
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
    pub(super) fn message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
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
    pub(super) fn string(out: &mut Vec<u8>, field: u32, value: &str) {
        encode_key(field, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value.as_bytes());
    }

    /// A varint field (enum, bool, uint).
    pub(super) fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
        encode_key(field, WireType::Varint, out);
        encode_varint(value, out);
    }

    /// The body of a KeyValue with a string value: key (1), value (2) = AnyValue.string_value (1).
    pub(super) fn string_key_value(out: &mut Vec<u8>, key: &str, value: &str) {
        string(out, 1, key);
        message(out, 2, |out| string(out, 1, value));
    }

    /// The body of a KeyValue with an int value: AnyValue.int_value (3).
    pub(super) fn int_key_value(out: &mut Vec<u8>, key: &str, value: i64) {
        string(out, 1, key);
        // int64 is a varint of the two's complement.
        message(out, 2, |out| varint_field(out, 3, value as u64));
    }

    /// Metric name (1), description (2), unit (3).
    pub(super) fn metric_header(out: &mut Vec<u8>, name: &str, description: &str, unit: &str) {
        string(out, 1, name);
        string(out, 2, description);
        string(out, 3, unit);
    }

    /// A data_points (1) field of a Gauge or Sum: NumberDataPoint with its attributes (already
    /// encoded as fields 7), time_unix_nano (3, fixed64) and as_double (4) or as_int (6,
    /// sfixed64).
    pub(super) fn point(
        out: &mut Vec<u8>,
        attributes: &[u8],
        extra: Option<(&str, &str)>,
        start_time_unix_nano: u64,
        time_unix_nano: u64,
        value: Num,
    ) {
        message(out, 1, |out| {
            out.extend_from_slice(attributes);
            if let Some((k, v)) = extra {
                message(out, 7, |out| string_key_value(out, k, v));
            }
            if start_time_unix_nano != 0 {
                encode_key(2, WireType::SixtyFourBit, out);
                out.extend_from_slice(&start_time_unix_nano.to_le_bytes());
            }
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
