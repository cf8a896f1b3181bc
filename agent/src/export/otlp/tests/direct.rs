use super::super::*;
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
        extra: crate::collect::JobExtra {
            account: if k8s { String::new() } else { "physics".into() },
            partition: if k8s { String::new() } else { "gpu".into() },
            array_id: if k8s { String::new() } else { "4240".into() },
            array_task_id: if k8s { String::new() } else { "2".into() },
            time_limit_seconds: (!k8s).then_some(3600),
            labels: if k8s {
                vec![("team".into(), "vision".into())]
            } else {
                Vec::new()
            },
            shares: if k8s {
                "ml/trainer-0=0.5,ml/x=0.5".into()
            } else {
                String::new()
            },
            ..Default::default()
        },
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
