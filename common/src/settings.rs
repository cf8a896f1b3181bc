//! Settings declared once, read from three places.
//!
//! A binary declares its settings as one struct of groups (listeners, storage, query limits, …),
//! each group a struct whose fields derive both [`clap::Args`] and serde: the field's name is the
//! TOML key, its `#[arg(long, env = "GPUWATCH_…", default_value = …)]` the flag, the variable and
//! the default, its doc comment the `--help` text and the line of the reference page
//! ([`reference`]). Adding a setting is adding such a field.
//!
//! [`load`] merges the three places with one precedence, **flag > environment > file >
//! default**, for every setting alike:
//!
//! 1. the command line is parsed with the variables of the leaf (sub)command read through an
//!    injected lookup (so tests never touch the process environment): an empty variable counts
//!    as unset, a `SetTrue` flag takes `true`/`false`/`1`/`0`/`yes`/`no`/`on`/`off`, a repeatable
//!    flag takes a comma-separated list, and a value its setting refuses names the variable;
//! 2. the TOML file (`--config`, or its variable) is read into a table; a key that is no setting
//!    and no section of the binary is refused with its line;
//! 3. each setting takes the flag's value when the flag or its variable was given, else the
//!    file's, else the declared default; a file value of the wrong type is refused with its key
//!    and line.
//!
//! Sections that only the file has (`[retention]`, `[alerting]`, …) are read by the binary from
//! the same text with [`section`].

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Reads an environment variable (`std::env::var` in the binaries, a map in tests).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Settings merged from the three places, and where they came from.
#[derive(Debug, Clone)]
pub struct Loaded<S> {
    /// Every setting.
    pub settings: S,
    /// The keys given by a flag, a variable or the file (the others hold their defaults).
    pub given: BTreeSet<String>,
    /// The parsed command line (the leaf subcommand's matches are under it).
    pub matches: ArgMatches,
    /// The config file's text, for the binary's own sections; empty without a file.
    pub file_text: String,
    /// The config file, if one was given.
    pub file: Option<PathBuf>,
}

/// What [`load`] needs besides the command line.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The environment.
    pub env: EnvLookup<'a>,
    /// The keys the config file may have beyond the settings of this command: the settings of
    /// sibling commands that share the file, and file-only sections.
    pub other_keys: &'a [&'a str],
}

impl std::fmt::Debug for Sources<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("other_keys", &self.other_keys)
            .finish()
    }
}

/// The id of the `--config FILE` argument, which every binary's settings carry.
pub const CONFIG: &str = "config";

/// Parses `args` against `cmd` with the environment of `sources`, reads the config file, and
/// merges the settings of the leaf subcommand into `S` (see the module docs).
pub fn load<S, I, T>(cmd: Command, args: I, sources: Sources<'_>) -> Result<Loaded<S>>
where
    S: clap::FromArgMatches + Serialize + DeserializeOwned,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let matches = parse(&cmd, args, sources.env)?;
    resolve(&cmd, matches, sources)
}

/// Step 1 of [`load`]: the command line, with the variables of the leaf subcommand's settings
/// that no flag gave.
pub fn parse(cmd: &Command, args: Vec<OsString>, env: EnvLookup<'_>) -> Result<ArgMatches> {
    parse_with_env(cmd, args, env)
}

/// Step 2 of [`load`]: the config file read and merged under the flags of `matches`.
pub fn resolve<S>(cmd: &Command, matches: ArgMatches, sources: Sources<'_>) -> Result<Loaded<S>>
where
    S: clap::FromArgMatches + Serialize + DeserializeOwned,
{
    let file = match leaf_matches(&matches).try_get_one::<PathBuf>(CONFIG) {
        Ok(Some(p)) => Some(p.clone()),
        _ => None,
    };
    let text = match &file {
        Some(path) => std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.clone(),
            source,
        })?,
        None => String::new(),
    };
    resolve_text(cmd, matches, file.as_deref(), &text, sources)
}

