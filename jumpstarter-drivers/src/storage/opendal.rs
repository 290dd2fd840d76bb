//! `Opendal`: file operations on any storage service opendal supports.
//!
//! Config (as upstream): `scheme` (`fs`, `memory`, `http`; `s3` with the `storage-s3`
//! feature), `kwargs` (the service options, e.g. `root`; for `http`: `endpoint`, `root`,
//! and `username`/`password` or `token`), and
//! `remove_created_on_close` (the files written through the driver are removed when the
//! session ends: the lease, or the `jmp shell`). Every path is relative to the service root;
//! paths that leave it (`..`) are refused. Files a session leaves open are discarded when it
//! ends.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex as StdMutex},
    time::Duration,
};

use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use jumpstarter_core::{
    CallContext, Driver, DriverError, driver, driver::DriverArgs, wire::resource::ResourceHandle,
};
use opendal::Operator;
use serde::{Deserialize, Serialize};
use tokio::{io::AsyncWriteExt, sync::Mutex};
use uuid::Uuid;

use super::{HashAlgo, Hasher, StorageError};
use jumpstarter_core::sync::LockExt;

/// Schemes compiled into this build.
const SCHEMES: &[&str] = &[
    "fs",
    "memory",
    "http",
    #[cfg(feature = "storage-s3")]
    "s3",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpendalConfig {
    scheme: String,
    #[serde(default)]
    kwargs: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    remove_created_on_close: bool,
}

/// `open` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Mode {
    /// Read.
    #[serde(rename = "rb")]
    Read,
    /// Write (replaces the file when closed).
    #[serde(rename = "wb")]
    Write,
}

/// The kind of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryMode {
    /// A file.
    pub entry_is_file: bool,
    /// A directory.
    pub entry_is_dir: bool,
}

/// What `stat` returns (upstream's field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Content-Disposition.
    pub content_disposition: Option<String>,
    /// Size in bytes.
    pub content_length: u64,
    /// Content-MD5.
    pub content_md5: Option<String>,
    /// Content-Type.
    pub content_type: Option<String>,
    /// ETag.
    pub etag: Option<String>,
    /// File or directory.
    pub mode: EntryMode,
}

/// A request the caller may send itself (`presign_*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PresignedRequest {
    /// The URL.
    pub url: String,
    /// The HTTP method.
    pub method: String,
    /// Headers to send.
    pub headers: BTreeMap<String, String>,
}

/// What the service supports (upstream's field names).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capability {
    pub stat: bool,
    pub stat_with_if_match: bool,
    pub stat_with_if_none_match: bool,
    pub read: bool,
    pub read_with_if_match: bool,
    pub read_with_if_none_match: bool,
    pub read_with_override_cache_control: bool,
    pub read_with_override_content_disposition: bool,
    pub read_with_override_content_type: bool,
    pub write: bool,
    pub write_can_multi: bool,
    pub write_can_empty: bool,
    pub write_can_append: bool,
    pub write_with_content_type: bool,
    pub write_with_content_disposition: bool,
    pub write_with_cache_control: bool,
    pub write_multi_max_size: Option<u64>,
    pub write_multi_min_size: Option<u64>,
    pub write_total_max_size: Option<u64>,
    pub create_dir: bool,
    pub delete: bool,
    pub copy: bool,
    pub rename: bool,
    pub list: bool,
    pub list_with_limit: bool,
    pub list_with_start_after: bool,
    pub list_with_recursive: bool,
    pub presign: bool,
    pub presign_read: bool,
    pub presign_stat: bool,
    pub presign_write: bool,
    pub shared: bool,
    pub blocking: bool,
}

