//! The TOML config file of `--config`: the same settings as the flags, keys named like them
//! with underscores; unknown keys are errors.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::merge::Layer;
use super::parse::{parse_duration, parse_label, parse_metrics_addr, value_enum};
use super::{Protocol, SourceKind};
use crate::error::{Error, Result};

/// The config file: the same settings as the flags, keys named like them with underscores.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// OTLP endpoint.
    pub endpoint: Option<String>,
    /// `http` or `grpc`.
    pub protocol: Option<String>,
    /// Humantime duration, e.g. `"5s"`.
    pub interval: Option<String>,
    /// `auto`, `nvml` or `synthetic`.
    pub source: Option<String>,
    /// Simulated GPUs.
    pub synthetic_gpus: Option<usize>,
    /// Host name.
    pub host: Option<String>,
    /// Static labels, `["key=value", …]`.
    pub label: Option<Vec<String>>,
    /// Seed of the simulated fleet.
    pub seed: Option<u64>,
    /// Collect once and print.
    pub once: Option<bool>,
    /// Log filter.
    pub log_level: Option<String>,
    /// Job mapping directory.
    pub job_mapping_dir: Option<PathBuf>,
    /// The kubelet's pod-resources socket.
    pub pod_resources_socket: Option<PathBuf>,
    /// `/metrics` address or `off`.
    pub metrics_addr: Option<String>,
    /// Disk spool directory.
    pub buffer_dir: Option<PathBuf>,
    /// Disk spool bound, bytes.
    pub buffer_max_bytes: Option<u64>,
    /// Device nodes of `--source fake`.
    pub fake_dev_dir: Option<PathBuf>,
    /// MIG instances per GPU of `--source fake`.
    pub fake_mig: Option<u32>,
    /// Humantime duration between reads of the costly counters.
    pub slow_interval: Option<String>,
    /// Humantime duration a collection may wait to be sent with the next ones.
    pub flush_interval: Option<String>,
    /// File holding the bearer token sent to the endpoint.
    pub auth_token_file: Option<PathBuf>,
    /// Headers sent with every request, `["key=value", …]`.
    pub header: Option<Vec<String>>,
}

/// Read and parse the config file at `path`.
pub(super) fn file_layer(path: &Path) -> Result<Layer> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
        path: path.to_path_buf(),
        source,
    })?;
    parse_file(path, &text)
}

/// Parse config file `text` (read from `path`, for messages).
pub(super) fn parse_file(path: &Path, text: &str) -> Result<Layer> {
    let bad = |message: String| Error::ConfigParse {
        path: path.to_path_buf(),
        message,
    };
    let file: FileConfig =
        toml::from_str(text).map_err(|e| bad(e.to_string().trim().to_string()))?;
    let field = |key: &str, message: String| bad(format!("key `{key}`: {message}"));
    Ok(Layer {
        endpoint: file.endpoint,
        protocol: file
            .protocol
            .map(|v| value_enum::<Protocol>(&v).map_err(|m| field("protocol", m)))
            .transpose()?,
        interval: file
            .interval
            .map(|v| parse_duration(&v).map_err(|e| field("interval", e.to_string())))
            .transpose()?,
        source: file
            .source
            .map(|v| value_enum::<SourceKind>(&v).map_err(|m| field("source", m)))
            .transpose()?,
        synthetic_gpus: file.synthetic_gpus,
        host: file.host,
        label: file
            .label
            .map(|labels| {
                labels
                    .iter()
                    .map(|l| parse_label(l).map_err(|e| field("label", e.to_string())))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?,
        seed: file.seed,
        once: file.once,
        config: None,
        log_level: file.log_level,
        job_mapping_dir: file.job_mapping_dir,
        pod_resources_socket: file.pod_resources_socket,
        metrics_addr: file
            .metrics_addr
            .map(|v| parse_metrics_addr(&v).map_err(|m| field("metrics_addr", m)))
            .transpose()?,
        buffer_dir: file.buffer_dir,
        buffer_max_bytes: file.buffer_max_bytes,
        fake_dev_dir: file.fake_dev_dir,
        fake_mig: file.fake_mig,
        slow_interval: file
            .slow_interval
            .map(|v| parse_duration(&v).map_err(|e| field("slow_interval", e.to_string())))
            .transpose()?,
        flush_interval: file
            .flush_interval
            .map(|v| parse_duration(&v).map_err(|e| field("flush_interval", e.to_string())))
            .transpose()?,
        auth_token_file: file.auth_token_file,
        header: file
            .header
            .map(|hs| {
                hs.iter()
                    .map(|h| super::parse::header_arg(h).map_err(|m| field("header", m)))
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?,
    })
}
