//! What the board and its children share: settings, the private directory, the running
//! QEMU.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

use jumpstarter_core::{DriverError, sync::LockExt};

use super::process::Vm;

/// The kind of the boards' private directories: `jumpstarter-qemu-PID-RANDOM` (0700, in the
/// temporary directory; [`jumpstarter_core::leftovers`]), so the disk images of a killed
/// exporter are removed when the next board starts.
pub const DIR_KIND: &str = "jumpstarter-qemu";

/// Makes a board's private directory (disk images, the cloud-init password, the QMP and VNC
/// sockets): `jumpstarter-qemu-PID-RANDOM`, 0700 whatever the umask, in the temporary
/// directory, after removing those that exporters killed since left there. Removed when
/// dropped.
pub fn private_dir() -> Result<tempfile::TempDir, DriverError> {
    let base = std::env::temp_dir();
    jumpstarter_core::leftovers::private_dir_in(&base, DIR_KIND).map_err(|e| {
        DriverError::because(
            format!("cannot create the board's directory in {}", base.display()),
            e,
        )
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_directory_is_private_and_a_killed_exporters_is_removed_at_start() {
        use std::os::unix::fs::PermissionsExt as _;
        // As a process killed with SIGKILL leaves it: named after a PID that no longer runs,
        // with a half-written disk image.
        let stale = std::env::temp_dir().join(format!(
            "{DIR_KIND}-4294967294-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("root.partial"), b"half an image").unwrap();
        let dir = private_dir().unwrap();
        assert!(!stale.exists(), "{} is still there", stale.display());
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.path().display());
        let name = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            jumpstarter_core::leftovers::owner_pid(&name, DIR_KIND),
            Some(std::process::id()),
            "{name}"
        );
    }
}
