//! The `[jobs.advice]` section: every threshold of the job limiter and of the job report's
//! notes, with its default and the reason for it (docs/jobs.md, "Thresholds"). A site tunes
//! them the way jobstats and ClusterCockpit let sites tune theirs.
//!
//! ```toml
//! [jobs.advice]
//! input_duty = 0.6          # stricter about input stalls than the default 0.7
//! min_gpu_seconds = 600     # only judge jobs that held a GPU for 10 minutes
//! ```

use serde::Deserialize;

use crate::error::{Error, Result};

/// The `[jobs]` section of the server's config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsConfig {
    /// `[jobs.advice]`: thresholds of the limiter and the notes.
    #[serde(default)]
    pub advice: AdviceConfig,
    /// `[jobs.work]`: the counters a job reports its work with.
    #[serde(default)]
    pub work: super::work::WorkConfig,
}

impl JobsConfig {
    /// Checks both sections.
    pub fn validate(&self) -> Result<()> {
        self.advice.validate()?;
        self.work.validate()
    }
}

/// The thresholds of the limiter (per sample) and of the notes (per GPU). Ratios are in 0..1.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdviceConfig {
    /// Rules about how a job ran speak only for a GPU held at least this long, seconds
    /// [default: 300]: a short test job gets no lecture. `xid` and `ecc` always speak.
    pub min_gpu_seconds: f64,
    /// `idle_gpus`: a GPU idle for at least this share of its time in the job [default: 0.8].
    pub idle_gpu_share: f64,

    /// Limiter `host_transfer`: the busier PCIe direction at or above this share of the link's
    /// bandwidth (generation × width) [default: 0.05]. Pageable copies on an H100 moved 12% of a
    /// gen 5 x16 link; every other recorded workload under 0.3%.
    pub host_transfer_link_share: f64,
    /// Limiter `host_transfer` on a GPU whose link is not known: the busier direction at or
    /// above this many bytes per second [default: 1e9, 6% of a gen 3 x16 link, the slowest link
    /// of a data-centre GPU of the last decade].
    pub host_transfer_bytes_per_second: f64,
    /// Limiter `host_transfer` also needs SM activity below this [default: 0.5]: a GPU that
    /// computes while it copies is judged by its computing.
    pub host_transfer_max_sm_active: f64,
    /// Limiter `latency`: SM activity below this share of the time kernels ran (`sm_active` /
    /// max(`gpu_utilization`, `sm_active`)) [default: 0.5]: the kernels left most SMs idle.
    /// NVIDIA's DCGM guide calls SM activity under 0.5 likely ineffective use.
    pub latency_sm_fill: f64,
    /// Limiter `input`: kernels fill the SMs but run less than this share of the time
    /// [default: 0.7]: the GPU waits on the host between bursts. Measured: 0.59 for a matmul
    /// loop fed by one decoding thread, 0.8 for the same training with 8 loader workers.
    pub input_duty: f64,
    /// Limiter `latency` for a GPU busy all the time whose busiest unit (tensor, FP16, FP32,
    /// FP64 pipe or DRAM) is below this [default: 0.1]: no roof is near, the kernels wait on
    /// something else (memory latency, synchronisation, integer work).
    pub min_unit_activity: f64,

    /// A limiter class holding at least this share of a GPU's non-idle time gives its note
    /// (`input_stall`, `no_tensor_cores`, `memory_bound`, `host_transfer_bound`,
    /// `low_utilization`) [default: 0.3]: a phase of a third of the job is worth fixing, and a
    /// few noisy samples are not.
    pub limiter_share: f64,
    /// `memory_bound` also needs the mean DRAM activity of the memory-limited time at or above
    /// this [default: 0.5]: below half the bandwidth the memory is not what holds the job back.
    pub memory_bound_dram_active: f64,

    /// `tiny_kernels`: mean utilisation at or above this ... [default: 0.5]
    pub busy_utilization: f64,
    /// ... with mean SM activity below this [default: 0.25].
    pub low_sm_active: f64,
    /// `low_memory`: peak memory below this share of the GPU's memory [default: 0.2] ...
    pub low_memory_share: f64,
    /// ... while SM activity (utilisation where the GPU has no SM activity counter) averaged
    /// over its non-idle time stays below this [default: 0.5]: a job that keeps the SMs busy
    /// needs the whole GPU whatever memory it uses.
    pub low_memory_max_sm_active: f64,
    /// `throttled`: HW slowdown, SW or HW thermal slowdown or HW power brake in at least this
    /// share of the samples [default: 0.1].
    pub throttled_share: f64,
    /// `power_capped` (informational): the SW power cap in at least this share of the samples
    /// [default: 0.1].
    pub power_capped_share: f64,
    /// `time_limit`: an ended job that ran less than this share of its requested time limit
    /// (and left at least an hour of it unused) [default: 0.4].
    pub time_limit_share: f64,
}

