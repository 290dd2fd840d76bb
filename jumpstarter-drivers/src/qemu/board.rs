//! What the board and its children share: settings, the private directory, the running
//! QEMU.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

use jumpstarter_core::{DriverError, sync::LockExt};

use super::process::Vm;

/// The partitions a board has (upstream's names).
pub const PARTITIONS: [&str; 4] = ["root", "bios", "OVMF_CODE.fd", "OVMF_VARS.fd"];

/// A validated host port forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostfwd {
    /// The host address QEMU listens on.
    pub hostaddr: String,
    /// The host port.
    pub hostport: u16,
    /// The guest port it reaches.
    pub guestport: u16,
}

/// How QEMU executes the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// KVM when usable, TCG otherwise.
    Auto,
    /// Always KVM.
    Kvm,
    /// Always TCG (emulation).
    Tcg,
}

/// The board's settings (fixed at start, except memory and disk size).
#[derive(Debug)]
pub struct Settings {
    pub arch: String,
    pub cpu: Option<String>,
    pub smp: u32,
    pub hostname: String,
    pub username: String,
    pub password: String,
    pub default_partitions: BTreeMap<String, PathBuf>,
    pub hostfwd: BTreeMap<String, Hostfwd>,
    pub flash_timeout: std::time::Duration,
    pub accel: Accel,
    /// The instance id given to cloud-init.
    pub instance_id: uuid::Uuid,
}

/// What the board and its children share.
pub struct Shared {
    pub settings: Settings,
    /// The driver's private directory: disk images, QMP and VNC sockets, the console link.
    pub dir: tempfile::TempDir,
    /// `-m` of the next boot.
    pub mem: Mutex<String>,
    /// Grow the disk to this before the next boot.
    pub disk_size: Mutex<Option<String>>,
    /// The running QEMU, if any.
    pub vm: tokio::sync::Mutex<Option<Vm>>,
}

impl Shared {
    pub fn qmp_path(&self) -> PathBuf {
        self.dir.path().join("qmp")
    }
    pub fn vnc_path(&self) -> PathBuf {
        self.dir.path().join("vnc")
    }
    pub fn pty_path(&self) -> PathBuf {
        self.dir.path().join("pty")
    }

    /// The file of `partition` (`None`: root); with `use_default`, a configured default
    /// image stands in for a partition never flashed. Errors name the partition.
    pub fn partition_path(
        &self,
        partition: Option<&str>,
        use_default: bool,
    ) -> Result<PathBuf, DriverError> {
        let name = partition.unwrap_or("root");
        if !PARTITIONS.contains(&name) {
            return Err(DriverError::InvalidArgument(format!(
                "invalid partition name: {name} (expected one of {})",
                PARTITIONS.join(", ")
            )));
        }
        let path = self.dir.path().join(name);
        if use_default
            && !path.exists()
            && let Some(d) = self.settings.default_partitions.get(name)
        {
            return Ok(d.clone());
        }
        Ok(path)
    }

    pub fn mem(&self) -> String {
        self.mem.lock_or_recover().clone()
    }

    pub fn disk_size(&self) -> Option<String> {
        self.disk_size.lock_or_recover().clone()
    }
}

/// Whether a file can be opened for reading.
pub fn check_readable(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    if f.metadata()?.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    Ok(())
}
