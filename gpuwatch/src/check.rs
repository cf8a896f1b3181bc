//! `gpuwatch check` and `gpuwatch repair`: offline inspection and repair of a data directory
//! (or an `--object-store` prefix), with the server stopped. The work is
//! `gpuwatch_store::check`; this prints it (a table or `--format json`) and sets the exit code.

use std::path::PathBuf;

use clap::Args;
use gpuwatch_store::check::{CheckConfig, Report};

use crate::error::{Error, Result};
use crate::jobs::ReportFormat;

/// Where `check` and `repair` look.
#[derive(Debug, Clone, Args)]
pub(crate) struct CheckArgs {
    /// The server's data directory (WAL, writer id, alerting state; the tables too without
    /// --object-store).
    #[arg(
        long,
        env = "GPUWATCH_DATA_DIR",
        value_name = "DIR",
        default_value = "./gpuwatch-data"
    )]
    data_dir: PathBuf,
    /// The tables' object store, s3://bucket/prefix (credentials from the AWS variables), when
    /// the server keeps them there.
    #[arg(long, env = "GPUWATCH_OBJECT_STORE", value_name = "URL")]
    object_store: Option<String>,
    /// Only check that data files are present with their size, without reading them whole.
    #[arg(long)]
    quick: bool,
    /// Output format.
    #[arg(long, env = "GPUWATCH_FORMAT", value_enum, default_value = "table")]
    format: ReportFormat,
}

/// `gpuwatch repair`'s flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct RepairArgs {
    #[command(flatten)]
    check: CheckArgs,
    /// Make the changes; without it, repair only says what it would do (a dry run).
    #[arg(long)]
    apply: bool,
}

impl CheckArgs {
    fn config(&self) -> CheckConfig {
        CheckConfig {
            data_dir: self.data_dir.clone(),
            object_store: self.object_store.clone(),
            object_store_options: Vec::new(),
            quick: self.quick,
        }
    }
}

fn print(report: &Report, format: ReportFormat) -> Result<()> {
    let text = match format {
        ReportFormat::Table => report.to_table(),
        ReportFormat::Json => {
            let mut j = serde_json::to_string_pretty(report).map_err(|source| Error::Encode {
                what: "report",
                source,
            })?;
            j.push('\n');
            j
        }
    };
    print!("{text}");
    Ok(())
}

/// `gpuwatch check`: lists every damaged WAL record, commit and data file; exit 1 when there is
/// damage.
pub(crate) fn check(args: &CheckArgs) -> Result<()> {
    let report = gpuwatch_store::check::check(&args.config())?;
    print(&report, args.format)?;
    if report.damaged() {
        return Err(Error::Damaged(
            "damage found: `gpuwatch repair` shows what it would do, `gpuwatch repair --apply` does it (with the server stopped)".into(),
        ));
    }
    Ok(())
}

/// `gpuwatch repair`: what would be done (dry run), or, with `--apply`, done.
pub(crate) fn repair(args: &RepairArgs) -> Result<()> {
    let report = gpuwatch_store::check::repair(&args.check.config(), args.apply)?;
    print(&report, args.check.format)?;
    if report.damaged() && !args.apply {
        eprintln!("dry run: nothing was changed; run again with --apply to make these changes");
    }
    Ok(())
}
