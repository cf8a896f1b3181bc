//! Checks of a table's Delta log before `deltalake` reads it: a commit that cannot be read is
//! an error, never an empty commit.
//!
//! Every commit the store is about to read (those after the newest good checkpoint) is checked
//! on its own: not empty, every line a JSON object holding one Delta action, and — for commits
//! gpuwatch wrote — as many `add`/`remove` actions as its `commitInfo` announces
//! (`gpuwatch.files`), which catches a commit cut at a line boundary. A checkpoint is checked by
//! decoding it whole. The table is then read at its last good version: a damaged or missing
//! commit `K` hides `K` and every later version (the log must be read in order), a damaged
//! checkpoint is hidden and the commits after the checkpoint before it are read instead. What
//! was hidden is reported as [`LogHealth`]: the damaged entries and the versions not read.
//!
//! Checks are remembered per entry (name and size), so a refresh checks only what is new.

use std::collections::{BTreeMap, HashMap, HashSet};

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use serde_json::Value;

use super::table_dir;
use super::view::Ceiling;
use crate::Result;
use crate::persist::Storage;
use crate::persist::storage::Listed;
use crate::schema::Table;

/// The `commitInfo` key holding how many `add` and `remove` actions a commit of gpuwatch holds.
pub const FILES_KEY: &str = "gpuwatch.files";

const ACTIONS: [&str; 10] = [
    "add",
    "remove",
    "metaData",
    "protocol",
    "txn",
    "commitInfo",
    "cdc",
    "domainMetadata",
    "checkpointMetadata",
    "sidecar",
];

/// What kind of log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// `<version>.json`.
    Commit,
    /// `<version>.checkpoint[.<part>.<parts>].parquet`.
    Checkpoint,
    /// `_last_checkpoint`.
    LastCheckpoint,
}

/// A log entry that failed its checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadEntry {
    /// Its path, relative to the data directory or the object store prefix.
    pub path: String,
    /// Its version (none for `_last_checkpoint`).
    pub version: Option<u64>,
    /// What it is.
    pub kind: EntryKind,
    /// What is wrong with it.
    pub problem: String,
}

/// What the checks of one table's log found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LogHealth {
    /// The newest version the log names, readable or not (`None`: no log).
    pub newest: Option<u64>,
    /// The version the table is read at: the last good one (`None`: none is readable).
    pub read_at: Option<u64>,
    /// The checkpoint read from, if any.
    pub checkpoint: Option<u64>,
    /// The entries that failed their checks.
    pub bad: Vec<BadEntry>,
}

impl LogHealth {
    /// The versions that are not read, `first..=last`.
    pub fn lost(&self) -> Option<(u64, u64)> {
        match (self.read_at, self.newest) {
            (Some(r), Some(n)) if n > r => Some((r + 1, n)),
            (None, Some(n)) => Some((0, n)),
            _ => None,
        }
    }

    /// True when versions are not read: no commit, no vacuum on such a table.
    pub fn blocks(&self) -> bool {
        self.lost().is_some()
    }

    /// True when anything failed its checks.
    pub fn damaged(&self) -> bool {
        !self.bad.is_empty() || self.blocks()
    }

    /// A sentence for logs, warnings and errors: what is damaged, what is read, what to do.
    pub fn describe(&self, table: Table) -> String {
        let entries: Vec<String> = self
            .bad
            .iter()
            .map(|b| format!("{} {}", b.path, b.problem))
            .collect();
        let mut text = format!(
            "table {}: delta log damaged: {}",
            table.name(),
            entries.join("; ")
        );
        match (self.lost(), self.read_at) {
            (Some((first, last)), Some(at)) => text.push_str(&format!(
                "; read at version {at}, versions {first}..={last} are not read (rows they added are missing from answers, rows still in the write-ahead log are kept there); no commit or vacuum runs on this table until it is repaired: stop the server and run `gpuwatch check`, then `gpuwatch repair --apply`"
            )),
            (Some((first, last)), None) => text.push_str(&format!(
                "; no version is readable (versions {first}..={last}): the table answers with buffered rows only, and no commit or vacuum runs on it until it is repaired: stop the server and run `gpuwatch check`, then `gpuwatch repair --apply`"
            )),
            (None, _) => text.push_str(
                "; every version is read through the commits around it: run `gpuwatch repair --apply` to move the damaged entries to quarantine",
            ),
        }
        text
    }
}

