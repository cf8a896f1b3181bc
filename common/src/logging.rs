//! Logs on stderr, as text for people or as JSON lines for log pipelines (`--log-format`), with
//! one filter syntax (`--log-level`: a level or tracing directives).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::error::{Error, Result};

/// `--log-format`: how log lines are written on stderr.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text for people (colours when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, spans), for log pipelines.
    Json,
}

/// The filter of `--log-level`; `quiet` targets are kept at `warn` unless the filter names them.
pub fn filter(level: &str, quiet: &[&str]) -> Result<EnvFilter> {
    let mut directives = level.to_string();
    for target in quiet {
        if !level.contains(target) {
            directives.push_str(&format!(",{target}=warn"));
        }
    }
    EnvFilter::try_new(&directives).map_err(|source| Error::LogFilter {
        level: level.to_string(),
        source,
    })
}

/// The stderr layer for `format`.
pub fn stderr_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => layer
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => layer
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_targets_unless_named() {
        let f = filter("info", &["deltalake_core"]).expect("filter");
        assert!(f.to_string().contains("deltalake_core=warn"), "{f}");
        let f = filter("deltalake_core=debug", &["deltalake_core"]).expect("filter");
        assert!(!f.to_string().contains("deltalake_core=warn"), "{f}");
        assert!(filter("info,[", &[]).is_err());
    }
}
