//! `MockStorageMux`: a storage multiplexer without hardware, its medium a file.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use jumpstarter_core::{
    CallContext, Driver, DriverError, driver,
    driver::DriverArgs,
    wire::resource::{ResourceHandle, ResourceStream},
};
use serde::Deserialize;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::{
    HashAlgo, Partial, StorageError, WriteTarget, hash_reader, open_in_place,
    remove_leftover_partials, write_target,
};

/// Config of [`MockStorageMux`] (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MuxConfig {
    /// The file backing the medium (ours; upstream always uses a temporary file). A block
    /// device is written in place.
    #[serde(default)]
    file: Option<PathBuf>,
}

/// Removes the partial writes an earlier run left beside the medium `path` (and beside the
/// file it links to, where a write goes).
fn clean_partials_of(path: &Path) {
    let mut targets = vec![path.to_path_buf()];
    if let Ok(real) = std::fs::canonicalize(path)
        && real != path
    {
        targets.push(real);
    }
    for t in targets {
        if let (Some(dir), Some(name)) = (t.parent(), t.file_name()) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            remove_leftover_partials(dir, false, Some(&name.to_string_lossy()));
        }
    }
}

/// The kind of the private directories holding a temporary medium:
/// `jmp-storage-mux-PID-RANDOM` ([`jumpstarter_core::leftovers`]), so the ones of a killed
/// exporter are removed when the next mux starts.
const TEMP_MEDIUM_KIND: &str = "jmp-storage-mux";

/// The medium of a mock storage mux: a file that reads back what was written.
#[derive(Debug)]
pub struct Medium {
    path: PathBuf,
    // Removes the temporary medium (and any partial write beside it) with the driver
    // (absent for a configured file).
    _temp: Option<tempfile::TempDir>,
}

impl Medium {
    pub(super) fn new(file: Option<PathBuf>) -> Result<Self, DriverError> {
        match file {
            Some(path) => {
                clean_partials_of(&path);
                Ok(Self { path, _temp: None })
            }
            None => {
                let base = std::env::temp_dir();
                let failed = |e: std::io::Error| {
                    DriverError::because(
                        format!("cannot create the mock medium file in {}", base.display()),
                        e,
                    )
                };
                let dir = jumpstarter_core::leftovers::private_dir_in(&base, TEMP_MEDIUM_KIND)
                    .map_err(failed)?;
                let path = dir.path().join("medium.img");
                std::fs::File::create_new(&path).map_err(failed)?;
                Ok(Self {
                    path,
                    _temp: Some(dir),
                })
            }
        }
    }

    /// The backing file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the medium's content with the resource's bytes; a file changes only if the
    /// whole transfer arrived, a device is written in place. Returns the number of bytes
    /// stored.
    pub(super) async fn write(
        &self,
        ctx: &CallContext,
        src: &ResourceHandle,
    ) -> Result<u64, DriverError> {
        let mut stream = ctx.resource(src)?;
        let n = match write_target(&self.path).await? {
            WriteTarget::Replace(target) => self.replace(&mut stream, &target).await?,
            // A device cannot be swapped whole: it is written where it is, and a broken
            // transfer leaves it partly written (and says so).
            WriteTarget::InPlace => stream
                .copy_to_file(open_in_place(&self.path).await?)
                .await
                .map_err(|e| StorageError::PartlyWritten {
                    target: self.path.display().to_string(),
                    source: e,
                })?,
        };
        ctx.log_info(format!("wrote {n} bytes to the medium"));
        Ok(n)
    }

