//! `quarantine/`: damaged files moved aside — never deleted — each with a note of what was
//! wrong with it and what was kept from it.
//!
//! A file `<rel>` (relative to the data directory, or to the `--object-store` prefix for the
//! tables there) moves to `quarantine/<stamp>/<rel>` in the same place, and its note is
//! `quarantine/<stamp>/<rel>.note.json`. `<stamp>` is the UTC time of the move
//! (`20260101T101010.123Z`), so a file damaged twice keeps both copies. The server moves damaged
//! WAL segments (once every valid record in them is committed) and damaged alerting state;
//! `gpuwatch repair --apply` moves damaged data files and Delta log entries.

use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::persist::Storage;
use crate::wal::sync_dir;
use crate::{Error, Result};

/// The quarantine directory's name, under the data directory (and the object store prefix).
pub const DIR: &str = "quarantine";

/// What the note beside a quarantined file says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// Where the file was, relative to the data directory or the object store prefix.
    pub original: String,
    /// When it was moved (RFC 3339, UTC).
    pub moved_at: String,
    /// What was wrong with it.
    pub reason: String,
    /// What was kept from it and where, in detail (per kind of file).
    pub details: serde_json::Value,
}

impl Note {
    /// A note for `original`, moved at `now_millis`.
    pub fn new(
        original: &str,
        now_millis: i64,
        reason: impl Into<String>,
        details: serde_json::Value,
    ) -> Self {
        Self {
            original: original.to_string(),
            moved_at: chrono::DateTime::from_timestamp_millis(now_millis)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            reason: reason.into(),
            details,
        }
    }
}

/// `quarantine/<stamp>/<rel>` for a move at `now_millis`.
pub fn target(rel: &str, now_millis: i64) -> String {
    let stamp = chrono::DateTime::from_timestamp_millis(now_millis)
        .unwrap_or_default()
        .format("%Y%m%dT%H%M%S%.3fZ");
    format!("{DIR}/{stamp}/{rel}")
}

fn note_bytes(note: &Note) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(note).map_err(|source| Error::Json {
        path: note.original.clone(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Moves the local file `data_dir/<rel>` into the quarantine with its note (both durable when
/// this returns). Returns the file's new path.
pub fn move_local(data_dir: &Path, rel: &str, note: &Note, now_millis: i64) -> Result<PathBuf> {
    let from = data_dir.join(rel);
    let to = data_dir.join(target(rel, now_millis));
    let dir = to.parent().unwrap_or(data_dir).to_path_buf();
    fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    fs::rename(&from, &to).map_err(|e| Error::io(&from, e))?;
    let note_path = PathBuf::from(format!("{}.note.json", to.display()));
    let tmp = note_path.with_extension("tmp");
    fs::write(&tmp, note_bytes(note)?)
        .and_then(|()| fs::File::open(&tmp)?.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &note_path).map_err(|e| Error::io(&note_path, e))?;
    sync_dir(&dir)?;
    if let Some(parent) = from.parent() {
        sync_dir(parent)?;
    }
    Ok(to)
}

/// Moves `rel` of `storage` (local tables or an object store) into its quarantine with its note:
/// on local disk a rename, on an object store a copy then the delete of the original. A file
/// that is already gone (a data file the log names but that is missing) only gets its note.
/// Returns where the file went (`storage`'s location).
pub fn move_stored(storage: &Storage, rel: &str, note: &Note, now_millis: i64) -> Result<String> {
    if let Some(dir) = storage.local_dir() {
        if dir.join(rel).exists() {
            let to = move_local(dir, rel, note, now_millis)?;
            return Ok(to.display().to_string());
        }
    }
    let to = target(rel, now_millis);
    match storage.read(rel) {
        Ok(bytes) => {
            storage.put_new(&to, bytes)?;
            storage.put_new(&format!("{to}.note.json"), Bytes::from(note_bytes(note)?))?;
            storage.delete(rel)?;
        }
        Err(e) if e.is_not_found() => {
            storage.put_new(&format!("{to}.note.json"), Bytes::from(note_bytes(note)?))?;
        }
        Err(e) => return Err(e),
    }
    Ok(storage.location(&to))
}

/// Every note under the quarantine of `storage` and of the local `data_dir`, with the file it
/// describes (for `gpuwatch check`).
pub fn list(storage: &Storage, data_dir: &Path) -> Result<Vec<(String, Note)>> {
    let mut out = Vec::new();
    let local = data_dir.join(DIR);
    if local.exists() {
        for path in walk(&local)? {
            let text = path.display().to_string();
            if let Some(file) = text.strip_suffix(".note.json") {
                let note = read_note(&path)?;
                out.push((file.to_string(), note));
            }
        }
    }
    if storage.is_object_store() {
        for listed in storage.list(DIR)? {
            if let Some(file) = listed.rel.strip_suffix(".note.json") {
                let bytes = storage.read(&listed.rel)?;
                let note = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
                    path: storage.location(&listed.rel),
                    source,
                })?;
                out.push((storage.location(file), note));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn read_note(path: &Path) -> Result<Note> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.display().to_string(),
        source,
    })
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let entry = entry.map_err(|e| Error::io(&d, e))?;
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_file_moves_with_its_note_and_is_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("wal")).expect("mkdir");
        fs::write(dir.path().join("wal/00000000000000000003.wal"), b"x").expect("write");
        let storage = Storage::local(dir.path(), true).expect("storage");
        let note = Note::new(
            "wal/00000000000000000003.wal",
            1_700_000_000_123,
            "bytes 8..20 damaged",
            serde_json::json!({"records_replayed": 2}),
        );
        let to = move_local(
            dir.path(),
            "wal/00000000000000000003.wal",
            &note,
            1_700_000_000_123,
        )
        .expect("move");
        assert!(!dir.path().join("wal/00000000000000000003.wal").exists());
        assert!(
            to.ends_with("quarantine/20231114T221320.123Z/wal/00000000000000000003.wal"),
            "{}",
            to.display()
        );
        assert_eq!(fs::read(&to).expect("moved"), b"x");
        let listed = list(&storage, dir.path()).expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].1, note);
        assert_eq!(listed[0].0, to.display().to_string());
    }
}
