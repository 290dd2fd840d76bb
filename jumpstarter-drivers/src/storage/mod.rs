//! Storage: storage multiplexers (a medium switched between the exporter and the device
//! under test) and the Opendal driver (files on any storage service opendal supports).
//!
//! Upstream package `jumpstarter_driver_opendal`:
//! - [`MockStorageMux`] / [`MockStorageMuxFlasher`]: a storage mux backed by a file
//!   (`host`, `dut`, `off`, `write(handle)`, `read(handle)`, plus our `hash`);
//! - [`MockFlasher`]: a flasher whose partitions are files (`flash(handle, partition)`,
//!   `dump(handle, partition)`), with [`FlasherClient`] and [`flasher_cli`];
//! - [`Opendal`]: file operations on a configured opendal service (`scheme` + `kwargs`);
//! - [`StorageMuxClient`] and [`OpendalClient`]: the client halves, and [`mux_cli`] /
//!   [`opendal_cli`] the `j storage ...` commands.
//!
//! Bytes travel as resource streams (see `jumpstarter_core::wire::resource`): written to a
//! temporary file and renamed into place only when the whole transfer arrived, so a broken
//! transfer never leaves a half-written file that looks complete.

mod client;
mod flasher;
mod flasher_client;
mod http_transport;
mod mux;
mod opendal;
mod progress;

use std::path::{Path, PathBuf};

use jumpstarter_core::DriverError;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

pub use client::{
    OpendalClient, OpendalFile, Presign, StorageMuxClient, TransferOptions, detect_encoding,
    mux_cli, opendal_cli,
};
pub(crate) use client::{presigned_get, refuse_url_dump, url_of, write_local_atomically};
pub use flasher::{DEFAULT_PARTITION, MockFlasher};
pub use flasher_client::{FlasherClient, flasher_cli};
pub use mux::{MockStorageMux, MockStorageMuxFlasher};
pub use opendal::{Capability, EntryMode, Metadata, Opendal, PresignedRequest};
pub use progress::{Progress, ProgressReader, ProgressWriter};

/// Upstream client class of storage muxes.
pub const STORAGE_MUX_CLIENT: &str = "jumpstarter_driver_opendal.client.StorageMuxClient";
/// Upstream client class of storage muxes that flash (`flash`, `dump`).
pub const STORAGE_MUX_FLASHER_CLIENT: &str =
    "jumpstarter_driver_opendal.client.StorageMuxFlasherClient";
/// Upstream client class of flashers (`flash`, `dump` with a partition).
pub const FLASHER_CLIENT: &str = "jumpstarter_driver_opendal.client.FlasherClient";
/// Upstream client class of the Opendal driver.
pub const OPENDAL_CLIENT: &str = "jumpstarter_driver_opendal.client.OpendalClient";

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A path leaves the configured root.
    #[error("path {0:?} is outside the storage root")]
    OutsideRoot(String),
    /// The configured service is unknown or not built in.
    #[error(
        "unknown or unsupported opendal scheme {scheme:?} (built in: {available}; s3 needs the `storage-s3` feature)"
    )]
    UnknownScheme {
        /// The scheme asked for.
        scheme: String,
        /// The schemes available.
        available: String,
    },
    /// A service option (`kwargs.KEY`) is missing or not valid.
    #[error("kwargs.{key}: {message}")]
    BadKwarg {
        /// The option.
        key: &'static str,
        /// What is wrong.
        message: String,
        /// The parse error, when the option is not a URL.
        #[source]
        source: Option<http::uri::InvalidUri>,
    },
    /// An opendal operation failed.
    #[error("{op} {path:?}")]
    Opendal {
        /// The operation.
        op: &'static str,
        /// The path.
        path: String,
        /// The opendal error (boxed: it is large).
        source: Box<::opendal::Error>,
    },
    /// A local file operation failed.
    #[error("{what} {path}")]
    File {
        /// What we were doing.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A transfer broke midway.
    #[error("transfer into {target} failed, nothing was stored")]
    Transfer {
        /// Where the bytes were going.
        target: String,
        /// Why.
        source: std::io::Error,
    },
    /// A transfer broke midway into a medium written in place (a device).
    #[error("transfer into {target} failed midway, the device is partly written")]
    PartlyWritten {
        /// The device.
        target: String,
        /// Why.
        source: std::io::Error,
    },
    /// No open file with that descriptor.
    #[error("unknown file descriptor {0}: not opened by this driver, or already closed")]
    UnknownFd(uuid::Uuid),
    /// The file is not open for that operation.
    #[error("file {fd}: {message}")]
    BadFileMode {
        /// The descriptor.
        fd: uuid::Uuid,
        /// What is wrong.
        message: String,
    },
}