impl Default for AdviceConfig {
    fn default() -> Self {
        Self {
            min_gpu_seconds: 300.0,
            idle_gpu_share: 0.8,
            host_transfer_link_share: 0.05,
            host_transfer_bytes_per_second: 1e9,
            host_transfer_max_sm_active: 0.5,
            latency_sm_fill: 0.5,
            input_duty: 0.7,
            min_unit_activity: 0.1,
            limiter_share: 0.3,
            memory_bound_dram_active: 0.5,
            busy_utilization: 0.5,
            low_sm_active: 0.25,
            low_memory_share: 0.2,
            low_memory_max_sm_active: 0.5,
            throttled_share: 0.1,
            power_capped_share: 0.1,
            time_limit_share: 0.4,
        }
    }
}

impl AdviceConfig {
    /// The ratios, by their TOML key.
    fn ratios(&self) -> [(&'static str, f64); 15] {
        [
            ("idle_gpu_share", self.idle_gpu_share),
            ("host_transfer_link_share", self.host_transfer_link_share),
            (
                "host_transfer_max_sm_active",
                self.host_transfer_max_sm_active,
            ),
            ("latency_sm_fill", self.latency_sm_fill),
            ("input_duty", self.input_duty),
            ("min_unit_activity", self.min_unit_activity),
            ("limiter_share", self.limiter_share),
            ("memory_bound_dram_active", self.memory_bound_dram_active),
            ("busy_utilization", self.busy_utilization),
            ("low_sm_active", self.low_sm_active),
            ("low_memory_share", self.low_memory_share),
            ("low_memory_max_sm_active", self.low_memory_max_sm_active),
            ("throttled_share", self.throttled_share),
            ("power_capped_share", self.power_capped_share),
            ("time_limit_share", self.time_limit_share),
        ]
    }

    /// Checks the values: ratios in 0..1, durations and rates not negative.
    pub fn validate(&self) -> Result<()> {
        for (key, v) in self.ratios() {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::Config(format!(
                    "jobs.advice.{key} = {v}: write a ratio between 0 and 1 (docs/jobs.md lists each threshold)"
                )));
            }
        }
        for (key, v) in [
            ("min_gpu_seconds", self.min_gpu_seconds),
            (
                "host_transfer_bytes_per_second",
                self.host_transfer_bytes_per_second,
            ),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::Config(format!(
                    "jobs.advice.{key} = {v}: write a number of 0 or more"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_to_missing_keys_and_bad_values_are_refused() {
        let j: JobsConfig = toml::from_str("[advice]\ninput_duty = 0.6\n").expect("parse");
        assert_eq!(j.advice.input_duty, 0.6);
        assert_eq!(j.advice.min_gpu_seconds, 300.0);
        assert!(j.advice.validate().is_ok());
        let empty: JobsConfig = toml::from_str("").expect("empty");
        assert_eq!(empty.advice, AdviceConfig::default());
        let unknown = toml::from_str::<JobsConfig>("[advice]\ninput_dutty = 0.6\n");
        assert!(
            unknown
                .expect_err("unknown key")
                .to_string()
                .contains("input_dutty")
        );
        let bad = AdviceConfig {
            limiter_share: 1.5,
            ..AdviceConfig::default()
        };
        let e = bad.validate().expect_err("ratio").to_string();
        assert!(e.contains("jobs.advice.limiter_share"), "{e}");
        let bad = AdviceConfig {
            min_gpu_seconds: -1.0,
            ..AdviceConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