impl From<opendal::Capability> for Capability {
    fn from(c: opendal::Capability) -> Self {
        let size = |v: Option<usize>| v.map(|n| n as u64);
        Self {
            stat: c.stat,
            stat_with_if_match: c.stat_with_if_match,
            stat_with_if_none_match: c.stat_with_if_none_match,
            read: c.read,
            read_with_if_match: c.read_with_if_match,
            read_with_if_none_match: c.read_with_if_none_match,
            read_with_override_cache_control: c.read_with_override_cache_control,
            read_with_override_content_disposition: c.read_with_override_content_disposition,
            read_with_override_content_type: c.read_with_override_content_type,
            write: c.write,
            write_can_multi: c.write_can_multi,
            write_can_empty: c.write_can_empty,
            write_can_append: c.write_can_append,
            write_with_content_type: c.write_with_content_type,
            write_with_content_disposition: c.write_with_content_disposition,
            write_with_cache_control: c.write_with_cache_control,
            write_multi_max_size: size(c.write_multi_max_size),
            write_multi_min_size: size(c.write_multi_min_size),
            write_total_max_size: size(c.write_total_max_size),
            create_dir: c.create_dir,
            delete: c.delete,
            copy: c.copy,
            rename: c.rename,
            list: c.list,
            list_with_limit: c.list_with_limit,
            list_with_start_after: c.list_with_start_after,
            list_with_recursive: c.list_with_recursive,
            presign: c.presign,
            presign_read: c.presign_read,
            presign_stat: c.presign_stat,
            presign_write: c.presign_write,
            shared: c.shared,
            // Blocking calls are not part of opendal's service capability any more.
            blocking: false,
        }
    }
}

/// Resolves `path` against the service root, lexically: `.` and `..` are applied, and a
/// path that climbs above the root is refused. A trailing `/` (a directory) is kept; the
/// root itself is `/`.
pub fn normalize_path(path: &str) -> Result<String, StorageError> {
    if path.contains('\0') {
        return Err(StorageError::OutsideRoot(path.to_string()));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(StorageError::OutsideRoot(path.to_string()));
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Ok("/".into());
    }
    let mut out = parts.join("/");
    if path.ends_with('/') {
        out.push('/');
    }
    Ok(out)
}

/// Refuses `rel` (a [`normalize_path`] result) when a component of it, below `root`, is a
/// symbolic link that resolves outside `root`, or one that dangles (where it leads cannot be
/// checked, and writing through it would create the target). Links that stay inside `root`
/// are followed. The walk stops at the first component that does not exist: nothing below
/// it exists either.
pub async fn check_beneath(root: &Path, rel: &str) -> Result<(), StorageError> {
    let root = match tokio::fs::canonicalize(root).await {
        Ok(r) => r,
        // No root yet: nothing under it can lead anywhere.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::file("resolving the storage root", root)(e)),
    };
    let outside = || StorageError::OutsideRoot(rel.to_string());
    let mut cur = root.clone();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        let next = cur.join(part);
        match tokio::fs::symlink_metadata(&next).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StorageError::file("checking", &next)(e)),
            Ok(m) if m.file_type().is_symlink() => {
                let Ok(resolved) = tokio::fs::canonicalize(&next).await else {
                    return Err(outside());
                };
                if !resolved.starts_with(&root) {
                    return Err(outside());
                }
                cur = resolved;
            }
            Ok(_) => cur = next,
        }
    }
    Ok(())
}

enum OpenFile {
    Read {
        path: String,
        reader: opendal::Reader,
        pos: u64,
        size: u64,
    },
    Write {
        path: String,
        // Where the bytes go until close (renamed over `path` then), when the service
        // can rename; otherwise `path` itself.
        staging: String,
        writer: Option<opendal::Writer>,
        written: u64,
        failed: Option<String>,
    },
    Closed,
}

type FileSlot = Arc<Mutex<OpenFile>>;

/// File operations on an opendal service.
pub struct Opendal {
    op: Operator,
    scheme: String,
    files: StdMutex<HashMap<Uuid, FileSlot>>,
    created: Arc<StdMutex<BTreeSet<String>>>,
    remove_created_on_close: bool,
    /// The `fs` service's root directory: paths are checked against it so that no symbolic
    /// link leads out of it.
    fs_root: Option<PathBuf>,
}

impl std::fmt::Debug for Opendal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opendal")
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

fn od(op: &'static str, path: &str) -> impl FnOnce(opendal::Error) -> StorageError {
    let path = path.to_string();
    move |source| StorageError::Opendal {
        op,
        path,
        source: Box::new(source),
    }
}

