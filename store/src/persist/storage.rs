//! Where the tables live: the local data directory, or an object store
//! (`--object-store s3://bucket/prefix`), both seen through one `ObjectStore`.
//!
//! - **Local disk** goes through [`DurableLocal`]: every write is a temporary file, fsynced,
//!   linked (create-only) or renamed into place, and its directory fsynced, because the WAL is
//!   truncated on the strength of those files and Delta commits being durable.
//! - **Object store**: S3 through the `object_store` crate. Data files and Delta commits are
//!   written create-only (`PutMode::Create`, sent as `If-None-Match: *`), which is also how two
//!   servers race for a Delta version: the loser sees the version exists and the Delta
//!   transaction layer checks its commit against the winner's.
//!
//! Every file name carries the writer's id (one per data directory, hence per WAL), so two
//! servers writing to one prefix never collide on a data file.
//!
//! The store's methods are synchronous (the server calls them on blocking threads); object store
//! and Delta calls run on a small runtime owned by [`Storage`], so they work from any thread.

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

use crate::delta::durable::DurableLocal;
use crate::wal::sync_dir;
use crate::{Error, Result};

/// The file in the data directory holding this data directory's writer id.
pub const WRITER_ID_FILE: &str = "writer-id";

/// Where earlier releases kept the writer id (object store only); read and renamed at start.
const OLD_WRITER_ID_FILE: &str = "object-store-writer-id";

/// Who writes: one per data directory (its WAL).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Writer {
    /// Id of the data directory (its WAL): stable across restarts of one server.
    pub id: String,
    /// Id of the process: new at every start.
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
            source: None,
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

/// Local directory or S3 prefix.
#[derive(Debug, Clone)]
enum Place {
    Local(PathBuf),
    Object(ObjectStoreUrl),
}

struct Inner {
    place: Place,
    /// The store at the root of the file system or the bucket.
    root: Arc<dyn ObjectStore>,
    /// The key prefix of the data directory or the `--object-store` prefix in `root`.
    prefix: String,
    /// A second S3 client for the query engine, which runs on the server's runtime.
    query_store: Option<Arc<dyn ObjectStore>>,
    runtime: Runtime,
    writer: Writer,
}

/// Where the tables live. Cheap to clone.
#[derive(Clone)]
pub struct Storage(Arc<Inner>);

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("place", &self.0.place)
            .field("writer", &self.0.writer)
            .finish()
    }
}

fn build_s3(url: &ObjectStoreUrl, options: &[(String, String)]) -> Result<Arc<dyn ObjectStore>> {
    let mut builder = AmazonS3Builder::from_env();
    for (key, value) in options {
        let key = key.parse().map_err(|e| Error::ObjectStoreConfig {
            url: url.to_string(),
            detail: format!("{e}"),
            source: Some(e),
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
            source: Some(e),
        })?;
    Ok(Arc::new(store))
}

/// 16 hex digits, different at every call.
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

fn valid_id(id: &str) -> bool {
    id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit())
}

