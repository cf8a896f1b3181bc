//! Where the Parquet files and the catalog live: the local data directory, or an object store
//! (`--object-store s3://bucket/prefix`).
//!
//! - **Local disk** keeps the original code path: every file is written to a temporary name,
//!   fsynced, renamed into place and its directory fsynced; the catalog is one `catalog.json`
//!   replaced the same way. The object store crate's `LocalFileSystem` is not used for it because
//!   it does not fsync, and the WAL is truncated on the strength of these files being durable.
//! - **Object store**: every object is written once, create-only (`PutMode::Create`, sent as
//!   `If-None-Match: *`), and never overwritten. The catalog is a series of versioned objects,
//!   `catalog/<version:020>.json`; a server loads the highest version at start and each change
//!   writes version + 1. When that version already exists, another server shares the prefix: the
//!   write fails with [`Error::CatalogConflict`], naming the prefix and the other writer, and the
//!   store stops persisting (see `Store::fenced`). Object names carry the writer's id, so two
//!   writers never collide on a Parquet object: the catalog is the one point where they meet.
//!
//! The store's methods are synchronous (the server calls them on blocking threads); object store
//! calls run on a small runtime owned by [`Storage`], so they work from any thread.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::catalog::Catalog;
use crate::wal::sync_dir;
use crate::{Error, Result};

/// The folder of catalog versions under an object store prefix.
pub const CATALOG_DIR: &str = "catalog";

/// The file in the data directory holding this data directory's writer id.
pub const WRITER_ID_FILE: &str = "object-store-writer-id";

/// Who wrote a catalog version (object store only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Writer {
    /// Id of the data directory (its WAL): stable across restarts of one server.
    pub id: String,
    /// Id of the process that wrote it: new at every start.
    pub instance: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The data directory holding that writer's WAL.
    pub data_dir: String,
}

impl fmt::Display for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "writer {} (host {}, pid {}, data dir {})",
            self.id, self.host, self.pid, self.data_dir
        )
    }
}

/// A parsed `s3://bucket/prefix` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStoreUrl {
    /// The bucket.
    pub bucket: String,
    /// The prefix inside the bucket, without leading or trailing `/` (may be empty).
    pub prefix: String,
}

impl ObjectStoreUrl {
    /// Parses `s3://bucket[/prefix]`.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |detail: &str| Error::ObjectStoreConfig {
            url: url.to_string(),
            detail: detail.to_string(),
        };
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("only s3://bucket/prefix is supported"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty()
            || !bucket
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(bad(
                "the bucket name must be lowercase letters, digits, '-' and '.'",
            ));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || ObjectPath::parse(&prefix).is_err()
        {
            return Err(bad("the prefix must be a plain path such as team/gpuwatch"));
        }
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
        })
    }

    /// `s3://bucket`, the address DataFusion finds the store under.
    pub fn base(&self) -> String {
        format!("s3://{}", self.bucket)
    }
}

impl fmt::Display for ObjectStoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// A tokio runtime that is shut down without blocking when dropped (it may be dropped on an
/// async thread).
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The object store side of [`Storage`].
pub struct Remote {
    url: ObjectStoreUrl,
    /// Used on `runtime` by the store.
    store: Arc<dyn ObjectStore>,
    /// A second client for the query engine, which runs on the server's runtime.
    query_store: Arc<dyn ObjectStore>,
    runtime: Runtime,
    writer: Writer,
    /// Catalog versions known to exist (listed at start or written since) and when they were
    /// written: the candidates for deletion, so that deleting old versions never lists.
    versions: std::sync::Mutex<Vec<(u64, chrono::DateTime<chrono::Utc>)>>,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("writer", &self.writer)
            .finish()
    }
}

/// Where the Parquet files and the catalog live. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Storage {
    /// Under the data directory.
    Local(PathBuf),
    /// In an object store, under a prefix.
    Object(Arc<Remote>),
}

