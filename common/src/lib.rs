//! Plumbing shared by the server (`gpuwatch`) and the agent (`gpuwatch-agent`).
//!
//! - [`settings`]: every setting is one documented field of a clap + serde struct; flags, the
//!   `GPUWATCH_*` environment and the TOML file are merged (flag > env > file > default) by one
//!   generic function, and the reference page is rendered from the same declaration.
//! - [`duration`]: the human durations (`5s`, `1m30s`) settings are written in.
//! - [`logging`]: `--log-level` and `--log-format text|json` for both binaries.
//! - [`metrics`]: the Prometheus registry helpers (`*_build_info`, `process_*`), the registry's
//!   OpenMetrics and text-format 0.0.4 renderings, and the one label escaper / line writer of the
//!   agent's hand-written exposition.

pub mod duration;
mod error;
pub mod logging;
pub mod metrics;
pub mod settings;

pub use duration::HumanDuration;
pub use error::{Error, Result};
