//! The catalog: which Parquet files hold which data, and how much of the WAL they cover.
//!
//! On local disk it is one JSON file, `catalog.json`, replaced atomically (write a temporary file,
//! fsync, rename, fsync the directory), so a crash leaves either the old or the new catalog. On an
//! object store each change is a new object, `catalog/<generation:020>.json`, written create-only
//! (see [`super::storage`]). Files that the catalog does not name are leftovers of an interrupted
//! persist and are removed at start.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::storage::Writer;
use crate::wal::sync_dir;
use crate::{Error, Result};

/// The catalog file's name in the data directory.
pub const CATALOG_FILE: &str = "catalog.json";

/// One persisted Parquet file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// Table name.
    pub table: String,
    /// Path relative to the data directory, `/`-separated.
    pub path: String,
    /// Smallest `time` in the file (ns).
    pub min_time: i64,
    /// Largest `time` in the file (ns).
    pub max_time: i64,
    /// Rows.
    pub rows: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// 0: written by a persist; 1: the result of compacting a window (whose rollups exist).
    #[serde(default)]
    pub level: u8,
}

/// A file no longer in the catalog, kept on disk until no query can still be reading it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// Path relative to the data directory.
    pub path: String,
    /// When it left the catalog (ns since the epoch, the store's clock).
    pub at: i64,
}

/// The catalog's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Format version.
    pub version: u32,
    /// Every WAL segment up to and including this one is in the files below.
    pub wal_persisted_through: u64,
    /// The files, in the order they were written.
    pub files: Vec<FileMeta>,
    /// Files replaced by compaction or dropped by retention, deleted after a grace period.
    #[serde(default)]
    pub retired: Vec<Retired>,
    /// The next number for a compacted file's name.
    #[serde(default)]
    pub next_id: u64,
    /// Incremented by every change: on an object store, the version in the object's name.
    #[serde(default)]
    pub generation: u64,
    /// Who wrote this version (object store only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<Writer>,
    /// Object store only: per writer id (one per data directory, hence per WAL), the last WAL
    /// segment of that writer covered by the files. A server replays its own WAL against its own
    /// entry, so a catalog written by another server never makes it skip a segment.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub wal_persisted_by: std::collections::BTreeMap<String, u64>,
}

impl Catalog {
    /// Loads the catalog of `data_dir`, or an empty one if there is none yet.
    pub fn load(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(CATALOG_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Catalog {
                path,
                detail: e.to_string(),
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Catalog {
                version: 1,
                ..Default::default()
            }),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Replaces the catalog of `data_dir` atomically.
    pub fn save(&self, data_dir: &Path) -> Result<()> {
        let path = data_dir.join(CATALOG_FILE);
        let tmp = data_dir.join(format!("{CATALOG_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::Catalog {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(&bytes).map_err(|e| Error::io(&tmp, e))?;
        f.sync_all().map_err(|e| Error::io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        sync_dir(data_dir)
    }

    /// Absolute path of a file of this catalog.
    pub fn absolute(data_dir: &Path, file: &FileMeta) -> PathBuf {
        data_dir.join(&file.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_and_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(Catalog::load(dir.path()).expect("empty").files.len(), 0);
        let c = Catalog {
            version: 1,
            wal_persisted_through: 4,
            files: vec![FileMeta {
                table: "gpu_metrics".into(),
                path: "tables/gpu_metrics/x.parquet".into(),
                min_time: 1,
                max_time: 2,
                rows: 3,
                bytes: 4,
                level: 0,
            }],
            retired: vec![Retired {
                path: "tables/gpu_metrics/y.parquet".into(),
                at: 9,
            }],
            next_id: 2,
            generation: 7,
            ..Default::default()
        };
        c.save(dir.path()).expect("save");
        assert_eq!(Catalog::load(dir.path()).expect("load"), c);
        fs::write(dir.path().join(CATALOG_FILE), b"{").expect("write");
        let err = Catalog::load(dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains("unreadable"), "{err}");
    }
}