impl StorageError {
    /// What `map_err` needs for a failed local file operation: `what` we were doing to
    /// `path`.
    pub(crate) fn file(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::File { what, path, source }
    }
}

impl From<StorageError> for DriverError {
    fn from(e: StorageError) -> Self {
        match &e {
            StorageError::OutsideRoot(_)
            | StorageError::BadFileMode { .. }
            | StorageError::UnknownScheme { .. }
            | StorageError::BadKwarg { .. } => DriverError::invalid(e),
            StorageError::Opendal { source, .. }
                if source.kind() == ::opendal::ErrorKind::Unsupported =>
            {
                DriverError::Unimplemented(jumpstarter_core::error_chain(&e))
            }
            _ => DriverError::other(e),
        }
    }
}

/// A digest algorithm `hash` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgo {
    /// MD5 (for compatibility; not for integrity against an adversary).
    Md5,
    /// SHA-256.
    #[default]
    Sha256,
}

/// An incremental digest of either algorithm.
pub enum Hasher {
    /// MD5 state.
    Md5(md5::Md5),
    /// SHA-256 state.
    Sha256(sha2::Sha256),
}

impl Hasher {
    /// A fresh digest.
    pub fn new(algo: HashAlgo) -> Self {
        use sha2::Digest;
        match algo {
            HashAlgo::Md5 => Hasher::Md5(md5::Md5::new()),
            HashAlgo::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
        }
    }

    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        use sha2::Digest;
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
        }
    }

    /// The lowercase hex digest.
    pub fn finish_hex(self) -> String {
        use sha2::Digest;
        let bytes: Vec<u8> = match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Digests at most `limit` bytes of `reader` (all of it when `None`); returns the hex
/// digest and the number of bytes read.
pub async fn hash_reader<R: AsyncRead + Unpin>(
    mut reader: R,
    algo: HashAlgo,
    limit: Option<u64>,
) -> std::io::Result<(String, u64)> {
    let mut h = Hasher::new(algo);
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let want = match limit {
            Some(l) => usize::try_from((l - total).min(buf.len() as u64)).unwrap_or(buf.len()),
            None => buf.len(),
        };
        if want == 0 {
            break;
        }
        let n = reader.read(&mut buf[..want]).await?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((h.finish_hex(), total))
}

/// A sibling path for a partial write (`.<name>.partial-<uuid>`), renamed over `target`
/// once complete.
fn partial_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    target.with_file_name(format!(".{name}.partial-{}", uuid::Uuid::new_v4().simple()))
}

/// Whether `name` is one of our partial-write names (`.<name>.partial-<32 hex digits>`, as
/// [`partial_path`] and the Opendal driver's staging paths make them); with `of`, only the
/// partial files of that file name.
pub(crate) fn is_partial_name(name: &str, of: Option<&str>) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let Some((base, id)) = rest.rsplit_once(".partial-") else {
        return false;
    };
    !base.is_empty()
        && id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && of.is_none_or(|of| of == base)
}

/// At most this many directories are visited when looking for leftover partial files.
const PARTIAL_SCAN_DIRS: usize = 100_000;

/// Removes what an earlier process (killed midway through a write) left of our partial files
/// in `dir` (and below it with `recursive`; symbolic links are not followed), logging each;
/// with `of`, only those of that file name. Returns the paths removed. A directory that
/// cannot be read is skipped with a warning: this is housekeeping, never a reason to fail.
pub(crate) fn remove_leftover_partials(
    dir: &Path,
    recursive: bool,
    of: Option<&str>,
) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    let mut visited = 0;
    while let Some(d) = dirs.pop() {
        visited += 1;
        if visited > PARTIAL_SCAN_DIRS {
            tracing::warn!(
                "stopped looking for leftover partial files under {} after {PARTIAL_SCAN_DIRS} directories",
                dir.display()
            );
            break;
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(
                    "cannot look for leftover partial files in {}: {e}",
                    d.display(),
                    e = jumpstarter_core::error_chain(&e)
                );
                continue;
            }
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                if recursive {
                    dirs.push(path);
                }
                continue;
            }
            if !kind.is_file() || !is_partial_name(&entry.file_name().to_string_lossy(), of) {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(
                        "removed {}: a partial write left by an earlier run (it crashed or was killed midway)",
                        path.display()
                    );
                    removed.push(path);
                }
                Err(e) => tracing::warn!(
                    "cannot remove leftover partial file {}: {e}",
                    path.display(),
                    e = jumpstarter_core::error_chain(&e)
                ),
            }
        }
    }
    removed
}

/// How a local path receives a whole new content.
#[derive(Debug, PartialEq)]
pub(crate) enum WriteTarget {
    /// A regular file (or none yet): written beside it with [`Partial`], renamed over this
    /// path (a symbolic link's target: the link stays) once complete.
    Replace(PathBuf),
    /// A device, pipe or socket (a block device, `/dev/null`, `/dev/stdout`, a FIFO):
    /// written in place, since there is no file to swap, and renaming over it would replace
    /// it.
    InPlace,
}

