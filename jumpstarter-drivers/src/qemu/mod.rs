//! A virtual board: upstream's `jumpstarter_driver_qemu.driver.Qemu`.
//!
//! The driver (client class `jumpstarter_driver_qemu.client.QemuClient`) runs
//! `qemu-system-<arch>` and has upstream's children:
//!
//! - `power` (`PowerClient`): `on` starts QEMU (controlled through QMP on a Unix socket in
//!   the driver's private directory), `off` stops it; `read` is UNIMPLEMENTED as upstream;
//! - `flasher` (`jumpstarter_driver_qemu.client.QemuFlasherClient`): `flash(source,
//!   partition)` writes an image (gzip/xz/bzip2/zstd recognised by their magic bytes and
//!   expanded) to partition `root` (the disk, the default), `bios`, `OVMF_CODE.fd` or
//!   `OVMF_VARS.fd`; `dump(target, partition)` sends one back. Flashing is refused while
//!   the board runs;
//! - `console` (`PySerial`): the guest's first serial port (a pty QEMU opens, found with
//!   QMP `query-chardev`);
//! - `vnc` (`UnixNetwork`): QEMU's VNC server;
//! - one `TcpNetwork` per `hostfwd` entry: a host port QEMU forwards to a guest port, so
//!   `j NAME forward-tcp` reaches a service in the guest.
//!
//! Config fields as upstream: `arch` (default: the exporter's), `cpu`, `smp` (2), `mem`
//! (`512M`), `disk_size` (grow the disk to this before boot), `hostname`, `username`,
//! `password` (given to the guest through a cloud-init `CIDATA` disk, and returned by
//! `get_hostname`/`get_username`/`get_password`), `default_partitions` (images used for a
//! partition never flashed), `hostfwd` (`NAME: {hostport, guestport, hostaddr, protocol}`),
//! `flash_timeout` (seconds a flash may take). Our addition: `accel` (`auto`, the default:
//! KVM when `/dev/kvm` is usable and `arch` is the exporter's, TCG otherwise; `kvm`; `tcg`).
//! Upstream's OCI flashing (`fls_*` fields, `flash_oci`) is not supported: those fields are
//! refused at start, `oci://` sources with UNIMPLEMENTED. The vsock `ssh` child is not
//! provided.
//!
//! Every config value that reaches QEMU's or `qemu-img`'s command line is checked at start
//! and refused naming its field, so that none can add options of its own (QEMU splits
//! option values at `,` and reads `key=value` in them): `hostfwd.NAME.hostaddr` is an IPv4
//! address, `cpu` a CPU model with its features (letters, digits and `_-.+=,`, not
//! starting with `-` or `,`), `arch` a target name, a `default_partitions` path UTF-8 and not
//! starting with `-` (sizes and ports are numbers already).
//!
//! Problems only a boot can see (no `qemu-system-<arch>`, an unreadable image) are logged at
//! start and fail `power on` with an error naming the field; the exporter and its other
//! drivers keep working.
//!
//! Every QEMU runs in a process group of its own, killed with the board's `off`, at the end
//! of the session, when the driver is dropped, and, through a watcher process, when the
//! exporter is killed (a watcher process, as the exporter's hooks have).

mod board;
mod client;
mod flasher;
mod power;
mod process;
pub mod qmp;
mod size;

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use jumpstarter_core::{Driver, DriverError, driver, driver::DriverArgs, sync::LockExt};
use serde::Deserialize;

pub use board::{Accel, Hostfwd, PARTITIONS};
pub use client::{QemuClient, QemuFlasherClient, cli, flasher_cli};
pub use flasher::QemuFlasher;
pub use power::QemuPower;
pub use size::parse_size;

use board::{Settings, Shared, check_readable};

use crate::{
    network::{TcpNetwork, UnixNetwork},
    serial::{PySerial, SerialUrl},
};

/// Upstream client class of the QEMU board.
pub const QEMU_CLIENT: &str = "jumpstarter_driver_qemu.client.QemuClient";
/// Upstream client class of the QEMU board's flasher.
pub const QEMU_FLASHER_CLIENT: &str = "jumpstarter_driver_qemu.client.QemuFlasherClient";

/// Names of the built-in children (a `hostfwd` entry may not take one).
const BUILT_IN_CHILDREN: [&str; 5] = ["power", "flasher", "console", "vnc", "ssh"];