/// [`resolve`] with the config file's `text` given (read from `path`; `None`: no file).
pub fn resolve_text<S>(
    cmd: &Command,
    matches: ArgMatches,
    path: Option<&Path>,
    text: &str,
    sources: Sources<'_>,
) -> Result<Loaded<S>>
where
    S: clap::FromArgMatches + Serialize + DeserializeOwned,
{
    let leaf = leaf_matches(&matches);
    let cli = S::from_arg_matches(leaf)?;
    let leaf_cmd = leaf_command(cmd, &matches);
    let (settings, given) = merge(&cli, leaf, &leaf_cmd, path, text, sources)?;
    Ok(Loaded {
        settings,
        given,
        matches,
        file_text: text.to_string(),
        file: path.map(Path::to_path_buf),
    })
}

/// Reads the file-only section `name` of the config file's `text` (absent: `None`).
pub fn section<T: DeserializeOwned>(
    path: Option<&Path>,
    text: &str,
    name: &str,
) -> Result<Option<T>> {
    if text.is_empty() {
        return Ok(None);
    }
    let table: toml::Table = toml::from_str(text).map_err(|e| parse_error(path, &e.to_string()))?;
    let Some(value) = table.get(name) else {
        return Ok(None);
    };
    value.clone().try_into::<T>().map(Some).map_err(|e| {
        let at = line_of(text, name)
            .map(|l| format!("line {l}: "))
            .unwrap_or_default();
        parse_error(path, &format!("{at}[{name}]: {}", e.message().trim()))
    })
}

fn parse_error(path: Option<&Path>, message: &str) -> Error {
    Error::ConfigParse {
        path: path.map(Path::to_path_buf).unwrap_or_default(),
        message: message.trim().to_string(),
    }
}

/// The 1-based line where `key` is set (`key = …` or `[key]`) in `text`.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            let bare = l.strip_prefix(key).map(str::trim_start);
            let quoted = l
                .strip_prefix('"')
                .and_then(|r| r.strip_prefix(key))
                .and_then(|r| r.strip_prefix('"'))
                .map(str::trim_start);
            matches!(bare.or(quoted), Some(r) if r.starts_with('='))
                || l.starts_with(&format!("[{key}]"))
                || l.starts_with(&format!("[{key}."))
        })
        .map(|i| i + 1)
}

/// The matches of the innermost subcommand given.
pub fn leaf_matches(m: &ArgMatches) -> &ArgMatches {
    match m.subcommand() {
        Some((_, sub)) => leaf_matches(sub),
        None => m,
    }
}

/// The innermost subcommand given, as declared in `cmd`.
fn leaf_command(cmd: &Command, m: &ArgMatches) -> Command {
    match m.subcommand() {
        Some((name, sub)) => match cmd.find_subcommand(name) {
            Some(c) => leaf_command(c, sub),
            None => cmd.clone(),
        },
        None => cmd.clone(),
    }
}

/// `cmd` without its environment variables: they are read through the injected lookup.
fn without_env(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let mut cmd = cmd.mut_args(|a| a.env(None::<&'static str>));
    for n in names {
        cmd = cmd.mut_subcommand(n, without_env);
    }
    cmd
}

/// Parses `args`; the variables of every setting of the leaf subcommand not given as a flag
/// are read through `env` and added as flags (so a flag beats its variable).
fn parse_with_env(
    cmd: &Command,
    mut args: Vec<OsString>,
    env: EnvLookup<'_>,
) -> Result<ArgMatches> {
    let bare = without_env(cmd.clone());
    let first = match bare.clone().try_get_matches_from(args.clone()) {
        Ok(m) => m,
        // Help, version and usage errors as the declared command writes them (with the
        // variables' names).
        Err(e) => {
            return Err(cmd
                .clone()
                .try_get_matches_from(args)
                .err()
                .unwrap_or(e)
                .into());
        }
    };
    let leaf = leaf_command(cmd, &first);
    let given = leaf_matches(&first);
    for arg in leaf.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let id = arg.get_id().as_str();
        if given.value_source(id) == Some(ValueSource::CommandLine) {
            continue;
        }
        let var = var.to_string_lossy().into_owned();
        let Some(value) = env(&var)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
        else {
            continue;
        };
        let bad = |reason: String| Error::BadEnv {
            var: var.clone(),
            value: value.clone(),
            reason,
        };
        match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => {
                if parse_bool(&value).map_err(bad)? {
                    args.push(format!("--{long}").into());
                }
            }
            ArgAction::Append => {
                for piece in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    check_value(arg, piece).map_err(bad)?;
                    args.push(format!("--{long}={piece}").into());
                }
            }
            _ => {
                check_value(arg, &value).map_err(bad)?;
                args.push(format!("--{long}={value}").into());
            }
        }
    }
    Ok(bare.try_get_matches_from(args)?)
}

