//! Data files that cannot be read. A file is found damaged when it enters the store's view
//! (missing, empty, or not the size its commit names: one listing per date directory), or when
//! a query or compaction fails to read it (then it is read and decoded whole to tell which file
//! it was). A damaged file is quarantined from reads: every snapshot leaves it out and says so
//! (each answer that skipped data carries a warning), maintenance leaves it alone (its hour is
//! compacted and rolled up without it, retention and vacuum never touch it), and it stays where
//! it is, named by its commit, until `gpuwatch repair --apply` moves it to `quarantine/`.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;

use super::{Store, lock};
use crate::Result;
use crate::delta::schema::from_file_batch;
use crate::persist::{FileMeta, Storage};
use crate::schema::Table;

/// A data file the store stopped reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DamagedFile {
    /// Its table.
    pub table: String,
    /// Its path, relative to the data directory or the object store prefix.
    pub path: String,
    /// Rows its commit says it holds (0 when unknown).
    pub rows: u64,
    /// Bytes its commit says it holds.
    pub bytes: u64,
    /// What is wrong with it.
    pub problem: String,
}

impl DamagedFile {
    fn of(meta: &FileMeta, problem: String) -> Self {
        Self {
            table: meta.table.clone(),
            path: meta.path.clone(),
            rows: meta.rows,
            bytes: meta.bytes,
            problem,
        }
    }

    /// The warning an answer that skipped it carries.
    pub fn warning(&self) -> String {
        format!(
            "skipped damaged file {} ({} rows): it {}",
            self.path, self.rows, self.problem
        )
    }
}

/// The files of `files` that are missing, empty, or not their commit's size: one listing per
/// directory. Files another engine named by a full URL are not checked.
pub fn check_presence(storage: &Storage, files: &[FileMeta]) -> Result<Vec<DamagedFile>> {
    let mut by_dir: BTreeMap<&str, Vec<&FileMeta>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.path.contains("://")) {
        let dir = f.path.rsplit_once('/').map_or("", |(d, _)| d);
        by_dir.entry(dir).or_default().push(f);
    }
    let mut out = Vec::new();
    for (dir, metas) in by_dir {
        let sizes: BTreeMap<String, u64> = storage
            .list(dir)?
            .into_iter()
            .map(|l| (l.rel, l.size))
            .collect();
        for meta in metas {
            let problem = match sizes.get(&meta.path) {
                None => {
                    Some("is missing (its commit names it, the storage does not hold it)".into())
                }
                Some(0) => Some("is empty (0 bytes)".into()),
                Some(size) if meta.bytes > 0 && *size != meta.bytes => Some(format!(
                    "has {size} bytes where its commit says {}",
                    meta.bytes
                )),
                Some(_) => None,
            };
            if let Some(p) = problem {
                out.push(DamagedFile::of(meta, p));
            }
        }
    }
    Ok(out)
}

/// Reads `meta` whole and decodes every row; the problem when it is damaged. An error means
/// the storage could not be asked (nothing is known of the file then).
pub fn verify(storage: &Storage, table: Table, meta: &FileMeta) -> Result<Option<String>> {
    let bytes = match storage.read(&meta.path) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(Some("is missing".into())),
        Err(e) => return Err(e),
    };
    if bytes.is_empty() {
        return Ok(Some("is empty (0 bytes)".into()));
    }
    let size = bytes.len() as u64;
    if meta.bytes > 0 && size != meta.bytes {
        return Ok(Some(format!(
            "has {size} bytes where its commit says {}",
            meta.bytes
        )));
    }
    let reader = match ParquetRecordBatchReaderBuilder::try_new(bytes).and_then(|b| b.build()) {
        Ok(r) => r,
        Err(e) => return Ok(Some(format!("is not a readable Parquet file ({e})"))),
    };
    let mut rows = 0u64;
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => return Ok(Some(format!("cannot be decoded ({e})"))),
        };
        if let Err(e) = from_file_batch(table, &batch) {
            return Ok(Some(format!("does not hold the table's columns ({e})")));
        }
        rows += batch.num_rows() as u64;
    }
    if meta.rows > 0 && rows != meta.rows {
        return Ok(Some(format!(
            "holds {rows} rows where its commit says {}",
            meta.rows
        )));
    }
    Ok(None)
}

