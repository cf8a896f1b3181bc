use super::super::*;
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
            extra: Default::default(),
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