/// The writer id of `data_dir`, created on first use (or taken over from the file earlier
/// releases kept for object stores).
fn writer_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(WRITER_ID_FILE);
    let read = |path: &Path| -> Result<Option<String>> {
        match fs::read_to_string(path) {
            Ok(s) => {
                let id = s.trim().to_string();
                if valid_id(&id) {
                    Ok(Some(id))
                } else {
                    Err(Error::Catalog {
                        path: path.to_path_buf(),
                        detail: format!("{id:?} is not a writer id"),
                    })
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    };
    if let Some(id) = read(&path)? {
        return Ok(id);
    }
    let id = match read(&data_dir.join(OLD_WRITER_ID_FILE))? {
        Some(id) => id,
        None => random_hex(),
    };
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(id.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(data_dir)?;
    Ok(id)
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn runtime(data_dir: &Path) -> Result<Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gpuwatch-storage")
        .enable_all()
        .build()
        .map_err(|e| Error::io(data_dir, e))?;
    Ok(Runtime(Some(rt)))
}

fn writer(data_dir: &Path, id: String) -> Writer {
    Writer {
        id,
        instance: random_hex(),
        host: host_name(),
        pid: std::process::id(),
        data_dir: data_dir.display().to_string(),
    }
}

/// An object's path relative to the storage root, and when it was last written.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Relative to the data directory or the prefix, `/`-separated.
    pub rel: String,
    /// Last modification.
    pub last_modified: chrono::DateTime<chrono::Utc>,
    /// Size in bytes.
    pub size: u64,
}

impl Storage {
    /// Local disk under `data_dir`, which also holds the WAL and the writer id. With `writer_id`
    /// false (a query node) no id is created: this process writes nothing.
    pub fn local(data_dir: &Path, writer_id_file: bool) -> Result<Self> {
        fs::create_dir_all(data_dir).map_err(|e| Error::io(data_dir, e))?;
        let dir = fs::canonicalize(data_dir).map_err(|e| Error::io(data_dir, e))?;
        let prefix = ObjectPath::from_filesystem_path(&dir)
            .map_err(|e| Error::ObjectStoreConfig {
                url: dir.display().to_string(),
                detail: format!("not a usable path: {e}"),
                source: Some(e.into()),
            })?
            .to_string();
        let id = if writer_id_file {
            writer_id(&dir)?
        } else {
            random_hex()
        };
        Ok(Self(Arc::new(Inner {
            place: Place::Local(dir.clone()),
            root: Arc::new(DurableLocal::default()),
            prefix,
            query_store: None,
            runtime: runtime(&dir)?,
            writer: writer(&dir, id),
        })))
    }

    /// The object store at `url` (`s3://bucket/prefix`), with credentials and endpoint from the
    /// AWS environment variables, overridden by `options` (`AmazonS3ConfigKey` names such as
    /// `aws_endpoint`). `data_dir` holds the WAL and the writer id (unless `writer_id_file` is
    /// false: a query node, which writes no WAL).
    pub fn object_store(
        url: &str,
        options: &[(String, String)],
        data_dir: &Path,
        writer_id_file: bool,
    ) -> Result<Self> {
        let url = ObjectStoreUrl::parse(url)?;
        let root = build_s3(&url, options)?;
        let query_store = build_s3(&url, options)?;
        let id = if writer_id_file {
            fs::create_dir_all(data_dir).map_err(|e| Error::io(data_dir, e))?;
            writer_id(data_dir)?
        } else {
            random_hex()
        };
        Ok(Self(Arc::new(Inner {
            prefix: url.prefix.clone(),
            place: Place::Object(url),
            root,
            query_store: Some(query_store),
            runtime: runtime(data_dir)?,
            writer: writer(data_dir, id),
        })))
    }

    /// True for an object store.
    pub fn is_object_store(&self) -> bool {
        matches!(self.0.place, Place::Object(_))
    }

    /// The writer this process is.
    pub fn writer(&self) -> &Writer {
        &self.0.writer
    }

    /// The data directory or `s3://bucket/prefix`, for messages.
    pub fn describe(&self) -> String {
        match &self.0.place {
            Place::Local(dir) => dir.display().to_string(),
            Place::Object(url) => url.to_string(),
        }
    }

    /// The local data directory (local storage only).
    pub fn local_dir(&self) -> Option<&Path> {
        match &self.0.place {
            Place::Local(dir) => Some(dir),
            Place::Object(_) => None,
        }
    }

    /// The store at the root of the file system or bucket.
    pub fn root_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.0.root)
    }

    /// The key of `rel` in [`Storage::root_store`].
    pub fn key(&self, rel: &str) -> Result<ObjectPath> {
        let key = if self.0.prefix.is_empty() {
            rel.to_string()
        } else if rel.is_empty() {
            self.0.prefix.clone()
        } else {
            format!("{}/{rel}", self.0.prefix)
        };
        ObjectPath::parse(&key).map_err(|e| Error::ObjectStore {
            location: self.location(rel),
            source: e.into(),
        })
    }

    /// The URL of the directory `rel` (`file:///…` or `s3://bucket/prefix/…`), as Delta names
    /// its tables.
    pub fn url(&self, rel: &str) -> Result<url::Url> {
        let text = match &self.0.place {
            Place::Local(dir) => {
                return url::Url::from_directory_path(dir.join(rel)).map_err(|()| {
                    Error::ObjectStoreConfig {
                        url: dir.join(rel).display().to_string(),
                        detail: "not an absolute path".into(),
                        source: None,
                    }
                });
            }
            Place::Object(u) => format!("{}/{}/", u.base(), self.key(rel)?),
        };
        url::Url::parse(&text).map_err(|e| Error::ObjectStoreConfig {
            detail: format!("not a url: {e}"),
            url: text,
            source: None,
        })
    }

    /// For the query engine: the address to register (`s3://bucket`) and a client.
    pub fn query_object_store(&self) -> Option<(String, Arc<dyn ObjectStore>)> {
        match (&self.0.place, &self.0.query_store) {
            (Place::Object(url), Some(store)) => Some((url.base(), Arc::clone(store))),
            _ => None,
        }
    }

    /// Where the query engine reads `rel`: an absolute path, or `s3://bucket/prefix/rel`.
    pub fn location(&self, rel: &str) -> String {
        match &self.0.place {
            Place::Local(dir) => dir.join(rel).to_string_lossy().into_owned(),
            Place::Object(url) => {
                if url.prefix.is_empty() {
                    format!("{}/{rel}", url.base())
                } else {
                    format!("{}/{}/{rel}", url.base(), url.prefix)
                }
            }
        }
    }

    fn error(&self, rel: &str, source: object_store::Error) -> Error {
        Error::ObjectStore {
            location: self.location(rel),
            source,
        }
    }

    /// Runs `f` on the storage runtime and waits for it, from any thread.
    pub fn block<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let Some(rt) = &self.0.runtime.0 else {
            return Err(Error::StorageClient {
                location: self.describe(),
                detail: "the storage client is shut down".into(),
            });
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv().map_err(|_| Error::StorageClient {
            location: self.describe(),
            detail: "the storage client stopped during a request".into(),
        })
    }

    /// Writes a new file (`rel`, `/`-separated, relative to the data directory or the prefix),
    /// create-only and durable when this returns. A retried put that meets its own earlier
    /// attempt (a lost response) is a success.
    pub fn put_new(&self, rel: &str, bytes: Bytes) -> Result<()> {
        let key = self.key(rel)?;
        let store = self.root_store();
        let payload = bytes.clone();
        let put = self.block(async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            store
                .put_opts(&key, PutPayload::from_bytes(payload), opts)
                .await
                .map(|_| ())
        })?;
        match put {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. })
                if self.read(rel).is_ok_and(|b| b == bytes) =>
            {
                Ok(())
            }
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::Fenced(format!(
                "{} already exists with other bytes, and objects are never overwritten: another server uses this data directory's writer id (a copied data directory?) on {}; stop one of them and give each its own data directory, then restart this one",
                self.location(rel),
                self.describe()
            ))),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// Reads a whole file.
    pub fn read(&self, rel: &str) -> Result<Bytes> {
        let key = self.key(rel)?;
        let store = self.root_store();
        self.block(async move { store.get(&key).await?.bytes().await })?
            .map_err(|e| self.error(rel, e))
    }

    /// Deletes a file; one already gone is not an error.
    pub fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel)?;
        let store = self.root_store();
        match self.block(async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// Every object under the directory `rel_dir`.
    pub fn list(&self, rel_dir: &str) -> Result<Vec<Listed>> {
        self.list_from(rel_dir, None)
    }

    /// The objects under the directory `rel_dir` whose path sorts after `after_rel` (a log
    /// listed from a version on, without reading its older entries).
    pub fn list_after(&self, rel_dir: &str, after_rel: &str) -> Result<Vec<Listed>> {
        self.list_from(rel_dir, Some(after_rel))
    }

    fn list_from(&self, rel_dir: &str, after_rel: Option<&str>) -> Result<Vec<Listed>> {
        let key = self.key(rel_dir)?;
        let offset = after_rel.map(|a| self.key(a)).transpose()?;
        let store = self.root_store();
        let metas = match self.block(async move {
            match offset {
                Some(o) => {
                    store
                        .list_with_offset(Some(&key), &o)
                        .try_collect::<Vec<_>>()
                        .await
                }
                None => store.list(Some(&key)).try_collect::<Vec<_>>().await,
            }
        })? {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(self.error(rel_dir, e)),
        };
        let strip = if self.0.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.0.prefix)
        };
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let rel = m.location.as_ref().strip_prefix(&strip)?.to_string();
                Some(Listed {
                    rel,
                    last_modified: m.last_modified,
                    size: m.size,
                })
            })
            .collect())
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
    }

    #[test]
    fn local_files_round_trip_and_a_writer_id_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(OLD_WRITER_ID_FILE), "00112233445566aa").expect("old id");
        let s = Storage::local(dir.path(), true).expect("storage");
        assert_eq!(s.writer().id, "00112233445566aa");
        s.put_new("tables/t/a.parquet", Bytes::from_static(b"x"))
            .expect("put");
        s.put_new("tables/t/a.parquet", Bytes::from_static(b"x"))
            .expect("the same bytes again");
        assert!(
            s.put_new("tables/t/a.parquet", Bytes::from_static(b"y"))
                .is_err()
        );
        assert_eq!(&s.read("tables/t/a.parquet").expect("read")[..], b"x");
        let listed: Vec<String> = s
            .list("tables")
            .expect("list")
            .into_iter()
            .map(|l| l.rel)
            .collect();
        assert_eq!(listed, vec!["tables/t/a.parquet".to_string()]);
        s.delete("tables/t/a.parquet").expect("delete");
        s.delete("tables/t/a.parquet").expect("gone already");
        assert!(s.list("tables").expect("list").is_empty());
        assert!(
            s.url("tables/t")
                .expect("url")
                .as_str()
                .starts_with("file:///")
        );
        let again = Storage::local(dir.path(), true).expect("again");
        assert_eq!(again.writer().id, "00112233445566aa");
    }
}