/// Where the chain of symbolic links at `path` ends (at most 40 links, as the kernel
/// follows): `path` itself when it is no link.
async fn dangling_link_target(path: &Path) -> PathBuf {
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        let is_link = tokio::fs::symlink_metadata(&at)
            .await
            .is_ok_and(|m| m.file_type().is_symlink());
        let Some(next) = is_link
            .then_some(())
            .and(tokio::fs::read_link(&at).await.ok())
        else {
            return at;
        };
        at = match at.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
    }
    at
}

/// How `path` receives a new content; a directory is refused before anything moves.
pub(crate) async fn write_target(path: &Path) -> Result<WriteTarget, StorageError> {
    let Ok(meta) = tokio::fs::metadata(path).await else {
        // Missing (or unreadable: creating the partial file reports it). A symbolic link
        // to a file that does not exist yet names where the content goes: the link stays.
        return Ok(WriteTarget::Replace(dangling_link_target(path).await));
    };
    if meta.is_dir() {
        return Err(is_a_directory("writing", path));
    }
    if !meta.is_file() {
        return Ok(WriteTarget::InPlace);
    }
    let link = tokio::fs::symlink_metadata(path)
        .await
        .is_ok_and(|m| m.file_type().is_symlink());
    if !link {
        return Ok(WriteTarget::Replace(path.to_path_buf()));
    }
    tokio::fs::canonicalize(path)
        .await
        .map(WriteTarget::Replace)
        .map_err(StorageError::file("resolving", path))
}

/// The error for a local file that turned out to be a directory.
pub(crate) fn is_a_directory(what: &'static str, path: &Path) -> StorageError {
    StorageError::file(what, path)(std::io::Error::new(
        std::io::ErrorKind::IsADirectory,
        "it is a directory",
    ))
}

/// Opens an existing device, pipe or socket for writing (see [`WriteTarget::InPlace`]).
pub(crate) async fn open_in_place(path: &Path) -> Result<std::fs::File, StorageError> {
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .await
        .map_err(StorageError::file("opening", path))?;
    Ok(file.into_std().await)
}

/// A file being written beside its target (at [`partial_path`]) until
/// [`Partial::commit`] renames it over the target. Dropped uncommitted (the write failed,
/// or the call was cancelled because its client went away or was interrupted), the file is
/// removed: nothing half-written stays behind.
#[derive(Debug)]
pub(crate) struct Partial {
    path: Option<PathBuf>,
    target: PathBuf,
}

impl Partial {
    /// Creates the partial file of `target`; an error names `target`.
    pub(crate) async fn create(target: &Path) -> Result<(Self, std::fs::File), StorageError> {
        let path = partial_path(target);
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(StorageError::file("creating", target))?;
        let partial = Self {
            path: Some(path),
            target: target.to_path_buf(),
        };
        Ok((partial, file.into_std().await))
    }

