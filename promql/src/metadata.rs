//! `/api/v1/metadata`: the type and help of the dcgm-exporter series gpuwatch answers.

use crate::json;

/// (name, type, help) of every dcgm-exporter series the PromQL API reads.
pub const METADATA: &[(&str, &str, &str)] = &[
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active.",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active.",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active.",
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
    ),
    (
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "Framebuffer memory total (in MiB).",
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
    ),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
    ),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask).",
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons (bitmask).",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus, in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus, in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, in bytes per second.",
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors.",
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed.",
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
    ),
];

/// The `data` of `/api/v1/metadata`, for one metric or all, at most `limit` metrics.
pub fn render(metric: Option<&str>, limit: Option<usize>) -> String {
    let mut out = String::from("{");
    let mut n = 0usize;
    for (name, ty, help) in METADATA {
        if metric.is_some_and(|m| m != *name) {
            continue;
        }
        if limit.is_some_and(|l| n >= l) {
            break;
        }
        if n > 0 {
            out.push(',');
        }
        n += 1;
        out.push_str(&format!(
            "{}:[{{\"type\":\"{ty}\",\"help\":{},\"unit\":\"\"}}]",
            json::string(name),
            json::string(help)
        ));
    }
    out.push('}');
    out
}