fn metadata(m: &opendal::Metadata) -> Metadata {
    Metadata {
        content_disposition: m.content_disposition().map(str::to_string),
        content_length: m.content_length(),
        content_md5: m.content_md5().map(str::to_string),
        content_type: m.content_type().map(str::to_string),
        etag: m.etag().map(str::to_string),
        mode: EntryMode {
            entry_is_file: m.is_file(),
            entry_is_dir: m.is_dir(),
        },
    }
}

fn presigned(r: opendal::raw::PresignedRequest) -> PresignedRequest {
    PresignedRequest {
        url: r.uri().to_string(),
        method: r.method().as_str().to_string(),
        headers: r
            .header()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    }
}

fn staging_path(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/.{name}.partial-{}", Uuid::new_v4().simple()),
        None => format!(".{path}.partial-{}", Uuid::new_v4().simple()),
    }
}

#[driver(
    client = "jumpstarter_driver_opendal.client.OpendalClient",
    session_end = end_session
)]
impl Opendal {
    /// Opens `path` for reading (`rb`) or writing (`wb`); returns a file descriptor.
    ///
    /// A file opened for writing appears (replacing any old one) only when closed after
    /// every write succeeded.
    #[export]
    async fn open(&self, path: String, mode: Mode) -> Result<Uuid, DriverError> {
        let path = self.resolve(&path).await?;
        let file = match mode {
            Mode::Read => {
                let meta = self.op.stat(&path).await.map_err(od("stat", &path))?;
                let reader = self.op.reader(&path).await.map_err(od("open", &path))?;
                OpenFile::Read {
                    size: meta.content_length(),
                    path,
                    reader,
                    pos: 0,
                }
            }
            Mode::Write => {
                let staging = if self.op.info().capability().rename {
                    staging_path(&path)
                } else {
                    path.clone()
                };
                let writer = self.op.writer(&staging).await.map_err(od("open", &path))?;
                OpenFile::Write {
                    path,
                    staging,
                    writer: Some(writer),
                    written: 0,
                    failed: None,
                }
            }
        };
        let fd = Uuid::new_v4();
        self.files
            .lock_or_recover()
            .insert(fd, Arc::new(Mutex::new(file)));
        Ok(fd)
    }