    /// Renames the file over `target`; on error the file is removed.
    pub(crate) async fn commit(mut self, target: &Path) -> Result<(), StorageError> {
        let Some(path) = self.path.take() else {
            return Ok(());
        };
        if let Err(source) = tokio::fs::rename(&path, target).await {
            self.path = Some(path);
            return Err(StorageError::file("renaming into place", target)(source));
        }
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        let Some(path) = self.path.take() else {
            return;
        };
        tracing::info!(
            "write into {} not completed: left unchanged",
            self.target.display()
        );
        // Inline, even on a runtime worker: this runs only when a write failed or was
        // cancelled, and a task queued for later would not run if the runtime is shutting
        // down (the exporter stopping mid-transfer) – the file would stay behind.
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "cannot remove partial file {}: {e}",
                path.display(),
                e = jumpstarter_core::error_chain(&e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hashes_match_known_values() {
        let (h, n) = hash_reader(&b"hello\n"[..], HashAlgo::Sha256, None)
            .await
            .unwrap();
        assert_eq!(
            h,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(n, 6);
        let (h, _) = hash_reader(&b"hello\n"[..], HashAlgo::Md5, None)
            .await
            .unwrap();
        assert_eq!(h, "b1946ac92492d2347c6235b4d2611184");
        let (h, n) = hash_reader(&b"hello\nworld"[..], HashAlgo::Sha256, Some(6))
            .await
            .unwrap();
        assert_eq!(n, 6);
        assert!(h.starts_with("5891b5b5"));
    }

    #[test]
    fn partial_names_are_recognised_and_leftovers_removed() {
        let p = partial_path(Path::new("/a/b/disk.img"));
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(is_partial_name(&name, None));
        assert!(is_partial_name(&name, Some("disk.img")));
        assert!(!is_partial_name(&name, Some("other.img")));
        for not_ours in [
            "disk.img",
            ".disk.img",
            ".disk.img.partial-",
            ".disk.img.partial-xyz",
            "disk.img.partial-0123456789abcdef0123456789abcdef",
            "..partial-0123456789abcdef0123456789abcdef",
            ".disk.img.partial-0123456789ABCDEF0123456789ABCDEF",
        ] {
            assert!(!is_partial_name(not_ours, None), "{not_ours}");
        }

        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let top = partial_path(&dir.path().join("disk.img"));
        let deep = partial_path(&sub.join("x.bin"));
        std::fs::write(&top, b"half").unwrap();
        std::fs::write(&deep, b"half").unwrap();
        std::fs::write(dir.path().join("disk.img"), b"keep").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"keep").unwrap();
        // Only the named file's partials, only in the directory itself.
        assert!(remove_leftover_partials(dir.path(), false, Some("other")).is_empty());
        assert_eq!(
            remove_leftover_partials(dir.path(), false, None),
            vec![top.clone()]
        );
        assert!(deep.exists());
        assert_eq!(
            remove_leftover_partials(dir.path(), true, None),
            vec![deep.clone()]
        );
        assert_eq!(names_in(dir.path()), [".hidden", "disk.img", "sub"]);
    }

    #[test]
    fn partial_paths_are_hidden_siblings() {
        let p = partial_path(Path::new("/a/b/disk.img"));
        assert_eq!(p.parent(), Some(Path::new("/a/b")));
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".disk.img.partial-"), "{name}");
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_committed_partial_replaces_its_target() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        std::fs::write(&target, b"old").unwrap();
        let (partial, mut file) = Partial::create(&target).await.unwrap();
        file.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        partial.commit(&target).await.unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(names_in(dir.path()), ["disk.img"]);
    }

    #[tokio::test]
    async fn a_partial_dropped_or_cancelled_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        // Dropped after an error.
        let (partial, _file) = Partial::create(&target).await.unwrap();
        assert_eq!(names_in(dir.path()).len(), 1);
        drop(partial);
        assert!(names_in(dir.path()).is_empty());
        // A write cancelled midway (its future dropped, as when the client goes away).
        let writing = async {
            let (_partial, _file) = Partial::create(&target).await.unwrap();
            std::future::pending::<()>().await;
        };
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), writing).await;
        assert!(cut.is_err());
        assert!(
            names_in(dir.path()).is_empty(),
            "{:?}",
            names_in(dir.path())
        );
        assert!(!target.exists());
    }

    #[tokio::test]
    async fn write_targets_by_kind_of_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("new.img");
        assert_eq!(
            write_target(&missing).await.unwrap(),
            WriteTarget::Replace(missing.clone())
        );
        let real = dir.path().join("real.img");
        std::fs::write(&real, b"x").unwrap();
        assert_eq!(
            write_target(&real).await.unwrap(),
            WriteTarget::Replace(real.clone())
        );
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            write_target(&link).await.unwrap(),
            WriteTarget::Replace(real.canonicalize().unwrap())
        );
        // A link to a file not there yet: the content goes to the file it names, through
        // a relative link and a second link too.
        let dangling = dir.path().join("dangling.img");
        std::os::unix::fs::symlink("later.img", &dangling).unwrap();
        let twice = dir.path().join("twice.img");
        std::os::unix::fs::symlink(&dangling, &twice).unwrap();
        for l in [&dangling, &twice] {
            assert_eq!(
                write_target(l).await.unwrap(),
                WriteTarget::Replace(dir.path().join("later.img"))
            );
        }
        let e = jumpstarter_core::error_chain(&write_target(dir.path()).await.unwrap_err());
        assert!(e.contains("it is a directory"), "{e}");
        assert_eq!(
            write_target(Path::new("/dev/null")).await.unwrap(),
            WriteTarget::InPlace
        );
        let fifo = dir.path().join("out.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert_eq!(write_target(&fifo).await.unwrap(), WriteTarget::InPlace);
    }

    #[tokio::test]
    async fn partial_errors_name_the_target_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir/disk.img");
        let e = Partial::create(&missing).await.unwrap_err().to_string();
        assert!(
            e.contains("creating") && e.contains("no-such-dir/disk.img"),
            "{e}"
        );
        // A rename that fails (into a missing directory) removes the partial.
        let target = dir.path().join("disk.img");
        let (partial, _file) = Partial::create(&target).await.unwrap();
        let e = partial.commit(&missing).await.unwrap_err().to_string();
        assert!(e.contains("renaming into place"), "{e}");
        assert!(
            names_in(dir.path()).is_empty(),
            "{:?}",
            names_in(dir.path())
        );
    }
}
