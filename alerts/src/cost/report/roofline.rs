//! A GPU's roofline over its time in the job: the achieved share of each unit's peak (tensor
//! cores, FP16/FP32/FP64 pipes, DRAM, PCIe, NVLink), time-weighted over the job's samples.
//!
//! The pipe counters are shares of the pipe's peak at the clock the GPU ran, so the share of
//! its peak at the maximum clock is `activity × SM clock / max SM clock` (the recorded traces
//! reproduce each workload's own FLOP/s this way: tests/fixtures/gpu-traces/README.md). DRAM
//! activity is already a share of the peak bandwidth, PCIe is measured against the link's
//! generation × width. Rates (FLOP/s, bytes/s) and NVLink's share need the model's peaks
//! ([`super::super::peaks`]); an unknown model gets shares only.
//!
//! The chart the console draws is the normalised roofline: `compute_share` (the busiest pipe's
//! share of its own peak) against `intensity` = `compute_share / memory_share`, the arithmetic
//! intensity in units of the ridge point. The roof is `min(1, intensity)`: left of 1 a GPU can
//! at best be memory-bound, right of it compute-bound. GPUs of different models share the chart.

use serde::{Deserialize, Serialize};

use super::super::peaks::{self, ModelPeaks};

/// One unit of the roofline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoofUnit {
    /// `tensor`, `fp16`, `fp32`, `fp64`, `dram`, `pcie`, `nvlink`.
    pub unit: String,
    /// Achieved share of the unit's peak (0..1); null where not measured or, for NVLink,
    /// where the model's peak is unknown.
    pub share: Option<f64>,
    /// Achieved rate, in `rate_unit`, where the peak is known (PCIe: measured).
    pub achieved: Option<f64>,
    /// The unit's peak, in `rate_unit`.
    pub peak: Option<f64>,
    /// `FLOP/s` or `B/s`.
    pub rate_unit: String,
}

/// A GPU's roofline over its time in the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// The peaks table's entry for the GPU's model (docs/jobs.md), null for an unknown model.
    pub model: Option<String>,
    /// Where that entry's figures come from.
    pub source: Option<String>,
    /// Tensor (the activity the FP16 pipe does not explain; peak: dense FP16/BF16), FP16, FP32
    /// and FP64 pipes, DRAM, PCIe (busier direction, against the link), NVLink (busier
    /// direction, against the model's peak each way).
    pub units: Vec<RoofUnit>,
    /// The busiest of tensor, FP16, FP32 and FP64, as a share of its peak.
    pub compute_share: Option<f64>,
    /// Which unit that is.
    pub compute_unit: Option<String>,
    /// DRAM bandwidth share.
    pub memory_share: Option<f64>,
    /// `compute_share / memory_share`: arithmetic intensity relative to the ridge point.
    pub intensity: Option<f64>,
}

/// The time-weighted shares and rates the per-GPU query gives.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub tensor: Option<f64>,
    pub fp16: Option<f64>,
    pub fp32: Option<f64>,
    pub fp64: Option<f64>,
    pub dram: Option<f64>,
    pub pcie_share: Option<f64>,
    pub pcie_bytes: Option<f64>,
    pub nvlink_bytes: Option<f64>,
}

fn unit(name: &str, share: Option<f64>, peak: Option<f64>, rate_unit: &str) -> RoofUnit {
    RoofUnit {
        unit: name.into(),
        share,
        achieved: share.zip(peak).map(|(s, p)| s * p),
        peak,
        rate_unit: rate_unit.into(),
    }
}

/// The roofline of a GPU of `gpu_model` from its measured shares.
pub fn build(gpu_model: Option<&str>, m: &Measured) -> Roofline {
    let p: Option<&ModelPeaks> = gpu_model.and_then(peaks::for_model);
    let nvlink_share = m
        .nvlink_bytes
        .zip(p.and_then(|p| p.nvlink_bytes))
        .map(|(b, peak)| b / peak);
    let pcie_peak = m
        .pcie_bytes
        .zip(m.pcie_share)
        .filter(|(_, s)| *s > 0.0)
        .map(|(b, s)| b / s);
    let units = vec![
        unit("tensor", m.tensor, p.map(|p| p.tensor_flops), "FLOP/s"),
        unit("fp16", m.fp16, p.and_then(|p| p.fp16_flops), "FLOP/s"),
        unit("fp32", m.fp32, p.map(|p| p.fp32_flops), "FLOP/s"),
        unit("fp64", m.fp64, p.and_then(|p| p.fp64_flops), "FLOP/s"),
        unit("dram", m.dram, p.map(|p| p.dram_bytes), "B/s"),
        RoofUnit {
            unit: "pcie".into(),
            share: m.pcie_share,
            achieved: m.pcie_bytes,
            peak: pcie_peak,
            rate_unit: "B/s".into(),
        },
        RoofUnit {
            unit: "nvlink".into(),
            share: nvlink_share,
            achieved: m.nvlink_bytes,
            peak: p.and_then(|p| p.nvlink_bytes),
            rate_unit: "B/s".into(),
        },
    ];
    let compute = units[..4]
        .iter()
        .filter_map(|u| u.share.map(|s| (u.unit.clone(), s)))
        .fold(None, |best: Option<(String, f64)>, (n, s)| match best {
            Some((_, b)) if b >= s => best,
            _ => Some((n, s)),
        });
    let intensity = match (compute.as_ref(), m.dram) {
        (Some((_, c)), Some(d)) if d > 0.0 => Some(c / d),
        _ => None,
    };
    Roofline {
        model: p.map(|p| p.name.to_string()),
        source: p.map(|p| p.source.to_string()),
        units,
        compute_share: compute.as_ref().map(|(_, s)| *s),
        compute_unit: compute.map(|(n, _)| n),
        memory_share: m.dram,
        intensity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_get_rates_and_unknown_ones_shares_only() {
        let m = Measured {
            tensor: Some(0.65),
            fp16: Some(0.0),
            fp32: Some(0.0),
            fp64: Some(0.0),
            dram: Some(0.25),
            pcie_share: Some(0.001),
            pcie_bytes: Some(63e6),
            nvlink_bytes: Some(45e9),
        };
        let r = build(Some("NVIDIA H100 80GB HBM3"), &m);
        assert_eq!(r.model.as_deref(), Some("H100 SXM5"));
        assert_eq!(r.compute_unit.as_deref(), Some("tensor"));
        assert_eq!(r.intensity, Some(0.65 / 0.25));
        let tensor = &r.units[0];
        assert!((tensor.achieved.expect("rate") - 0.65 * 989.4e12).abs() < 1e3);
        let nvlink = r.units.iter().find(|u| u.unit == "nvlink").expect("nvlink");
        assert_eq!(nvlink.share, Some(0.1));
        let pcie = r.units.iter().find(|u| u.unit == "pcie").expect("pcie");
        assert!((pcie.peak.expect("link") - 63e9).abs() < 1.0);

        let r = build(Some("Tesla T4"), &m);
        assert_eq!(r.model, None);
        assert_eq!(r.units[0].share, Some(0.65));
        assert_eq!(r.units[0].achieved, None);
        assert_eq!(
            r.units
                .iter()
                .find(|u| u.unit == "nvlink")
                .expect("nvlink")
                .share,
            None
        );
        assert_eq!(r.compute_share, Some(0.65));

        let none = build(None, &Measured::default());
        assert_eq!(none.compute_share, None);
        assert_eq!(none.intensity, None);
    }
}
