//! The alerting service's own metrics, in the Prometheus text format, for the server's `/metrics`.
//! Label sets are bounded: states (3), receivers (from the config file).

use std::fmt::Write;
use std::sync::atomic::Ordering;

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
/// Hours the job-usage ledger holds.
pub const LEDGER_HOURS: &str = "gpuwatch_jobs_ledger_hours";
/// Alerting state files found damaged at start and moved to quarantine.
pub const STATE_QUARANTINED: &str = "gpuwatch_alerting_state_files_quarantined";

/// Renders the metrics.
pub fn render(a: &Alerting) -> String {
    let mut out = String::new();
    if let Some(l) = a.ledger() {
        let snap = l.snapshot();
        let _ = writeln!(
            out,
            "# HELP {LEDGER_WATERMARK} End of the hours the jobs view reads from its ledger (the rest from raw samples)\n# TYPE {LEDGER_WATERMARK} gauge\n{LEDGER_WATERMARK} {}",
            snap.watermark.unwrap_or(0) / 1_000_000_000
        );
        let _ = writeln!(
            out,
            "# HELP {LEDGER_HOURS} Hours held by the jobs view's ledger\n# TYPE {LEDGER_HOURS} gauge\n{LEDGER_HOURS} {}",
            l.hours()
        );
    }
    let _ = writeln!(
        out,
        "# HELP {STATE_QUARANTINED} Alerting state files found damaged at start and moved to quarantine (alerting started without them)\n# TYPE {STATE_QUARANTINED} gauge\n{STATE_QUARANTINED} {}",
        a.quarantined().len()
    );
    let alerts = a.alerts();
    let _ = writeln!(
        out,
        "# HELP {ALERTS} Alerts by state\n# TYPE {ALERTS} gauge"
    );
    for s in [State::Pending, State::Firing, State::Resolved] {
        let n = alerts.iter().filter(|x| x.state == s).count();
        let _ = writeln!(out, "{ALERTS}{{state=\"{}\"}} {n}", s.as_str());
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
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            v.load(Ordering::Relaxed)
        );
    }
    let pending = a.outbox().pending();
    let stats: Vec<(String, (u64, u64, u64))> = pending
        .keys()
        .filter_map(|r| a.outbox().stats(r).map(|s| (r.clone(), s)))
        .collect();
    for (name, help, kind, pick) in [
        (SENT, "Notifications delivered", "counter", 0usize),
        (
            RETRIES,
            "Notification attempts that failed and are retried",
            "counter",
            1,
        ),
        (
            DROPPED,
            "Notifications dropped: permanent error or older than max_age",
            "counter",
            2,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (r, s) in &stats {
            let v = [s.0, s.1, s.2][pick];
            let _ = writeln!(out, "{name}{{receiver=\"{}\"}} {v}", escape(r));
        }
    }
    let _ = writeln!(
        out,
        "# HELP {QUEUED} Notifications waiting for delivery\n# TYPE {QUEUED} gauge"
    );
    for (r, n) in &pending {
        let _ = writeln!(out, "{QUEUED}{{receiver=\"{}\"}} {n}", escape(r));
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