/// Whether `value` is one `arg` takes; the reason, if not.
fn check_value(arg: &clap::Arg, value: &str) -> std::result::Result<(), String> {
    // A bare copy: the value parser alone, without the relations (conflicts, requirements)
    // that name other arguments of the declaring command.
    let bare = clap::Arg::new(arg.get_id().clone())
        .long("value")
        .value_parser(arg.get_value_parser().clone())
        .ignore_case(arg.is_ignore_case_set());
    let probe = Command::new("probe")
        .arg(bare)
        .try_get_matches_from([OsString::from("probe"), format!("--value={value}").into()]);
    let parsed = probe;
    if parsed.is_ok() {
        return Ok(());
    }
    let names: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| p.get_name().to_string())
        .collect();
    if !names.is_empty() {
        return Err(format!("expected one of: {}", names.join(", ")));
    }
    let text = parsed.err().map(|e| e.to_string()).unwrap_or_default();
    // clap's "error: invalid value 'x' for '--flag <X>': reason" becomes "reason".
    let reason = text
        .lines()
        .next()
        .unwrap_or_default()
        .rsplit_once("': ")
        .map_or(text.as_str(), |(_, r)| r)
        .trim()
        .to_string();
    Err(reason)
}

/// `true`/`false` as variables write them.
pub fn parse_bool(value: &str) -> std::result::Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".to_string()),
    }
}

/// flag > env > file > default for every setting of `cli` (parsed from `m`).
fn merge<S: Serialize + DeserializeOwned>(
    cli: &S,
    m: &ArgMatches,
    cmd: &Command,
    path: Option<&Path>,
    text: &str,
    sources: Sources<'_>,
) -> Result<(S, BTreeSet<String>)> {
    let file = match path {
        Some(_) => {
            toml::from_str::<toml::Table>(text).map_err(|e| parse_error(path, &e.to_string()))?
        }
        None => toml::Table::new(),
    };
    let settings: BTreeSet<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().as_str().to_string())
        .filter(|id| id != CONFIG && id != "help" && id != "version")
        .collect();
    for key in file.keys() {
        if !settings.contains(key) && !sources.other_keys.contains(&key.as_str()) {
            let at = line_of(text, key)
                .map(|l| format!("line {l}: "))
                .unwrap_or_default();
            return Err(parse_error(
                path,
                &format!(
                    "{at}unknown key `{key}`: the keys are the flag names with underscores (docs/configuration.md)"
                ),
            ));
        }
    }
    let Value::Object(flags) = to_json(cli)? else {
        return Err(declaration("settings", "not a struct of fields"));
    };
    let mut merged = flags.clone();
    let mut given = BTreeSet::new();
    for (key, value) in &flags {
        let from_flag = m.value_source(key) == Some(ValueSource::CommandLine);
        if from_flag {
            given.insert(key.clone());
        } else if let Some(v) = file.get(key) {
            given.insert(key.clone());
            merged.insert(key.clone(), file_value(key, v)?);
        } else {
            merged.insert(key.clone(), value.clone());
        }
    }
    match serde_json::from_value::<S>(Value::Object(merged)) {
        Ok(s) => Ok((s, given)),
        Err(e) => Err(blame_file_value::<S>(&flags, &file, path, text).unwrap_or(
            Error::Declaration {
                key: "settings".into(),
                source: e,
            },
        )),
    }
}