    /// Sends the rest of file `fd` (from its position to the end) into resource `dst`.
    #[export]
    async fn file_read(
        &self,
        ctx: &CallContext,
        fd: Uuid,
        dst: ResourceHandle,
    ) -> Result<(), DriverError> {
        let slot = self.file(fd)?;
        let mut file = slot.lock().await;
        let OpenFile::Read {
            path,
            reader,
            pos,
            size,
        } = &mut *file
        else {
            return Err(mode_error(&file, fd, "not open for reading"));
        };
        let mut stream = ctx.resource(&dst)?;
        let mut chunks = reader
            .clone()
            .into_bytes_stream(*pos..*size)
            .await
            .map_err(od("read", path))?;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            let n = chunk.len() as u64;
            stream.write_chunk(chunk).await?;
            *pos += n;
        }
        stream.shutdown().await?;
        Ok(())
    }

    /// Appends the bytes of resource `src` to file `fd`. If the transfer breaks, the file
    /// is marked failed: closing it then reports the error and stores nothing.
    #[export]
    async fn file_write(
        &self,
        ctx: &CallContext,
        fd: Uuid,
        src: ResourceHandle,
    ) -> Result<(), DriverError> {
        let slot = self.file(fd)?;
        let mut file = slot.lock().await;
        let OpenFile::Write {
            path,
            writer,
            written,
            failed,
            ..
        } = &mut *file
        else {
            return Err(mode_error(&file, fd, "not open for writing"));
        };
        if let Some(f) = failed {
            return Err(DriverError::Failed(format!(
                "file {fd}: an earlier write failed ({f})"
            )));
        }
        let Some(w) = writer.as_mut() else {
            return Err(mode_error(&OpenFile::Closed, fd, ""));
        };
        let mut stream = ctx.resource(&src)?;
        // Until the transfer ends well: if this call is cancelled midway (its client went
        // away), the file stays marked failed, so that closing it stores nothing.
        *failed = Some("a write was interrupted".into());
        let result: Result<(), StorageError> = async {
            loop {
                // Chunks as received: no copy unless the bytes are being decoded.
                let chunk = stream.chunk().await.map_err(|e| StorageError::Transfer {
                    target: path.clone(),
                    source: e,
                })?;
                let Some(bytes) = chunk else {
                    return Ok(());
                };
                let n = bytes.len();
                w.write(bytes).await.map_err(od("write", path))?;
                *written += n as u64;
            }
        }
        .await;
        if let Err(e) = result {
            *failed = Some(jumpstarter_core::error_chain(&e));
            if let Some(mut w) = writer.take() {
                let _ = w.abort().await;
            }
            return Err(e.into());
        }
        *failed = None;
        Ok(())
    }

    /// Moves the position of read file `fd` (`whence` 0: from start, 1: from the current
    /// position, 2: from the end); returns the new position.
    #[export]
    async fn file_seek(&self, fd: Uuid, pos: i64, whence: Option<u8>) -> Result<u64, DriverError> {
        let slot = self.file(fd)?;
        let mut file = slot.lock().await;
        let OpenFile::Read { pos: cur, size, .. } = &mut *file else {
            return Err(mode_error(&file, fd, "not seekable"));
        };
        let base = match whence.unwrap_or(0) {
            0 => 0i128,
            1 => *cur as i128,
            2 => *size as i128,
            w => {
                return Err(DriverError::InvalidArgument(format!(
                    "invalid whence {w} (0, 1 or 2)"
                )));
            }
        };
        let new = base + pos as i128;
        if new < 0 {
            return Err(DriverError::InvalidArgument(format!(
                "file {fd}: negative seek position {new}"
            )));
        }
        *cur = u64::try_from(new).unwrap_or(u64::MAX);
        Ok(*cur)
    }

    /// The position of file `fd` (bytes written so far for a file open for writing).
    #[export]
    async fn file_tell(&self, fd: Uuid) -> Result<u64, DriverError> {
        let slot = self.file(fd)?;
        let file = slot.lock().await;
        match &*file {
            OpenFile::Read { pos, .. } => Ok(*pos),
            OpenFile::Write { written, .. } => Ok(*written),
            OpenFile::Closed => Err(mode_error(&file, fd, "")),
        }
    }

    /// Closes file `fd`; for a file open for writing, commits it (or reports why nothing
    /// was stored).
    #[export]
    async fn file_close(&self, fd: Uuid) -> Result<(), DriverError> {
        let slot = self.file(fd)?;
        let mut file = slot.lock().await;
        let old = std::mem::replace(&mut *file, OpenFile::Closed);
        if let OpenFile::Write {
            path,
            staging,
            writer,
            failed,
            ..
        } = old
        {
            if let Some(f) = failed {
                self.discard(&staging, &path).await;
                return Err(DriverError::Failed(format!(
                    "{path}: not stored, a write failed: {f}"
                )));
            }
            let Some(mut w) = writer else {
                return Ok(());
            };
            if let Err(e) = w.close().await {
                self.discard(&staging, &path).await;
                return Err(StorageError::Opendal {
                    op: "close",
                    path,
                    source: Box::new(e),
                }
                .into());
            }
            if staging != path
                && let Err(e) = self.op.rename(&staging, &path).await
            {
                self.discard(&staging, &path).await;
                return Err(StorageError::Opendal {
                    op: "rename",
                    path,
                    source: Box::new(e),
                }
                .into());
            }
            self.created.lock_or_recover().insert(path);
        }
        Ok(())
    }

    /// Whether file `fd` is closed.
    #[export]
    async fn file_closed(&self, fd: Uuid) -> Result<bool, DriverError> {
        let slot = self.file(fd)?;
        let file = slot.lock().await;
        Ok(matches!(&*file, OpenFile::Closed))
    }

    /// Whether file `fd` can be read.
    #[export]
    async fn file_readable(&self, fd: Uuid) -> Result<bool, DriverError> {
        self.open_mode(fd).await.map(|m| m == Mode::Read)
    }

    /// Whether file `fd` can seek.
    #[export]
    async fn file_seekable(&self, fd: Uuid) -> Result<bool, DriverError> {
        self.open_mode(fd).await.map(|m| m == Mode::Read)
    }

    /// Whether file `fd` can be written.
    #[export]
    async fn file_writable(&self, fd: Uuid) -> Result<bool, DriverError> {
        self.open_mode(fd).await.map(|m| m == Mode::Write)
    }

    /// Metadata of `path`.
    #[export]
    async fn stat(&self, path: String) -> Result<Metadata, DriverError> {
        let path = self.resolve(&path).await?;
        let m = self.op.stat(&path).await.map_err(od("stat", &path))?;
        Ok(metadata(&m))
    }

    /// The hex digest of file `path` (`algo` `sha256`, the default, or `md5`), computed on
    /// the exporter.
    #[export]
    async fn hash(&self, path: String, algo: Option<HashAlgo>) -> Result<String, DriverError> {
        let path = self.resolve(&path).await?;
        let meta = self.op.stat(&path).await.map_err(od("stat", &path))?;
        let reader = self.op.reader(&path).await.map_err(od("open", &path))?;
        let mut chunks = reader
            .into_bytes_stream(0..meta.content_length())
            .await
            .map_err(od("read", &path))?;
        let mut h = Hasher::new(algo.unwrap_or_default());
        while let Some(chunk) = chunks.try_next().await? {
            h.update(&chunk);
        }
        Ok(h.finish_hex())
    }

    /// Copies `source` to `target`.
    #[export]
    async fn copy(&self, source: String, target: String) -> Result<(), DriverError> {
        let (s, t) = (self.resolve(&source).await?, self.resolve(&target).await?);
        self.op.copy(&s, &t).await.map_err(od("copy", &s))?;
        Ok(())
    }

    /// Renames `source` to `target`.
    #[export]
    async fn rename(&self, source: String, target: String) -> Result<(), DriverError> {
        let (s, t) = (self.resolve(&source).await?, self.resolve(&target).await?);
        self.op.rename(&s, &t).await.map_err(od("rename", &s))?;
        Ok(())
    }

    /// Removes `path` and everything under it.
    #[export]
    async fn remove_all(&self, path: String) -> Result<(), DriverError> {
        let path = self.resolve(&path).await?;
        if path == "/" {
            return Err(DriverError::InvalidArgument(
                "refusing to remove the whole storage root".into(),
            ));
        }
        self.op
            .delete_with(&path)
            .recursive(true)
            .await
            .map_err(od("remove_all", &path))?;
        Ok(())
    }

    /// Creates directory `path` (which must end with `/`).
    #[export]
    async fn create_dir(&self, path: String) -> Result<(), DriverError> {
        let path = self.resolve(&path).await?;
        self.op
            .create_dir(&path)
            .await
            .map_err(od("create_dir", &path))?;
        Ok(())
    }

    /// Deletes file `path` (no error if it does not exist).
    #[export]
    async fn delete(&self, path: String) -> Result<(), DriverError> {
        let path = self.resolve(&path).await?;
        self.op.delete(&path).await.map_err(od("delete", &path))?;
        Ok(())
    }

    /// Whether `path` exists.
    #[export]
    async fn exists(&self, path: String) -> Result<bool, DriverError> {
        let path = self.resolve(&path).await?;
        Ok(self.op.exists(&path).await.map_err(od("exists", &path))?)
    }

    /// Streams the entries directly under directory `path`.
    #[export(streaming)]
    async fn list(
        &self,
        path: String,
    ) -> Result<BoxStream<'static, Result<String, DriverError>>, DriverError> {
        self.lister(path, false).await
    }

    /// Streams every entry under directory `path`, recursively.
    #[export(streaming)]
    async fn scan(
        &self,
        path: String,
    ) -> Result<BoxStream<'static, Result<String, DriverError>>, DriverError> {
        self.lister(path, true).await
    }

    /// What the service supports.
    #[export]
    async fn capability(&self) -> Result<Capability, DriverError> {
        Ok(self.op.info().capability().into())
    }

    /// A request that reads the metadata of `path` without the exporter (services that
    /// presign only, e.g. S3; others fail with UNIMPLEMENTED).
    #[export]
    async fn presign_stat(
        &self,
        path: String,
        expire_second: u64,
    ) -> Result<PresignedRequest, DriverError> {
        let path = self.presign_check(&path, "presign_stat", |c| c.presign_stat)?;
        let r = self
            .op
            .presign_stat(&path, Duration::from_secs(expire_second))
            .await
            .map_err(od("presign_stat", &path))?;
        Ok(presigned(r))
    }

    /// A request that reads `path` without the exporter (see `presign_stat`).
    #[export]
    async fn presign_read(
        &self,
        path: String,
        expire_second: u64,
    ) -> Result<PresignedRequest, DriverError> {
        let path = self.presign_check(&path, "presign_read", |c| c.presign_read)?;
        let r = self
            .op
            .presign_read(&path, Duration::from_secs(expire_second))
            .await
            .map_err(od("presign_read", &path))?;
        Ok(presigned(r))
    }

    /// A request that writes `path` without the exporter (see `presign_stat`).
    #[export]
    async fn presign_write(
        &self,
        path: String,
        expire_second: u64,
    ) -> Result<PresignedRequest, DriverError> {
        let path = self.presign_check(&path, "presign_write", |c| c.presign_write)?;
        let r = self
            .op
            .presign_write(&path, Duration::from_secs(expire_second))
            .await
            .map_err(od("presign_write", &path))?;
        Ok(presigned(r))
    }

    /// Paths written through this driver (and registered with `register_path`).
    #[export]
    async fn get_created_resources(&self) -> Result<BTreeSet<String>, DriverError> {
        Ok(self.created.lock_or_recover().clone())
    }

    /// Records `path` as created by this driver (removed when the session ends if
    /// `remove_created_on_close` is set).
    #[export]
    async fn register_path(&self, path: String) -> Result<(), DriverError> {
        let path = self.resolve(&path).await?;
        self.created.lock_or_recover().insert(path);
        Ok(())
    }
}