fn build_s3(url: &ObjectStoreUrl, options: &[(String, String)]) -> Result<Arc<dyn ObjectStore>> {
    let mut builder = AmazonS3Builder::from_env();
    for (key, value) in options {
        let key = key.parse().map_err(|e| Error::ObjectStoreConfig {
            url: url.to_string(),
            detail: format!("{e}"),
        })?;
        builder = builder.with_config(key, value);
    }
    let store = builder
        .with_bucket_name(&url.bucket)
        .build()
        .map_err(|e| Error::ObjectStoreConfig {
            url: url.to_string(),
            detail: format!(
                "{e}; set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (and AWS_ENDPOINT_URL, AWS_ALLOW_HTTP=true for a server other than AWS)"
            ),
        })?;
    Ok(Arc::new(store))
}

fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The writer id of `data_dir`, created on first use.
fn writer_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(WRITER_ID_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().to_string();
            if id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()) {
                return Ok(id);
            }
            Err(Error::Catalog {
                path,
                detail: format!("{id:?} is not a writer id"),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = random_hex();
            let tmp = path.with_extension("tmp");
            let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
            f.write_all(id.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::io(&tmp, e))?;
            fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
            sync_dir(data_dir)?;
            Ok(id)
        }
        Err(e) => Err(Error::io(path, e)),
    }
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn catalog_version_of(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Storage {
    /// Local disk under `data_dir`.
    pub fn local(data_dir: impl Into<PathBuf>) -> Self {
        Self::Local(data_dir.into())
    }

    /// The object store at `url` (`s3://bucket/prefix`), with credentials and endpoint from the
    /// AWS environment variables, overridden by `options` (`AmazonS3ConfigKey` names such as
    /// `aws_endpoint`). `data_dir` holds the WAL and the writer id.
    pub fn object_store(url: &str, options: &[(String, String)], data_dir: &Path) -> Result<Self> {
        let url = ObjectStoreUrl::parse(url)?;
        let store = build_s3(&url, options)?;
        let query_store = build_s3(&url, options)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("gpuwatch-object-store")
            .enable_all()
            .build()
            .map_err(|e| Error::io(data_dir, e))?;
        fs::create_dir_all(data_dir).map_err(|e| Error::io(data_dir, e))?;
        let writer = Writer {
            id: writer_id(data_dir)?,
            instance: random_hex(),
            host: host_name(),
            pid: std::process::id(),
            data_dir: data_dir.display().to_string(),
        };
        Ok(Self::Object(Arc::new(Remote {
            url,
            store,
            query_store,
            runtime: Runtime(Some(runtime)),
            writer,
            versions: Default::default(),
        })))
    }

    /// True for an object store.
    pub fn is_object_store(&self) -> bool {
        matches!(self, Self::Object(_))
    }

    /// The writer this process is, on an object store.
    pub fn writer(&self) -> Option<&Writer> {
        match self {
            Self::Local(_) => None,
            Self::Object(r) => Some(&r.writer),
        }
    }

    /// The data directory or `s3://bucket/prefix`, for messages.
    pub fn describe(&self) -> String {
        match self {
            Self::Local(dir) => dir.display().to_string(),
            Self::Object(r) => r.url.to_string(),
        }
    }

    /// For the query engine: the address to register (`s3://bucket`) and a client.
    pub fn query_object_store(&self) -> Option<(String, Arc<dyn ObjectStore>)> {
        match self {
            Self::Local(_) => None,
            Self::Object(r) => Some((r.url.base(), Arc::clone(&r.query_store))),
        }
    }

    /// Where the query engine reads `rel`: an absolute path, or `s3://bucket/prefix/rel`.
    pub fn location(&self, rel: &str) -> String {
        match self {
            Self::Local(dir) => dir.join(rel).to_string_lossy().into_owned(),
            Self::Object(r) => format!("{}/{}", r.url.base(), r.key(rel)),
        }
    }

    /// The name of a new file: `base` on local disk, `base-<writer id>` on an object store.
    pub fn file_name(&self, base: &str) -> String {
        match self {
            Self::Local(_) => base.to_string(),
            Self::Object(r) => format!("{base}-{}", r.writer.id),
        }
    }

    /// Writes a new file (`rel`, `/`-separated, relative to the data directory or the prefix).
    /// Local: temporary name, fsync, rename, fsync of the directory. Object store: create-only.
    pub fn put_new(&self, rel: &str, bytes: Bytes) -> Result<()> {
        match self {
            Self::Local(dir) => {
                let path = dir.join(rel);
                let parent = path
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| dir.clone());
                fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
                let tmp = path.with_extension("parquet.tmp");
                let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
                f.write_all(&bytes).map_err(|e| Error::io(&tmp, e))?;
                f.sync_all().map_err(|e| Error::io(&tmp, e))?;
                fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
                sync_dir(&parent)
            }
            Self::Object(r) => r.put_create(rel, bytes).map(|_| ()),
        }
    }

    /// Reads a whole file.
    pub fn read(&self, rel: &str) -> Result<Bytes> {
        match self {
            Self::Local(dir) => {
                let path = dir.join(rel);
                fs::read(&path)
                    .map(Bytes::from)
                    .map_err(|e| Error::io(path, e))
            }
            Self::Object(r) => r.get(rel),
        }
    }

    /// Deletes a file; one already gone is not an error.
    pub fn delete(&self, rel: &str) -> Result<()> {
        match self {
            Self::Local(dir) => {
                let path = dir.join(rel);
                match fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(Error::io(path, e)),
                }
            }
            Self::Object(r) => {
                let key = r.path(rel)?;
                let store = Arc::clone(&r.store);
                let k = key.clone();
                match r.block(async move { store.delete(&k).await })? {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(r.error(rel, e)),
                }
            }
        }
    }

    /// Loads the catalog: `catalog.json`, or the highest `catalog/<version>.json` version.
    pub fn load_catalog(&self) -> Result<Catalog> {
        match self {
            Self::Local(dir) => Catalog::load(dir),
            Self::Object(r) => r.load_catalog(),
        }
    }

    /// Saves `catalog` as its version (`catalog.generation`): replaces `catalog.json` on local
    /// disk, writes `catalog/<version>.json` create-only on an object store.
    pub fn save_catalog(&self, catalog: &Catalog) -> Result<()> {
        match self {
            Self::Local(dir) => catalog.save(dir),
            Self::Object(r) => r.save_catalog(catalog),
        }
    }

    /// Removes leftovers of an interrupted persist or compaction: files under `tables/` that the
    /// catalog neither names nor lists as retired. On an object store (listed once, at start) only
    /// this writer's leftovers and objects older than `min_age` are removed, since another server
    /// sharing the prefix by mistake may be about to name a fresh one in its catalog.
    pub fn remove_orphans(&self, catalog: &Catalog, min_age: std::time::Duration) -> Result<usize> {
        match self {
            Self::Local(dir) => super::remove_orphans(dir, catalog),
            Self::Object(r) => r.remove_orphans(catalog, min_age),
        }
    }

    /// Deletes old catalog versions: every version below `keep_from`, written more than `min_age`
    /// ago. Returns how many were deleted. Nothing on local disk.
    pub fn delete_old_catalogs(
        &self,
        keep_from: u64,
        min_age: std::time::Duration,
    ) -> Result<usize> {
        match self {
            Self::Local(_) => Ok(0),
            Self::Object(r) => r.delete_old_catalogs(keep_from, min_age),
        }
    }
}

