use super::*;
use crate::notify::silence::{Matcher, Silence};

const S: i64 = 1_000_000_000;

fn config(extra: &str) -> AlertingConfig {
    let text = format!(
        r#"
external_url = "http://gw"
[[receivers]]
name = "hook"
kind = "webhook"
url = "http://127.0.0.1:1/hook"
[[receivers]]
name = "am"
kind = "alertmanager"
url = "http://127.0.0.1:1"
resend_delay = "1m"
{extra}
[[routes]]
receiver = "am"
continue = true
[[routes]]
receiver = "hook"
group_by = ["alertname", "host"]
group_wait = "30s"
group_interval = "5m"
repeat_interval = "4h"
"#
    );
    toml::from_str(&text).expect("config")
}

fn alert(host: &str, state: State, at: i64) -> Alert {
    let mut labels = BTreeMap::new();
    labels.insert("alertname".to_string(), "Idle".to_string());
    labels.insert("host".to_string(), host.to_string());
    labels.insert("gpu".to_string(), "0".to_string());
    Alert {
        rule: "Idle".into(),
        fingerprint: crate::engine::fingerprint(&labels),
        labels,
        annotations: BTreeMap::new(),
        value: 0.0,
        state,
        active_at: 0,
        fired_at: Some(0),
        resolved_at: (state == State::Resolved).then_some(at),
        last_seen: at,
    }
}

