//! The `GPUWATCH_*` environment variables: one per flag. Empty variables count as unset.

use std::path::PathBuf;

use super::merge::Layer;
use super::parse::{
    duration_arg, header_arg, label_arg, parse_bool, parse_metrics_addr, value_enum,
};
use super::{Protocol, SourceKind};
use crate::error::{Error, Result};

/// The environment layer. Empty variables count as unset.
pub(super) fn env_layer(env: &dyn Fn(&str) -> Option<String>) -> Result<Layer> {
    fn get<T>(
        env: &dyn Fn(&str) -> Option<String>,
        var: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>> {
        let Some(value) = env(var).filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        parse(&value).map(Some).map_err(|reason| Error::BadEnv {
            var: var.to_string(),
            value,
            reason,
        })
    }
    let string = |v: &str| Ok(v.trim().to_string());
    Ok(Layer {
        endpoint: get(env, "GPUWATCH_ENDPOINT", string)?,
        protocol: get(env, "GPUWATCH_PROTOCOL", value_enum::<Protocol>)?,
        interval: get(env, "GPUWATCH_INTERVAL", duration_arg)?,
        source: get(env, "GPUWATCH_SOURCE", value_enum::<SourceKind>)?,
        synthetic_gpus: get(env, "GPUWATCH_SYNTHETIC_GPUS", |v| {
            v.trim().parse::<usize>().map_err(|e| e.to_string())
        })?,
        host: get(env, "GPUWATCH_HOST", string)?,
        label: get(env, "GPUWATCH_LABEL", |v| {
            v.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(label_arg)
                .collect::<Result<Vec<_>, String>>()
        })?,
        seed: get(env, "GPUWATCH_SEED", |v| {
            v.trim().parse::<u64>().map_err(|e| e.to_string())
        })?,
        once: get(env, "GPUWATCH_ONCE", parse_bool)?,
        config: get(env, "GPUWATCH_CONFIG", |v| Ok(PathBuf::from(v.trim())))?,
        log_level: get(env, "GPUWATCH_LOG_LEVEL", string)?,
        job_mapping_dir: get(env, "GPUWATCH_JOB_MAPPING_DIR", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        pod_resources_socket: get(env, "GPUWATCH_POD_RESOURCES_SOCKET", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        metrics_addr: get(env, "GPUWATCH_METRICS_ADDR", parse_metrics_addr)?,
        buffer_dir: get(env, "GPUWATCH_BUFFER_DIR", |v| Ok(PathBuf::from(v.trim())))?,
        buffer_max_bytes: get(env, "GPUWATCH_BUFFER_MAX_BYTES", |v| {
            v.trim().parse::<u64>().map_err(|e| e.to_string())
        })?,
        fake_dev_dir: get(env, "GPUWATCH_FAKE_DEV_DIR", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        fake_mig: get(env, "GPUWATCH_FAKE_MIG", |v| {
            v.trim().parse::<u32>().map_err(|e| e.to_string())
        })?,
        slow_interval: get(env, "GPUWATCH_SLOW_INTERVAL", duration_arg)?,
        flush_interval: get(env, "GPUWATCH_FLUSH_INTERVAL", duration_arg)?,
        auth_token_file: get(env, "GPUWATCH_AUTH_TOKEN_FILE", |v| {
            Ok(PathBuf::from(v.trim()))
        })?,
        header: get(env, "GPUWATCH_HEADER", |v| {
            v.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(header_arg)
                .collect::<Result<Vec<_>, String>>()
        })?,
    })
}
