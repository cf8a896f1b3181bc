//! The object store a table's Delta log is read through: the storage's own, with the log
//! entries that failed their checks (`guard.rs`) and every version past the last good one
//! hidden, so that `deltalake` reads exactly the versions the store checked — a damaged commit
//! is never read as an empty one — and a damaged checkpoint is read around through the commits.

use std::collections::HashSet;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

use super::guard::version_of;

/// Which versions of the log `deltalake` may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ceiling {
    /// Every version (while this store creates a table or commits; checked right after).
    Open,
    /// Versions up to and including this one.
    At(u64),
    /// None: the log holds no readable version.
    Nothing,
}

impl Ceiling {
    fn admits(self, version: u64) -> bool {
        match self {
            Ceiling::Open => true,
            Ceiling::At(v) => version <= v,
            Ceiling::Nothing => false,
        }
    }
}

/// What is hidden: log entries by full key, and versions above the ceiling.
#[derive(Debug, Clone)]
pub struct Veil {
    /// `<table key>/_delta_log/`.
    log_prefix: String,
    ceiling: Ceiling,
    hidden: HashSet<String>,
}

impl Veil {
    /// Nothing hidden yet, for the log under `log_prefix` (`<table key>/_delta_log/`).
    pub fn new(log_prefix: String) -> Self {
        Self {
            log_prefix,
            ceiling: Ceiling::Open,
            hidden: HashSet::new(),
        }
    }

    /// Shows versions up to `ceiling`, minus `hidden` (full keys).
    pub fn set(&mut self, ceiling: Ceiling, hidden: HashSet<String>) {
        self.ceiling = ceiling;
        self.hidden = hidden;
    }

    /// Shows every version (a commit or create in progress).
    pub fn open(&mut self) {
        self.ceiling = Ceiling::Open;
    }

    /// Shows versions up to `ceiling`, hiding what was hidden.
    pub fn set_ceiling(&mut self, ceiling: Ceiling) {
        self.ceiling = ceiling;
    }

    fn hides(&self, key: &str) -> bool {
        let Some(name) = key.strip_prefix(&self.log_prefix) else {
            return false;
        };
        if self.hidden.contains(key) {
            return true;
        }
        version_of(name).is_some_and(|v| !self.ceiling.admits(v))
    }
}

/// `inner` with the entries of a [`Veil`] hidden from reads and listings.
pub struct LogView {
    inner: Arc<dyn ObjectStore>,
    veil: Arc<RwLock<Veil>>,
}

impl LogView {
    /// A view of `inner` through `veil`.
    pub fn new(inner: Arc<dyn ObjectStore>, veil: Arc<RwLock<Veil>>) -> Self {
        Self { inner, veil }
    }

    fn hides(&self, key: &Path) -> bool {
        self.veil
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .hides(key.as_ref())
    }

    fn not_found(key: &Path) -> object_store::Error {
        object_store::Error::NotFound {
            path: key.to_string(),
            source: "hidden: this log entry failed its checks or is past the last good version"
                .into(),
        }
    }

    fn filter(
        &self,
        stream: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let veil = Arc::clone(&self.veil);
        stream
            .filter(move |m| {
                let keep = match m {
                    Ok(meta) => !veil
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .hides(meta.location.as_ref()),
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .boxed()
    }
}

impl fmt::Debug for LogView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogView").field("veil", &self.veil).finish()
    }
}

impl fmt::Display for LogView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LogView({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for LogView {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if self.hides(location) {
            return Err(Self::not_found(location));
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if self.hides(location) {
            return Err(Self::not_found(location));
        }
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.filter(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.filter(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let mut listed = self.inner.list_with_delimiter(prefix).await?;
        listed.objects.retain(|m| !self.hides(&m.location));
        Ok(listed)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
