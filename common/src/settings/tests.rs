//! The layering of settings: precedence, the environment, the file's keys and values.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser};
use serde::{Deserialize, Serialize};

use super::*;
use crate::HumanDuration;

/// A group of settings as a binary declares them.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
struct Net {
    /// Where to listen.
    #[arg(long, env = "T_ADDR", default_value = "127.0.0.1:1")]
    addr: SocketAddr,
    /// How often.
    #[arg(long, env = "T_EVERY", default_value = "5s")]
    every: HumanDuration,
    /// Be open.
    #[arg(long, env = "T_OPEN")]
    open: bool,
}

#[derive(Debug, Clone, Args, Serialize, Deserialize)]
struct Other {
    /// Labels.
    #[arg(long, env = "T_LABEL")]
    label: Vec<String>,
    /// A mode.
    #[arg(long, env = "T_MODE", value_enum, default_value = "fast")]
    mode: Mode,
    /// Optional path.
    #[arg(long, env = "T_PATH", conflicts_with = "label")]
    path: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Fast,
    Slow,
}

#[derive(Debug, Clone, Parser, Serialize, Deserialize)]
struct Cli {
    /// The file.
    #[arg(long, env = "T_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    net: Net,
    #[command(flatten)]
    #[serde(flatten)]
    other: Other,
}

fn load_with(args: &[&str], env: &[(&str, &str)]) -> Result<Loaded<Cli>> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |k: &str| map.get(k).cloned();
    load(
        Cli::command(),
        std::iter::once("t").chain(args.iter().copied()),
        Sources {
            env: &lookup,
            other_keys: &["section"],
        },
    )
}

fn file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("c.toml");
    std::fs::write(&p, text).expect("write");
    let s = p.display().to_string();
    (dir, s)
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let (_d, f) =
        file("addr = \"127.0.0.1:3\"\nevery = \"1m\"\nlabel = [\"file\"]\nmode = \"slow\"\n");
    let l = load_with(
        &["--config", &f, "--addr", "127.0.0.1:4"],
        &[("T_ADDR", "127.0.0.1:5"), ("T_EVERY", "7s")],
    )
    .expect("load");
    assert_eq!(l.settings.net.addr.port(), 4, "flag beats env");
    assert_eq!(l.settings.net.every.get().as_secs(), 7, "env beats file");
    assert_eq!(
        l.settings.other.label,
        vec!["file".to_string()],
        "file beats default"
    );
    assert_eq!(l.settings.other.mode, Mode::Slow);
    assert!(!l.settings.net.open, "default");
    assert!(l.given.contains("addr") && l.given.contains("label") && !l.given.contains("open"));
    // A flag typed with its default value still wins.
    let l = load_with(&["--config", &f, "--every", "5s"], &[]).expect("load");
    assert_eq!(l.settings.net.every.get().as_secs(), 5);
    // The file's variable, and the flag over it.
    let (_d2, g) = file("mode = \"fast\"\n");
    let l = load_with(&["--config", &g], &[("T_CONFIG", &f)]).expect("load");
    assert_eq!(l.settings.other.mode, Mode::Fast);
    let l = load_with(&[], &[("T_CONFIG", &f)]).expect("load");
    assert_eq!(l.settings.other.mode, Mode::Slow);
}

#[test]
fn environment_values() {
    let l = load_with(
        &[],
        &[
            ("T_OPEN", "yes"),
            ("T_LABEL", "a, b,,c"),
            ("T_PATH", " "),
            ("T_MODE", "SLOW"),
        ],
    );
    let e = l.expect_err("case of an enum");
    assert!(e.to_string().contains("expected one of: fast, slow"), "{e}");
    let l = load_with(
        &[],
        &[("T_OPEN", "yes"), ("T_LABEL", "a, b,,c"), ("T_PATH", " ")],
    )
    .expect("load");
    assert!(l.settings.net.open);
    assert_eq!(l.settings.other.label, ["a", "b", "c"]);
    assert_eq!(l.settings.other.path, None, "an empty variable is unset");
    let e = load_with(&[], &[("T_EVERY", "soon")]).expect_err("bad");
    assert!(matches!(e, Error::BadEnv { .. }), "{e}");
    assert!(
        e.to_string().contains("T_EVERY") && e.to_string().contains("use e.g. 5s"),
        "{e}"
    );
    // A variable of an argument related to others (conflicts_with) is checked too.
    let l = load_with(&[], &[("T_PATH", "/p")]).expect("load");
    assert_eq!(
        l.settings.other.path.as_deref(),
        Some(std::path::Path::new("/p"))
    );
    let e = load_with(&[], &[("T_OPEN", "maybe")]).expect_err("bad bool");
    assert!(e.to_string().contains("T_OPEN"), "{e}");
}

#[test]
fn file_keys_and_values_are_checked_with_their_line() {
    let (_d, f) = file("# a comment\nmode = \"fast\"\nadr = \"x\"\n");
    let e = load_with(&["--config", &f], &[])
        .expect_err("unknown key")
        .to_string();
    assert!(
        e.contains("adr") && e.contains("line 3") && e.contains(&f),
        "{e}"
    );
    let (_d, f) = file("mode = \"fast\"\n\naddr = \"nonsense\"\n");
    let e = load_with(&["--config", &f], &[])
        .expect_err("bad value")
        .to_string();
    assert!(e.contains("line 3") && e.contains("`addr`"), "{e}");
    let (_d, f) = file("every = 5\n");
    assert!(load_with(&["--config", &f], &[]).is_err());
    let (_d, f) = file("[section]\nx = 1\n");
    let l = load_with(&["--config", &f], &[]).expect("other keys pass");
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        x: u32,
    }
    let s: Option<Section> = section(l.file.as_deref(), &l.file_text, "section").expect("section");
    assert_eq!(s.map(|s| s.x), Some(1));
    let (_d, f) = file("[section]\ny = 1\n");
    let l = load_with(&["--config", &f], &[]).expect("load");
    let e = section::<Section>(l.file.as_deref(), &l.file_text, "section").expect_err("unknown");
    assert!(
        e.to_string().contains("line 1") && e.to_string().contains("y"),
        "{e}"
    );
    let e = load_with(&["--config", "/nonexistent/x.toml"], &[]).expect_err("missing");
    assert!(matches!(e, Error::ConfigRead { .. }), "{e}");
}

#[test]
fn help_shows_the_variables_and_the_reference_lists_every_flag() {
    let e = load_with(&["--help"], &[]).expect_err("help");
    let help = e.to_string();
    assert!(
        help.contains("T_EVERY") && help.contains("[default: 5s]"),
        "{help}"
    );
    let r = reference(&Cli::command());
    for f in [
        "`--addr ADDR`",
        "`T_EVERY`",
        "`5s`",
        "How often",
        "`--label LABEL` (repeatable)",
        "`fast`",
    ] {
        assert!(r.contains(f), "{f} missing from\n{r}");
    }
    assert_eq!(flags(&Cli::command()).len(), 7);
    let doc = "a\n<!-- BEGIN x -->\nold\n<!-- END x -->\nb";
    assert_eq!(
        replace_block(doc, "x", "new\n").as_deref(),
        Some("a\n<!-- BEGIN x -->\nnew\n<!-- END x -->\nb")
    );
}