fn mode_error(file: &OpenFile, fd: Uuid, what: &str) -> DriverError {
    match file {
        OpenFile::Closed => StorageError::BadFileMode {
            fd,
            message: "the file is closed".into(),
        }
        .into(),
        _ => StorageError::BadFileMode {
            fd,
            message: what.into(),
        }
        .into(),
    }
}

/// Gives opendal's network services their HTTP client, once per process: reqwest on rustls
/// with ring, installed as the process's default crypto provider unless one already is
/// (reqwest is built without a provider of its own, and would panic without one).
#[cfg(feature = "storage-s3")]
fn install_http_client() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error means another provider is installed already: reqwest uses that one.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        opendal_http_transport_reqwest::install_default();
    });
}

/// The `http` service's `endpoint`: an `http://` or `https://` URL naming a host (opendal
/// would only find out at the first request, with a message that does not name it).
fn check_http_endpoint(endpoint: Option<&str>) -> Result<(), StorageError> {
    let bad = |message: String| StorageError::BadKwarg {
        key: "endpoint",
        message,
        source: None,
    };
    let endpoint = endpoint
        .filter(|e| !e.is_empty())
        .ok_or_else(|| bad("missing: the http scheme needs the server's URL".into()))?;
    let uri: http::Uri = endpoint.parse().map_err(|e| StorageError::BadKwarg {
        key: "endpoint",
        message: format!(
            "{endpoint:?} is not a URL: {e}",
            e = jumpstarter_core::error_chain(&e)
        ),
        source: Some(e),
    })?;
    let scheme_ok = uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) {
        return Err(bad(format!(
            "{endpoint:?} is not an http:// or https:// URL with a host"
        )));
    }
    Ok(())
}

