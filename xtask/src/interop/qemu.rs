//! Interop of the QEMU board: upstream's Python `QemuClient` (flasher, power, and the
//! console's `pexpect()`) on our exporter's `Qemu` driver, booting the test board of
//! `cargo xtask qemu-board`.

use std::time::Duration;

use anyhow::{Result, ensure};

use super::{Env, check, path_with_venv};
use crate::procs;

/// Flashing, a TCG boot and power off: minutes on a busy machine, bounded.
const BOARD_TIMEOUT: Duration = Duration::from_secs(600);

fn board_config(env: &Env) -> Result<std::path::PathBuf> {
    let path = env.work.path().join("qemu-board.yaml");
    std::fs::write(
        &path,
        "apiVersion: jumpstarter.dev/v1alpha1
kind: ExporterConfig
metadata:
  namespace: default
  name: interop-qemu
endpoint: \"\"
token: \"\"
export:
  board:
    type: jumpstarter_driver_qemu.driver.Qemu
    config:
      arch: x86_64
      accel: tcg
      smp: 1
      mem: 256M
",
    )?;
    Ok(path)
}

/// Upstream `QemuClient` in our `jmp shell`: flash, power on, `console.pexpect()` to the
/// prompt, a command and its output, power off.
pub fn py_client_to_our_qemu(env: &Env) -> Result<()> {
    let image = crate::qemu_board::prepare()?;
    let config = board_config(env)?;
    let mut c = env.ours(&env.jmp);
    c.env("PATH", path_with_venv(env))
        .arg("shell")
        .arg("--exporter-config")
        .arg(&config)
        .arg("--")
        .arg(env.venv.join("bin/python"))
        .arg(env.scripts.join("qemu_board.py"))
        .arg(&image);
    let out = procs::run(c, BOARD_TIMEOUT)?;
    check(&out, "python qemu_board.py in our jmp shell")?;
    ensure!(
        out.stdout.contains("flashed")
            && out.stdout.contains("novnc ok")
            && out.stdout.contains("python qemu ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    if let Some(line) = out.stdout.lines().find(|l| l.starts_with("prompt after")) {
        println!("   {line}");
    }
    Ok(())
}
