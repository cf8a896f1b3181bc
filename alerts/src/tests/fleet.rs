//! The built-in rule pack against the synthetic fleet, with injected time: an abandoned
//! notebook's idle GPU fires `GpuIdleInJob` to local receivers in every format, and it resolves
//! when the GPU is no longer idle in a job.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuwatch_agent::{Fleet, Source, encode};
use gpuwatch_query::{EngineConfig, QueryEngine};
use gpuwatch_store::clock::ManualClock;
use gpuwatch_store::ingest::otlp::to_write_batch;
use gpuwatch_store::{ReadStore, Store, StoreConfig};
use tokio::sync::watch;

use crate::cost::CostConfig;
use crate::notify::AlertingConfig;
use crate::notify::tests::{Recv, start_receiver};
use crate::{Alerting, EngineSource, State, builtin_rules};

const T0: i64 = 1_800_000_000_000_000_000;
const S: i64 = 1_000_000_000;

fn ok(_: usize) -> (u16, Option<&'static str>, Duration) {
    (200, None, Duration::ZERO)
}

async fn wait_for(limit: Duration, what: &str, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The rows of an `alerts_active` table: rule, state, fingerprint, since (ns), sorted.
async fn active(engine: &QueryEngine, table: &str) -> Vec<(String, String, String, i64)> {
    let sql = format!(
        "SELECT rule, state, fingerprint, CAST(time AS BIGINT) AS t FROM {table} ORDER BY 1, 3"
    );
    let r = engine.query(&sql).await.expect("alerts_active");
    let text = |b: &arrow::array::RecordBatch, i: usize| {
        let c = arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Utf8).expect("cast");
        let c = arrow::array::cast::AsArray::as_string::<i32>(&c).clone();
        (0..b.num_rows())
            .map(move |k| c.value(k).to_string())
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for b in &r.batches {
        let t =
            arrow::array::cast::AsArray::as_primitive::<arrow::datatypes::Int64Type>(b.column(3));
        let (rule, state, fp) = (text(b, 0), text(b, 1), text(b, 2));
        for k in 0..b.num_rows() {
            out.push((rule[k].clone(), state[k].clone(), fp[k].clone(), t.value(k)));
        }
    }
    out
}

fn bodies(r: &Recv) -> Vec<String> {
    r.got().iter().map(|g| g.body.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_notebook_fires_gpu_idle_in_job_and_resolves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(
        Store::open(
            StoreConfig {
                wal_sync: false,
                ..StoreConfig::new(dir.path().join("data"))
            },
            clock.clone(),
        )
        .expect("store"),
    );
    let read: Arc<dyn ReadStore> = store.clone();
    let engine = QueryEngine::new(read, EngineConfig::default()).expect("engine");
    CostConfig {
        default_gpu_hour_usd: 2.0,
        ..CostConfig::default()
    }
    .register(engine.context(), &crate::cost::JobsConfig::default())
    .await
    .expect("cost");

    let mut receivers = Vec::new();
    let mut toml_text = String::from("external_url = \"http://127.0.0.1:9500\"\n");
    for kind in ["webhook", "slack", "teams", "discord", "alertmanager"] {
        let (r, _h) = start_receiver("127.0.0.1:0", ok).await;
        let url = if kind == "alertmanager" {
            format!("http://{}", r.addr)
        } else {
            r.url()
        };
        toml_text.push_str(&format!(
            "[[receivers]]\nname = \"{kind}\"\nkind = \"{kind}\"\nurl = \"{url}\"\nrate_limit_per_second = 50\n\
             [[routes]]\nreceiver = \"{kind}\"\nmatchers = {{alertname = \"GpuIdleInJob\"}}\n\
             group_by = [\"alertname\", \"host\"]\ngroup_wait = \"30s\"\ngroup_interval = \"1m\"\ncontinue = true\n"
        ));
        receivers.push((kind, r));
    }
    let config: AlertingConfig = toml::from_str(&toml_text).expect("alerting config");
    let alerting = Arc::new(
        Alerting::open(
            builtin_rules().expect("rule pack"),
            config,
            Some(&dir.path().join("alerts")),
            clock.clone(),
            Some(Arc::clone(&store)),
        )
        .expect("alerting"),
    );
    crate::active::register(engine.context(), Some(Arc::clone(&alerting)))
        .await
        .expect("alerts_active");
    crate::active::register_as(engine.context(), "active_from_history", None)
        .await
        .expect("the query node's alerts_active");
    let (stop, rx) = watch::channel(false);
    let _workers = alerting.outbox().start(rx);
    let source = EngineSource::new(engine.clone(), Duration::from_secs(30));

    // Two GPUs: a training job on GPU 0, an abandoned notebook holding GPU 1 (see the fleet's
    // model; it ends 45 to 120 minutes in). Samples every 30 s, rules every 5 simulated minutes,
    // for 2 h 15 min.
    let mut fleet = Fleet::new(2, 7);
    let resource = vec![("host.name".to_string(), "sim-node-01".to_string())];
    let step = 30 * S;
    let mut fired_at = None;
    let mut resolved_at = None;
    let mut t = T0;
    while t < T0 + 135 * 60 * S {
        let samples = fleet.collect(t as u64).expect("collect");
        let (batch, _) = to_write_batch(&encode(&samples, &resource), t).expect("decode");
        store.write(&batch).expect("write");
        if (t - T0) % (300 * S) == 0 {
            alerting.evaluate_all(&source).await.expect("evaluate");
            alerting.tick().expect("tick");
            let idle: Vec<_> = alerting
                .alerts()
                .into_iter()
                .filter(|a| a.rule == "GpuIdleInJob")
                .collect();
            if fired_at.is_none() && idle.iter().any(|a| a.state == State::Firing) {
                fired_at = Some(t);
            }
            // What fires now, from the engine's state and from the history, agree.
            let now = active(&engine, "alerts_active").await;
            assert_eq!(now, active(&engine, "active_from_history").await, "at {t}");
            let firing = idle.iter().filter(|a| a.state == State::Firing).count();
            let listed = now
                .iter()
                .filter(|r| r.0 == "GpuIdleInJob" && r.1 == "firing");
            assert_eq!(listed.count(), firing, "at {t}");
            if fired_at.is_some()
                && resolved_at.is_none()
                && let Some(a) = idle.iter().find(|a| a.state == State::Resolved)
            {
                resolved_at = a.resolved_at;
            }
        }
        clock.advance(step);
        t += step;
    }
    let errors = alerting.engine().rule_errors();
    assert!(errors.is_empty(), "rule pack errors: {errors:?}");
    let fired = fired_at.expect("GpuIdleInJob never fired");
    let resolved = resolved_at.expect("GpuIdleInJob never resolved");
    assert!(resolved > fired);

    // Every receiver heard it fire and resolve.
    for (kind, r) in &receivers[..4] {
        wait_for(
            Duration::from_secs(20),
            &format!("{kind} firing + resolved"),
            || {
                let b = bodies(r);
                let firing = b.iter().any(|x| {
                    x.contains("GpuIdleInJob") && (x.contains("firing") || x.contains("FIRING"))
                });
                let resolved = b
                    .iter()
                    .any(|x| x.contains("resolved") || x.contains("RESOLVED"));
                firing && resolved
            },
        )
        .await;
    }
    let hook = &receivers[0].1;
    let first = &hook.got()[0].body;
    assert_eq!(first["status"], "firing");
    let a = &first["alerts"][0];
    assert_eq!(a["labels"]["alertname"], "GpuIdleInJob");
    assert_eq!(a["labels"]["host"], "sim-node-01");
    assert_eq!(a["labels"]["job_name"], "notebook");
    assert!(
        a["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("idle for") && s.contains("sim-node-01")),
        "{a}"
    );
    // Alertmanager: pushed while firing (endsAt ahead), then once with endsAt = the resolution.
    let am = &receivers[4].1;
    let ended = crate::notify::format::rfc3339(Some(resolved));
    wait_for(
        Duration::from_secs(20),
        "alertmanager resolved push",
        || bodies(am).iter().any(|b| b.contains(&ended)),
    )
    .await;
    let got = am.got();
    assert!(got.len() >= 2, "{}", got.len());
    assert!(got.iter().all(|g| g.path == "/api/v2/alerts"));
    assert!(got[0].body[0]["endsAt"].as_str() > got[0].body[0]["startsAt"].as_str());

    // The history is queryable, in order.
    let r = engine
        .query("SELECT state FROM alerts WHERE rule = 'GpuIdleInJob' ORDER BY time")
        .await
        .expect("alerts table");
    let states: Vec<String> = r
        .batches
        .iter()
        .flat_map(|b| {
            // Store tables give strings as views.
            let col = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)
                .expect("cast to Utf8");
            let col = arrow::array::cast::AsArray::as_string::<i32>(&col).clone();
            (0..b.num_rows())
                .map(move |i| col.value(i).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        &states[..3],
        ["pending", "firing", "resolved"],
        "{states:?}"
    );
    let _ = stop.send(true);
}
