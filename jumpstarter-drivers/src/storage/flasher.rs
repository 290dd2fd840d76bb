//! `MockFlasher`: a flasher without hardware, each partition a file in a temporary
//! directory (upstream `jumpstarter_driver_opendal.driver.MockFlasher`).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use jumpstarter_core::{
    CallContext, Driver, DriverError, driver, driver::DriverArgs, sync::LockExt,
    wire::resource::ResourceHandle,
};
use serde::Deserialize;

use super::mux::Medium;

/// The partition a flash or dump without a target uses (as upstream).
pub const DEFAULT_PARTITION: &str = "default";

/// The kind of the flashers' private directories: `jmp-mock-flasher-PID-RANDOM` (0700, in
/// the temporary directory; [`jumpstarter_core::leftovers`]), so the partitions of a killed
/// exporter are removed when the next flasher starts.
const DIR_KIND: &str = "jmp-mock-flasher";

/// A flasher without hardware: `flash(source, partition)` stores the image of each
/// partition in a file of a temporary directory, `dump(target, partition)` sends it back.
#[derive(Debug)]
pub struct MockFlasher {
    dir: tempfile::TempDir,
    media: Mutex<BTreeMap<String, Arc<Medium>>>,
}

/// A partition name names a file of the flasher's directory: no path separators, not `.`
/// or `..`, at most 255 bytes.
fn check_partition(name: &str) -> Result<(), DriverError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(DriverError::InvalidArgument(format!(
            "invalid partition {name:?}: a partition is a name without '/' (e.g. {DEFAULT_PARTITION:?}, \"boot\")"
        )))
    }
}

impl MockFlasher {
    /// Constructor for the registry (takes no config).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct NoConfig {}
        let _: NoConfig = args.parse()?;
        Ok(Arc::new(Self::new()?))
    }

    /// A flasher with no partition written yet, its partitions in a private directory of
    /// the temporary directory (after removing those killed exporters left there).
    pub fn new() -> Result<Self, DriverError> {
        let base = std::env::temp_dir();
        let dir = jumpstarter_core::leftovers::private_dir_in(&base, DIR_KIND).map_err(|e| {
            DriverError::because(
                format!(
                    "cannot create the mock flasher's directory in {}",
                    base.display()
                ),
                e,
            )
        })?;
        Ok(Self {
            dir,
            media: Mutex::new(BTreeMap::new()),
        })
    }

    /// The medium of a partition (`default` when none is named).
    fn medium(&self, partition: Option<String>) -> Result<Arc<Medium>, DriverError> {
        let name = partition.unwrap_or_else(|| DEFAULT_PARTITION.to_string());
        check_partition(&name)?;
        let mut media = self.media.lock_or_recover();
        if let Some(m) = media.get(&name) {
            return Ok(m.clone());
        }
        let m = Arc::new(Medium::new(Some(self.dir.path().join(&name)))?);
        media.insert(name, m.clone());
        Ok(m)
    }

    /// The file holding a partition's image.
    pub fn partition_path(&self, partition: &str) -> Result<std::path::PathBuf, DriverError> {
        check_partition(partition)?;
        Ok(self.dir.path().join(partition))
    }
}

#[driver(client = "jumpstarter_driver_opendal.client.FlasherClient")]
impl MockFlasher {
    /// Writes the bytes of resource `source` to `partition` (`default` when null).
    #[export]
    async fn flash(
        &self,
        ctx: &CallContext,
        source: ResourceHandle,
        partition: Option<String>,
    ) -> Result<(), DriverError> {
        let medium = self.medium(partition)?;
        medium.write(ctx, &source).await.map(|_| ())
    }

    /// Sends the image of `partition` (`default` when null) into resource `target`.
    #[export]
    async fn dump(
        &self,
        ctx: &CallContext,
        target: ResourceHandle,
        partition: Option<String>,
    ) -> Result<(), DriverError> {
        let medium = self.medium(partition)?;
        if !medium.path().exists() {
            return Err(DriverError::InvalidArgument(format!(
                "partition {:?} was never flashed",
                medium
                    .path()
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            )));
        }
        medium.read(ctx, &target).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_stay_inside_the_directory() {
        for ok in ["default", "boot", "rootfs.a", "..x"] {
            assert!(check_partition(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "../etc", "x\0"] {
            assert!(check_partition(bad).is_err(), "{bad:?}");
        }
        assert!(check_partition(&"x".repeat(256)).is_err());
    }

    #[test]
    fn the_partitions_are_private_and_a_killed_exporters_are_removed_at_start() {
        use std::os::unix::fs::PermissionsExt as _;
        // As a process killed with SIGKILL leaves it: named after a PID that no longer runs.
        let stale = std::env::temp_dir().join(format!(
            "{DIR_KIND}-4294967294-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join(DEFAULT_PARTITION), b"old image").unwrap();
        let flasher = MockFlasher::new().unwrap();
        assert!(!stale.exists(), "{} is still there", stale.display());
        // Its own directory: 0700, named after this process (so a later sweep takes it once
        // this process is gone), removed with the flasher.
        let dir = flasher.partition_path(DEFAULT_PARTITION).unwrap();
        let dir = dir.parent().unwrap().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            jumpstarter_core::leftovers::owner_pid(&name, DIR_KIND),
            Some(std::process::id()),
            "{name}"
        );
        drop(flasher);
        assert!(!dir.exists());
    }
}