fn default_smp() -> u32 {
    2
}
fn default_mem() -> String {
    "512M".into()
}
fn default_hostname() -> String {
    "demo".into()
}
fn default_username() -> String {
    "jumpstarter".into()
}
fn default_password() -> String {
    "password".into()
}
fn default_flash_timeout() -> u64 {
    30 * 60
}
fn default_hostaddr() -> String {
    "127.0.0.1".into()
}
fn default_protocol() -> String {
    "tcp".into()
}

/// Upstream's config fields (and `accel`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    arch: Option<String>,
    #[serde(default)]
    cpu: Option<String>,
    #[serde(default = "default_smp")]
    smp: u32,
    #[serde(default = "default_mem")]
    mem: String,
    #[serde(default)]
    disk_size: Option<String>,
    #[serde(default = "default_hostname")]
    hostname: String,
    #[serde(default = "default_username")]
    username: String,
    #[serde(default = "default_password")]
    password: String,
    #[serde(default)]
    default_partitions: BTreeMap<String, PathBuf>,
    #[serde(default)]
    hostfwd: BTreeMap<String, HostfwdConfig>,
    #[serde(default)]
    fls_version: Option<String>,
    #[serde(default)]
    fls_allow_custom_binaries: bool,
    #[serde(default)]
    fls_custom_binary_url: Option<String>,
    #[serde(default = "default_flash_timeout")]
    flash_timeout: u64,
    #[serde(default)]
    accel: Option<String>,
}

/// One `hostfwd` entry, as upstream's `Hostfwd` model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostfwdConfig {
    #[serde(default = "default_protocol")]
    protocol: String,
    #[serde(default = "default_hostaddr")]
    hostaddr: String,
    hostport: u32,
    guestport: u32,
}

/// The QEMU board (`jumpstarter_driver_qemu.driver.Qemu`).
pub struct Qemu {
    shared: Arc<Shared>,
    children: Vec<(String, Arc<dyn Driver>)>,
}

#[driver(client = "jumpstarter_driver_qemu.client.QemuClient", children = built_in)]
impl Qemu {
    /// The guest's host name.
    #[export]
    async fn get_hostname(&self) -> Result<String, DriverError> {
        Ok(self.shared.settings.hostname.clone())
    }

    /// The guest user's name.
    #[export]
    async fn get_username(&self) -> Result<String, DriverError> {
        Ok(self.shared.settings.username.clone())
    }

    /// The guest user's password.
    #[export]
    async fn get_password(&self) -> Result<String, DriverError> {
        Ok(self.shared.settings.password.clone())
    }

    /// Grows the disk to `size` (e.g. `20G`) at the next power on.
    #[export]
    async fn set_disk_size(&self, size: String) -> Result<(), DriverError> {
        parse_size(&size).map_err(DriverError::invalid)?;
        *self.shared.disk_size.lock_or_recover() = Some(size);
        Ok(())
    }

    /// Sets the memory of the next boot (e.g. `2G`).
    #[export]
    async fn set_memory_size(&self, size: String) -> Result<(), DriverError> {
        parse_size(&size).map_err(DriverError::invalid)?;
        *self.shared.mem.lock_or_recover() = size;
        Ok(())
    }
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> DriverError {
    DriverError::InvalidArgument(format!("{field}: {msg}"))
}

/// Checks `cpu`, passed as `-cpu CPU`: a model and `,`-separated features (`+sse4.2`,
/// `-vmx`, `pmu=off`), nothing that QEMU would read as another option.
fn check_cpu(cpu: &str) -> Result<(), DriverError> {
    let bad = |why: &str| {
        invalid(
            "cpu",
            format!("{cpu:?} {why} (expected a CPU model and features, e.g. host,+ssse3,pmu=off)"),
        )
    };
    if let Some(c) = cpu
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '+' | '=' | ',')))
    {
        return Err(bad(&format!("holds {c:?}")));
    }
    if cpu.starts_with('-') {
        return Err(bad("starts with -"));
    }
    if cpu.split(',').any(str::is_empty) {
        return Err(bad("has an empty model or feature"));
    }
    Ok(())
}

/// Checks a `default_partitions` path, passed to QEMU (`-bios PATH`, `file=PATH`) and to
/// `qemu-img` as a separate argument: text, and not something `qemu-img` reads as an
/// option.
fn check_partition_path(field: &str, path: &Path) -> Result<(), DriverError> {
    let Some(text) = path.to_str() else {
        return Err(invalid(field, "the path is not UTF-8"));
    };
    if text.is_empty() {
        return Err(invalid(field, "empty path"));
    }
    if text.starts_with('-') {
        return Err(invalid(
            field,
            format!("{text:?} starts with - (write ./{text} for a relative path)"),
        ));
    }
    Ok(())
}