impl Opendal {
    /// An Opendal driver for `scheme` with the service options `kwargs`.
    pub fn new(
        scheme: &str,
        kwargs: BTreeMap<String, String>,
        remove_created_on_close: bool,
    ) -> Result<Self, StorageError> {
        if !SCHEMES.contains(&scheme) {
            return Err(StorageError::UnknownScheme {
                scheme: scheme.to_string(),
                available: SCHEMES.join(", "),
            });
        }
        if scheme == "http" {
            check_http_endpoint(kwargs.get("endpoint").map(String::as_str))?;
        }
        opendal::init_default_registry();
        #[cfg(feature = "storage-s3")]
        install_http_client();
        let fs_root = (scheme == "fs")
            .then(|| kwargs.get("root").map(PathBuf::from))
            .flatten();
        if let Some(root) = &fs_root {
            super::remove_leftover_partials(root, true, None);
        }
        let mut op = Operator::via_iter(scheme, kwargs).map_err(|e| StorageError::Opendal {
            op: "configure",
            path: scheme.to_string(),
            source: Box::new(e),
        })?;
        if scheme == "http" {
            // Read-only over the exporter's own HTTP client (no other HTTP stack needed).
            op = op.with_context(
                opendal::OperationContext::new()
                    .with_http_transport(super::http_transport::ExporterHttp::transporter()),
            );
        }
        Ok(Self {
            op,
            scheme: scheme.to_string(),
            files: StdMutex::default(),
            created: Arc::default(),
            remove_created_on_close,
            fs_root,
        })
    }