fn hook(out: &[(String, Message)]) -> Vec<(String, Vec<String>)> {
    out.iter()
        .filter(|(r, _)| r == "hook")
        .map(|(_, m)| {
            (
                m.status.clone(),
                m.alerts
                    .iter()
                    .map(|a| format!("{}:{}", a.labels["host"], a.status))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn group_wait_interval_repeat_and_resolve() {
    let mut d = Dispatcher::new(config(""), None).expect("dispatcher");
    let none = Silences::default();
    d.ingest(&[alert("a", State::Firing, 0)], 0)
        .expect("ingest");
    assert!(
        hook(&d.tick(29 * S, &none).expect("tick")).is_empty(),
        "group_wait"
    );
    let out = d.tick(30 * S, &none).expect("tick");
    assert_eq!(hook(&out), vec![("firing".into(), vec!["a:firing".into()])]);

    // Unchanged: nothing at the next group_interval (dedup).
    d.ingest(&[alert("a", State::Firing, 60 * S)], 60 * S)
        .expect("ingest");
    assert!(hook(&d.tick(330 * S, &none).expect("tick")).is_empty());
    // A second host is a second group with its own group_wait.
    d.ingest(
        &[
            alert("a", State::Firing, 400 * S),
            alert("b", State::Firing, 400 * S),
        ],
        400 * S,
    )
    .expect("ingest");
    assert!(hook(&d.tick(429 * S, &none).expect("tick")).is_empty());
    assert_eq!(
        hook(&d.tick(430 * S, &none).expect("tick")),
        vec![("firing".into(), vec!["b:firing".into()])]
    );
    // Repeat after 4h.
    let t = 30 * S + 4 * 3600 * S;
    d.ingest(
        &[alert("a", State::Firing, t), alert("b", State::Firing, t)],
        t,
    )
    .expect("ingest");
    let out = hook(&d.tick(t + 300 * S, &none).expect("tick"));
    assert!(
        out.contains(&("firing".into(), vec!["a:firing".into()])),
        "{out:?}"
    );

    // Resolve a: one resolved notification at the next interval, then nothing more.
    let t2 = t + 400 * S;
    d.ingest(
        &[
            alert("a", State::Resolved, t2),
            alert("b", State::Firing, t2),
        ],
        t2,
    )
    .expect("ingest");
    let out = hook(&d.tick(t2 + 300 * S, &none).expect("tick"));
    assert!(
        out.contains(&("resolved".into(), vec!["a:resolved".into()])),
        "{out:?}"
    );
    d.ingest(
        &[
            alert("a", State::Resolved, t2),
            alert("b", State::Firing, t2),
        ],
        t2 + 600 * S,
    )
    .expect("ingest");
    let out = hook(&d.tick(t2 + 900 * S, &none).expect("tick"));
    assert!(
        out.iter()
            .all(|(_, a)| !a.contains(&"a:resolved".to_string())),
        "{out:?}"
    );
}

#[test]
fn silences_hold_back_and_release() {
    let mut d = Dispatcher::new(config(""), None).expect("dispatcher");
    let mut s = Silences::default();
    s.add(
        Silence {
            id: String::new(),
            matchers: vec![Matcher {
                name: "host".into(),
                value: "a|c".into(),
                is_regex: true,
                is_equal: true,
            }],
            starts_at: 0,
            ends_at: 100 * S,
            created_by: "t".into(),
            comment: "maintenance".into(),
        },
        0,
    )
    .expect("silence");
    d.ingest(&[alert("a", State::Firing, 0)], 0)
        .expect("ingest");
    let out = d.tick(30 * S, &s).expect("tick");
    assert!(out.is_empty(), "silenced: {out:?}");
    // After the silence ends the still-firing alert is notified as new.
    d.ingest(&[alert("a", State::Firing, 200 * S)], 200 * S)
        .expect("ingest");
    let out = d.tick(400 * S, &s).expect("tick");
    assert_eq!(hook(&out), vec![("firing".into(), vec!["a:firing".into()])]);
}

#[test]
fn alertmanager_push_resends_while_firing() {
    let mut d = Dispatcher::new(config(""), None).expect("dispatcher");
    let none = Silences::default();
    let am = |out: &[(String, Message)]| -> Vec<String> {
        out.iter()
            .filter(|(r, _)| r == "am")
            .flat_map(|(_, m)| m.alerts.iter().map(|a| a.status.clone()))
            .collect()
    };
    d.ingest(&[alert("a", State::Firing, 0)], 0)
        .expect("ingest");
    let out = d.tick(0, &none).expect("tick");
    assert_eq!(am(&out), vec!["firing"]);
    let ends = out[0].1.alerts[0].ends_at.expect("ends_at");
    assert_eq!(ends, 4 * 60 * S, "endsAt four resend delays ahead");
    assert!(am(&d.tick(59 * S, &none).expect("tick")).is_empty());
    assert_eq!(am(&d.tick(60 * S, &none).expect("tick")), vec!["firing"]);
    d.ingest(&[alert("a", State::Resolved, 70 * S)], 70 * S)
        .expect("ingest");
    assert_eq!(am(&d.tick(70 * S, &none).expect("tick")), vec!["resolved"]);
    assert!(am(&d.tick(200 * S, &none).expect("tick")).is_empty());
}

#[test]
fn restart_sends_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("dispatch.json");
    let none = Silences::default();
    {
        let mut d = Dispatcher::new(config(""), Some(p.clone())).expect("dispatcher");
        d.ingest(&[alert("a", State::Firing, 0)], 0)
            .expect("ingest");
        assert_eq!(hook(&d.tick(30 * S, &none).expect("tick")).len(), 1);
        assert_eq!(hook(&d.tick(30 * S, &none).expect("tick")).len(), 0);
    }
    let mut d = Dispatcher::new(config(""), Some(p)).expect("dispatcher");
    d.ingest(&[alert("a", State::Firing, 40 * S)], 40 * S)
        .expect("ingest");
    for t in [40, 330, 630, 930] {
        // (The Alertmanager push is re-sent by design; the grouped receiver must stay quiet.)
        let out = hook(&d.tick(t * S, &none).expect("tick"));
        assert!(out.is_empty(), "at {t}s after restart: {out:?}");
    }
}

#[test]
fn bad_routes_are_clear_errors() {
    let mut c = config("");
    c.routes[1].receiver = "nobody".into();
    let e = Dispatcher::new(c, None)
        .expect_err("unknown receiver")
        .to_string();
    assert!(e.contains("nobody") && e.contains("not defined"), "{e}");
}
