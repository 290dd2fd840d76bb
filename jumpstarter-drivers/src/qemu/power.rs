//! The board's `power` child: starts and stops `qemu-system-<arch>`.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::stream::BoxStream;
use jumpstarter_core::{CallContext, DriverError, driver};

use super::{
    board::{Accel, Shared, check_readable},
    process::{ProcessGroup, Vm},
    qmp::{Qmp, QmpError, pty_of},
    size::parse_size,
};
use crate::power::PowerReading;

/// How long QEMU may take to open its QMP socket.
const QMP_WAIT: Duration = Duration::from_secs(10);
/// How long QEMU has to exit on `SIGTERM` before `SIGKILL`.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// The most of QEMU's own output quoted in an error.
const LOG_TAIL: usize = 2000;

/// `qemu-system-<arch>` on `PATH`; the error names the `arch` field.
pub fn qemu_binary(arch: &str) -> Result<PathBuf, DriverError> {
    let name = format!("qemu-system-{arch}");
    find_on_path(&name).ok_or_else(|| {
        DriverError::failed(format!(
            "arch: {name} is not installed (not found on PATH); install QEMU for {arch} \
             (Debian: apt-get install qemu-system-{}) or set arch",
            debian_package_arch(arch)
        ))
    })
}

fn debian_package_arch(arch: &str) -> &str {
    match arch {
        "x86_64" | "i386" => "x86",
        "aarch64" => "arm",
        other => other,
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| rustix::fs::access(p, rustix::fs::Access::EXEC_OK).is_ok() && p.is_file())
}

/// Whether KVM can run this guest: the exporter's architecture and a `/dev/kvm` we may open.
fn kvm_usable(arch: &str) -> bool {
    arch == std::env::consts::ARCH
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok()
}

/// A path inside a QEMU option value (commas doubled).
fn opt_path(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The board's power switch (`PowerClient`): QEMU on and off.
pub struct QemuPower {
    shared: Arc<Shared>,
}

#[driver(
    client = "jumpstarter_driver_power.client.PowerClient",
    session_end = off_at_session_end
)]
impl QemuPower {
    /// Starts QEMU (no-op with a warning when it runs already).
    #[export]
    async fn on(&self, ctx: &CallContext) -> Result<(), DriverError> {
        let mut vm = self.shared.vm.lock().await;
        if let Some(v) = vm.as_mut() {
            match v.group.try_exited() {
                None => {
                    ctx.log_warning("already powered on, ignoring request");
                    return Ok(());
                }
                Some(status) => {
                    ctx.log_info(format!("QEMU had exited ({status}); starting it again"));
                    *vm = None;
                }
            }
        }
        *vm = Some(self.start(ctx).await?);
        Ok(())
    }

    /// Stops QEMU (no-op with a warning when it is not running).
    #[export]
    async fn off(&self, ctx: &CallContext) -> Result<(), DriverError> {
        if !self.stop().await {
            ctx.log_warning("already powered off, ignoring request");
        } else {
            ctx.log_info("powered off");
        }
        Ok(())
    }

    /// Power readings: not available from QEMU (UNIMPLEMENTED, as upstream).
    #[export(streaming)]
    async fn read(
        &self,
    ) -> Result<BoxStream<'static, Result<PowerReading, DriverError>>, DriverError> {
        Err(DriverError::Unimplemented(
            "read: QEMU boards have no power readings".into(),
        ))
    }
}

impl QemuPower {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    async fn off_at_session_end(&self) {
        self.stop().await;
    }

    /// Stops QEMU; whether it was running.
    async fn stop(&self) -> bool {
        let vm = self.shared.vm.lock().await.take();
        let _ = std::fs::remove_file(self.shared.pty_path());
        match vm {
            Some(v) => {
                v.group.stop(STOP_GRACE).await;
                true
            }
            None => false,
        }
    }

