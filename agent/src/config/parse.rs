//! Parsers of the values that flags, environment variables and the file share.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ValueEnum;

use super::MetricsAddr;
use crate::error::{Error, Result};

/// Parse a humantime duration (`5s`, `500ms`, `1m`).
pub fn parse_duration(value: &str) -> Result<Duration> {
    humantime::parse_duration(value.trim()).map_err(|e| Error::BadDuration {
        value: value.to_string(),
        reason: e.to_string(),
    })
}

/// Parse `key=value`.
pub fn parse_label(value: &str) -> Result<(String, String)> {
    let bad = || Error::BadLabel {
        value: value.to_string(),
    };
    let (k, v) = value.split_once('=').ok_or_else(bad)?;
    let k = k.trim();
    if k.is_empty() {
        return Err(bad());
    }
    Ok((k.to_string(), v.trim().to_string()))
}

pub(super) fn duration_arg(value: &str) -> Result<Duration, String> {
    parse_duration(value).map_err(|e| e.to_string())
}

/// Parse `--metrics-addr`: `host:port`, or `off` / `none` / empty to disable.
pub fn parse_metrics_addr(value: &str) -> Result<MetricsAddr, String> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("none") {
        return Ok(MetricsAddr(None));
    }
    v.parse::<SocketAddr>()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("expected an address such as 127.0.0.1:9400, or off; got {v:?}"))
}

pub(super) fn metrics_addr_arg(value: &str) -> Result<MetricsAddr, String> {
    parse_metrics_addr(value)
}

/// A `--header KEY=VALUE`.
pub(super) fn header_arg(value: &str) -> Result<(String, String), String> {
    let (k, v) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not KEY=VALUE"))?;
    let (k, v) = (k.trim().to_string(), v.trim().to_string());
    super::otel::check_header(&k, &v)?;
    Ok((k, v))
}

pub(super) fn label_arg(value: &str) -> Result<(String, String), String> {
    parse_label(value).map_err(|e| e.to_string())
}

pub(super) fn value_enum<T: ValueEnum>(value: &str) -> Result<T, String> {
    T::from_str(value.trim(), true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("expected one of: {}", names.join(", "))
    })
}

pub(super) fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".to_string()),
    }
}
