//! Sources of GPU samples: the [`Source`] trait, the [`GpuSample`] it yields, and the two
//! implementations: [`nvml::NvmlSource`] (real GPUs through `libnvidia-ml.so.1`) and
//! [`synthetic::Fleet`] (a simulated node of H100s, for demos and tests).
//!
//! The fields of [`GpuSample`] are the value columns of `gpu_metrics` in docs/schema.md, in the
//! same order and with the same units. `None` means the source could not read the value; it is
//! never replaced by 0.

pub mod fake;
pub mod gpm;
pub mod nvml;
pub mod synthetic;

use serde::Serialize;

use crate::error::Result;

/// The scheduler job that owns a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobLabels {
    /// Job id as the scheduler prints it (e.g. Slurm's `SLURM_JOB_ID`).
    pub id: String,
    /// User that submitted the job.
    pub user: String,
    /// Job name.
    pub name: String,
    /// `slurm`, `kubernetes` or `static`.
    pub scheduler: String,
    /// The Kubernetes pod and container, for `scheduler = kubernetes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s: Option<PodLabels>,
    /// Account, partition, QOS, array ids, time limit and pod labels, where known.
    #[serde(skip_serializing_if = "JobExtra::is_empty")]
    pub extra: JobExtra,
}

/// What a job says of itself beyond its id, user and name: the chargeback labels. Empty
/// strings (and `None`) mean unknown and are not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobExtra {
    /// Slurm account (`SLURM_JOB_ACCOUNT`, `job.account`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub account: String,
    /// Slurm partition (`SLURM_JOB_PARTITION`, `job.partition`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// Slurm QOS (`SLURM_JOB_QOS`, `job.qos`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub qos: String,
    /// Id of the array job this job is a task of (`SLURM_ARRAY_JOB_ID`, `job.array_id`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub array_id: String,
    /// Task id within the array (`SLURM_ARRAY_TASK_ID`, `job.array_task_id`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub array_task_id: String,
    /// The job's time limit in seconds (`job.time_limit_seconds`), from the job mapping dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_limit_seconds: Option<u64>,
    /// The pod labels named by `--pod-label`, sorted by name (`k8s.pod.label.<name>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<(String, String)>,
    /// On a GPU sample, when several jobs used the GPU: each job's share of it, `id=share` pairs
    /// sorted by id and joined by `,` (`job.shares`; [`crate::attribute::shares`]). Empty
    /// otherwise; never filled from another sample.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub shares: String,
}

impl JobExtra {
    /// True when nothing is known.
    pub fn is_empty(&self) -> bool {
        *self == JobExtra::default()
    }

    /// Fills what `self` does not know from `other` (field by field).
    pub fn fill_from(&mut self, other: &JobExtra) {
        for (mine, theirs) in [
            (&mut self.account, &other.account),
            (&mut self.partition, &other.partition),
            (&mut self.qos, &other.qos),
            (&mut self.array_id, &other.array_id),
            (&mut self.array_task_id, &other.array_task_id),
        ] {
            if mine.is_empty() {
                mine.clone_from(theirs);
            }
        }
        if self.time_limit_seconds.is_none() {
            self.time_limit_seconds = other.time_limit_seconds;
        }
        if self.labels.is_empty() {
            self.labels.clone_from(&other.labels);
        }
    }

    /// The attributes to send, `(OTLP name, value)`, unknown ones left out.
    pub fn attributes(&self) -> Vec<(String, ExtraValue<'_>)> {
        let mut out = Vec::new();
        for (k, v) in [
            ("job.account", &self.account),
            ("job.partition", &self.partition),
            ("job.qos", &self.qos),
            ("job.array_id", &self.array_id),
            ("job.array_task_id", &self.array_task_id),
        ] {
            if !v.is_empty() {
                out.push((k.to_string(), ExtraValue::Str(v)));
            }
        }
        if let Some(t) = self.time_limit_seconds {
            let t = i64::try_from(t).unwrap_or(i64::MAX);
            out.push(("job.time_limit_seconds".to_string(), ExtraValue::Int(t)));
        }
        for (k, v) in &self.labels {
            out.push((format!("k8s.pod.label.{k}"), ExtraValue::Str(v)));
        }
        if !self.shares.is_empty() {
            out.push(("job.shares".to_string(), ExtraValue::Str(&self.shares)));
        }
        out
    }
}

/// The value of one [`JobExtra::attributes`] entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraValue<'a> {
    /// A string attribute.
    Str(&'a str),
    /// An integer attribute.
    Int(i64),
}

/// Where a GPU is allocated in Kubernetes (from the kubelet's pod-resources API).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PodLabels {
    /// `k8s.namespace.name`.
    pub namespace: String,
    /// `k8s.pod.name`.
    pub pod: String,
    /// `k8s.container.name`.
    pub container: String,
}