impl Qemu {
    fn built_in(&self) -> Vec<(String, Arc<dyn Driver>)> {
        self.children.clone()
    }

    /// Constructor for the registry: upstream's fields (see the module docs).
    pub fn from_args(args: &DriverArgs) -> Result<Arc<dyn Driver>, DriverError> {
        let c: Config = args.parse()?;
        Ok(Arc::new(Self::new(c)?))
    }

    fn new(c: Config) -> Result<Self, DriverError> {
        if c.fls_version.is_some() {
            return Err(invalid(
                "fls_version",
                "OCI flashing with fls is not supported by this exporter",
            ));
        }
        if c.fls_allow_custom_binaries {
            return Err(invalid(
                "fls_allow_custom_binaries",
                "OCI flashing with fls is not supported by this exporter",
            ));
        }
        if c.fls_custom_binary_url.is_some() {
            return Err(invalid(
                "fls_custom_binary_url",
                "OCI flashing with fls is not supported by this exporter",
            ));
        }
        let arch = c.arch.unwrap_or_else(|| std::env::consts::ARCH.to_string());
        if arch.is_empty()
            || !arch
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            return Err(invalid(
                "arch",
                format!("{arch:?} is not a QEMU target name (e.g. x86_64, aarch64)"),
            ));
        }
        if c.smp == 0 {
            return Err(invalid("smp", "must be at least 1"));
        }
        parse_size(&c.mem).map_err(|e| invalid("mem", e))?;
        if let Some(d) = &c.disk_size {
            parse_size(d).map_err(|e| invalid("disk_size", e))?;
        }
        if c.flash_timeout == 0 {
            return Err(invalid("flash_timeout", "must be at least 1 second"));
        }
        for (name, path) in &c.default_partitions {
            if !PARTITIONS.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("default_partitions.{name}"),
                    format!(
                        "unknown partition (expected one of {})",
                        PARTITIONS.join(", ")
                    ),
                ));
            }
            check_partition_path(&format!("default_partitions.{name}"), path)?;
        }
        if let Some(cpu) = &c.cpu {
            check_cpu(cpu)?;
        }
        let accel = match c.accel.as_deref() {
            None | Some("auto") => Accel::Auto,
            Some("kvm") => Accel::Kvm,
            Some("tcg") => Accel::Tcg,
            Some(other) => {
                return Err(invalid(
                    "accel",
                    format!("{other:?} is not one of auto, kvm, tcg"),
                ));
            }
        };
        let mut hostfwd = BTreeMap::new();
        for (name, h) in c.hostfwd {
            let field = format!("hostfwd.{name}");
            if BUILT_IN_CHILDREN.contains(&name.as_str()) {
                return Err(invalid(&field, "the name of a built-in child of the board"));
            }
            if h.protocol != "tcp" {
                return Err(invalid(
                    &format!("{field}.protocol"),
                    format!("{:?} is not supported (only tcp)", h.protocol),
                ));
            }
            let port = |v: u32, f: &str| {
                u16::try_from(v)
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| invalid(&format!("{field}.{f}"), "must be from 1 to 65535"))
            };
            // Pasted into `-netdev user,...,hostfwd=tcp:HOSTADDR:...`: an address and nothing
            // else (a `,` would add options of QEMU's own).
            if h.hostaddr.parse::<Ipv4Addr>().is_err() {
                return Err(invalid(
                    &format!("{field}.hostaddr"),
                    format!(
                        "{:?} is not an IPv4 address (e.g. 127.0.0.1; QEMU's user network \
                         takes no host name here)",
                        h.hostaddr
                    ),
                ));
            }
            hostfwd.insert(
                name,
                Hostfwd {
                    hostport: port(h.hostport, "hostport")?,
                    guestport: port(h.guestport, "guestport")?,
                    hostaddr: h.hostaddr,
                },
            );
        }
        let dir = board::private_dir()?;
        let settings = Settings {
            arch,
            cpu: c.cpu,
            smp: c.smp,
            hostname: c.hostname,
            username: c.username,
            password: c.password,
            default_partitions: c.default_partitions,
            hostfwd,
            flash_timeout: std::time::Duration::from_secs(c.flash_timeout),
            accel,
            instance_id: uuid::Uuid::new_v4(),
        };
        warn_about_boot_problems(&settings);
        let shared = Arc::new(Shared {
            settings,
            dir,
            mem: Mutex::new(c.mem),
            disk_size: Mutex::new(c.disk_size),
            vm: tokio::sync::Mutex::new(None),
        });
        let mut children: Vec<(String, Arc<dyn Driver>)> = vec![
            ("power".into(), Arc::new(QemuPower::new(shared.clone()))),
            ("flasher".into(), Arc::new(QemuFlasher::new(shared.clone()))),
            (
                "console".into(),
                Arc::new(PySerial::new(SerialUrl::Device(shared.pty_path()))),
            ),
            ("vnc".into(), Arc::new(UnixNetwork::new(shared.vnc_path()))),
        ];
        for (name, h) in &shared.settings.hostfwd {
            children.push((
                name.clone(),
                Arc::new(TcpNetwork::new(h.hostaddr.clone(), h.hostport, true)),
            ));
        }
        Ok(Self { shared, children })
    }
}

