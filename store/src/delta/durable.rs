//! The local file system as an object store whose writes are durable when they return.
//!
//! `object_store`'s `LocalFileSystem` writes a temporary file and renames it into place without
//! an fsync, so after a machine crash a Delta commit it reported written may be empty or gone,
//! while the WAL segments it covered were already deleted. This store delegates everything to
//! `LocalFileSystem` except `put`, which writes a temporary file in the target's directory,
//! fsyncs it, links it into place (create-only: `link` fails when the name exists, which is how
//! two writers race for a Delta version) or renames it (overwrite), and fsyncs the directory.

use std::fmt;
use std::io::Write;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// `LocalFileSystem` rooted at `/`, with durable puts.
#[derive(Debug)]
pub struct DurableLocal {
    inner: LocalFileSystem,
}

impl Default for DurableLocal {
    fn default() -> Self {
        Self {
            inner: LocalFileSystem::new(),
        }
    }
}

impl fmt::Display for DurableLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocal")
    }
}

/// An I/O error on a path, kept typed inside `object_store::Error::Generic` (a full disk is
/// found by its `io::Error`, see [`crate::Error::is_disk_full`]).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
struct PathIo {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn generic(path: &FsPath, source: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "DurableLocal",
        source: Box::new(PathIo {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A name for a temporary file beside `target`, unique within this process.
fn temporary(target: &FsPath) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Writes `bytes` at `target` durably; with `create`, fails if `target` exists.
fn write_durably(target: &FsPath, bytes: &[u8], create: bool) -> Result<()> {
    let dir = target
        .parent()
        .ok_or_else(|| generic(target, std::io::Error::other("no parent directory")))?;
    std::fs::create_dir_all(dir).map_err(|e| generic(dir, e))?;
    let tmp = temporary(target);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(generic(&tmp, e));
    }
    let placed = if create {
        std::fs::hard_link(&tmp, target).and_then(|()| std::fs::remove_file(&tmp))
    } else {
        std::fs::rename(&tmp, target)
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            return Err(object_store::Error::AlreadyExists {
                path: target.display().to_string(),
                source: Box::new(e),
            });
        }
        return Err(generic(target, e));
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| generic(dir, e))
}

#[async_trait]
impl ObjectStore for DurableLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let create = match opts.mode {
            PutMode::Overwrite => false,
            PutMode::Create => true,
            PutMode::Update(_) => {
                return Err(object_store::Error::NotImplemented {
                    operation: "put with PutMode::Update".into(),
                    implementer: "DurableLocal".into(),
                });
            }
        };
        let target = self.inner.path_to_filesystem(location)?;
        let bytes: Bytes = payload.into();
        tokio::task::spawn_blocking(move || write_durably(&target, &bytes, create))
            .await
            .map_err(|e| object_store::Error::JoinError { source: e })??;
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn create_only_puts_refuse_an_existing_name_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = DurableLocal::default();
        let rel = format!("{}/a/b/00001.json", dir.path().display());
        let key = Path::parse(rel.trim_start_matches('/')).expect("path");
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&key, PutPayload::from_static(b"one"), create.clone())
            .await
            .expect("first");
        let err = store
            .put_opts(&key, PutPayload::from_static(b"two"), create)
            .await
            .expect_err("second");
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err}"
        );
        let got = store
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(&got[..], b"one");
        store
            .put(&key, PutPayload::from_static(b"three"))
            .await
            .expect("overwrite");
        let got = store
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(&got[..], b"three");
        let names: Vec<String> = std::fs::read_dir(dir.path().join("a/b"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["00001.json".to_string()]);
    }
}