/// One reading of one GPU (or MIG instance). Becomes one row of `gpu_metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSample {
    /// When the sample was taken, Unix nanoseconds. Every OTLP point of this sample carries it.
    pub time_unix_nano: u64,
    /// NVML UUID, e.g. `GPU-d853f77f-20d8-fea5-b52e-db4f7c0749c4` (OTLP `hw.id`).
    pub gpu_uuid: String,
    /// NVML device index (OTLP `gpu.index`).
    pub gpu_index: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3` (OTLP `hw.model`).
    pub gpu_model: String,
    /// MIG instance as `gi.ci`, `None` for a whole GPU.
    pub mig_instance: Option<String>,
    /// The job that owns the GPU, `None` when free or unknown.
    pub job: Option<JobLabels>,

    /// Ratio 0..1 of time a kernel ran (`hw.gpu.utilization`).
    pub gpu_utilization: Option<f64>,
    /// Ratio 0..1 of time the memory controller was busy (`gpu.memory_controller.utilization`).
    pub memory_utilization: Option<f64>,
    /// GPM SM activity ratio (`gpu.sm.active`).
    pub sm_active: Option<f64>,
    /// GPM SM occupancy ratio (`gpu.sm.occupancy`).
    pub sm_occupancy: Option<f64>,
    /// GPM tensor pipe activity ratio (`gpu.tensor.active`).
    pub tensor_active: Option<f64>,
    /// GPM DRAM bandwidth activity ratio (`gpu.dram.active`).
    pub dram_active: Option<f64>,
    /// GPM FP64 pipe activity ratio (`gpu.fp64.active`).
    pub fp64_active: Option<f64>,
    /// GPM FP32 pipe activity ratio (`gpu.fp32.active`).
    pub fp32_active: Option<f64>,
    /// GPM FP16 pipe activity ratio (`gpu.fp16.active`).
    pub fp16_active: Option<f64>,
    /// Ratio 0..1 of time the graphics engine was active, GPM `GRAPHICS_UTIL`
    /// (`gpu.graphics.active`; dcgm-exporter's `DCGM_FI_PROF_GR_ENGINE_ACTIVE`).
    pub gr_engine_active: Option<f64>,
    /// Framebuffer memory in use, bytes (`hw.gpu.memory.usage`).
    pub memory_used_bytes: Option<i64>,
    /// Framebuffer memory installed, bytes (`hw.gpu.memory.limit`).
    pub memory_total_bytes: Option<i64>,
    /// Board power draw, watts (`hw.power`).
    pub power_watts: Option<f64>,
    /// Energy since driver load, joules; only ever increases (`hw.energy`).
    pub energy_joules: Option<f64>,
    /// GPU core temperature, °C (`hw.temperature`).
    pub temperature_celsius: Option<f64>,
    /// HBM temperature, °C (`gpu.memory.temperature`).
    pub memory_temperature_celsius: Option<f64>,
    /// SM clock, MHz (`gpu.clock.sm`).
    pub sm_clock_mhz: Option<i64>,
    /// Memory clock, MHz (`gpu.clock.memory`).
    pub memory_clock_mhz: Option<i64>,
    /// NVML clocks-event-reasons bitmask: 0x1 GPU idle, 0x4 SW power cap, …
    /// (`gpu.clock.event_reasons`).
    pub clock_event_reasons: Option<i64>,
    /// PCIe bytes per second sent by the GPU (`gpu.pcie.transmit.rate`).
    pub pcie_tx_bytes_per_second: Option<f64>,
    /// PCIe bytes per second received by the GPU (`gpu.pcie.receive.rate`).
    pub pcie_rx_bytes_per_second: Option<f64>,
    /// NVLink bytes per second sent, all links (`gpu.nvlink.transmit.rate`).
    pub nvlink_tx_bytes_per_second: Option<f64>,
    /// NVLink bytes per second received, all links (`gpu.nvlink.receive.rate`).
    pub nvlink_rx_bytes_per_second: Option<f64>,
    /// Single-bit (corrected) ECC errors since driver load (`hw.errors`, `error.type=corrected`).
    pub ecc_sbe_volatile_total: Option<i64>,
    /// Double-bit (uncorrected) ECC errors since driver load (`hw.errors`,
    /// `error.type=uncorrected`).
    pub ecc_dbe_volatile_total: Option<i64>,
    /// Rows remapped for uncorrectable errors (`gpu.remapped_rows.uncorrectable`).
    pub remapped_rows_uncorrectable: Option<i64>,
    /// 1 when a row remapping failed (`gpu.remapped_rows.failure`).
    pub remapped_rows_failure: Option<i64>,
    /// XID errors since agent start (`gpu.xid.errors`).
    pub xid_errors_total: Option<i64>,
    /// The GPU's maximum SM clock, MHz (`gpu.clock.sm.max`): the clock the activity ratios'
    /// peaks are quoted at.
    pub sm_clock_max_mhz: Option<i64>,
    /// Current PCIe link generation, 1–6 (`gpu.pcie.link.generation`).
    pub pcie_link_gen: Option<i64>,
    /// Current PCIe link width, lanes (`gpu.pcie.link.width`).
    pub pcie_link_width: Option<i64>,
}

impl GpuSample {
    /// A sample with the identity set and every value `None`.
    pub fn empty(time_unix_nano: u64, gpu_uuid: String, gpu_index: u32, gpu_model: String) -> Self {
        GpuSample {
            time_unix_nano,
            gpu_uuid,
            gpu_index,
            gpu_model,
            mig_instance: None,
            job: None,
            gpu_utilization: None,
            memory_utilization: None,
            sm_active: None,
            sm_occupancy: None,
            tensor_active: None,
            dram_active: None,
            fp64_active: None,
            fp32_active: None,
            fp16_active: None,
            gr_engine_active: None,
            memory_used_bytes: None,
            memory_total_bytes: None,
            power_watts: None,
            energy_joules: None,
            temperature_celsius: None,
            memory_temperature_celsius: None,
            sm_clock_mhz: None,
            memory_clock_mhz: None,
            clock_event_reasons: None,
            pcie_tx_bytes_per_second: None,
            pcie_rx_bytes_per_second: None,
            nvlink_tx_bytes_per_second: None,
            nvlink_rx_bytes_per_second: None,
            ecc_sbe_volatile_total: None,
            ecc_dbe_volatile_total: None,
            remapped_rows_uncorrectable: None,
            remapped_rows_failure: None,
            xid_errors_total: None,
            sm_clock_max_mhz: None,
            pcie_link_gen: None,
            pcie_link_width: None,
        }
    }
}

/// One process holding a context on a GPU. Becomes one row of `gpu_processes`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSample {
    /// When the sample was taken, Unix nanoseconds.
    pub time_unix_nano: u64,
    /// UUID of the GPU the process runs on.
    pub gpu_uuid: String,
    /// NVML index of that GPU.
    pub gpu_index: u32,
    /// Process id (in the agent's pid namespace).
    pub pid: u32,
    /// Short command name from `/proc/<pid>/comm`, when readable.
    pub process_name: Option<String>,
    /// The job the process belongs to (from its environment or cgroup).
    pub job: Option<JobLabels>,
    /// GPU memory used by the process, bytes.
    pub used_memory_bytes: Option<i64>,
    /// Ratio 0..1 of the GPU's SMs the process kept busy since the previous sample.
    pub sm_utilization: Option<f64>,
}

/// Something that happened on a GPU between two collections (NVML event set). Becomes one row
/// of `gpu_events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuEvent {
    /// When the agent saw it, Unix nanoseconds.
    pub time_unix_nano: u64,
    /// UUID of the GPU.
    pub gpu_uuid: String,
    /// NVML index of the GPU.
    pub gpu_index: u32,
    /// `xid`, `ecc_sbe` or `ecc_dbe`.
    pub kind: String,
    /// The XID number; 0 for ECC events.
    pub code: i64,
    /// Free text, e.g. `xid 79: GPU has fallen off the bus`.
    pub detail: String,
}

/// Something that reads the GPUs of one host.
///
/// Time is passed in rather than read from the clock, so that tests are deterministic and the
/// server's `demo` can backfill history by calling [`Source::collect`] with past times.
pub trait Source: Send {
    /// Short name for logs: `nvml` or `synthetic`.
    fn name(&self) -> &'static str;

    /// Read every GPU once, stamping each sample with `now_unix_nano`.
    fn collect(&mut self, now_unix_nano: u64) -> Result<Vec<GpuSample>>;

    /// Whether the samples are simulated (adds `gpuwatch.simulated = true` to the resource).
    fn simulated(&self) -> bool {
        false
    }

    /// The processes on the GPUs, read by the last [`Source::collect`]. Empty by default.
    fn processes(&mut self) -> Vec<ProcessSample> {
        Vec::new()
    }

    /// The events seen since the previous call (drained). Empty by default.
    fn events(&mut self) -> Vec<GpuEvent> {
        Vec::new()
    }

    /// Whether the host's job attribution (mapping dir, `/proc`) applies to these GPUs. The
    /// simulated fleet carries its own simulated jobs and says no.
    fn attributable(&self) -> bool {
        true
    }
}
