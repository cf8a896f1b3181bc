//! Peak rates per GPU model, for the job roofline (docs/jobs.md, "Peaks"): dense (no
//! sparsity) FLOP/s at the maximum SM clock, DRAM and NVLink bytes per second, each from
//! NVIDIA's datasheet or architecture whitepaper of the model. The activity counters are
//! shares of these peaks at the clock the GPU ran, so a share needs no peak; the peaks turn
//! shares into rates (TFLOP/s, TB/s) and give NVLink, which has no share counter, a share.

/// The peaks of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelPeaks {
    /// The model as the table names it.
    pub name: &'static str,
    /// Globs over `gpu_model` (NVML's product name), first match in the table wins.
    pub patterns: &'static [&'static str],
    /// Where the figures come from.
    pub source: &'static str,
    /// Maximum SM clock, MHz (used where the agent did not read it).
    pub sm_clock_max_mhz: Option<f64>,
    /// Dense FP16/BF16 tensor-core FLOP/s. TF32 work at full tensor activity is half this,
    /// FP8 twice; FP64 matrix products (DFMA, counted as tensor activity on A100 and H100)
    /// run at `fp64_tensor_flops`.
    pub tensor_flops: f64,
    /// FP64 on tensor cores (DFMA), FLOP/s, where the model has it.
    pub fp64_tensor_flops: Option<f64>,
    /// FP16 pipe (non-tensor) FLOP/s.
    pub fp16_flops: Option<f64>,
    /// FP32 pipe FLOP/s.
    pub fp32_flops: f64,
    /// FP64 pipe FLOP/s.
    pub fp64_flops: Option<f64>,
    /// DRAM bandwidth, bytes/s.
    pub dram_bytes: f64,
    /// NVLink bandwidth each way, bytes/s (half the datasheet's bidirectional figure); `None`
    /// without NVLink.
    pub nvlink_bytes: Option<f64>,
}

const T: f64 = 1e12;
const GB: f64 = 1e9;

/// The table (docs/jobs.md shows it with the same figures; a test compares them).
pub const PEAKS: &[ModelPeaks] = &[
    ModelPeaks {
        name: "H100 SXM5",
        patterns: &["*H100 80GB HBM3*", "*H100*SXM*"],
        source: "NVIDIA H100 Tensor Core GPU architecture whitepaper (SXM5, at 1980 MHz; the datasheet rounds them to 34, 67 and 1,979 with sparsity)",
        sm_clock_max_mhz: Some(1980.0),
        tensor_flops: 989.4 * T,
        fp64_tensor_flops: Some(66.9 * T),
        fp16_flops: Some(133.8 * T),
        fp32_flops: 66.9 * T,
        fp64_flops: Some(33.5 * T),
        dram_bytes: 3350.0 * GB,
        nvlink_bytes: Some(450.0 * GB),
    },
    ModelPeaks {
        name: "H100 NVL",
        patterns: &["*H100 NVL*"],
        source: "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL)",
        sm_clock_max_mhz: None,
        tensor_flops: 835.5 * T,
        fp64_tensor_flops: Some(60.0 * T),
        fp16_flops: None,
        fp32_flops: 60.0 * T,
        fp64_flops: Some(30.0 * T),
        dram_bytes: 3900.0 * GB,
        nvlink_bytes: Some(300.0 * GB),
    },
    ModelPeaks {
        name: "H100 PCIe",
        patterns: &["*H100 PCIe*", "*H100*PCIE*"],
        source: "NVIDIA H100 Tensor Core GPU datasheet (PCIe); H100 whitepaper (FP16 non-tensor)",
        sm_clock_max_mhz: Some(1755.0),
        tensor_flops: 756.5 * T,
        fp64_tensor_flops: Some(51.0 * T),
        fp16_flops: Some(102.4 * T),
        fp32_flops: 51.0 * T,
        fp64_flops: Some(26.0 * T),
        dram_bytes: 2000.0 * GB,
        nvlink_bytes: Some(300.0 * GB),
    },
    ModelPeaks {
        name: "H200 NVL",
        patterns: &["*H200 NVL*"],
        source: "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL)",
        sm_clock_max_mhz: None,
        tensor_flops: 835.5 * T,
        fp64_tensor_flops: Some(60.0 * T),
        fp16_flops: None,
        fp32_flops: 60.0 * T,
        fp64_flops: Some(30.0 * T),
        dram_bytes: 4800.0 * GB,
        nvlink_bytes: Some(450.0 * GB),
    },
    ModelPeaks {
        name: "H200 SXM",
        patterns: &["*H200*"],
        source: "NVIDIA H200 Tensor Core GPU datasheet (SXM); the H100 SXM5's GH100 at the same clock (FP16 non-tensor)",
        sm_clock_max_mhz: Some(1980.0),
        tensor_flops: 989.4 * T,
        fp64_tensor_flops: Some(66.9 * T),
        fp16_flops: Some(133.8 * T),
        fp32_flops: 66.9 * T,
        fp64_flops: Some(33.5 * T),
        dram_bytes: 4800.0 * GB,
        nvlink_bytes: Some(450.0 * GB),
    },
    ModelPeaks {
        name: "A100 SXM4 80GB",
        patterns: &["*A100*SXM4-80GB*", "*A100-SXM-80GB*"],
        source: "NVIDIA A100 Tensor Core GPU datasheet; A100 whitepaper (FP16 non-tensor)",
        sm_clock_max_mhz: Some(1410.0),
        tensor_flops: 312.0 * T,
        fp64_tensor_flops: Some(19.5 * T),
        fp16_flops: Some(78.0 * T),
        fp32_flops: 19.5 * T,
        fp64_flops: Some(9.7 * T),
        dram_bytes: 2039.0 * GB,
        nvlink_bytes: Some(300.0 * GB),
    },
    ModelPeaks {
        name: "A100 PCIe 80GB",
        patterns: &["*A100*80GB*PCIe*", "*A100*PCIE*80GB*"],
        source: "NVIDIA A100 Tensor Core GPU datasheet; A100 whitepaper (FP16 non-tensor)",
        sm_clock_max_mhz: Some(1410.0),
        tensor_flops: 312.0 * T,
        fp64_tensor_flops: Some(19.5 * T),
        fp16_flops: Some(78.0 * T),
        fp32_flops: 19.5 * T,
        fp64_flops: Some(9.7 * T),
        dram_bytes: 1935.0 * GB,
        nvlink_bytes: Some(300.0 * GB),
    },
    ModelPeaks {
        name: "A100 40GB",
        patterns: &["*A100*"],
        source: "NVIDIA A100 Tensor Core GPU datasheet (40GB, SXM4 and PCIe); A100 whitepaper (FP16 non-tensor)",
        sm_clock_max_mhz: Some(1410.0),
        tensor_flops: 312.0 * T,
        fp64_tensor_flops: Some(19.5 * T),
        fp16_flops: Some(78.0 * T),
        fp32_flops: 19.5 * T,
        fp64_flops: Some(9.7 * T),
        dram_bytes: 1555.0 * GB,
        nvlink_bytes: Some(300.0 * GB),
    },
    ModelPeaks {
        name: "L40S",
        patterns: &["*L40S*"],
        source: "NVIDIA L40S datasheet",
        sm_clock_max_mhz: Some(2520.0),
        tensor_flops: 362.05 * T,
        fp64_tensor_flops: None,
        fp16_flops: None,
        fp32_flops: 91.6 * T,
        fp64_flops: None,
        dram_bytes: 864.0 * GB,
        nvlink_bytes: None,
    },
];