impl Remote {
    fn key(&self, rel: &str) -> String {
        if self.url.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.url.prefix)
        }
    }

    fn path(&self, rel: &str) -> Result<ObjectPath> {
        ObjectPath::parse(self.key(rel)).map_err(|e| Error::ObjectStore {
            location: self.location(rel),
            detail: e.to_string(),
        })
    }

    fn location(&self, rel: &str) -> String {
        format!("{}/{}", self.url.base(), self.key(rel))
    }

    fn error(&self, rel: &str, e: object_store::Error) -> Error {
        Error::ObjectStore {
            location: self.location(rel),
            detail: e.to_string(),
        }
    }

    /// Runs `f` on the storage runtime and waits for it, from any thread.
    fn block<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let Some(rt) = &self.runtime.0 else {
            return Err(Error::ObjectStore {
                location: self.url.to_string(),
                detail: "the object store client is shut down".into(),
            });
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv().map_err(|_| Error::ObjectStore {
            location: self.url.to_string(),
            detail: "the object store client stopped during a request".into(),
        })
    }

    /// Create-only put. `Ok(Err(AlreadyExists))` is returned as is for the caller to explain.
    fn put_create_raw(
        &self,
        rel: &str,
        bytes: Bytes,
    ) -> Result<std::result::Result<(), object_store::Error>> {
        let key = self.path(rel)?;
        let store = Arc::clone(&self.store);
        self.block(async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            store
                .put_opts(&key, PutPayload::from_bytes(bytes), opts)
                .await
                .map(|_| ())
        })
    }

    /// True when `rel` holds exactly `bytes`: a create-only put that the client retried after
    /// its first attempt landed (a lost response) meets its own object.
    fn holds(&self, rel: &str, bytes: &Bytes) -> bool {
        self.get(rel).is_ok_and(|existing| existing == *bytes)
    }

    fn put_create(&self, rel: &str, bytes: Bytes) -> Result<()> {
        match self.put_create_raw(rel, bytes.clone())? {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) if self.holds(rel, &bytes) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::ObjectStore {
                location: self.location(rel),
                detail: format!(
                    "the object already exists, and objects are never overwritten: another server may be writing to {}",
                    self.url
                ),
            }),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    fn get(&self, rel: &str) -> Result<Bytes> {
        let key = self.path(rel)?;
        let store = Arc::clone(&self.store);
        self.block(async move { store.get(&key).await?.bytes().await })?
            .map_err(|e| self.error(rel, e))
    }

    fn list(&self, rel_dir: &str) -> Result<Vec<object_store::ObjectMeta>> {
        let key = self.path(rel_dir)?;
        let store = Arc::clone(&self.store);
        self.block(async move { store.list(Some(&key)).try_collect::<Vec<_>>().await })?
            .map_err(|e| self.error(rel_dir, e))
    }

    /// The path of an object relative to the prefix.
    fn relative(&self, meta: &object_store::ObjectMeta) -> Option<String> {
        let full = meta.location.as_ref();
        if self.url.prefix.is_empty() {
            return Some(full.to_string());
        }
        full.strip_prefix(&self.url.prefix)?
            .strip_prefix('/')
            .map(str::to_string)
    }

    fn catalog_versions(&self) -> Result<Vec<(u64, object_store::ObjectMeta)>> {
        let mut out: Vec<(u64, object_store::ObjectMeta)> = self
            .list(CATALOG_DIR)?
            .into_iter()
            .filter_map(|m| {
                let v = m.location.filename().and_then(catalog_version_of)?;
                Some((v, m))
            })
            .collect();
        out.sort_by_key(|(v, _)| *v);
        Ok(out)
    }

    fn catalog_rel(version: u64) -> String {
        format!("{CATALOG_DIR}/{version:020}.json")
    }

    fn read_catalog(&self, version: u64) -> Result<Catalog> {
        let rel = Self::catalog_rel(version);
        let bytes = self.get(&rel)?;
        let catalog: Catalog = serde_json::from_slice(&bytes).map_err(|e| Error::Catalog {
            path: PathBuf::from(self.location(&rel)),
            detail: e.to_string(),
        })?;
        if catalog.generation != version {
            return Err(Error::Catalog {
                path: PathBuf::from(self.location(&rel)),
                detail: format!("it says it is version {}", catalog.generation),
            });
        }
        Ok(catalog)
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, Vec<(u64, chrono::DateTime<chrono::Utc>)>> {
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn load_catalog(&self) -> Result<Catalog> {
        let versions = self.catalog_versions()?;
        *self.versions() = versions
            .iter()
            .map(|(v, m)| (*v, m.last_modified))
            .collect();
        match versions.last() {
            Some((v, _)) => self.read_catalog(*v),
            None => Ok(Catalog {
                version: 1,
                ..Default::default()
            }),
        }
    }

    fn save_catalog(&self, catalog: &Catalog) -> Result<()> {
        let version = catalog.generation;
        let rel = Self::catalog_rel(version);
        let bytes =
            Bytes::from(
                serde_json::to_vec_pretty(catalog).map_err(|e| Error::Catalog {
                    path: PathBuf::from(self.location(&rel)),
                    detail: e.to_string(),
                })?,
            );
        let written = match self.put_create_raw(&rel, bytes.clone())? {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) if self.holds(&rel, &bytes) => Ok(()),
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                self.versions().push((version, chrono::Utc::now()));
                self.check_predecessor(version)
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                let other = match self.read_catalog(version) {
                    Ok(c) => match c.writer {
                        Some(w) if w.instance == self.writer.instance => format!(
                            "this same process ({w}): an earlier write of this version reported a failure but landed"
                        ),
                        Some(w) => w.to_string(),
                        None => "a writer that did not sign it".into(),
                    },
                    Err(e) => format!("a writer that could not be read back ({e})"),
                };
                Err(Error::CatalogConflict {
                    prefix: self.url.to_string(),
                    version,
                    other,
                })
            }
            Err(e) => Err(self.error(&rel, e)),
        }
    }

    /// After writing `version`: the version before it must still exist. Old versions are deleted
    /// oldest first and a server never deletes its current one, so a missing predecessor means
    /// that another server moved the catalog past it (and deleted it after the grace period), and
    /// this server's version, though written, is one nobody will read.
    fn check_predecessor(&self, version: u64) -> Result<()> {
        if version <= 1 {
            return Ok(());
        }
        let rel = Self::catalog_rel(version - 1);
        let key = self.path(&rel)?;
        let store = Arc::clone(&self.store);
        match self.block(async move { store.head(&key).await })? {
            Ok(_) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Err(Error::CatalogConflict {
                prefix: self.url.to_string(),
                version: version - 1,
                other: "another server, which has since moved the catalog further and deleted that version".into(),
            }),
            Err(e) => Err(self.error(&rel, e)),
        }
    }

    fn remove_orphans(&self, catalog: &Catalog, min_age: std::time::Duration) -> Result<usize> {
        let known: HashSet<&str> = catalog
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(catalog.retired.iter().map(|r| r.path.as_str()))
            .collect();
        let mine = format!("-{}.parquet", self.writer.id);
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(min_age).unwrap_or(chrono::Duration::MAX);
        let mut removed = 0;
        for meta in self.list("tables")? {
            let Some(rel) = self.relative(&meta) else {
                continue;
            };
            if known.contains(rel.as_str()) {
                continue;
            }
            if !rel.ends_with(&mine) && meta.last_modified > cutoff {
                tracing::warn!(object = %self.location(&rel),
                    "an object no catalog version names was written recently by another writer: left in place");
                continue;
            }
            tracing::warn!(object = %self.location(&rel),
                "removing an object no catalog entry names (left by an interrupted persist or compaction)");
            let key = meta.location.clone();
            let store = Arc::clone(&self.store);
            match self.block(async move { store.delete(&key).await })? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                Err(e) => return Err(self.error(&rel, e)),
            }
        }
        Ok(removed)
    }

    fn delete_old_catalogs(&self, keep_from: u64, min_age: std::time::Duration) -> Result<usize> {
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(min_age).unwrap_or(chrono::Duration::MAX);
        let mut due: Vec<u64> = self
            .versions()
            .iter()
            .filter(|(v, at)| *v < keep_from && *at <= cutoff)
            .map(|(v, _)| *v)
            .collect();
        // Oldest first: the versions that remain are always the newest ones.
        due.sort_unstable();
        let mut deleted = 0;
        for v in due {
            let rel = Self::catalog_rel(v);
            let key = self.path(&rel)?;
            let store = Arc::clone(&self.store);
            match self.block(async move { store.delete(&key).await })? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                    self.versions().retain(|(x, _)| *x != v);
                    deleted += 1;
                }
                Err(e) => return Err(self.error(&rel, e)),
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = ObjectStoreUrl::parse("s3://my-bucket/team/gpuwatch/").expect("url");
        assert_eq!(u.bucket, "my-bucket");
        assert_eq!(u.prefix, "team/gpuwatch");
        assert_eq!(u.to_string(), "s3://my-bucket/team/gpuwatch");
        assert_eq!(u.base(), "s3://my-bucket");
        assert_eq!(
            ObjectStoreUrl::parse("s3://b").expect("bucket only").prefix,
            ""
        );
        for bad in ["gs://b/p", "s3://", "s3://B/p", "s3://b/a/../c", "/tmp/x"] {
            let err = ObjectStoreUrl::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert_eq!(catalog_version_of("00000000000000000042.json"), Some(42));
        assert_eq!(catalog_version_of("42.json"), None);
        assert_eq!(catalog_version_of("00000000000000000042.json.tmp"), None);
    }
}