/// Logs what would make `power on` fail, so it shows at start.
fn warn_about_boot_problems(s: &Settings) {
    if let Err(e) = power::qemu_binary(&s.arch) {
        tracing::warn!("QEMU board: {e}", e = jumpstarter_core::error_chain(&e));
    }
    for (name, path) in &s.default_partitions {
        if let Err(e) = check_readable(path) {
            tracing::warn!(
                "QEMU board: default_partitions.{name}: {} cannot be read ({e}); power on will fail until the partition is flashed",
                path.display(),
                e = jumpstarter_core::error_chain(&e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(yaml: serde_json::Value) -> Result<Qemu, DriverError> {
        let args = DriverArgs { config: yaml };
        Qemu::new(args.parse()?)
    }

    #[test]
    fn the_board_directory_is_private_and_named_for_the_sweep() {
        use std::os::unix::fs::PermissionsExt as _;
        let q = build(serde_json::Value::Null).unwrap();
        let dir = q.shared.dir.path();
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            jumpstarter_core::leftovers::owner_pid(&name, board::DIR_KIND),
            Some(std::process::id())
        );
    }

    #[test]
    fn defaults_are_upstreams_and_children_are_named_as_upstream() {
        let q = build(serde_json::json!({
            "hostfwd": {"http": {"hostport": 8080, "guestport": 80}}
        }))
        .unwrap();
        let s = &q.shared.settings;
        assert_eq!(s.arch, std::env::consts::ARCH);
        assert_eq!((s.smp, s.hostname.as_str()), (2, "demo"));
        assert_eq!(
            (s.username.as_str(), s.password.as_str()),
            ("jumpstarter", "password")
        );
        assert_eq!(q.shared.mem(), "512M");
        assert_eq!(s.accel, Accel::Auto);
        let names: Vec<_> = q.children.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["power", "flasher", "console", "vnc", "http"]);
        let classes: Vec<_> = q.children.iter().map(|(_, d)| d.client_class()).collect();
        assert_eq!(classes[0], crate::power::POWER_CLIENT);
        assert_eq!(classes[1], QEMU_FLASHER_CLIENT);
        assert_eq!(classes[2], crate::serial::PYSERIAL_CLIENT);
        assert_eq!(classes[4], crate::network::NETWORK_CLIENT);
        assert_eq!(q.client_class(), QEMU_CLIENT);
    }

    #[test]
    fn bad_fields_are_refused_by_name() {
        for (cfg, field) in [
            (serde_json::json!({"arch": "../x"}), "arch"),
            (serde_json::json!({"mem": "lots"}), "mem"),
            (serde_json::json!({"disk_size": "1Q"}), "disk_size"),
            (serde_json::json!({"smp": 0}), "smp"),
            (serde_json::json!({"accel": "hvf"}), "accel"),
            (serde_json::json!({"fls_version": "1"}), "fls_version"),
            (
                serde_json::json!({"default_partitions": {"boot": "/x"}}),
                "default_partitions.boot",
            ),
            (
                serde_json::json!({"hostfwd": {"ssh": {"hostport": 1, "guestport": 22}}}),
                "hostfwd.ssh",
            ),
            (
                serde_json::json!({"hostfwd": {"a": {"hostport": 70000, "guestport": 22}}}),
                "hostfwd.a.hostport",
            ),
            (
                serde_json::json!({"hostfwd": {"a": {"hostport": 2, "guestport": 0}}}),
                "hostfwd.a.guestport",
            ),
            (
                serde_json::json!({"hostfwd": {"a": {"protocol": "udp", "hostport": 2, "guestport": 3}}}),
                "hostfwd.a.protocol",
            ),
        ] {
            let e = build(cfg.clone())
                .err()
                .unwrap_or_else(|| panic!("{cfg} accepted"));
            assert!(
                e.to_string().starts_with(&format!("{field}:")),
                "{cfg}: {e}"
            );
        }
        let e = build(serde_json::json!({"memory": "1G"})).err().unwrap();
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn values_that_would_add_qemu_options_are_refused_by_name() {
        let fwd = |hostaddr: &str| {
            serde_json::json!({"hostfwd": {"http": {"hostaddr": hostaddr, "hostport": 8080,
                                                    "guestport": 80}}})
        };
        let part = |path: &str| serde_json::json!({"default_partitions": {"root": path}});
        for (cfg, field) in [
            (
                fwd("127.0.0.1,guestfwd=tcp:10.0.2.100:1-cmd:touch /tmp/x"),
                "hostfwd.http.hostaddr",
            ),
            (
                fwd("127.0.0.1:22-:22,hostfwd=tcp:0.0.0.0"),
                "hostfwd.http.hostaddr",
            ),
            (fwd("-x"), "hostfwd.http.hostaddr"),
            (fwd("localhost"), "hostfwd.http.hostaddr"),
            (fwd(""), "hostfwd.http.hostaddr"),
            (fwd("::1"), "hostfwd.http.hostaddr"),
            (serde_json::json!({"cpu": "host -device x"}), "cpu"),
            (serde_json::json!({"cpu": "-help"}), "cpu"),
            (serde_json::json!({"cpu": ",x"}), "cpu"),
            (serde_json::json!({"cpu": "host,,x=1"}), "cpu"),
            (serde_json::json!({"cpu": "host\n-S"}), "cpu"),
            (serde_json::json!({"cpu": ""}), "cpu"),
            (serde_json::json!({"arch": "x86_64,help"}), "arch"),
            (serde_json::json!({"arch": "x86_64 -S"}), "arch"),
            (part("--help"), "default_partitions.root"),
            (part(""), "default_partitions.root"),
        ] {
            let e = build(cfg.clone())
                .err()
                .unwrap_or_else(|| panic!("{cfg} accepted"));
            assert!(
                e.to_string().starts_with(&format!("{field}:")),
                "{cfg}: {e}"
            );
        }
        // What real configs hold is still accepted.
        for cfg in [
            fwd("127.0.0.1"),
            fwd("0.0.0.0"),
            serde_json::json!({"cpu": "host"}),
            serde_json::json!({"cpu": "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"}),
            serde_json::json!({"cpu": "host,-vmx,pmu=off,hv-spinlocks=0x1fff"}),
            serde_json::json!({"cpu": "cortex-a57"}),
            serde_json::json!({"arch": "aarch64"}),
            part("/images/board,v2.img"),
            part("images/-board.img"),
            part("./-board.img"),
        ] {
            build(cfg.clone()).unwrap_or_else(|e| panic!("{cfg}: {e}"));
        }
    }

    #[test]
    fn partitions_fall_back_to_defaults_only_when_never_flashed() {
        let q =
            build(serde_json::json!({"default_partitions": {"root": "/images/root.img"}})).unwrap();
        let s = &q.shared;
        assert_eq!(
            s.partition_path(None, true).unwrap(),
            PathBuf::from("/images/root.img")
        );
        assert_eq!(
            s.partition_path(None, false).unwrap(),
            s.dir.path().join("root")
        );
        std::fs::write(s.dir.path().join("root"), b"x").unwrap();
        assert_eq!(
            s.partition_path(Some("root"), true).unwrap(),
            s.dir.path().join("root")
        );
        assert!(s.partition_path(Some("boot"), true).is_err());
    }

    #[tokio::test]
    async fn sizes_are_validated_before_they_are_kept() {
        let q = build(serde_json::Value::Null).unwrap();
        assert!(q.set_memory_size("a lot".into()).await.is_err());
        assert_eq!(q.shared.mem(), "512M");
        q.set_memory_size("2G".into()).await.unwrap();
        assert_eq!(q.shared.mem(), "2G");
        assert!(q.set_disk_size("-1G".into()).await.is_err());
        assert_eq!(q.shared.disk_size(), None);
        q.set_disk_size("20G".into()).await.unwrap();
        assert_eq!(q.shared.disk_size().as_deref(), Some("20G"));
    }
}