/// `*` and `?` glob match (case-sensitive, like the `[cost]` price patterns).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The peaks of `gpu_model`, if the table knows it.
pub fn for_model(gpu_model: &str) -> Option<&'static ModelPeaks> {
    PEAKS
        .iter()
        .find(|m| m.patterns.iter().any(|p| glob(p, gpu_model)))
}

/// SQL: the table's maximum SM clock of the row's `gpu_model` (null when unknown), the
/// fallback where the agent did not read `sm_clock_max_mhz`.
pub fn max_clock_sql() -> String {
    let mut s = String::from("CASE");
    for m in PEAKS {
        let Some(mhz) = m.sm_clock_max_mhz else {
            continue;
        };
        for p in m.patterns {
            s.push_str(&format!(
                " WHEN gpu_model LIKE {} ESCAPE '\\' THEN {}",
                super::sql_str(&super::glob_to_like(p)),
                super::limiter::lit(mhz)
            ));
        }
    }
    s.push_str(" END");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_product_names_find_their_model() {
        for (name, want) in [
            ("NVIDIA H100 80GB HBM3", Some("H100 SXM5")),
            ("NVIDIA H100 PCIe", Some("H100 PCIe")),
            ("NVIDIA H100 NVL", Some("H100 NVL")),
            ("NVIDIA H200", Some("H200 SXM")),
            ("NVIDIA H200 NVL", Some("H200 NVL")),
            ("NVIDIA A100-SXM4-80GB", Some("A100 SXM4 80GB")),
            ("NVIDIA A100 80GB PCIe", Some("A100 PCIe 80GB")),
            ("NVIDIA A100-SXM4-40GB", Some("A100 40GB")),
            ("NVIDIA A100-PCIE-40GB", Some("A100 40GB")),
            ("NVIDIA L40S", Some("L40S")),
            ("Tesla T4", None),
            ("", None),
        ] {
            assert_eq!(for_model(name).map(|m| m.name), want, "{name}");
        }
    }

    #[test]
    fn the_docs_table_shows_the_same_figures() {
        let doc = include_str!("../../../docs/jobs.md");
        let tf = |v: f64| format!("{}", v / T);
        for m in PEAKS {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| {} |", m.name)))
                .unwrap_or_else(|| panic!("docs/jobs.md has no peaks row for {}", m.name));
            for v in [
                Some(m.tensor_flops),
                Some(m.fp32_flops),
                m.fp64_flops,
                m.fp16_flops,
            ]
            .into_iter()
            .flatten()
            {
                assert!(row.contains(&tf(v)), "{}: {} not in {row}", m.name, tf(v));
            }
            assert!(row.contains(&format!("{}", m.dram_bytes / GB)), "{row}");
        }
    }
}