/// What the store knows of damaged data files.
#[derive(Debug, Default)]
pub(super) struct Damage {
    /// Damaged files by path.
    files: BTreeMap<String, DamagedFile>,
    /// Files whose presence was checked already, by path.
    present: HashSet<String>,
}

impl Damage {
    /// The damage of the file at `path`, if it is damaged.
    pub(super) fn file(&self, path: &str) -> Option<&DamagedFile> {
        self.files.get(path)
    }
}

impl Store {
    /// The data files the store stopped reading, over all tables.
    pub fn damaged_files(&self) -> Vec<DamagedFile> {
        lock(&self.damage).files.values().cloned().collect()
    }

    /// True when `path` (relative) is a damaged file.
    pub(super) fn is_damaged(&self, path: &str) -> bool {
        lock(&self.damage).files.contains_key(path)
    }

    /// The active files of `table` that are not damaged (what maintenance works on).
    pub(super) fn readable_files(&self, table: Table) -> Vec<FileMeta> {
        let files = self.files(table);
        let damage = lock(&self.damage);
        files
            .iter()
            .filter(|f| !damage.files.contains_key(&f.path))
            .cloned()
            .collect()
    }

    /// Remembers damaged files, loudly.
    pub(super) fn note_damaged(&self, found: Vec<DamagedFile>) {
        let mut damage = lock(&self.damage);
        for f in found {
            if damage.files.contains_key(&f.path) {
                continue;
            }
            tracing::error!(table = %f.table, file = %f.path, rows = f.rows, problem = %f.problem,
                "damaged data file: left out of every answer (each answer says so) and of maintenance until `gpuwatch repair --apply` moves it to quarantine");
            self.stats.damaged_files.fetch_add(1, Ordering::Relaxed);
            damage.files.insert(f.path.clone(), f);
        }
    }

    /// Checks that the files of `table` not checked yet are present with their size, and
    /// forgets the files that left the table.
    pub(super) fn check_new_files(&self, table: Table) {
        let files = self.files(table);
        let fresh: Vec<FileMeta> = {
            let mut damage = lock(&self.damage);
            let current: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
            let dir = format!("tables/{}/", table.name());
            damage
                .present
                .retain(|p| !p.starts_with(&dir) || current.contains(p.as_str()));
            damage
                .files
                .retain(|p, _| !p.starts_with(&dir) || current.contains(p.as_str()));
            files
                .iter()
                .filter(|f| !damage.present.contains(&f.path))
                .cloned()
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        match check_presence(&self.storage, &fresh) {
            Ok(found) => {
                lock(&self.damage)
                    .present
                    .extend(fresh.into_iter().map(|f| f.path));
                self.note_damaged(found);
            }
            Err(e) => tracing::warn!(table = table.name(), error = %e,
                "could not list the table's files to check them; retried at the next refresh"),
        }
    }

    /// Reads the files of `table` at `locations` (as snapshots name them) whole; those that are
    /// damaged are quarantined from reads. Returns what was newly found.
    pub fn verify_files(&self, table: Table, locations: &[String]) -> Vec<DamagedFile> {
        let files = self.files(table);
        let mut found = Vec::new();
        for meta in files.iter().filter(|m| {
            locations.contains(&self.storage.location(&m.path)) && !self.is_damaged(&m.path)
        }) {
            match verify(&self.storage, table, meta) {
                Ok(Some(problem)) => found.push(DamagedFile::of(meta, problem)),
                Ok(None) => {}
                Err(e) => tracing::warn!(file = %meta.path, error = %e,
                    "could not read a data file to check it"),
            }
        }
        self.note_damaged(found.clone());
        found
    }

    /// Finds which of `inputs` cannot be read (after a compaction failed reading them).
    pub(super) fn find_damaged(&self, table: Table, inputs: &[FileMeta]) -> Vec<DamagedFile> {
        let locations: Vec<String> = inputs
            .iter()
            .map(|m| self.storage.location(&m.path))
            .collect();
        self.verify_files(table, &locations)
    }
}
