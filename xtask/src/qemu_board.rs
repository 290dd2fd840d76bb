//! The QEMU test board: Debian's kernel and busybox on a small bootable disk image, for the
//! end-to-end board test (`jumpstarter-cli`'s `qemu::` tests).
//!
//! `prepare` installs what it needs with `apt-get` when missing (QEMU, busybox-static,
//! syslinux, mtools, dosfstools), downloads the kernel package (`apt-get download`, not
//! installed), and builds `board.img` in `<target>/qemu-board/` once: a FAT disk that
//! SYSLINUX boots into the kernel with a busybox initramfs. The guest loads virtio-net,
//! configures QEMU's user network (10.0.2.15), serves `/www` with busybox `httpd` on port 80,
//! prints `jumpstarter-board: ready` and runs a shell with the prompt `board# ` on the
//! serial console (`ttyS0`). Everything stays in the cache directory, outside the sources.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};

/// Bump when the image recipe changes (the cache is rebuilt).
const RECIPE: &str = "board-v1";

/// Debian packages the board needs on the host.
const PACKAGES: [&str; 7] = [
    "qemu-system-x86",
    "qemu-utils",
    "busybox-static",
    "syslinux",
    "syslinux-common",
    "mtools",
    "dosfstools",
];

/// Kernel modules for the virtio network card, in load order.
const MODULES: [&str; 8] = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
];

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in MODULES; do insmod /lib/modules/$m.ko; done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
mkdir -p /www
echo "hello from the jumpstarter qemu board" > /www/index.html
httpd -p 80 -h /www
echo "jumpstarter-board: ready"
export PS1='board# '
while true; do setsid cttyhack sh; done
"#;

const SYSLINUX_CFG: &str = "DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL vmlinuz
  INITRD initrd.gz
  APPEND console=ttyS0,115200 panic=-1 loglevel=4
";

/// The cache directory of the board, outside the checkout and named after its recipe.
pub fn cache_dir() -> PathBuf {
    crate::cache_root().join(format!(
        "qemu-board-{}",
        crate::workspace::short_hash(RECIPE)
    ))
}

/// `cargo xtask qemu-board`: prepares the board, links it as `<target>/qemu-board/board.img`
/// (where `cargo test`'s QEMU tests look without `JUMPSTARTER_QEMU_BOARD_IMAGE`) and prints
/// the image's path.
pub fn run() -> Result<()> {
    let img = prepare()?;
    let link_dir = crate::target_dir().join("qemu-board");
    std::fs::create_dir_all(&link_dir)?;
    let link = link_dir.join("board.img");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&img, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    println!("{}", img.display());
    Ok(())
}

/// Installs the tools if missing and builds the image once; returns its path.
pub fn prepare() -> Result<PathBuf> {
    let dir = cache_dir();
    let img = dir.join("board.img");
    let stamp = dir.join("stamp");
    ensure_packages()?;
    if img.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == RECIPE) {
        return Ok(img);
    }
    println!("== building the QEMU test board in {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let kernel = fetch_kernel(&dir)?;
    let initrd = build_initramfs(&dir, &kernel)?;
    build_disk(&dir, &kernel.vmlinuz, &initrd, &img)?;
    std::fs::write(&stamp, RECIPE)?;
    Ok(img)
}

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .into_iter()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

fn ensure_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    crate::workspace::apt_install(&missing, false, "the QEMU board test needs them")
}

struct Kernel {
    vmlinuz: PathBuf,
    modules: PathBuf,
}

/// Downloads Debian's current kernel package and extracts the kernel and the virtio modules.
fn fetch_kernel(dir: &Path) -> Result<Kernel> {
    let deps = output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .context("apt-cache depends linux-image-amd64 names no kernel package")?;
    let version = package.trim_start_matches("linux-image-").to_string();
    println!("== apt-get download {package}");
    run_cmd(
        Command::new("apt-get")
            .args(["download", &package])
            .current_dir(dir),
    )?;
    let deb = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let x = dir.join("kernel");
    std::fs::create_dir_all(&x)?;
    let mut members = vec![format!("./boot/vmlinuz-{version}")];
    members.extend(
        MODULES
            .iter()
            .map(|m| format!("./lib/modules/{version}/kernel/{m}")),
    );
    let script = format!(
        "dpkg-deb --fsys-tarfile \"$1\" | tar -x -C \"$2\" {}",
        members.join(" ")
    );
    run_cmd(
        Command::new("sh")
            .args(["-c", &script, "extract"])
            .arg(&deb)
            .arg(&x),
    )?;
    std::fs::remove_file(&deb)?;
    Ok(Kernel {
        vmlinuz: x.join(format!("boot/vmlinuz-{version}")),
        modules: x.join(format!("lib/modules/{version}/kernel")),
    })
}

fn build_initramfs(dir: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let root = dir.join("initramfs");
    for d in ["bin", "lib/modules", "proc", "sys", "dev", "www", "tmp"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("copying /bin/busybox (package busybox-static)")?;
    let mut names = Vec::new();
    for m in MODULES {
        let from = kernel.modules.join(m);
        let name = Path::new(m)
            .file_stem()
            .and_then(|s| s.to_str())
            .context("module name")?
            .to_string();
        std::fs::copy(&from, root.join(format!("lib/modules/{name}.ko")))
            .with_context(|| format!("copying {}", from.display()))?;
        names.push(name);
    }
    let init = root.join("init");
    std::fs::write(&init, INIT.replace("MODULES", &names.join(" ")))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    }
    let initrd = dir.join("initrd.gz");
    run_cmd(
        Command::new("sh")
            .args([
                "-c",
                "cd \"$1\" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > \"$2\"",
                "cpio",
            ])
            .arg(&root)
            .arg(&initrd),
    )?;
    Ok(initrd)
}

fn build_disk(dir: &Path, vmlinuz: &Path, initrd: &Path, img: &Path) -> Result<()> {
    let cfg = dir.join("syslinux.cfg");
    std::fs::write(&cfg, SYSLINUX_CFG)?;
    let f = std::fs::File::create(img)?;
    f.set_len(32 << 20)?;
    drop(f);
    run_cmd(Command::new("mkfs.fat").args(["-n", "JSBOARD"]).arg(img))?;
    run_cmd(Command::new("syslinux").arg("--install").arg(img))?;
    for (file, name) in [
        (vmlinuz, "vmlinuz"),
        (initrd, "initrd.gz"),
        (&cfg, "syslinux.cfg"),
    ] {
        run_cmd(
            Command::new("mcopy")
                .arg("-i")
                .arg(img)
                .arg(file)
                .arg(format!("::{name}")),
        )?;
    }
    Ok(())
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let what = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let what = format!("{cmd:?}");
    let o = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(o.status.success(), "{what} failed ({})", o.status);
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}