fn file_value(key: &str, v: &toml::Value) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::Declaration {
        key: key.to_string(),
        source: e,
    })
}

fn declaration(key: &str, why: &str) -> Error {
    Error::Declaration {
        key: key.into(),
        source: serde::de::Error::custom(why),
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<Value> {
    serde_json::to_value(v).map_err(|e| Error::Declaration {
        key: "settings".into(),
        source: e,
    })
}

/// Finds the file value that does not fit its setting: the first key (in file order) whose
/// value alone, over the flags' and defaults' values, does not deserialize.
fn blame_file_value<S: DeserializeOwned>(
    flags: &Map<String, Value>,
    file: &toml::Table,
    path: Option<&Path>,
    text: &str,
) -> Option<Error> {
    let mut keys: Vec<&String> = file.keys().filter(|k| flags.contains_key(*k)).collect();
    keys.sort_by_key(|k| line_of(text, k).unwrap_or(usize::MAX));
    for key in keys {
        let mut one = flags.clone();
        one.insert(key.clone(), file_value(key, &file[key]).ok()?);
        if let Err(e) = serde_json::from_value::<S>(Value::Object(one)) {
            let at = line_of(text, key)
                .map(|l| format!("line {l}: "))
                .unwrap_or_default();
            return Some(parse_error(path, &format!("{at}key `{key}`: {e}")));
        }
    }
    None
}

/// The reference of `cmd`'s settings as a Markdown table: flag, variable, default, meaning (the
/// doc comment). docs/configuration.md is made of these tables, so it cannot drift from
/// `--help`.
pub fn reference(cmd: &Command) -> String {
    let mut out = String::from("| flag | env | default | meaning |\n| --- | --- | --- | --- |\n");
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if arg.is_hide_set() || long == "help" || long == "version" {
            continue;
        }
        let value = match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => String::new(),
            _ => arg
                .get_value_names()
                .and_then(|n| n.first())
                .map(|n| format!(" {n}"))
                .unwrap_or_else(|| format!(" {}", arg.get_id().as_str().to_uppercase())),
        };
        let repeat = if matches!(arg.get_action(), ArgAction::Append) {
            " (repeatable)"
        } else {
            ""
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_else(|| "—".into());
        let default = match arg.get_action() {
            ArgAction::SetTrue => "off".to_string(),
            _ => {
                let d: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| format!("`{}`", v.to_string_lossy()))
                    .collect();
                if d.is_empty() {
                    "none".into()
                } else {
                    d.join(", ")
                }
            }
        };
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let mut meaning = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|p| !p.is_hide_set())
            .map(|p| match p.get_help() {
                Some(h) => format!("`{}`: {}", p.get_name(), h),
                None => format!("`{}`", p.get_name()),
            })
            .collect();
        if !values.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue) {
            meaning.push_str(&format!(" — {}", values.join("; ")));
        }
        out.push_str(&format!(
            "| `--{long}{value}`{repeat} | {env} | {default} | {} |\n",
            meaning.replace('|', "\\|")
        ));
    }
    out
}

/// The long flags of `cmd` (its settings as `--help` lists them).
pub fn flags(cmd: &Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help" && *l != "version")
        .map(|l| format!("--{l}"))
        .collect()
}

/// Replaces the block between `<!-- BEGIN name -->` and `<!-- END name -->` in `doc` with
/// `body`; `None` when the markers are missing.
pub fn replace_block(doc: &str, name: &str, body: &str) -> Option<String> {
    let begin = format!("<!-- BEGIN {name} -->\n");
    let end = format!("<!-- END {name} -->");
    let start = doc.find(&begin)? + begin.len();
    let stop = start + doc[start..].find(&end)?;
    Some(format!("{}{}{}", &doc[..start], body, &doc[stop..]))
}

#[cfg(test)]
mod tests;