/// The version a log file name carries (`<20 digits>.…`), if any.
pub fn version_of(name: &str) -> Option<u64> {
    let digits = name.get(..20)?;
    if name.as_bytes().get(20) != Some(&b'.') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Commit(u64),
    Checkpoint { version: u64, parts: u32 },
    LastCheckpoint,
    Other,
}

fn parse(name: &str) -> Entry {
    if name == "_last_checkpoint" {
        return Entry::LastCheckpoint;
    }
    let Some(version) = version_of(name) else {
        return Entry::Other;
    };
    let rest = &name[21..];
    if rest == "json" {
        return Entry::Commit(version);
    }
    if rest == "checkpoint.parquet" {
        return Entry::Checkpoint { version, parts: 1 };
    }
    // `checkpoint.<part:010>.<parts:010>.parquet`
    let parts = rest
        .strip_prefix("checkpoint.")
        .and_then(|r| r.strip_suffix(".parquet"))
        .and_then(|r| r.split_once('.'))
        .and_then(|(_, n)| n.parse().ok());
    match parts {
        Some(parts) => Entry::Checkpoint { version, parts },
        None => Entry::Other,
    }
}

/// Checks one commit's bytes; the problem, if any.
pub fn check_commit(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return Some("is empty (0 bytes)".into());
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Some("is not UTF-8 text".into());
    };
    let (mut actions, mut files, mut declared) = (0u64, 0u64, None);
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return Some(format!("line {} is not JSON ({e})", i + 1)),
        };
        let Some((key, body)) = value
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
        else {
            return Some(format!("line {} is not a Delta action", i + 1));
        };
        if !ACTIONS.contains(&key.as_str()) {
            return Some(format!("line {} holds an unknown action {key:?}", i + 1));
        }
        match key.as_str() {
            "add" | "remove" => files += 1,
            "commitInfo" => declared = body.get(FILES_KEY).and_then(Value::as_u64),
            _ => {}
        }
        actions += 1;
    }
    if actions == 0 {
        return Some("holds no action".into());
    }
    match declared {
        Some(d) if d != files => Some(format!(
            "is cut short: {files} of the {d} add/remove actions its commitInfo announces"
        )),
        _ => None,
    }
}

/// Checks one checkpoint file's bytes by decoding it whole; the problem, if any.
pub fn check_checkpoint(bytes: bytes::Bytes) -> Option<String> {
    if bytes.is_empty() {
        return Some("is empty (0 bytes)".into());
    }
    let reader = match ParquetRecordBatchReaderBuilder::try_new(bytes).and_then(|b| b.build()) {
        Ok(r) => r,
        Err(e) => return Some(format!("is not a readable Parquet file ({e})")),
    };
    for batch in reader {
        if let Err(e) = batch {
            return Some(format!("cannot be decoded ({e})"));
        }
    }
    None
}

/// The checks of one table's log, remembered between inspections.
#[derive(Debug, Default)]
pub struct Inspector {
    /// Problem (or none) of each entry checked, by path and size.
    checked: HashMap<String, (u64, Option<String>)>,
    /// The checkpoint the last inspection read from: later listings start there.
    base: Option<u64>,
}

/// What an inspection decided: what to show `deltalake`, and what it found.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// Versions shown.
    pub ceiling: Ceiling,
    /// Full keys hidden (damaged checkpoints, a `_last_checkpoint` naming one).
    pub hidden: HashSet<String>,
    /// What was found.
    pub health: LogHealth,
}

impl Inspector {
    /// Checks the log of `table` (every entry from the newest good checkpoint on; with `all`,
    /// every entry of the log, for `gpuwatch check`).
    pub fn inspect(&mut self, storage: &Storage, table: Table, all: bool) -> Result<Inspection> {
        let log = format!("{}/_delta_log", table_dir(table));
        let mut bad = Vec::new();
        let from = if all {
            None
        } else {
            self.start(storage, &log)?
        };
        let listed = match from {
            Some(v) => storage.list_after(&log, &format!("{log}/{v:020}"))?,
            None => storage.list(&log)?,
        };
        let mut inspection = self.decide(storage, &log, &listed, all, &mut bad)?;
        if from.is_some() && inspection.health.checkpoint.is_none() && inspection.health.blocks() {
            // The checkpoint listed from was damaged: start again from the whole log.
            bad.clear();
            self.base = None;
            let listed = storage.list(&log)?;
            inspection = self.decide(storage, &log, &listed, all, &mut bad)?;
        }
        self.base = inspection.health.checkpoint;
        Ok(inspection)
    }

