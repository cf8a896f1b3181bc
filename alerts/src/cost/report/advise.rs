//! The notes of docs/jobs.md, from a report's figures and the `[jobs.advice]` thresholds. Each
//! note names its rule, the GPU, the figure that triggered it and the threshold, the cause and
//! the fix. Rules about how a job ran speak only for a GPU held `min_gpu_seconds`; `xid` and
//! `ecc` always speak. Throttling blames only what the job cannot control: the SW power cap is
//! at most the informational `power_capped`.

use super::super::AdviceConfig;
use super::{Advice, GpuReport, JobReport, share};

/// A ratio as a percentage; one decimal under 1% (0.1% is not 0%).
fn pct(v: f64) -> String {
    if v > 0.0 && v < 0.01 {
        format!("{:.1}%", v * 100.0)
    } else {
        format!("{:.0}%", v * 100.0)
    }
}

/// `GPU 3 on n1` (or the UUID when the index is unknown).
pub(super) fn gpu_name(g: &GpuReport) -> String {
    match g.gpu_index {
        Some(i) => format!("GPU {i} on {}", g.host),
        None => format!("GPU {} on {}", g.gpu_uuid, g.host),
    }
}

pub(super) fn gib(b: i64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A note about GPU `g`.
fn note(
    g: &GpuReport,
    rule: &str,
    value: f64,
    threshold: f64,
    figure: String,
    advice: &str,
) -> Advice {
    Advice {
        rule: rule.into(),
        figure: format!("{}: {figure}", gpu_name(g)),
        advice: advice.into(),
        host: Some(g.host.clone()),
        gpu_uuid: Some(g.gpu_uuid.clone()),
        gpu_index: g.gpu_index,
        value: Some(value),
        threshold: Some(threshold),
        unit: "ratio".into(),
        informational: false,
    }
}

/// `idle_gpus`: one note for the job naming each GPU idle for most of its time.
fn idle_gpus(r: &JobReport, t: &AdviceConfig) -> Option<Advice> {
    let long_enough = |g: &&GpuReport| g.gpu_seconds >= t.min_gpu_seconds;
    let idle: Vec<&GpuReport> = r
        .per_gpu
        .iter()
        .filter(long_enough)
        .filter(|g| share(g.idle_gpu_seconds, g.gpu_seconds) >= t.idle_gpu_share)
        .collect();
    if idle.is_empty() {
        return None;
    }
    let names: Vec<String> = idle
        .iter()
        .map(|g| {
            format!(
                "{} idle {}",
                gpu_name(g),
                pct(share(g.idle_gpu_seconds, g.gpu_seconds))
            )
        })
        .collect();
    let n = r.per_gpu.len();
    let advice = if idle.len() == n {
        "the GPUs sat idle most of the job: check that the code runs on the GPU (e.g. the framework sees CUDA), or run it without a GPU".to_string()
    } else {
        let keep = n - idle.len();
        format!(
            "request {keep} GPU{} instead of {n}, or make the code use every GPU it asks for",
            if keep == 1 { "" } else { "s" }
        )
    };
    let (idle_s, held_s) = idle.iter().fold((0.0, 0.0), |(i, h), g| {
        (i + g.idle_gpu_seconds, h + g.gpu_seconds)
    });
    Some(Advice {
        rule: "idle_gpus".into(),
        figure: format!(
            "{} of {n} GPUs idle for most of the job ({})",
            idle.len(),
            names.join(", ")
        ),
        advice,
        value: Some(share(idle_s, held_s)),
        threshold: Some(t.idle_gpu_share),
        unit: "ratio".into(),
        ..Advice::default()
    })
}

const INPUT_STALL: &str = "the GPU computes in bursts and waits for the next batch between them: feed it faster — more data-loader workers (PyTorch DataLoader num_workers), pin_memory=True, prefetching (prefetch_factor, non_blocking copies), or decoding on the GPU (NVIDIA DALI)";
const NO_TENSOR_FP32: &str = "FP32 arithmetic ran on the FP32 pipe, not on the tensor cores: allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True, or torch.set_float32_matmul_precision('high')) or train in bf16 with automatic mixed precision (torch.autocast)";
const NO_TENSOR_FP16: &str = "half-precision arithmetic ran on the FP16 pipe, not on the tensor cores: express it as matrix products (cuBLAS, cuDNN, torch.matmul, torch.autocast) so the tensor cores take it";
const NO_TENSOR_FP64: &str = "FP64 arithmetic ran on the FP64 pipe: matrix products through cuBLAS/cuSOLVER (DGEMM) run on the FP64 tensor cores of A100 and H100 at twice the pipe's rate; where the precision allows, FP32 with TF32 is far faster";
const MEMORY_BOUND: &str = "DRAM bandwidth, not arithmetic, set the pace: fuse element-wise operations (torch.compile, fused optimisers and kernels), raise the batch size so each byte feeds more arithmetic, and use lower precision (bf16, FP8) to move fewer bytes";
const HOST_TRANSFER: &str = "the GPU waited on copies over PCIe: allocate host buffers pinned (pin_memory=True, cudaHostAlloc) so copies run at the link's speed, overlap them with compute (non_blocking=True on a separate CUDA stream), and keep data on the GPU between steps";
const LOW_UTILIZATION: &str = "the kernels were too small or too few to fill the GPU: launch fewer, bigger kernels (larger batches, fused operations), capture the step in CUDA graphs (torch.cuda.graphs, torch.compile mode='reduce-overhead'), and avoid host synchronisations in the loop (.item(), .cpu(), torch.cuda.synchronize)";
const TINY_KERNELS: &str = "utilisation over-reports (it counts time with any kernel running): batch more work per kernel (larger batches, fused kernels, CUDA graphs)";
const LOW_MEMORY: &str = "the job used a small part of the GPU's memory and kept its SMs less than half busy: a smaller GPU or a MIG slice would do, or raise the batch size";
const THROTTLED: &str = "the GPU ran below its clocks for reasons the job does not control (cooling, power delivery, hardware): tell the administrators the host and GPU; the job ran slower than it could";
const POWER_CAPPED: &str = "a GPU working flat out reaches its power limit and lowers its clock to stay under it — the normal state of a busy GPU, nothing to fix in the job (the limit is the administrators' setting)";

/// `no_tensor_cores`: the FP32, FP16 and FP64 pipes together hold `limiter_share` of the busy
/// time; the advice follows the busiest of them.
fn no_tensor_cores(g: &GpuReport, t: &AdviceConfig) -> Option<Advice> {
    let pipes = [
        ("fp32", NO_TENSOR_FP32),
        ("fp16", NO_TENSOR_FP16),
        ("fp64", NO_TENSOR_FP64),
    ];
    let share: f64 = pipes.iter().map(|(c, _)| g.busy_share(c)).sum();
    if share < t.limiter_share {
        return None;
    }
    let (c, text) = pipes
        .iter()
        .max_by(|a, b| g.busy_share(a.0).total_cmp(&g.busy_share(b.0)))?;
    let activity = g
        .limiter_figures
        .get(*c)
        .map_or_else(String::new, |a| format!(", pipe {} busy", pct(*a)));
    Some(note(
        g,
        "no_tensor_cores",
        share,
        t.limiter_share,
        format!(
            "limited by the {} pipe in {} of its busy time{activity}",
            c.to_uppercase(),
            pct(share)
        ),
        text,
    ))
}

/// The limiter's notes for one GPU: `input_stall`, `no_tensor_cores`, `memory_bound`,
/// `host_transfer_bound`, `low_utilization` (unless `tiny_kernels` speaks for it).
fn limiter_notes(g: &GpuReport, t: &AdviceConfig, tiny: bool, out: &mut Vec<Advice>) {
    let fig = |c: &str| g.limiter_figures.get(c).copied();
    // The share of the busy time of a class holding at least `limiter_share` of it.
    let holds = |c: &str| Some(g.busy_share(c)).filter(|s| *s >= t.limiter_share);
    let push = |notes: &mut Vec<Advice>, rule: &str, share: f64, figure: String, advice: &str| {
        notes.push(note(g, rule, share, t.limiter_share, figure, advice));
    };
    if let Some(input) = holds("input") {
        let duty = fig("input").map_or_else(String::new, |d| {
            format!(" (kernels ran {} of the time in those seconds)", pct(d))
        });
        let figure = format!("waiting on input in {} of its busy time{duty}", pct(input));
        push(out, "input_stall", input, figure, INPUT_STALL);
    }
    out.extend(no_tensor_cores(g, t));
    if let Some(memory) = holds("memory")
        && let Some(dram) = fig("memory")
        && dram >= t.memory_bound_dram_active
    {
        let figure = format!(
            "limited by DRAM bandwidth in {} of its busy time (DRAM {} busy, threshold {})",
            pct(memory),
            pct(dram),
            pct(t.memory_bound_dram_active)
        );
        push(out, "memory_bound", memory, figure, MEMORY_BOUND);
    }
    if let Some(host) = holds("host_transfer") {
        let rate =
            fig("host_transfer").map_or_else(String::new, |b| format!(" at {:.1} GB/s", b / 1e9));
        let figure = format!(
            "copying over PCIe{rate} with idle SMs in {} of its busy time",
            pct(host)
        );
        push(out, "host_transfer_bound", host, figure, HOST_TRANSFER);
    }
    if let Some(latency) = holds("latency").filter(|_| !tiny) {
        let fill = fig("latency").map_or_else(String::new, |f| {
            format!(" (kernels kept {} of the SMs busy while they ran)", pct(f))
        });
        let figure = format!("latency-bound in {} of its busy time{fill}", pct(latency));
        push(out, "low_utilization", latency, figure, LOW_UTILIZATION);
    }
}

/// `tiny_kernels`, `low_memory`, `throttled` and `power_capped` for one GPU.
fn usage_notes(g: &GpuReport, t: &AdviceConfig, idle_gpu: bool, out: &mut Vec<Advice>) {
    if let Some(m) = g.peak_memory_share
        && let (Some(used), Some(total)) = (g.peak_memory_used_bytes, g.memory_total_bytes)
        && !idle_gpu
        && m < t.low_memory_share
        && g.busy_sm_active
            .or(g.busy_utilization)
            .is_none_or(|sm| sm < t.low_memory_max_sm_active)
    {
        out.push(note(
            g,
            "low_memory",
            m,
            t.low_memory_share,
            format!("peak memory {} of {} ({})", gib(used), gib(total), pct(m)),
            LOW_MEMORY,
        ));
    }
    if let Some(th) = g.throttled_share
        && th >= t.throttled_share
    {
        let reasons: Vec<String> = g
            .throttle_reasons
            .iter()
            .map(|(n, s)| format!("{n} {}", pct(*s)))
            .collect();
        out.push(note(
            g,
            "throttled",
            th,
            t.throttled_share,
            format!("slowed in {} of samples ({})", pct(th), reasons.join(", ")),
            THROTTLED,
        ));
    }
    if let Some(cap) = g.power_capped_share
        && cap >= t.power_capped_share
    {
        let clock = match (g.power_capped_sm_clock_mhz, g.sm_clock_max_mhz) {
            (Some(c), Some(m)) if m > 0.0 => format!(
                ": SM clock {c:.0} of {m:.0} MHz ({} of its maximum, {} lost)",
                pct(c / m),
                pct(1.0 - c / m)
            ),
            (Some(c), _) => format!(": SM clock {c:.0} MHz"),
            _ => String::new(),
        };
        let mut a = note(
            g,
            "power_capped",
            cap,
            t.power_capped_share,
            format!(
                "at its power limit (SW power cap) in {} of samples{clock}",
                pct(cap)
            ),
            POWER_CAPPED,
        );
        a.informational = true;
        out.push(a);
    }
}

/// `xid` and `ecc` for one GPU (no minimum duration).
fn error_notes(r: &JobReport, g: &GpuReport, out: &mut Vec<Advice>) {
    let count = |n: i64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    if g.xid_events > 0 {
        let codes: Vec<String> = r
            .events
            .iter()
            .filter(|e| e.kind == "xid" && e.host == g.host && e.gpu_uuid == g.gpu_uuid)
            .filter_map(|e| e.code.map(|c| c.to_string()))
            .collect();
        let mut a = note(
            g,
            "xid",
            g.xid_events as f64,
            1.0,
            format!(
                "{} (XID {})",
                count(g.xid_events, "XID event"),
                codes.join(", ")
            ),
            "a GPU error happened during the job: if it failed or ran slowly, resubmit it and tell the administrators the host and GPU",
        );
        a.unit = "events".into();
        out.push(a);
    }
    if g.ecc_events > 0 {
        let mut a = note(
            g,
            "ecc",
            g.ecc_events as f64,
            1.0,
            count(g.ecc_events, "ECC event"),
            "memory errors on the GPU during the job: check the job's results and tell the administrators",
        );
        a.unit = "events".into();
        out.push(a);
    }
}

/// The notes of docs/jobs.md, applied to a report's figures with the thresholds `t`.
pub fn advise(r: &JobReport, t: &AdviceConfig) -> Vec<Advice> {
    let mut out: Vec<Advice> = idle_gpus(r, t).into_iter().collect();
    for g in r
        .per_gpu
        .iter()
        .filter(|g| g.gpu_seconds >= t.min_gpu_seconds)
    {
        let idle_gpu = share(g.idle_gpu_seconds, g.gpu_seconds) >= t.idle_gpu_share;
        // tiny_kernels: busy by utilisation, but the SMs mostly wait.
        let tiny = match (g.mean_utilization, g.mean_sm_active) {
            (Some(u), Some(sm)) if u >= t.busy_utilization && sm < t.low_sm_active => Some(note(
                g,
                "tiny_kernels",
                sm,
                t.low_sm_active,
                format!("utilisation {} but SM activity {}", pct(u), pct(sm)),
                TINY_KERNELS,
            )),
            _ => None,
        };
        if !idle_gpu {
            limiter_notes(g, t, tiny.is_some(), &mut out);
        }
        out.extend(tiny);
        usage_notes(g, t, idle_gpu, &mut out);
    }
    for g in &r.per_gpu {
        error_notes(r, g, &mut out);
    }
    out.extend(super::charge::time_limit_note(r, t));
    out
}