    /// Constructor for the registry (`scheme`, `kwargs`, `remove_created_on_close`).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let cfg: OpendalConfig = args.parse()?;
        let kwargs = cfg
            .kwargs
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect();
        Ok(Arc::new(Self::new(
            &cfg.scheme,
            kwargs,
            cfg.remove_created_on_close,
        )?))
    }

    /// `path` normalized ([`normalize_path`]) and, on the `fs` service, checked so that no
    /// existing component of it is a symbolic link leading out of the root.
    async fn resolve(&self, path: &str) -> Result<String, StorageError> {
        let rel = normalize_path(path)?;
        if let Some(root) = &self.fs_root {
            check_beneath(root, &rel).await?;
        }
        Ok(rel)
    }

    fn file(&self, fd: Uuid) -> Result<FileSlot, DriverError> {
        self.files
            .lock_or_recover()
            .get(&fd)
            .cloned()
            .ok_or_else(|| StorageError::UnknownFd(fd).into())
    }

    async fn open_mode(&self, fd: Uuid) -> Result<Mode, DriverError> {
        let slot = self.file(fd)?;
        let file = slot.lock().await;
        match &*file {
            OpenFile::Read { .. } => Ok(Mode::Read),
            OpenFile::Write { .. } => Ok(Mode::Write),
            OpenFile::Closed => Err(mode_error(&file, fd, "")),
        }
    }

    /// Undoes what an ended session left behind (upstream builds its drivers per session
    /// and does this in `close()`): files still open are closed, writes among them
    /// discarded (nothing is stored), and with `remove_created_on_close` the files created
    /// through the driver are removed.
    async fn end_session(&self) {
        let open: Vec<FileSlot> = self
            .files
            .lock_or_recover()
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in open {
            let old = std::mem::replace(&mut *slot.lock().await, OpenFile::Closed);
            if let OpenFile::Write {
                path,
                staging,
                writer,
                ..
            } = old
            {
                if let Some(mut w) = writer {
                    let _ = w.abort().await;
                }
                self.discard(&staging, &path).await;
                tracing::info!("{path}: still open for writing when the session ended; not stored");
            }
        }
        if self.remove_created_on_close {
            let created = std::mem::take(&mut *self.created.lock_or_recover());
            for p in created {
                if let Err(e) = self.op.delete(&p).await {
                    tracing::warn!(
                        "cannot remove created file {p}: {e}",
                        e = jumpstarter_core::error_chain(&e)
                    );
                }
            }
        }
    }

    async fn discard(&self, staging: &str, path: &str) {
        if staging != path
            && let Err(e) = self.op.delete(staging).await
        {
            tracing::warn!(
                "cannot remove partial file {staging}: {e}",
                e = jumpstarter_core::error_chain(&e)
            );
        }
    }

    async fn lister(
        &self,
        path: String,
        recursive: bool,
    ) -> Result<BoxStream<'static, Result<String, DriverError>>, DriverError> {
        let path = self.resolve(&path).await?;
        let lister = self
            .op
            .lister_with(&path)
            .recursive(recursive)
            .await
            .map_err(od("list", &path))?;
        let root = self.fs_root.clone();
        Ok(lister
            .map(move |e| {
                e.map(|e| e.path().to_string())
                    .map_err(|source| DriverError::from(od("list", &path)(source)))
            })
            // Entries reached through a link that leads out of the root are left out.
            .filter_map(move |e| {
                let root = root.clone();
                async move {
                    match (&e, root) {
                        (Ok(p), Some(root)) => match check_beneath(&root, p).await {
                            Ok(()) => Some(e),
                            Err(StorageError::OutsideRoot(_)) => None,
                            Err(err) => Some(Err(err.into())),
                        },
                        _ => Some(e),
                    }
                }
            })
            .boxed())
    }

    fn presign_check(
        &self,
        path: &str,
        what: &str,
        supported: impl Fn(&opendal::Capability) -> bool,
    ) -> Result<String, DriverError> {
        let path = normalize_path(path)?;
        if !supported(&self.op.info().capability()) {
            return Err(DriverError::Unimplemented(format!(
                "{what} is not supported by the {} service",
                self.scheme
            )));
        }
        Ok(path)
    }
}