    /// Where a listing may start: the checkpoint read last time, or `_last_checkpoint`'s.
    fn start(&mut self, storage: &Storage, log: &str) -> Result<Option<u64>> {
        if self.base.is_some() {
            return Ok(self.base);
        }
        match storage.read(&format!("{log}/_last_checkpoint")) {
            Ok(bytes) => Ok(serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("version")?.as_u64())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn decide(
        &mut self,
        storage: &Storage,
        log: &str,
        listed: &[Listed],
        all: bool,
        bad: &mut Vec<BadEntry>,
    ) -> Result<Inspection> {
        let mut commits: BTreeMap<u64, &Listed> = BTreeMap::new();
        let mut checkpoints: BTreeMap<u64, Vec<(&Listed, u32)>> = BTreeMap::new();
        let mut last_checkpoint = None;
        for l in listed {
            let name = l.rel.rsplit('/').next().unwrap_or(&l.rel);
            match parse(name) {
                Entry::Commit(v) => {
                    commits.insert(v, l);
                }
                Entry::Checkpoint { version, parts } => {
                    checkpoints.entry(version).or_default().push((l, parts));
                }
                Entry::LastCheckpoint => last_checkpoint = Some(l),
                Entry::Other => {}
            }
        }
        let newest = commits.keys().chain(checkpoints.keys()).max().copied();
        let mut hidden = HashSet::new();
        let checkpoint = self.good_checkpoint(storage, &checkpoints, bad, &mut hidden)?;
        let read_at = self.good_commits(storage, &commits, checkpoint, all, bad)?;
        if let Some(l) = last_checkpoint {
            self.check_hint(storage, l, checkpoint, bad, &mut hidden)?;
        }
        let ceiling = match read_at {
            Some(v) => Ceiling::At(v),
            None if newest.is_none() => Ceiling::Open,
            None => Ceiling::Nothing,
        };
        let hidden = hidden
            .into_iter()
            .map(|rel| storage.key(&rel).map(|k| k.to_string()))
            .collect::<Result<_>>()?;
        let _ = log;
        Ok(Inspection {
            ceiling,
            hidden,
            health: LogHealth {
                newest,
                read_at,
                checkpoint,
                bad: bad.clone(),
            },
        })
    }

    /// The problem of `l`, checked once per name and size.
    fn problem(
        &mut self,
        storage: &Storage,
        l: &Listed,
        check: impl FnOnce(bytes::Bytes) -> Option<String>,
    ) -> Result<Option<String>> {
        if let Some((size, p)) = self.checked.get(&l.rel)
            && *size == l.size
        {
            return Ok(p.clone());
        }
        let p = match storage.read(&l.rel) {
            Ok(bytes) => check(bytes),
            Err(e) if e.is_not_found() => Some("is missing".into()),
            Err(e) => return Err(e),
        };
        self.checked.insert(l.rel.clone(), (l.size, p.clone()));
        Ok(p)
    }

    /// The newest checkpoint whose every part decodes; damaged ones are hidden and reported.
    fn good_checkpoint(
        &mut self,
        storage: &Storage,
        checkpoints: &BTreeMap<u64, Vec<(&Listed, u32)>>,
        bad: &mut Vec<BadEntry>,
        hidden: &mut HashSet<String>,
    ) -> Result<Option<u64>> {
        for (version, parts) in checkpoints.iter().rev() {
            let expected = parts.first().map(|(_, n)| *n).unwrap_or(1) as usize;
            let mut whole = parts.len() == expected;
            for (l, _) in parts {
                if let Some(p) = self.problem(storage, l, check_checkpoint)? {
                    whole = false;
                    bad.push(BadEntry {
                        path: l.rel.clone(),
                        version: Some(*version),
                        kind: EntryKind::Checkpoint,
                        problem: p,
                    });
                }
            }
            if whole {
                return Ok(Some(*version));
            }
            hidden.extend(parts.iter().map(|(l, _)| l.rel.clone()));
        }
        Ok(None)
    }

    /// The last version of an unbroken run of good commits after `checkpoint` (or from 0).
    /// With `all`, the commits before the checkpoint are checked and reported too.
    fn good_commits(
        &mut self,
        storage: &Storage,
        commits: &BTreeMap<u64, &Listed>,
        checkpoint: Option<u64>,
        all: bool,
        bad: &mut Vec<BadEntry>,
    ) -> Result<Option<u64>> {
        if all {
            for (v, l) in commits.range(..checkpoint.map_or(0, |c| c + 1)) {
                if let Some(p) = self.problem(storage, l, |b| check_commit(&b))? {
                    bad.push(commit_entry(l, *v, p));
                }
            }
        }
        let mut read_at = checkpoint;
        let mut next = checkpoint.map_or(0, |c| c + 1);
        let last = commits.keys().next_back().copied();
        while last.is_some_and(|l| next <= l) {
            let Some(l) = commits.get(&next) else {
                bad.push(BadEntry {
                    path: format!("{}/{next:020}.json", log_dir(commits)),
                    version: Some(next),
                    kind: EntryKind::Commit,
                    problem: "is missing (later versions exist)".into(),
                });
                break;
            };
            if let Some(p) = self.problem(storage, l, |b| check_commit(&b))? {
                bad.push(commit_entry(l, next, p));
                break;
            }
            read_at = Some(next);
            next += 1;
        }
        Ok(read_at)
    }

    /// `_last_checkpoint` is hidden when it is not JSON or names a checkpoint not read.
    fn check_hint(
        &mut self,
        storage: &Storage,
        l: &Listed,
        checkpoint: Option<u64>,
        bad: &mut Vec<BadEntry>,
        hidden: &mut HashSet<String>,
    ) -> Result<()> {
        let bytes = match storage.read(&l.rel) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let named = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("version")?.as_u64());
        let problem = match named {
            None => Some("is not valid JSON naming a checkpoint version".to_string()),
            Some(v) if Some(v) != checkpoint && checkpoint.is_none_or(|c| v > c) => {
                Some(format!("names checkpoint {v}, which is not readable"))
            }
            Some(_) => None,
        };
        if let Some(problem) = problem {
            bad.push(BadEntry {
                path: l.rel.clone(),
                version: None,
                kind: EntryKind::LastCheckpoint,
                problem,
            });
            hidden.insert(l.rel.clone());
        }
        Ok(())
    }
}

fn commit_entry(l: &Listed, version: u64, problem: String) -> BadEntry {
    BadEntry {
        path: l.rel.clone(),
        version: Some(version),
        kind: EntryKind::Commit,
        problem,
    }
}

/// The log directory of the listed commits (for naming a missing one).
fn log_dir(commits: &BTreeMap<u64, &Listed>) -> String {
    commits
        .values()
        .next()
        .and_then(|l| l.rel.rsplit_once('/'))
        .map(|(d, _)| d.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_are_checked_line_by_line_and_against_their_count() {
        let good = br#"{"commitInfo":{"gpuwatch.files":2}}
{"txn":{"appId":"a","version":3}}
{"add":{"path":"a.parquet"}}
{"add":{"path":"b.parquet"}}
"#;
        assert_eq!(check_commit(good), None);
        assert_eq!(check_commit(b""), Some("is empty (0 bytes)".into()));
        assert_eq!(check_commit(b"\n \n"), Some("holds no action".into()));
        let cut = &good[..good.len() - 10];
        assert!(check_commit(cut).is_some_and(|p| p.contains("line 4 is not JSON")));
        let at_line = good
            .split(|b| *b == b'\n')
            .take(3)
            .collect::<Vec<_>>()
            .join(&b'\n');
        assert_eq!(
            check_commit(&at_line),
            Some("is cut short: 1 of the 2 add/remove actions its commitInfo announces".into())
        );
        assert!(check_commit(b"\x00\x01garbage").is_some());
        assert!(check_commit(br#"{"nope":{}}"#).is_some_and(|p| p.contains("unknown action")));
        // Commits of other writers (no count) are checked line by line only.
        assert_eq!(check_commit(br#"{"add":{"path":"x"}}"#), None);
    }

    #[test]
    fn names_parse_to_their_versions() {
        assert_eq!(parse("00000000000000000012.json"), Entry::Commit(12));
        assert_eq!(
            parse("00000000000000000100.checkpoint.parquet"),
            Entry::Checkpoint {
                version: 100,
                parts: 1
            }
        );
        assert_eq!(
            parse("00000000000000000100.checkpoint.0000000001.0000000002.parquet"),
            Entry::Checkpoint {
                version: 100,
                parts: 2
            }
        );
        assert_eq!(parse("_last_checkpoint"), Entry::LastCheckpoint);
        assert_eq!(parse(".00000000000000000003.json.1.0.tmp"), Entry::Other);
        assert_eq!(version_of("00000000000000000007.crc"), Some(7));
        assert_eq!(version_of("0000000000000000007.json"), None);
    }
}