    /// Writes the stream's bytes beside the file `target`, renamed over it once complete.
    async fn replace(
        &self,
        stream: &mut ResourceStream,
        target: &Path,
    ) -> Result<u64, StorageError> {
        // Removed unless renamed into place below, also when this call is cancelled.
        let (partial, file) = Partial::create(target).await?;
        let n = stream
            .copy_to_file(file)
            .await
            .map_err(|e| StorageError::Transfer {
                target: self.path.display().to_string(),
                source: e,
            })?;
        // The old content stays open across the rename, so that its blocks are released
        // when this handle closes, on a blocking thread after the reply, instead of inside
        // the rename (freeing a GiB on tmpfs takes about 0.2 s).
        let old = match tokio::fs::File::open(target).await {
            Ok(f) => Some(f.into_std().await),
            Err(_) => None,
        };
        partial.commit(target).await?;
        if let Some(old) = old {
            tokio::task::spawn_blocking(move || drop(old));
        }
        Ok(n)
    }

    /// Opens the medium for reading.
    async fn open(&self) -> Result<tokio::fs::File, StorageError> {
        tokio::fs::File::open(&self.path)
            .await
            .map_err(StorageError::file("opening", &self.path))
    }

    /// Sends the medium's content into the resource.
    pub(super) async fn read(
        &self,
        ctx: &CallContext,
        dst: &ResourceHandle,
    ) -> Result<u64, DriverError> {
        let mut stream = ctx.resource(dst)?;
        let file = self.open().await?;
        let n = stream.copy_from_file(file.into_std().await).await?;
        stream.shutdown().await?;
        Ok(n)
    }

    /// How many bytes the medium holds (a block device's size too).
    async fn size(&self) -> Result<u64, DriverError> {
        let mut file = self.open().await?;
        let end = file
            .seek(std::io::SeekFrom::End(0))
            .await
            .map_err(StorageError::file("finding the size of", &self.path))?;
        Ok(end)
    }

    /// The digest of the first `length` bytes of the medium (all of it when `None`).
    async fn hash(&self, algo: HashAlgo, length: Option<u64>) -> Result<String, DriverError> {
        let file = self.open().await?;
        let reader = tokio::io::BufReader::with_capacity(1024 * 1024, file);
        let (digest, n) = hash_reader(reader, algo, length).await?;
        if let Some(l) = length
            && n < l
        {
            return Err(DriverError::InvalidArgument(format!(
                "the medium holds {n} bytes, fewer than the {l} asked to hash"
            )));
        }
        Ok(digest)
    }
}

/// A storage mux without hardware: `host`/`dut`/`off` only log, and the medium is a file
/// (a temporary one unless `file:` is configured) that reads back what was written.
#[derive(Debug)]
pub struct MockStorageMux {
    medium: Medium,
}

/// [`MockStorageMux`] reported as a flasher (`StorageMuxFlasherClient`: `flash`, `dump`
/// on the client side, built from `host`, `write`/`read` and `dut`).
#[derive(Debug)]
pub struct MockStorageMuxFlasher {
    medium: Medium,
}

