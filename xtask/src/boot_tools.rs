//! The clients the boot-server tests drive (`jumpstarter-drivers`' `boot::` tests): curl for
//! `HttpServer` and TFTP with options, tftp-hpa's `tftp` for plain RFC 1350 transfers.
//! `ensure` installs the missing ones with `apt-get` (Debian); under `CI=true` those tests
//! fail, naming the tool, when it is missing.

use std::process::Command;

use anyhow::{Result, ensure};

/// Debian packages and the command each provides.
const TOOLS: [(&str, &str); 2] = [("curl", "curl"), ("tftp-hpa", "tftp")];

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs curl and tftp-hpa when missing.
pub fn ensure() -> Result<()> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(_, cmd)| !have(cmd))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("== apt-get install {}", missing.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let ok = install()
        || (Command::new("apt-get")
            .arg("update")
            .status()
            .is_ok_and(|s| s.success())
            && install());
    ensure!(
        ok,
        "apt-get install {} failed (the boot-server tests need them; run as root)",
        missing.join(" ")
    );
    Ok(())
}