impl Drop for Opendal {
    fn drop(&mut self) {
        if !self.remove_created_on_close {
            return;
        }
        let paths: Vec<String> = self.created.lock_or_recover().iter().cloned().collect();
        let op = self.op.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for p in paths {
                    if let Err(e) = op.delete(&p).await {
                        tracing::warn!(
                            "cannot remove created file {p}: {e}",
                            e = jumpstarter_core::error_chain(&e)
                        );
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_root() {
        assert_eq!(normalize_path("a.txt").unwrap(), "a.txt");
        assert_eq!(normalize_path("/a/./b/../c").unwrap(), "a/c");
        assert_eq!(normalize_path("dir/").unwrap(), "dir/");
        assert_eq!(normalize_path("/").unwrap(), "/");
        assert_eq!(normalize_path("").unwrap(), "/");
        assert_eq!(normalize_path("a/..").unwrap(), "/");
        for bad in ["..", "../x", "a/../../x", "/../etc/passwd", "x\0y"] {
            let e = normalize_path(bad).unwrap_err();
            assert!(e.to_string().contains("outside the storage root"), "{bad}");
        }
    }

    #[test]
    fn unknown_scheme_is_refused() {
        let e = Opendal::new("nosuch", BTreeMap::new(), false).unwrap_err();
        assert!(e.to_string().contains("\"nosuch\""), "{e}");
        assert!(e.to_string().contains("fs"), "{e}");
        assert!(Opendal::new("memory", BTreeMap::new(), false).is_ok());
    }

    #[test]
    fn leftover_staging_files_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let top = dir.path().join(staging_path("disk.img"));
        let deep = dir.path().join(staging_path("d/x.bin"));
        std::fs::write(&top, b"half").unwrap();
        std::fs::write(&deep, b"half").unwrap();
        std::fs::write(dir.path().join("disk.img"), b"keep").unwrap();
        let kwargs = BTreeMap::from([(
            "root".to_string(),
            dir.path().to_string_lossy().into_owned(),
        )]);
        let _d = Opendal::new("fs", kwargs, false).unwrap();
        assert!(!top.exists() && !deep.exists());
        assert!(dir.path().join("disk.img").exists());
    }

    #[test]
    fn staging_paths_are_hidden_siblings() {
        assert!(staging_path("a/b/c.img").starts_with("a/b/.c.img.partial-"));
        assert!(staging_path("c.img").starts_with(".c.img.partial-"));
    }
}
