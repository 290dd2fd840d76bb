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

    /// A flasher with no partition written yet.
    pub fn new() -> Result<Self, DriverError> {
        let dir = tempfile::Builder::new()
            .prefix("jmp-mock-flasher-")
            .tempdir()
            .map_err(|e| DriverError::because("cannot create the mock flasher's directory", e))?;
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
}