    async fn start(&self, ctx: &CallContext) -> Result<Vm, DriverError> {
        let sh = &self.shared;
        let s = &sh.settings;
        let binary = qemu_binary(&s.arch)?;
        let root = sh.partition_path(Some("root"), true)?;
        let bios = sh.partition_path(Some("bios"), true)?;
        let ovmf_code = sh.partition_path(Some("OVMF_CODE.fd"), true)?;
        let ovmf_vars = sh.partition_path(Some("OVMF_VARS.fd"), true)?;

        let kvm = match s.accel {
            Accel::Auto => kvm_usable(&s.arch),
            Accel::Kvm => true,
            Accel::Tcg => false,
        };
        // `-S`: the guest starts paused and runs on `cont` once the console's pty is known,
        // so the console sees the boot from its first byte. (Upstream lets it run and sends
        // `system_reset` instead; a reset that lands while SeaBIOS is still shadowing itself
        // leaves the CPU executing zeroed memory for good, which a loaded machine hit.)
        let mut args: Vec<String> = vec!["-S".into(), "-nodefaults".into(), "-nographic".into()];
        let mut cpu = s.cpu.clone();
        if kvm {
            args.extend(["-accel".into(), "kvm".into()]);
            cpu.get_or_insert_with(|| "host".into());
        } else {
            args.extend(["-accel".into(), "tcg".into()]);
        }
        match s.arch.as_str() {
            "aarch64" => args.extend(["-machine".into(), "virt".into()]),
            "x86_64" => args.extend(["-machine".into(), "q35".into()]),
            _ => {}
        }
        let cpu = cpu.or_else(|| match s.arch.as_str() {
            "aarch64" => Some("cortex-a57".into()),
            "x86_64" => Some("qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt".into()),
            _ => None,
        });
        if let Some(cpu) = cpu {
            args.extend(["-cpu".into(), cpu]);
        }
        let qmp_path = sh.qmp_path();
        let _ = std::fs::remove_file(&qmp_path);
        let mut netdev = "user,id=eth0".to_string();
        for h in s.hostfwd.values() {
            netdev.push_str(&format!(
                ",hostfwd=tcp:{}:{}-:{}",
                h.hostaddr, h.hostport, h.guestport
            ));
        }
        args.extend([
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", opt_path(&qmp_path)),
            "-smp".into(),
            s.smp.to_string(),
            "-m".into(),
            sh.mem(),
            "-vnc".into(),
            format!("unix:{}", opt_path(&sh.vnc_path())),
            "-vga".into(),
            "none".into(),
            "-serial".into(),
            "pty".into(),
            "-netdev".into(),
            netdev,
            "-device".into(),
            "virtio-net-pci,netdev=eth0".into(),
            "-device".into(),
            "virtio-gpu-pci".into(),
        ]);
        if bios.exists() {
            readable("bios", &bios)?;
            args.extend(["-bios".into(), bios.display().to_string()]);
        }
        if ovmf_code.exists() && ovmf_vars.exists() {
            readable("OVMF_CODE.fd", &ovmf_code)?;
            readable("OVMF_VARS.fd", &ovmf_vars)?;
            args.extend([
                "-drive".into(),
                format!(
                    "file={},if=pflash,format=raw,unit=0,readonly=on",
                    opt_path(&ovmf_code)
                ),
                "-drive".into(),
                format!(
                    "file={},if=pflash,format=raw,unit=1,snapshot=on,readonly=off",
                    opt_path(&ovmf_vars)
                ),
            ]);
        }
        if root.exists() {
            readable("root", &root)?;
            let (format, virtual_size) = image_info(ctx, &root).await?;
            if let Some(wanted) = sh.disk_size() {
                grow_disk(ctx, &root, &wanted, virtual_size).await?;
            }
            args.extend([
                "-blockdev".into(),
                format!(
                    "driver={format},node-name=rootfs,file.driver=file,file.filename={}",
                    opt_path(&root)
                ),
                "-device".into(),
                "virtio-blk-pci,drive=rootfs,bootindex=1".into(),
            ]);
        } else if let Some(d) = s.default_partitions.get("root") {
            return Err(DriverError::failed(format!(
                "default_partitions.root: {} does not exist",
                d.display()
            )));
        }
        let cidata = self.cidata()?;
        args.extend([
            "-blockdev".into(),
            format!(
                "driver=vvfat,node-name=cidata,read-only=on,dir={},label=CIDATA",
                opt_path(cidata.path())
            ),
            "-device".into(),
            "virtio-blk-pci,drive=cidata".into(),
        ]);

        let log_path = sh.dir.path().join("qemu.log");
        let log = std::fs::File::create(&log_path).map_err(|e| {
            DriverError::because(format!("cannot create {}", log_path.display()), e)
        })?;
        let log2 = log
            .try_clone()
            .map_err(|e| DriverError::because(format!("cannot share {}", log_path.display()), e))?;
        ctx.log_info(format!(
            "starting {} with {}",
            binary.display(),
            if kvm {
                "KVM acceleration"
            } else if s.accel == Accel::Tcg {
                "TCG emulation (accel: tcg)"
            } else {
                "TCG emulation (KVM not usable: /dev/kvm cannot be opened or arch is not the exporter's)"
            }
        ));
        tracing::info!(
            "QEMU board: {} {} ({})",
            binary.display(),
            args.join(" "),
            if kvm { "KVM" } else { "TCG" }
        );
        let mut cmd = tokio::process::Command::new(&binary);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        let mut group = ProcessGroup::spawn(&mut cmd).map_err(|e| {
            DriverError::because(format!("arch: cannot start {}", binary.display()), e)
        })?;

        let deadline = Instant::now() + QMP_WAIT;
        let mut qmp = loop {
            if let Some(status) = group.try_exited() {
                return Err(DriverError::failed(format!(
                    "{} exited at start ({status}): {}",
                    binary.display(),
                    log_tail(&log_path)
                )));
            }
            match Qmp::connect(&qmp_path).await {
                Ok(q) => break q,
                Err(e) if Instant::now() > deadline => {
                    group.stop(STOP_GRACE).await;
                    return Err(DriverError::failed(format!(
                        "QEMU did not answer on its QMP socket within {QMP_WAIT:?} ({e}): {}",
                        log_tail(&log_path),
                        e = jumpstarter_core::error_chain(&e)
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let pty = async {
            let chardevs = qmp.execute("query-chardev", None).await?;
            let pty = pty_of(&chardevs, "serial0");
            qmp.execute("cont", None).await?;
            Ok::<_, QmpError>(pty)
        }
        .await;
        let pty = match pty {
            Ok(Some(p)) => p,
            Ok(None) => {
                group.stop(STOP_GRACE).await;
                return Err(DriverError::failed(
                    "QEMU reported no pty for serial0 (query-chardev)",
                ));
            }
            Err(e) => {
                group.stop(STOP_GRACE).await;
                return Err(DriverError::other(e));
            }
        };
        let link = sh.pty_path();
        let _ = std::fs::remove_file(&link);
        if let Err(e) = std::os::unix::fs::symlink(&pty, &link) {
            group.stop(STOP_GRACE).await;
            return Err(DriverError::because(
                format!("cannot link the console {} to {pty}", link.display()),
                e,
            ));
        }
        ctx.log_info(format!(
            "powered on (pid {}), console on {pty}",
            group.pid().unwrap_or_default()
        ));
        Ok(Vm {
            group,
            _cidata: cidata,
        })
    }

    /// The cloud-init `CIDATA` directory: the host name and the user (JSON is YAML), with
    /// the user's password: 0700 whatever the umask, inside the board's private directory.
    fn cidata(&self) -> Result<tempfile::TempDir, DriverError> {
        use std::os::unix::fs::PermissionsExt as _;
        let s = &self.shared.settings;
        let dir = tempfile::Builder::new()
            .prefix("cidata-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(self.shared.dir.path())
            .map_err(|e| DriverError::because("cannot create the CIDATA directory", e))?;
        let meta = serde_json::json!({
            "instance-id": s.instance_id.to_string(),
            "local-hostname": s.hostname,
        });
        let user = serde_json::json!({
            "ssh_pwauth": true,
            "users": [{
                "name": s.username,
                "plain_text_passwd": s.password,
                "lock_passwd": false,
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
            }],
        });
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text)
                .map_err(|e| DriverError::because(format!("cannot write CIDATA {name}"), e))
        };
        write("meta-data", format!("{meta}\n"))?;
        write("user-data", format!("#cloud-config\n{user}\n"))?;
        Ok(dir)
    }
}

/// Fails naming the partition when its image cannot be read.
fn readable(partition: &str, path: &Path) -> Result<(), DriverError> {
    check_readable(path).map_err(|e| {
        DriverError::because(
            format!(
                "default_partitions.{partition}: {} cannot be read",
                path.display()
            ),
            e,
        )
    })
}

/// The image's format (for `-blockdev driver=`) and virtual size, from `qemu-img info`
/// (raw and the file's size when `qemu-img` is missing or fails, as upstream).
async fn image_info(ctx: &CallContext, root: &Path) -> Result<(String, u64), DriverError> {
    let file_size = std::fs::metadata(root).map(|m| m.len()).unwrap_or(0);
    let out = tokio::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(root)
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    let info = match out {
        Ok(o) if o.status.success() => serde_json::from_slice::<serde_json::Value>(&o.stdout).ok(),
        _ => None,
    };
    let Some(info) = info else {
        ctx.log_warning("unable to detect image format, assuming raw");
        return Ok(("raw".into(), file_size));
    };
    let format = info
        .get("format")
        .and_then(|f| f.as_str())
        .unwrap_or("raw")
        .to_string();
    let size = info
        .get("virtual-size")
        .and_then(|s| s.as_u64())
        .unwrap_or(file_size);
    match format.as_str() {
        "raw" | "qcow2" | "qcow" | "vmdk" => Ok((format, size)),
        other => Err(DriverError::failed(format!(
            "unsupported image format: {other}"
        ))),
    }
}

/// Grows the disk to `wanted` (never shrinks it), as upstream before boot.
async fn grow_disk(
    ctx: &CallContext,
    root: &Path,
    wanted: &str,
    current: u64,
) -> Result<(), DriverError> {
    let requested = parse_size(wanted).map_err(|e| DriverError::invalid_because("disk_size", e))?;
    if requested < current {
        return Err(DriverError::failed(format!(
            "disk_size: shrinking the disk is not supported: current {current} bytes, requested {wanted}"
        )));
    }
    if requested == current {
        return Ok(());
    }
    let parent = root.parent().unwrap_or(Path::new("/"));
    if let Ok(st) = rustix::fs::statvfs(parent) {
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if requested > free {
            return Err(DriverError::failed(format!(
                "disk_size: not enough disk space: need {requested} bytes, only {free} available"
            )));
        }
    }
    ctx.log_info(format!("Resizing disk to {wanted}"));
    let out = tokio::process::Command::new("qemu-img")
        .arg("resize")
        .arg(root)
        .arg(requested.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| DriverError::because("disk_size: cannot run qemu-img", e))?;
    if !out.status.success() {
        return Err(DriverError::failed(format!(
            "disk_size: failed to resize disk: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The end of QEMU's log, for an error.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL);
    let tail = String::from_utf8_lossy(&text[start..]).trim().to_string();
    if tail.is_empty() {
        "(QEMU printed nothing)".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_qemu_names_the_arch_field() {
        let e = qemu_binary("no-such-arch").unwrap_err().to_string();
        assert!(
            e.starts_with("arch: qemu-system-no-such-arch is not installed"),
            "{e}"
        );
    }

    #[test]
    fn the_cloud_init_directory_holding_the_password_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let shared = Shared {
            settings: super::super::board::Settings {
                arch: std::env::consts::ARCH.into(),
                cpu: None,
                smp: 1,
                hostname: "demo".into(),
                username: "jumpstarter".into(),
                password: "secret".into(),
                default_partitions: Default::default(),
                hostfwd: Default::default(),
                flash_timeout: Duration::from_secs(1),
                accel: Accel::Tcg,
                instance_id: uuid::Uuid::new_v4(),
            },
            dir: super::super::board::private_dir().unwrap(),
            mem: "512M".to_string().into(),
            disk_size: None.into(),
            vm: None.into(),
        };
        let power = QemuPower::new(Arc::new(shared));
        let cidata = power.cidata().unwrap();
        let mode = std::fs::metadata(cidata.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{}", cidata.path().display());
        let user = std::fs::read_to_string(cidata.path().join("user-data")).unwrap();
        assert!(user.contains("secret"), "{user}");
    }

    #[test]
    fn commas_in_paths_are_escaped() {
        assert_eq!(opt_path(Path::new("/a,b/c")), "/a,,b/c");
    }
}
