//! The catalog of earlier releases, read once to convert a data directory or prefix to Delta
//! tables (see `delta::convert`).
//!
//! On local disk it was one JSON file, `catalog.json`; on an object store a series of versions,
//! `catalog/<version:020>.json`, the highest being current. It named every Parquet file (written
//! under `tables/<table>/<YYYY-MM-DD>/<HH>/`, times in nanoseconds) and the last WAL segment the
//! files covered, per writer on an object store.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::storage::Storage;
use crate::{Error, Result};

/// The catalog file's name in the data directory or under the prefix.
pub const CATALOG_FILE: &str = "catalog.json";

/// The folder of catalog versions under an object store prefix.
pub const CATALOG_DIR: &str = "catalog";

/// One Parquet file named by the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LegacyFile {
    /// Table name.
    pub table: String,
    /// Path relative to the data directory or prefix, `/`-separated.
    pub path: String,
    /// Smallest `time` in the file (ns).
    pub min_time: i64,
    /// Largest `time` in the file (ns).
    pub max_time: i64,
    /// Rows.
    pub rows: u64,
    /// 0: written by a persist; 1: a compacted window whose rollups exist.
    #[serde(default)]
    pub level: u8,
}

/// A file that had left the catalog, kept until its grace period ended.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LegacyRetired {
    /// Path relative to the data directory or prefix.
    pub path: String,
}

/// What conversion needs of an earlier release's catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LegacyCatalog {
    /// Every WAL segment up to this one is in the files (local disk).
    #[serde(default)]
    pub wal_persisted_through: u64,
    /// The files.
    #[serde(default)]
    pub files: Vec<LegacyFile>,
    /// Files no longer named, not yet deleted.
    #[serde(default)]
    pub retired: Vec<LegacyRetired>,
    /// Object store: per writer id, the last WAL segment of that writer the files cover.
    #[serde(default)]
    pub wal_persisted_by: BTreeMap<String, u64>,
}

fn catalog_version_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl LegacyCatalog {
    /// The last WAL segment of `writer` that the files cover.
    pub fn covered(&self, writer: &str, object_store: bool) -> u64 {
        if object_store {
            self.wal_persisted_by.get(writer).copied().unwrap_or(0)
        } else {
            self.wal_persisted_through
        }
    }

    /// Every object the earlier release's catalog kept: `catalog.json` or all catalog versions.
    pub fn catalog_objects(storage: &Storage) -> Result<Vec<String>> {
        if storage.is_object_store() {
            return Ok(storage
                .list(CATALOG_DIR)?
                .into_iter()
                .filter(|l| {
                    l.rel
                        .rsplit('/')
                        .next()
                        .and_then(catalog_version_of)
                        .is_some()
                })
                .map(|l| l.rel)
                .collect());
        }
        let exists = storage
            .local_dir()
            .is_some_and(|d| d.join(CATALOG_FILE).exists());
        Ok(if exists {
            vec![CATALOG_FILE.to_string()]
        } else {
            Vec::new()
        })
    }

    /// The current catalog of an earlier release, if there is one.
    pub fn load(storage: &Storage) -> Result<Option<Self>> {
        let current = if storage.is_object_store() {
            let mut versions: Vec<(u64, String)> = Self::catalog_objects(storage)?
                .into_iter()
                .filter_map(|rel| {
                    let v = rel.rsplit('/').next().and_then(catalog_version_of)?;
                    Some((v, rel))
                })
                .collect();
            versions.sort();
            match versions.pop() {
                Some((_, rel)) => rel,
                None => return Ok(None),
            }
        } else {
            if Self::catalog_objects(storage)?.is_empty() {
                return Ok(None);
            }
            CATALOG_FILE.to_string()
        };
        let bytes = storage.read(&current)?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Catalog {
                path: PathBuf::from(storage.location(&current)),
                detail: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_earlier_release_catalog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = Storage::local(dir.path(), true).expect("storage");
        assert_eq!(LegacyCatalog::load(&storage).expect("none"), None);
        std::fs::write(
            dir.path().join(CATALOG_FILE),
            r#"{"version":1,"wal_persisted_through":4,"files":[{"table":"gpu_metrics","path":"tables/gpu_metrics/2026-11-24/21/00000000000000000001.parquet","min_time":1,"max_time":2,"rows":3,"bytes":4,"level":1}],"retired":[{"path":"x","at":9}],"next_id":2,"generation":7}"#,
        )
        .expect("write");
        let c = LegacyCatalog::load(&storage).expect("load").expect("some");
        assert_eq!(c.covered("any", false), 4);
        assert_eq!(c.files[0].level, 1);
        assert_eq!(c.retired[0].path, "x");
        std::fs::write(dir.path().join(CATALOG_FILE), b"{").expect("write");
        let err = LegacyCatalog::load(&storage).expect_err("corrupt");
        assert!(err.to_string().contains("unreadable"), "{err}");
        assert_eq!(catalog_version_of("00000000000000000042.json"), Some(42));
        assert_eq!(catalog_version_of("42.json"), None);
    }
}
