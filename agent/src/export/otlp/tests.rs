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
        ("gpu.memory_controller.utilization", "1", Kind::Gauge),
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
        ("gpu.graphics.active", "1", Kind::Gauge),
        ("gpu.memory.temperature", "Cel", Kind::Gauge),
        ("gpu.clock.sm", "MHz", Kind::Gauge),
        ("gpu.clock.memory", "MHz", Kind::Gauge),
        ("gpu.clock.event_reasons", "1", Kind::Gauge),
        ("gpu.pcie.transmit.rate", "By/s", Kind::Gauge),
        ("gpu.pcie.receive.rate", "By/s", Kind::Gauge),
        ("gpu.nvlink.transmit.rate", "By/s", Kind::Gauge),
        ("gpu.nvlink.receive.rate", "By/s", Kind::Gauge),
        ("hw.errors", "{error}", Kind::CumulativeSum),
        ("hw.errors", "{error}", Kind::CumulativeSum),
        ("gpu.remapped_rows.uncorrectable", "{row}", Kind::Gauge),
        ("gpu.remapped_rows.failure", "1", Kind::Gauge),
        ("gpu.xid.errors", "{error}", Kind::CumulativeSum),
        ("gpu.clock.sm.max", "MHz", Kind::Gauge),
        ("gpu.pcie.link.generation", "1", Kind::Gauge),
        ("gpu.pcie.link.width", "{lane}", Kind::Gauge),
    ];
    let got: Vec<(&str, &str, Kind)> = METRICS.iter().map(|m| (m.name, m.unit, m.kind)).collect();
    assert_eq!(got, expected);
    // The two `hw.errors` definitions make one metric of two points per GPU.
    let mut expected = expected.to_vec();
    expected.dedup_by(|a, b| a.0 == b.0);

    // A full synthetic sample emits all of them, with the right OTLP shapes.
    let samples = Fleet::new(2, 1).collect(1_700_000_000_000_000_000).unwrap();
    let req = encode(&samples, &resource());
    let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
    assert_eq!(metrics.len(), expected.len());
    for (m, (name, unit, kind)) in metrics.iter().zip(&expected) {
        assert_eq!((m.name.as_str(), m.unit.as_str()), (*name, *unit));
        match (m.data.as_ref().unwrap(), kind) {
            (metric::Data::Gauge(g), Kind::Gauge) => assert_eq!(g.data_points.len(), 2),
            (metric::Data::Sum(s), Kind::CumulativeSum) => {
                assert!(s.is_monotonic);
                assert_eq!(
                    s.aggregation_temporality,
                    AggregationTemporality::Cumulative as i32
                );
                let per_gpu = if *name == "hw.errors" { 4 } else { 2 };
                assert_eq!(s.data_points.len(), per_gpu, "{name}");
                // Cumulative sums say since when they count.
                assert!(
                    s.data_points.iter().all(|p| p.start_time_unix_nano > 0),
                    "{name}"
                );
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
    assert_eq!(rm.scope_metrics[0].schema_url, super::SCHEMA_URL);
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
        extra: Default::default(),
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
            "hw.errors"
        ]
    );
    // ECC errors are `hw.errors` of `error.type` uncorrected (and corrected).
    let ecc = points(&metrics[3]);
    assert!(
        ecc.iter()
            .all(|p| str_attr(&p.attributes, "error.type") == Some("uncorrected"))
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

mod collection;
mod direct;