/// The driver methods both mock muxes export (they differ only in their client class).
macro_rules! mock_mux_driver {
    ($ty:ident, $client:literal) => {
        #[driver(client = $client)]
        impl $ty {
            /// Connects the medium to the host (exporter).
            #[export]
            async fn host(&self, ctx: &CallContext) -> Result<(), DriverError> {
                ctx.log_info("storage connected to host");
                Ok(())
            }

            /// Connects the medium to the device under test.
            #[export]
            async fn dut(&self, ctx: &CallContext) -> Result<(), DriverError> {
                ctx.log_info("storage connected to dut");
                Ok(())
            }

            /// Disconnects the medium.
            #[export]
            async fn off(&self, ctx: &CallContext) -> Result<(), DriverError> {
                ctx.log_info("storage disconnected");
                Ok(())
            }

            /// Writes the bytes of resource `src` to the medium.
            #[export]
            async fn write(
                &self,
                ctx: &CallContext,
                src: ResourceHandle,
            ) -> Result<(), DriverError> {
                self.medium.write(ctx, &src).await.map(|_| ())
            }

            /// Sends the medium's content into resource `dst`.
            #[export]
            async fn read(
                &self,
                ctx: &CallContext,
                dst: ResourceHandle,
            ) -> Result<(), DriverError> {
                self.medium.read(ctx, &dst).await.map(|_| ())
            }

            /// Ours (upstream has no such method): how many bytes the medium holds, so that a
            /// client can show a dump's percentage and ETA.
            #[export]
            async fn size(&self) -> Result<u64, DriverError> {
                self.medium.size().await
            }

            /// Ours (upstream has no such method): the hex digest of the first `length` bytes
            /// of the medium (all of it when absent), `algo` `sha256` (default) or `md5`. Lets
            /// a client verify a flash without reading the image back.
            #[export]
            async fn hash(
                &self,
                algo: Option<HashAlgo>,
                length: Option<u64>,
            ) -> Result<String, DriverError> {
                self.medium.hash(algo.unwrap_or_default(), length).await
            }
        }

        impl $ty {
            /// A mux whose medium is `file`, or a fresh temporary file.
            pub fn new(file: Option<PathBuf>) -> Result<Self, DriverError> {
                Ok(Self {
                    medium: Medium::new(file)?,
                })
            }

            /// Constructor for the registry (optional `file:`).
            pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
                let cfg: MuxConfig = args.parse()?;
                Ok(Arc::new(Self::new(cfg.file)?))
            }

            /// The file backing the medium.
            pub fn medium_path(&self) -> &Path {
                self.medium.path()
            }
        }
    };
}

mock_mux_driver!(
    MockStorageMux,
    "jumpstarter_driver_opendal.client.StorageMuxClient"
);
mock_mux_driver!(
    MockStorageMuxFlasher,
    "jumpstarter_driver_opendal.client.StorageMuxFlasherClient"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rejects_unknown_fields() {
        let args = DriverArgs {
            config: serde_json::json!({"flie": "/tmp/x"}),
        };
        let e = MockStorageMux::from_args(&args).err().unwrap();
        assert!(e.to_string().contains("flie"), "{e}");
    }

    #[test]
    fn leftover_partials_of_the_medium_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let medium = dir.path().join("mux1.img");
        std::fs::write(&medium, b"old").unwrap();
        let left = super::super::partial_path(&medium);
        std::fs::write(&left, b"half written").unwrap();
        let other = super::super::partial_path(&dir.path().join("other.img"));
        std::fs::write(&other, b"not ours to judge").unwrap();
        let _mux = MockStorageMux::new(Some(medium.clone())).unwrap();
        assert!(!left.exists(), "the leftover partial file is still there");
        assert!(other.exists(), "another file's partial was removed");
        assert_eq!(std::fs::read(&medium).unwrap(), b"old");
    }

    #[test]
    fn temporary_medium_is_removed_with_the_driver() {
        let mux = MockStorageMux::new(None).unwrap();
        let path = mux.medium_path().to_path_buf();
        assert!(path.exists());
        drop(mux);
        assert!(!path.exists());
    }

    #[test]
    fn the_temporary_media_a_killed_exporter_left_are_removed_at_start() {
        // As a process killed with SIGKILL leaves it: named after a PID that no longer runs,
        // with a partial write beside the medium.
        let stale = std::env::temp_dir().join(format!(
            "{TEMP_MEDIUM_KIND}-4294967294-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("medium.img"), b"old").unwrap();
        std::fs::write(stale.join(".medium.img.partial-1"), b"half").unwrap();
        let mux = MockStorageMux::new(None).unwrap();
        assert!(!stale.exists(), "{} is still there", stale.display());
        // Its own medium is in a directory named after this process, which it removes.
        let dir = mux.medium_path().parent().unwrap().to_path_buf();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            jumpstarter_core::leftovers::owner_pid(&name, TEMP_MEDIUM_KIND),
            Some(std::process::id()),
            "{name}"
        );
        drop(mux);
        assert!(!dir.exists());
    }
}
