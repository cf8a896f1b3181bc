//! The report and the job list as text, the way `gpuwatch job` and `gpuwatch jobs` print them.

use std::collections::BTreeMap;

use super::advise::{gib, gpu_name};
use super::charge::{JobCharge, slurm_duration};
use super::{GpuReport, JobReport, JobSummary};

fn pct(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn p(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), pct)
}

/// `tensor 92%, idle 8%`: the classes holding time, largest first.
fn weights(seconds: &BTreeMap<String, f64>) -> String {
    let total: f64 = seconds.values().sum();
    if total <= 0.0 {
        return "no GPU time".into();
    }
    let mut v: Vec<(&String, &f64)> = seconds.iter().filter(|(_, s)| **s > 0.0).collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter()
        .map(|(c, s)| format!("{c} {}", pct(**s / total)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1.23 T` / `456 G`: a rate with an SI prefix.
fn rate(v: f64, unit: &str) -> String {
    let (scale, prefix) = if v >= 1e12 {
        (1e12, "T")
    } else if v >= 1e9 {
        (1e9, "G")
    } else if v >= 1e6 {
        (1e6, "M")
    } else {
        (1e3, "k")
    };
    format!("{:.1} {prefix}{unit}", v / scale)
}

fn roofline_line(g: &GpuReport) -> String {
    let parts: Vec<String> = g
        .roofline
        .units
        .iter()
        .map(|u| {
            // A rate where the peak is known (PCIe and NVLink are measured), and worth a word.
            let achieved = u
                .achieved
                .filter(|_| u.share.is_none_or(|s| s >= 0.005))
                .filter(|a| *a >= 1e6)
                .map_or_else(String::new, |a| format!(" ({})", rate(a, &u.rate_unit)));
            format!("{} {}{achieved}", u.unit, p(u.share))
        })
        .collect();
    let model = g.roofline.model.as_deref().map_or_else(
        || "model not in the peaks table: shares only".to_string(),
        |m| format!("peaks of {m}"),
    );
    format!("    {}: {}  [{model}]\n", gpu_name(g), parts.join("  "))
}

fn gpu_row(g: &GpuReport) -> String {
    let mem = match (g.peak_memory_used_bytes, g.memory_total_bytes) {
        (Some(u), Some(t)) => format!("{} / {}", gib(u), gib(t)),
        (Some(u), None) => gib(u),
        _ => "-".into(),
    };
    format!(
        "  {:<15} {:>3}  {:<13} {:>5} / {:<5}   {:>5} {:>6}  {:>5} {:<22} {:>8.1}  {:>9}  {:>6}  {:>3}  {:>3}\n",
        g.host,
        g.gpu_index.map_or_else(|| "-".into(), |i| i.to_string()),
        g.limiter.as_deref().unwrap_or("-"),
        p(g.mean_utilization),
        p(g.max_utilization),
        p(g.mean_sm_active),
        p(g.mean_tensor_active),
        p(g.mean_dram_active),
        mem,
        g.idle_minutes,
        p(g.throttled_share),
        p(g.power_capped_share),
        g.xid_events,
        g.ecc_events
    )
}

/// `1234567` as `1.23M`: the work counts are large and only their scale matters at a glance.
fn si(v: f64) -> String {
    match v.abs() {
        a if a >= 1e9 => format!("{:.2}G", v / 1e9),
        a if a >= 1e6 => format!("{:.2}M", v / 1e6),
        a if a >= 1e4 => format!("{:.1}k", v / 1e3),
        _ => format!("{v:.1}"),
    }
}

/// The work line: what the job counted and what a unit of it cost.
fn work_line(w: Option<&super::JobWork>) -> String {
    let Some(w) = w else {
        return "  work done: not reported (docs/cost.md, \"Work done\", shows how a job reports it)\n"
            .into();
    };
    let or_dash = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".into(), f);
    format!(
        "  work done {} {}   {}/s   {} per GPU-hour   USD {} per million\n",
        si(w.done),
        w.unit,
        or_dash(w.per_second, &|v| si(v)),
        or_dash(w.per_gpu_hour, &|v| si(v)),
        or_dash(w.usd_per_million_units, &|v| format!("{v:.4}")),
    )
}

/// The events during the job and the notes, as text.
fn events_and_notes(r: &JobReport) -> String {
    let mut o = String::new();
    if !r.events.is_empty() {
        o.push_str("\n  events:\n");
        for e in &r.events {
            o.push_str(&format!(
                "    {} {} {} {} {}\n",
                e.time,
                e.host,
                e.gpu_uuid,
                e.kind,
                e.detail
                    .clone()
                    .or_else(|| e.code.map(|c| c.to_string()))
                    .unwrap_or_default()
            ));
        }
    }
    o.push('\n');
    if r.advice.is_empty() {
        o.push_str("  notes: none (no rule of docs/jobs.md matched)\n");
    } else {
        o.push_str("  notes:\n");
        for a in &r.advice {
            let tag = if a.informational {
                " (informational)"
            } else {
                ""
            };
            o.push_str(&format!(
                "  * [{}]{tag} {}: {}\n",
                a.rule, a.figure, a.advice
            ));
        }
    }
    o
}

/// `  account physics  partition gpu  …  time limit 02:00:00 (used 12%)`, or nothing when the
/// job carried no accounting label.
fn charge_line(c: &JobCharge) -> String {
    let mut parts: Vec<String> = [
        ("account", &c.account),
        ("partition", &c.partition),
        ("QOS", &c.qos),
        ("namespace", &c.namespace),
        ("labels", &c.labels),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
    .collect();
    if let (Some(a), Some(t)) = (&c.array_job_id, &c.array_task_id) {
        parts.push(format!("array {a}_{t}"));
    }
    if let Some(l) = c.time_limit_seconds {
        let used = c
            .time_limit_used
            .map_or_else(String::new, |u| format!(" (used {})", pct(u)));
        parts.push(format!("time limit {}{used}", slurm_duration(l)));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("  {}\n", parts.join("  "))
}

/// The report as text, the way `gpuwatch job` prints it.
pub fn render_text(r: &JobReport) -> String {
    let mut o = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    o.push_str(&format!(
        "Job {}  ({})\n  user {}  name {}  scheduler {}\n  hosts {}  GPUs {}\n  first seen {}  last seen {}\n\n",
        r.job_id,
        r.state,
        opt(&r.user),
        opt(&r.name),
        opt(&r.scheduler),
        r.hosts.join(","),
        r.gpus,
        r.first_seen,
        r.last_seen
    ));
    o.push_str(&charge_line(&r.charge));
    o.push_str(&format!(
        "  GPU-hours {:.3}   idle GPU-hours {:.3} ({})   energy {:.3} kWh\n  cost USD {:.2}   idle cost USD {:.2}   mean utilisation {}\n",
        r.gpu_hours,
        r.idle_gpu_hours,
        pct(r.idle_share),
        r.energy_kwh,
        r.cost_usd,
        r.idle_cost_usd,
        p(r.mean_utilization)
    ));
    o.push_str(&work_line(r.work.as_ref()));
    o.push_str(&format!(
        "  limiter {}   (GPU time: {})\n\n",
        r.limiter.as_deref().unwrap_or("-"),
        weights(&r.limiter_seconds)
    ));
    o.push_str(
        "  host            gpu  limiter       util(mean/max)  SM    tensor  DRAM  memory peak/total       idle min  throttled  capped  XID  ECC\n",
    );
    for g in &r.per_gpu {
        o.push_str(&gpu_row(g));
    }
    o.push_str("\n  roofline (achieved share of each unit's peak over the job):\n");
    for g in &r.per_gpu {
        o.push_str(&roofline_line(g));
        if !g.missing_counters.is_empty() {
            o.push_str(&format!(
                "      not read on this GPU: {}\n",
                g.missing_counters.join(", ")
            ));
        }
    }
    o.push_str(&processes_text(r));
    o.push_str(&events_and_notes(r));
    o
}

/// The job's GPU processes, as text.
fn processes_text(r: &JobReport) -> String {
    if r.processes.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "\n  processes:\n    host            GPU                                       pid      name             first seen            last seen             memory peak  SM share\n",
    );
    for p in &r.processes {
        o.push_str(&format!(
            "    {:<15} {:<41} {:<8} {:<16} {:<21} {:<21} {:>11}  {}\n",
            p.host,
            p.gpu_uuid,
            p.pid,
            p.name.as_deref().unwrap_or("-"),
            p.first_seen,
            p.last_seen,
            p.memory_peak_bytes
                .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "-".into()),
            p.sm_share
                .map(|v| format!("{:.0}%", v * 100.0))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    if r.processes_left_out {
        o.push_str(&format!(
            "    (more processes than the {} listed: query gpu_processes for all)\n",
            super::processes::MAX_PROCESSES
        ));
    }
    o
}

/// The job list as an aligned table, the way `gpuwatch jobs` prints it.
pub fn render_list(jobs: &[JobSummary]) -> String {
    let mut o = String::from(
        "job_id           user         name                 state    gpus  GPU-h     idle   util  SM     limiter        kWh       USD       idle USD  last seen\n",
    );
    let cut = |s: &Option<String>, n: usize| -> String {
        let t = s.clone().unwrap_or_else(|| "-".into());
        t.chars().take(n).collect()
    };
    for j in jobs {
        o.push_str(&format!(
            "{:<16} {:<12} {:<20} {:<8} {:>4}  {:>8.3} {:>5}  {:>5} {:>5}  {:<13}  {:>8.3}  {:>8.2}  {:>8.2}  {}\n",
            j.job_id.chars().take(16).collect::<String>(),
            cut(&j.user, 12),
            cut(&j.name, 20),
            j.state,
            j.gpus,
            j.gpu_hours,
            pct(j.idle_share),
            p(j.mean_utilization),
            p(j.mean_sm_active),
            cut(&j.limiter, 13),
            j.energy_kwh,
            j.cost_usd,
            j.idle_cost_usd,
            j.last_seen
        ));
    }
    o.push_str(&format!(
        "({} job{})\n",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    ));
    o
}
