//! The alerting service's own metrics, registered with the server's registry ([`register`]).
//! Label sets are bounded: states (3), receivers (from the config file).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpuwatch_common::metrics::{Kind, Registry, Sample, SampleCollector};

use crate::engine::State;
use crate::service::Alerting;

/// Alerts by state.
pub const ALERTS: &str = "gpuwatch_alerts";
/// Rule evaluations run.
pub const EVALUATIONS: &str = "gpuwatch_rule_evaluations_total";
/// Rule evaluations that failed.
pub const EVALUATION_FAILURES: &str = "gpuwatch_rule_evaluation_failures_total";
/// Notifications delivered, per receiver.
pub const SENT: &str = "gpuwatch_notifications_sent_total";
/// Failed attempts that will be retried, per receiver.
pub const RETRIES: &str = "gpuwatch_notification_retries_total";
/// Notifications dropped (permanent error or too old), per receiver.
pub const DROPPED: &str = "gpuwatch_notifications_dropped_total";
/// Notifications waiting, per receiver.
pub const QUEUED: &str = "gpuwatch_notifications_queued";

/// End of the hours the job-usage ledger has folded (Unix seconds; 0 before the first fold).
pub const LEDGER_WATERMARK: &str = "gpuwatch_jobs_ledger_watermark_seconds";
/// Start of the oldest day of the job ledger whose jobs' totals are not written yet: every
/// earlier day's are (Unix seconds; 0 while the ledger is empty).
pub const LEDGER_TOTALS_END: &str = "gpuwatch_jobs_ledger_totals_end_seconds";
/// Hours the job-usage ledger holds.
pub const LEDGER_HOURS: &str = "gpuwatch_jobs_ledger_hours";
/// Alerting state files found damaged at start and moved to quarantine.
pub const STATE_QUARANTINED: &str = "gpuwatch_alerting_state_files_quarantined";

/// Registers the alerting service's metrics with `registry`, read at each scrape from the
/// service `current` returns (none before the store is open).
pub fn register(
    registry: &mut Registry,
    current: impl Fn() -> Option<Arc<Alerting>> + Send + Sync + 'static,
) {
    registry.register_collector(Box::new(SampleCollector::new(move || {
        current().map(|a| samples(&a)).unwrap_or_default()
    })));
}

/// The metrics now.
pub fn samples(a: &Alerting) -> Vec<Sample> {
    let mut out = Vec::new();
    if let Some(l) = a.ledger() {
        let snap = l.snapshot();
        out.push(Sample::new(
            LEDGER_WATERMARK,
            Kind::Gauge,
            "End of the hours the jobs view reads from its ledger (the rest from raw samples)",
            (snap.watermark.unwrap_or(0) / 1_000_000_000) as f64,
        ));
        out.push(Sample::new(
            LEDGER_TOTALS_END,
            Kind::Gauge,
            "Start of the oldest ledger day whose jobs' totals are not written yet (the jobs view reads finished jobs of the earlier days from their totals)",
            (snap.totals_end().unwrap_or(0) / 1_000_000_000) as f64,
        ));
        out.push(Sample::new(
            LEDGER_HOURS,
            Kind::Gauge,
            "Folded hours of the jobs view's ledger still backed by raw samples (late samples refold them)",
            l.hours() as f64,
        ));
    }
    out.push(Sample::new(
        STATE_QUARANTINED,
        Kind::Gauge,
        "Alerting state files found damaged at start and moved to quarantine (alerting started without them)",
        a.quarantined().len() as f64,
    ));
    let alerts = a.alerts();
    for s in [State::Pending, State::Firing, State::Resolved] {
        let n = alerts.iter().filter(|x| x.state == s).count();
        out.push(labelled(
            ALERTS,
            Kind::Gauge,
            "Alerts by state",
            "state",
            s.as_str(),
            n as f64,
        ));
    }
    let e = a.engine();
    for (name, help, v) in [
        (EVALUATIONS, "Rule evaluations run", &e.evaluations),
        (
            EVALUATION_FAILURES,
            "Rule evaluations that failed",
            &e.evaluation_failures,
        ),
    ] {
        out.push(Sample::new(
            name,
            Kind::Counter,
            help,
            v.load(Ordering::Relaxed) as f64,
        ));
    }
    notification_samples(a, &mut out);
    out
}

/// Per receiver: delivered, retried, dropped, waiting.
fn notification_samples(a: &Alerting, out: &mut Vec<Sample>) {
    let pending = a.outbox().pending();
    let stats: Vec<(String, (u64, u64, u64))> = pending
        .keys()
        .filter_map(|r| a.outbox().stats(r).map(|s| (r.clone(), s)))
        .collect();
    for (name, help, pick) in [
        (SENT, "Notifications delivered", 0usize),
        (
            RETRIES,
            "Notification attempts that failed and are retried",
            1,
        ),
        (
            DROPPED,
            "Notifications dropped: permanent error or older than max_age",
            2,
        ),
    ] {
        for (r, s) in &stats {
            let v = [s.0, s.1, s.2][pick];
            out.push(labelled(name, Kind::Counter, help, "receiver", r, v as f64));
        }
    }
    for (r, n) in &pending {
        out.push(labelled(
            QUEUED,
            Kind::Gauge,
            "Notifications waiting for delivery",
            "receiver",
            r,
            *n as f64,
        ));
    }
}

fn labelled(
    name: &'static str,
    kind: Kind,
    help: &'static str,
    key: &str,
    value: &str,
    v: f64,
) -> Sample {
    Sample {
        labels: vec![(key.to_string(), value.to_string())],
        ..Sample::new(name, kind, help, v)
    }
}
