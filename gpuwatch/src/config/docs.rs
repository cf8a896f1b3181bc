//! docs/configuration.md's tables of settings, rendered from the declarations, so the page,
//! `--help` and the code cannot drift. The page holds each table between `<!-- BEGIN name -->`
//! and `<!-- END name -->`; a test renders them and compares (`GPUWATCH_BLESS=1` rewrites the
//! page).

use clap::{Args, Command, CommandFactory};
use gpuwatch_common::settings::{reference, replace_block};

/// The tables: (marker name, the command whose settings it lists).
pub(super) fn tables() -> Vec<(&'static str, Command)> {
    let cli = crate::Cli::command();
    let sub = |name: &'static str| {
        cli.find_subcommand(name)
            .cloned()
            .unwrap_or_else(|| Command::new(name))
    };
    vec![
        ("serve", sub("serve")),
        (
            "demo",
            super::settings::Fleet::augment_args(Command::new("demo")),
        ),
        ("sql", sub("sql")),
        ("job", sub("job")),
        ("jobs", sub("jobs")),
        ("check", sub("check")),
        ("repair", sub("repair")),
        ("agent", gpuwatch_agent::config::Cli::command()),
    ]
}

/// `doc` with every table rendered anew; `None` when a marker is missing.
pub(super) fn render(doc: &str) -> Option<String> {
    let mut out = doc.to_string();
    for (name, cmd) in tables() {
        out = replace_block(&out, name, &reference(&cmd))?;
    }
    Some(out)
}
